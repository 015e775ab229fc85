"""The Workloads naming one of our AdmissionChecks, cached from the watch (trimmed to what
the controller reads), and the entries of our AdmissionChecks in their
`status.admissionChecks`."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from netval.operator.kube.read_modify_write import (
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
)
from netval.operator.term_runtime import OperatorRuntime, ValidationView
from netval.operator.thread_pools import Concern

log = logging.getLogger("netval.operator.kueue")

MAX_ATTEMPTS: Final = 5


Key = tuple[str, str]  # (namespace, name)


class Workloads:
    """The Workloads naming one of our AdmissionChecks, by (namespace, name), fed by watch
    events (`changed(key)` is called when one changes); judged by the AdmissionChecks of ours
    in `checks`. Of a Workload naming none of ours only the names of its checks are kept
    (`others`): if one of them turns out to be ours (its AdmissionCheck arrives after the
    Workload, as at start-up), the Workload is read from the API (`fetch`)."""

    def __init__(
        self, checks: Mapping[str, AdmissionCheck], changed: Callable[[Key], None]
    ) -> None:
        self.checks = checks
        self.workloads: dict[Key, dict[str, Any]] = {}
        self.others: dict[Key, frozenset[str]] = {}
        self._names: dict[frozenset[str], frozenset[str]] = {}  # one copy per set of names
        self.patches = 0
        self._changed = changed

    def names_ours(self, names: Iterable[str]) -> bool:
        return any(n in self.checks for n in names)

    def on_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if event_type == "DELETED":
            self.workloads.pop(key, None)
            self.others.pop(key, None)
            self._changed(key)
            return
        names = _check_names(body)
        if not self.names_ours(names):
            self.workloads.pop(key, None)
            if names:
                self.others[key] = self._names.setdefault(names, names)
            else:
                self.others.pop(key, None)
            return
        self.others.pop(key, None)
        known = self.workloads.get(key)
        if known is not None and rv_older(
            meta.get("resourceVersion"), known["metadata"].get("resourceVersion")
        ):
            return
        self.workloads[key] = _trim(body)
        self._changed(key)

    def checks_changed(self, names: Collection[str]) -> list[Key]:
        """AdmissionChecks `names` became ours or stopped being ours: the Workloads naming
        them, cached or not, to be reconciled (those no longer naming one of ours leave the
        cache)."""
        out = []
        for key, workload in list(self.workloads.items()):
            held = _check_names(workload)
            if held & set(names):
                out.append(key)
                if not self.names_ours(held):
                    del self.workloads[key]
                    self.others[key] = held
        out += [key for key, held in self.others.items() if held & set(names)]
        return out

    def wanted(self, key: Key) -> bool:
        """A Workload not cached whose checks name one of ours now (to be read)."""
        held = self.others.get(key)
        return held is not None and self.names_ours(held)

    def relevant(self, workload: Mapping[str, Any]) -> bool:
        status = workload.get("status") or {}
        if not condition_true(status, "QuotaReserved") or condition_true(status, "Finished"):
            return False
        return any(c.get("name") in self.checks for c in status.get("admissionChecks") or [])

    def settled(self, workload: Mapping[str, Any]) -> bool:
        """Admitted with every entry of ours Ready or Retry: no change of the validation's
        state can change them (`decisions.decide` leaves them), only one of its nodes."""
        status = workload.get("status") or {}
        if not condition_true(status, "Admitted"):
            return False
        return all(
            c.get("state") in ("Ready", "Retry")
            for c in status.get("admissionChecks") or []
            if c.get("name") in self.checks
        )

    def validations(self, workload: Mapping[str, Any]) -> set[str]:
        """The validations our checks on it judge by."""
        out = set()
        for entry in (workload.get("status") or {}).get("admissionChecks") or []:
            check = self.checks.get(str(entry.get("name")))
            if check is not None and check.validation is not None:
                out.add(check.validation)
        return out

    def verdicts(
        self,
        workload: Mapping[str, Any],
        placed: Placement,
        view_of: Callable[[str], ValidationView | None],
    ) -> dict[str, Verdict]:
        status = workload.get("status") or {}
        admitted = condition_true(status, "Admitted")
        out: dict[str, Verdict] = {}
        for entry in status.get("admissionChecks") or []:
            check = self.checks.get(str(entry.get("name")))
            if check is None or check.validation is None:
                continue  # not ours, or ours but misconfigured (Active=False says why)
            verdict = decide(
                entry,
                view_of(check.validation),
                validation=check.validation,
                admitted=admitted,
                assigned_nodes=placed.named,
                domains=placed.domains,
                pods=admission_pods(status.get("admission")),
            )
            if verdict is not None:
                out[check.name] = verdict
        return out

    async def fetch(self, runtime: OperatorRuntime, key: Key, api_version: str) -> None:
        """Read a Workload not cached (`wanted`) from the API into the cache."""
        group, version = api_version.split("/", 1)
        try:
            fresh = await runtime.kube.pools.run(
                Concern.KUEUE, runtime.kube.custom.get_namespaced_custom_object,
                group, version, key[0], "workloads", key[1],
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                self.others.pop(key, None)
                return
            raise
        if isinstance(fresh, dict):
            self.on_event("MODIFIED", fresh)

    async def sync(
        self,
        runtime: OperatorRuntime,
        workload: dict[str, Any],
        place: Callable[[Mapping[str, Any]], Placement],
        view_of: Callable[[str], ValidationView | None],
    ) -> None:
        """Our entries of one Workload brought in line with the verdicts (a read-modify-write
        of its status); raises when the API fails (the caller backs off)."""
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
                self.verdicts(current, place(current), view_of),
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

        done = await read_modify_write_async(
            f"Workload {key[0]}/{key[1]}",
            read,
            change,
            write,
            current=workload,
            attempts=MAX_ATTEMPTS,
        )
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


def _check_names(body: Mapping[str, Any]) -> frozenset[str]:
    checks = (body.get("status") or {}).get("admissionChecks") or []
    return frozenset(str(c.get("name")) for c in checks if isinstance(c, Mapping))


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
