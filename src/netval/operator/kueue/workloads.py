"""The Workloads, cached from the watch (trimmed to what the controller reads), and the
entries of our AdmissionChecks in their `status.admissionChecks`."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from netval.operator.kube.read_modify_write import (
    StillConflicting,
    Unwritten,
    Written,
    read_modify_write_async,
)
from netval.operator.kueue.admission_checks import AdmissionCheck
from netval.operator.kueue.decisions import (
    Verdict,
    condition_true,
    decide,
    rv_older,
    updated_checks,
)
from netval.operator.kueue.topology import (
    SLICE_ANNOTATIONS,
    Placement,
    admission_pods,
    placement,
    pods_per_node,
)
from netval.operator.term_runtime import OperatorRuntime, ValidationView
from netval.operator.thread_pools import Concern

log = logging.getLogger("netval.operator.kueue")

MAX_ATTEMPTS: Final = 5


class Workloads:
    """The Workloads by (namespace, name), fed by watch events (`wake` is called when one
    changes); judged by the AdmissionChecks of ours in `checks`."""

    def __init__(self, checks: Mapping[str, AdmissionCheck], wake: Callable[[], None]) -> None:
        self.checks = checks
        self.workloads: dict[tuple[str, str], dict[str, Any]] = {}
        self.patches = 0
        self._wake = wake

    def on_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if event_type == "DELETED":
            self.workloads.pop(key, None)
            return
        known = self.workloads.get(key)
        if known is not None and rv_older(
            meta.get("resourceVersion"), known["metadata"].get("resourceVersion")
        ):
            return
        self.workloads[key] = _trim(body)
        self._wake()

    def relevant(self, workload: Mapping[str, Any]) -> bool:
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
        placed: Placement | None = None
        views = {} if views is None else views
        out: dict[str, Verdict] = {}
        for entry in status.get("admissionChecks") or []:
            check = self.checks.get(str(entry.get("name")))
            if check is None or check.validation is None:
                continue  # not ours, or ours but misconfigured (Active=False says why)
            if placed is None:
                placed = placement(
                    status.get("admission"), runtime.node_labels, pods_per_node(workload)
                )
            if check.validation not in views:
                views[check.validation] = runtime.validation_view(check.validation)
            view = views[check.validation]
            verdict = decide(
                entry,
                view,
                validation=check.validation,
                admitted=admitted,
                assigned_nodes=placed.named,
                domains=placed.domains,
                pods=admission_pods(status.get("admission")),
            )
            if verdict is not None:
                out[check.name] = verdict
        return out

    async def sync(
        self,
        runtime: OperatorRuntime,
        workload: dict[str, Any],
        views: dict[str, ValidationView | None] | None = None,
    ) -> None:
        custom = runtime.kube.custom
        meta = workload["metadata"]
        key = (meta["namespace"], meta["name"])
        group, version = str(workload["apiVersion"]).split("/", 1)
        args = (group, version, meta["namespace"], "workloads", meta["name"])

        async def read() -> dict[str, Any] | None:
            fresh = await runtime.kube.pools.run(
                Concern.KUEUE, custom.get_namespaced_custom_object, *args
            )
            if not isinstance(fresh, dict):
                return None
            self.workloads[key] = _trim(fresh)
            return self.workloads[key]

        def change(current: dict[str, Any]) -> dict[str, Any] | None:
            if not self.relevant(current):
                return None
            status = current.get("status") or {}
            checks = updated_checks(
                status.get("admissionChecks") or [],
                self.verdicts(runtime, current, views),
                datetime.now(UTC),
            )
            if checks is None:
                return None
            return {
                "metadata": {"resourceVersion": current["metadata"].get("resourceVersion")},
                "status": {"admissionChecks": checks},
            }

        async def write(patch: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
            result = await runtime.kube.pools.run(
                Concern.KUEUE, custom.patch_namespaced_custom_object_status, *args, patch
            )
            return patch["status"]["admissionChecks"], result

        try:
            done = await read_modify_write_async(
                f"Workload {key[0]}/{key[1]}",
                read,
                change,
                write,
                current=workload,
                attempts=MAX_ATTEMPTS,
            )
        except StillConflicting:
            log.warning("Workload %s/%s kept changing; deciding again next round", *key)
            return
        if done is Unwritten.GONE:
            self.workloads.pop(key, None)
        if not isinstance(done, Written):
            return
        checks, result = done.value
        self.patches += 1
        states = {c["name"]: c["state"] for c in checks if c.get("name") in self.checks}
        log.info("Workload %s/%s: admission checks %s", *key, states)
        if isinstance(result, dict):
            self.on_event("MODIFIED", result)


def _trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the controller needs of a Workload: its status, and of its pod sets only how
    they pack pods on nodes (`topology.pods_per_node`), not their pod templates."""
    meta = body.get("metadata") or {}
    pod_sets = []
    for ps in ((body.get("spec") or {}).get("podSets")) or []:
        if not isinstance(ps, Mapping):
            continue
        template_meta = (ps.get("template") or {}).get("metadata") or {}
        annotations = template_meta.get("annotations") or ps.get("annotations") or {}
        pod_sets.append(
            {
                "name": ps.get("name"),
                "topologyRequest": copy.deepcopy(ps.get("topologyRequest") or {}),
                "annotations": {k: annotations[k] for k in SLICE_ANNOTATIONS if k in annotations},
            }
        )
    return {
        "apiVersion": body.get("apiVersion"),
        "metadata": {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": {"podSets": pod_sets},
        "status": copy.deepcopy(dict(body.get("status") or {})),
    }
