"""Our AdmissionChecks (`controllerName: netval.io/fabric`), cached from the watch, and their
`Active` condition."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from netval.model.manifest import API_GROUP
from netval.operator.kube.api import PLURAL, VERSION, error_text
from netval.operator.kueue.decisions import (
    ACTIVE,
    active_condition,
    check_parameters,
    condition,
    rv_older,
    same_condition,
    with_condition,
)
from netval.operator.term_runtime import OperatorRuntime
from netval.operator.thread_pools import Concern

log = logging.getLogger("netval.operator.kueue")

CONTROLLER_NAME: Final = "netval.io/fabric"
NOT_FOUND_CONFIRM_SECONDS: Final = 10.0


@dataclass(slots=True)
class AdmissionCheck:
    """One AdmissionCheck of ours, as the controller keeps it."""

    name: str
    api_version: str
    generation: int
    resource_version: str | None
    conditions: list[dict[str, Any]]
    validation: str | None
    error: str | None


class AdmissionChecks:
    """The AdmissionChecks of our controller by name (fed by watch events; `changed(name,
    judging)` is called when one changes, `judging` True when the validation it judges by
    changed, it became ours or stopped being ours), and the writer of their Active
    condition."""

    def __init__(self, changed: Callable[[str, bool], None]) -> None:
        self.checks: dict[str, AdmissionCheck] = {}
        self.patches = 0
        self._changed = changed
        self._not_found_confirmed: dict[str, float] = {}

    def on_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        name = str(meta.get("name"))
        spec = body.get("spec") or {}
        if event_type == "DELETED" or spec.get("controllerName") != CONTROLLER_NAME:
            if self.checks.pop(name, None) is not None:
                self._changed(name, True)
            return
        known = self.checks.get(name)
        if known is not None and rv_older(meta.get("resourceVersion"), known.resource_version):
            return
        validation, error = check_parameters(spec)
        judging = known is None or (known.validation, known.error) != (validation, error)
        self.checks[name] = AdmissionCheck(
            name=name,
            api_version=str(body.get("apiVersion")),
            generation=int(meta.get("generation") or 0),
            resource_version=meta.get("resourceVersion"),
            conditions=[dict(c) for c in (body.get("status") or {}).get("conditions") or []],
            validation=validation,
            error=error,
        )
        self._changed(name, judging)

    async def sync(self, runtime: OperatorRuntime, check: AdmissionCheck) -> None:
        found = check.validation is not None and check.validation in runtime.specs
        want = active_condition(check.validation, check.error, found, check.generation)
        if same_condition(condition(check.conditions, ACTIVE), want):
            return
        # After a restart the runtime learns the validations from Kopf a moment later: only
        # say "not found" when the API agrees.
        if (
            want["reason"] == "ValidationNotFound"
            and check.validation is not None
            and not await self._confirm_not_found(runtime, check.validation)
        ):
            return
        group, version = check.api_version.split("/", 1)
        conditions = with_condition(check.conditions, want, datetime.now(UTC))
        patch = {
            "metadata": {"resourceVersion": check.resource_version},
            "status": {"conditions": conditions},
        }
        result = await runtime.kube.pools.run(
            Concern.KUEUE,
            runtime.kube.custom.patch_cluster_custom_object_status,
            group, version, "admissionchecks", check.name, patch,
        )  # fmt: skip
        self.patches += 1
        log.info("AdmissionCheck %s: Active=%s (%s)", check.name, want["status"], want["reason"])
        if isinstance(result, dict):
            self.on_event("MODIFIED", result)

    async def _confirm_not_found(self, runtime: OperatorRuntime, name: str) -> bool:
        confirmed = self._not_found_confirmed.get(name)
        if confirmed is not None and time.monotonic() - confirmed < NOT_FOUND_CONFIRM_SECONDS:
            return True

        def read() -> bool:
            try:
                runtime.kube.custom.get_cluster_custom_object(
                    API_GROUP, VERSION, PLURAL, name, _request_timeout=5
                )
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return name in runtime.states and name not in runtime.specs  # invalid spec

        try:
            missing = await runtime.kube.pools.run(Concern.KUEUE, read)
        except Exception as exc:
            log.warning("looking up NetworkValidation %s failed: %s", name, error_text(exc))
            return False
        if missing:
            self._not_found_confirmed[name] = time.monotonic()
        return missing
