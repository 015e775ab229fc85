"""Kueue AdmissionCheck controller for `controllerName: netval.io/fabric`.

Modelled on Kueue's own check controllers (provisioning, multikueue):

- AdmissionCheck: `spec.parameters` must name a NetworkValidation (`apiGroup: netval.io`,
  `kind: NetworkValidation`, `name`). The controller keeps the `Active` condition: True when
  the validation is known, False with reason `BadParameters` (wrong reference) or
  `ValidationNotFound` (no such validation; confirmed with the API first, so an operator
  restart that has not loaded the validations yet does not deactivate ClusterQueues).
- Workload: only once it has reserved quota (`QuotaReserved=True`) and is not finished, and
  only the `status.admissionChecks` entries of our AdmissionChecks: `Pending` -> `Ready` when
  the validation is Healthy and none of the nodes its admission names (topology assignment,
  `kubernetes.io/hostname` or any node-label levels) is unhealthy; `Pending` -> `Retry` when
  such an assigned node is unhealthy (Kueue releases the quota and places it again);
  `Pending` with a message while the validation is unknown or not Healthy; `Ready` -> `Retry`
  when the validation turns unhealthy before the Workload is admitted. An admitted (running)
  Workload is never evicted by this controller, as Kueue's provisioning controller does not
  retry admitted workloads. `Retry` is left for Kueue to reset (it does so on eviction).
  `Rejected` (which deactivates the Workload) is never set: no fabric condition is permanent.

Writes are merge patches of `status` carrying the object's resourceVersion (the whole
`admissionChecks` list, only our entries changed; a 409 re-reads and decides again).

The group is watched without a version: Kopf serves the cluster's preferred version, so
`v1beta2` where Kueue serves it, else `v1beta1`; writes use the version of the object read.
Enabled by `NETVAL_KUEUE_ENABLED=true` (`OperatorSettings.kueue_enabled`): only then does
`netval operator` import this module (Kopf then watches Kueue objects, which needs RBAC).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import kopf
from kubernetes.client.exceptions import ApiException

from netval.infra.task_stop import cancel_and_wait
from netval.model.manifest import API_GROUP, KIND
from netval.operator.kube.api import PLURAL, VERSION
from netval.operator.runtime import OperatorRuntime, ValidationView

log = logging.getLogger("netval.operator.kueue")

CONTROLLER_NAME: Final = "netval.io/fabric"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
ACTIVE: Final = "Active"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
KUEUE_MEMO_KEY: Final = "kueue"
RUNTIME_MEMO_KEY: Final = "runtime"
MAX_MESSAGE: Final = 1024
MAX_ATTEMPTS: Final = 5
NOT_FOUND_CONFIRM_SECONDS: Final = 10.0
WARN_EVERY: Final = 30.0

CheckState = Literal["Pending", "Ready", "Retry", "Rejected"]


# -- pure decisions -----------------------------------------------------------------------------


def check_parameters(spec: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(validation name, None) or (None, why the parameters cannot be used)."""
    params = (spec or {}).get("parameters") or {}
    want = f"apiGroup {API_GROUP}, kind {KIND}"
    if not params:
        return None, f"spec.parameters must name a NetworkValidation ({want}, name)"
    if params.get("apiGroup") != API_GROUP or params.get("kind") != KIND:
        got = f"apiGroup {params.get('apiGroup')!r}, kind {params.get('kind')!r}"
        return None, f"spec.parameters must reference {want}; got {got}"
    name = params.get("name")
    if not isinstance(name, str) or not name:
        return None, "spec.parameters.name must name a NetworkValidation"
    return name, None


def condition(
    conditions: Sequence[Mapping[str, Any]] | None, kind: str
) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == kind), None)


def condition_true(status: Mapping[str, Any] | None, kind: str) -> bool:
    found = condition((status or {}).get("conditions"), kind)
    return found is not None and found.get("status") == "True"


def with_condition(
    conditions: Sequence[Mapping[str, Any]] | None, new: Mapping[str, Any], now: datetime
) -> list[dict[str, Any]]:
    """`conditions` with `new` set (metav1.Condition rules: lastTransitionTime moves only when
    the status changes); other types untouched."""
    out = [dict(c) for c in conditions or () if c.get("type") != new["type"]]
    old = condition(conditions, str(new["type"]))
    entry = dict(new)
    if old is not None and old.get("status") == new["status"] and old.get("lastTransitionTime"):
        entry["lastTransitionTime"] = old["lastTransitionTime"]
    else:
        entry["lastTransitionTime"] = _timestamp(now)
    out.append(entry)
    return out


def same_condition(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    keys = ("status", "reason", "message", "observedGeneration")
    return a is not None and all(a.get(k) == b.get(k) for k in keys)


def active_condition(
    validation: str | None, error: str | None, found: bool, generation: int
) -> dict[str, Any]:
    """The Active condition for an AdmissionCheck of ours (without lastTransitionTime)."""
    if error is not None:
        status, reason, message = "False", "BadParameters", error
    elif not found:
        status, reason = "False", "ValidationNotFound"
        message = f"no NetworkValidation named {validation!r} is known to the netval operator"
    else:
        status, reason = "True", "Active"
        message = f"netval judges workloads by NetworkValidation {validation!r}"
    return {
        "type": ACTIVE,
        "status": status,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "observedGeneration": generation,
    }


@dataclass(frozen=True, slots=True)
class Verdict:
    state: CheckState
    message: str


def decide(
    current: Mapping[str, Any],
    view: ValidationView | None,
    *,
    validation: str,
    admitted: bool,
    assigned_nodes: Sequence[str] = (),
) -> Verdict | None:
    """The state our check entry should have (None: leave it as it is)."""
    state = current.get("state") or "Pending"
    if view is None:
        if state == "Pending":
            return Verdict("Pending", f"NetworkValidation {validation!r} is not known to netval")
        return None
    bad = [n for n in assigned_nodes if view.node_health.get(n) == "unhealthy"]
    ok = view.healthy and not bad
    if state == "Pending":
        if ok:
            where = (
                f"; none of the assigned nodes ({_names(assigned_nodes)}) is unhealthy"
                if assigned_nodes
                else ""
            )
            return Verdict("Ready", f"NetworkValidation {validation!r} is Healthy{where}")
        if bad:
            return Verdict(
                "Retry",
                f"assigned node(s) with unhealthy fabric: {_names(bad)} "
                f"(NetworkValidation {validation!r}); retry on other nodes",
            )
        return Verdict(
            "Pending",
            f"waiting for NetworkValidation {validation!r} to be Healthy: {view.healthy_message}",
        )
    if state == "Ready" and not ok and not admitted:
        why = f"assigned node(s) unhealthy: {_names(bad)}" if bad else view.healthy_message
        return Verdict("Retry", f"NetworkValidation {validation!r} is no longer Healthy: {why}")
    return None


def updated_checks(
    checks: Sequence[Mapping[str, Any]], verdicts: Mapping[str, Verdict], now: datetime
) -> list[dict[str, Any]] | None:
    """The whole admissionChecks list with our verdicts applied; None when nothing changes.
    Entries of other controllers are copied as they are."""
    out: list[dict[str, Any]] = []
    changed = False
    for entry in checks:
        new = copy.deepcopy(dict(entry))
        verdict = verdicts.get(str(entry.get("name")))
        if verdict is not None:
            message = verdict.message[:MAX_MESSAGE]
            if new.get("state") != verdict.state:
                new["state"] = verdict.state
                new["lastTransitionTime"] = _timestamp(now)
                changed = True
            if new.get("message") != message:
                new["message"] = message
                changed = True
            if not new.get("lastTransitionTime"):
                new["lastTransitionTime"] = _timestamp(now)
                changed = True
        out.append(new)
    return out if changed else None


def topology_domains(assignment: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(levels, [values per level] per domain) of a podSetAssignment's topologyAssignment,
    in Kueue v1beta1 (`domains`) or v1beta2 (`slices`, with prefix/suffix/roots or
    universalValue) form."""
    ta = assignment.get("topologyAssignment") or {}
    levels = [str(level) for level in ta.get("levels") or []]
    domains: list[list[str]] = []
    for domain in ta.get("domains") or []:
        domains.append([str(v) for v in domain.get("values") or []])
    for piece in ta.get("slices") or []:
        count = int(piece.get("domainCount") or 0)
        per_level: list[list[str]] = []
        for lv in piece.get("valuesPerLevel") or []:
            if lv.get("universalValue") is not None:
                per_level.append([str(lv["universalValue"])] * count)
            else:
                prefix, suffix = lv.get("prefix") or "", lv.get("suffix") or ""
                per_level.append([f"{prefix}{root}{suffix}" for root in lv.get("roots") or []])
        for i in range(count):
            domains.append([values[i] if i < len(values) else "" for values in per_level])
    return levels, domains


def assigned_nodes(
    admission: Mapping[str, Any] | None, node_labels: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """The nodes a Workload's admission places it on, where it says (Topology-Aware
    Scheduling); [] when it names flavors only (a flavor is a pool: the validation's Healthy
    condition judges the pool)."""
    nodes: set[str] = set()
    for psa in (admission or {}).get("podSetAssignments") or []:
        levels, domains = topology_domains(psa)
        if not levels:
            continue
        for values in domains:
            selector = dict(zip(levels, values, strict=False))
            if HOSTNAME_LABEL in selector:
                host = selector[HOSTNAME_LABEL]
                matched = [
                    n for n, labels in node_labels.items() if labels.get(HOSTNAME_LABEL) == host
                ]
                nodes.update(matched or [host])
            else:
                nodes.update(
                    n
                    for n, labels in node_labels.items()
                    if all(labels.get(k) == v for k, v in selector.items())
                )
    return sorted(nodes)


def _names(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown} and {len(names) - limit} more" if len(names) > limit else shown


def _timestamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rv_older(new: str | None, old: str | None) -> bool:
    """Whether resourceVersion `new` is older than `old` (when both are numbers, as etcd's
    are; opaque ones are never called older)."""
    try:
        return new is not None and old is not None and int(new) < int(old)
    except ValueError:
        return False


# -- the controller -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Check:
    name: str
    api_version: str
    generation: int
    resource_version: str | None
    conditions: list[dict[str, Any]]
    validation: str | None
    error: str | None


class KueueController:
    """Caches our AdmissionChecks and the Workloads (fed by Kopf's watch events) and, on each
    event and every `interval`, brings their status in line with the runtime's view."""

    def __init__(self, memo: Mapping[str, Any], *, interval: float = 1.0) -> None:
        self.memo = memo
        self.interval = interval
        self.checks: dict[str, _Check] = {}
        self.workloads: dict[tuple[str, str], dict[str, Any]] = {}
        self.patches = 0
        self._wake = asyncio.Event()
        self._not_found_confirmed: dict[str, float] = {}
        self._warned = -WARN_EVERY
        self._task: asyncio.Task[None] | None = None

    # -- watch events (Kopf handlers below) ------------------------------------------------

    def on_admission_check(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        name = str(meta.get("name"))
        spec = body.get("spec") or {}
        if event_type == "DELETED" or spec.get("controllerName") != CONTROLLER_NAME:
            self.checks.pop(name, None)
            return
        known = self.checks.get(name)
        if known is not None and _rv_older(meta.get("resourceVersion"), known.resource_version):
            return
        validation, error = check_parameters(spec)
        self.checks[name] = _Check(
            name=name,
            api_version=str(body.get("apiVersion")),
            generation=int(meta.get("generation") or 0),
            resource_version=meta.get("resourceVersion"),
            conditions=[dict(c) for c in (body.get("status") or {}).get("conditions") or []],
            validation=validation,
            error=error,
        )
        self._wake.set()

    def on_workload(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if event_type == "DELETED":
            self.workloads.pop(key, None)
            return
        known = self.workloads.get(key)
        if known is not None and _rv_older(
            meta.get("resourceVersion"), known["metadata"].get("resourceVersion")
        ):
            return
        self.workloads[key] = _trim(body)
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="netval-kueue")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
            self._wake.clear()
            runtime = self.memo.get(RUNTIME_MEMO_KEY)
            if not isinstance(runtime, OperatorRuntime):
                continue
            try:
                await self.reconcile(runtime)
            except Exception:  # a bug, not the API: reconcile handles API failures
                log.exception("Kueue admission checks: reconcile failed; retrying")

    async def reconcile(self, runtime: OperatorRuntime) -> None:
        for check in list(self.checks.values()):
            try:
                await self._sync_check(runtime, check)
            except Exception as exc:
                self._warn(f"AdmissionCheck {check.name}: status write failed: {_reason(exc)}")
        views: dict[str, ValidationView | None] = {}  # one view per validation per round
        for key in list(self.workloads):
            workload = self.workloads.get(key)
            if workload is None or not self._relevant(workload):
                continue
            try:
                await self._sync_workload(runtime, workload, views)
            except Exception as exc:
                self._warn(f"Workload {key[0]}/{key[1]}: status write failed: {_reason(exc)}")

    def _warn(self, message: str) -> None:
        """A warning, at most one per WARN_EVERY seconds (an API outage fails every round)."""
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            log.warning("%s (retrying every round)", message)

    # -- AdmissionChecks --------------------------------------------------------------------

    async def _sync_check(self, runtime: OperatorRuntime, check: _Check) -> None:
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
        result = await asyncio.to_thread(
            runtime.kube.custom.patch_cluster_custom_object_status,
            group, version, "admissionchecks", check.name, patch,
        )  # fmt: skip
        self.patches += 1
        log.info("AdmissionCheck %s: Active=%s (%s)", check.name, want["status"], want["reason"])
        if isinstance(result, dict):
            self.on_admission_check("MODIFIED", result)

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
            missing = await asyncio.to_thread(read)
        except Exception as exc:
            log.warning("looking up NetworkValidation %s failed: %s", name, exc)
            return False
        if missing:
            self._not_found_confirmed[name] = time.monotonic()
        return missing

    # -- Workloads --------------------------------------------------------------------------

    def _relevant(self, workload: Mapping[str, Any]) -> bool:
        status = workload.get("status") or {}
        if not condition_true(status, "QuotaReserved") or condition_true(status, "Finished"):
            return False
        return any(c.get("name") in self.checks for c in status.get("admissionChecks") or [])

    def verdicts(
        self,
        runtime: OperatorRuntime,
        workload: Mapping[str, Any],
        views: dict[str, ValidationView | None] | None = None,
    ) -> dict[str, Verdict]:
        status = workload.get("status") or {}
        admitted = condition_true(status, "Admitted")
        nodes: list[str] | None = None
        views = {} if views is None else views
        out: dict[str, Verdict] = {}
        for entry in status.get("admissionChecks") or []:
            check = self.checks.get(str(entry.get("name")))
            if check is None or check.validation is None:
                continue  # not ours, or ours but misconfigured (Active=False says why)
            if nodes is None:
                nodes = assigned_nodes(status.get("admission"), runtime.node_labels)
            if check.validation not in views:
                views[check.validation] = runtime.validation_view(check.validation)
            view = views[check.validation]
            verdict = decide(
                entry, view, validation=check.validation, admitted=admitted, assigned_nodes=nodes
            )
            if verdict is not None:
                out[check.name] = verdict
        return out

    async def _sync_workload(
        self,
        runtime: OperatorRuntime,
        workload: dict[str, Any],
        views: dict[str, ValidationView | None] | None = None,
    ) -> None:
        custom = runtime.kube.custom
        for _ in range(MAX_ATTEMPTS):
            meta = workload["metadata"]
            status = workload.get("status") or {}
            if not self._relevant(workload):
                return
            checks = updated_checks(
                status.get("admissionChecks") or [],
                self.verdicts(runtime, workload, views),
                datetime.now(UTC),
            )
            if checks is None:
                return
            group, version = str(workload["apiVersion"]).split("/", 1)
            args = (group, version, meta["namespace"], "workloads", meta["name"])
            patch = {
                "metadata": {"resourceVersion": meta.get("resourceVersion")},
                "status": {"admissionChecks": checks},
            }
            try:
                result = await asyncio.to_thread(
                    custom.patch_namespaced_custom_object_status, *args, patch
                )
            except ApiException as exc:
                if exc.status == 404:
                    self.workloads.pop((meta["namespace"], meta["name"]), None)
                    return
                if exc.status != 409:
                    raise
                fresh = await asyncio.to_thread(custom.get_namespaced_custom_object, *args)
                if not isinstance(fresh, dict):
                    return
                workload = _trim(fresh)
                self.workloads[(meta["namespace"], meta["name"])] = workload
                continue
            self.patches += 1
            states = {c["name"]: c["state"] for c in checks if c.get("name") in self.checks}
            log.info("Workload %s/%s: admission checks %s", meta["namespace"], meta["name"], states)
            if isinstance(result, dict):
                self.on_workload("MODIFIED", result)
            return
        log.warning("Workload %s/%s kept changing; deciding again next round",
                    workload["metadata"]["namespace"], workload["metadata"]["name"])  # fmt: skip


def _reason(exc: Exception) -> str:
    return str(exc.reason) if isinstance(exc, ApiException) else str(exc) or repr(exc)


def _trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the controller needs of a Workload (not its pod templates)."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "metadata": {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "status": copy.deepcopy(dict(body.get("status") or {})),
    }


# -- Kopf wiring --------------------------------------------------------------------------------


def _controller(memo: Mapping[str, Any]) -> KueueController | None:
    controller = memo.get(KUEUE_MEMO_KEY)
    return controller if isinstance(controller, KueueController) else None


@kopf.on.startup()
async def kueue_startup(memo: kopf.Memo, **_: Any) -> None:
    if not getattr(memo.get("settings"), "kueue_enabled", False):
        return  # NETVAL_KUEUE_ENABLED=false: watch events are ignored, nothing is written
    controller = KueueController(memo)
    memo[KUEUE_MEMO_KEY] = controller
    controller.start()


@kopf.on.cleanup()
async def kueue_cleanup(memo: kopf.Memo, **_: Any) -> None:
    controller = _controller(memo)
    if controller is not None:
        await controller.stop()


@kopf.on.event(KUEUE_GROUP, "admissionchecks")
async def kueue_admission_check_event(
    type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    controller = _controller(memo)
    if controller is not None:
        controller.on_admission_check(type, body)


@kopf.on.event(KUEUE_GROUP, "workloads")
async def kueue_workload_event(
    type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    controller = _controller(memo)
    if controller is not None:
        controller.on_workload(type, body)
