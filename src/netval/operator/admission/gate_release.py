"""Removing the scheduling gate from gated Pods once their validation admits them (Usable
and enough healthy nodes for each Pod, or Healthy under `admissionPolicy: strict`) and no
exclusion it decided waits for its Node write."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netval.infra.task_stop import cancel_and_wait
from netval.model.keys import AnnotationKey, LabelKey
from netval.operator.admission.mutate import (
    has_fabric_gate,
    orphan_message,
    set_fabric_gate,
    validation_label,
)
from netval.operator.gating.capacity import judge, min_healthy_nodes
from netval.operator.kube.api import error_text
from netval.operator.kube.paging import paged_items
from netval.operator.kube.read_modify_write import StillConflicting, Written, read_modify_write
from netval.operator.term_runtime import OperatorRuntime, ValidationView
from netval.operator.thread_pools import Concern

log = logging.getLogger("netval.operator.admission")

RELEASER_MEMO_KEY: Final = "gate_releaser"
RUNTIME_MEMO_KEY: Final = "runtime"
WARN_EVERY: Final = 30.0  # seconds between warnings about the same repeated failure
# Gated Pods per list page: a release after an outage may find thousands gated at once.
PAGE: Final = 500


def _admits(view: ValidationView, pod: Mapping[str, Any]) -> bool:
    """Whether `view` admits this gated Pod (its own min-healthy-nodes included). A value
    edited into something unreadable after admission counts as absent."""
    try:
        needed = min_healthy_nodes((pod.get("metadata") or {}).get("annotations"))
    except ValueError:
        needed = None
    return judge(view, needed).ok


class GateReleaser:
    """Removes `netval.io/fabric` from gated Pods (found by their `netval.io/gated-by` label)
    once their validation admits them, by the same judgement as the webhook
    (`netval.operator.gating.capacity.judge`).

    Every `interval` it asks the runtime (in memory) which validations admit workloads and
    have no exclusion waiting for its Node write (`ValidationView.pending_exclusions`: the
    label `unhealthy` the injected affinity reads, or the taint); it lists the gated Pods of
    one (a label-selected list) when the validation has just turned admitting or gained
    healthy nodes, when the webhook gated a Pod for it in the last
    `dirty_grace` seconds (a Pod gated just before the turn), or every `resync` seconds. A
    Pod whose `netval.io/min-healthy-nodes` asks for more healthy nodes than there are stays
    gated. Each Pod is patched with its resourceVersion (a 409 re-reads and retries); other
    gates and labels stay.

    Every `resync` seconds, once all validations are loaded, Pods gated for a validation that
    no longer exists get the annotation `netval.io/gate-message` saying so: they stay gated
    (releasing them would admit them onto fabric nobody judged), and the annotation tells
    their owner why and what to do. It is removed when the Pod is released."""

    def __init__(
        self,
        memo: Mapping[str, Any],
        *,
        interval: float = 1.0,
        resync: float = 15.0,
        dirty_grace: float = 5.0,
    ) -> None:
        self.memo = memo
        self.interval = interval
        self.resync = resync
        self.dirty_grace = dirty_grace
        self.released = 0
        # per validation: admitting, and its healthy nodes, when last looked at
        self._healthy: dict[str, tuple[bool, int]] = {}
        self._listed: dict[str, float] = {}
        self._dirty: dict[str, float] = {}
        self._warned = -WARN_EVERY
        self._orphans_checked = -1e9
        self.orphans_marked = 0
        self.orphan_checks = 0
        self._task: asyncio.Task[None] | None = None

    def note_gated(self, validation: str) -> None:
        self._dirty[validation] = time.monotonic()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="netval-gate-releaser")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def run(self) -> None:
        while True:
            runtime = self.memo.get(RUNTIME_MEMO_KEY)
            if isinstance(runtime, OperatorRuntime):
                try:
                    await self.pass_once(runtime)
                except Exception:  # a bug, not the API: pass_once handles API failures
                    log.exception("releasing gated pods failed; retrying")
            await asyncio.sleep(self.interval)

    async def pass_once(self, runtime: OperatorRuntime) -> None:
        for name in list(runtime.specs):
            view = runtime.validation_view(name)
            # an exclusion decided and not on its Node yet (the label the injected affinity
            # reads, the taint): a Pod released now could land on that node
            if view is None or view.pending_exclusions or not judge(view).ok:
                self._healthy[name] = (False, 0)
                continue
            was, had = self._healthy.get(name, (False, 0))
            turned = not was or view.healthy_nodes > had
            self._healthy[name] = (True, view.healthy_nodes)
            now = time.monotonic()
            if not (
                turned or name in self._dirty or now - self._listed.get(name, -1e9) >= self.resync
            ):
                continue
            try:
                count = await runtime.kube.pools.run(
                    Concern.GATES,
                    self._release_all,
                    runtime.kube.core,
                    name,
                    functools.partial(_admits, view),
                )
            except Exception as exc:
                self._healthy[name] = (False, 0)  # a turn not handled yet: try again next tick
                if now - self._warned >= WARN_EVERY:
                    self._warned = now
                    log.warning(
                        "releasing the gated pods of %s failed (retrying): %s",
                        name,
                        error_text(exc),
                    )
                continue
            self._listed[name] = now
            if (dirty := self._dirty.get(name)) is not None and dirty < now - self.dirty_grace:
                del self._dirty[name]
            if count:
                self.released += count
                log.info("NetworkValidation %s admits: released %d gated pod(s)", name, count)
        for name in set(self._healthy) - set(runtime.specs):
            self._healthy.pop(name, None)
            self._listed.pop(name, None)
        now = time.monotonic()
        if now - self._orphans_checked >= self.resync and await runtime.validations_loaded():
            self._orphans_checked = now
            try:
                marked = await runtime.kube.pools.run(
                    Concern.GATES, self._mark_orphans, runtime.kube.core, set(runtime.states)
                )
            except Exception as exc:
                self._orphans_checked = now - self.resync + self.interval  # retry soon
                log.warning(
                    "checking gated pods for deleted validations failed: %s", error_text(exc)
                )
                return
            self.orphan_checks += 1
            if marked:
                self.orphans_marked += marked
                log.warning(
                    "%d pod(s) gated for a NetworkValidation that does not exist: annotated %s",
                    marked,
                    AnnotationKey.GATE_MESSAGE.value,
                )

    def _release_all(
        self, core: client.CoreV1Api, validation: str, admits: Callable[[dict[str, Any]], bool]
    ) -> int:
        pods = paged_items(
            core.list_pod_for_all_namespaces,
            label_selector=f"{LabelKey.GATED_BY}={validation_label(validation)}",
            page=PAGE,
        )
        released = 0
        for pod in pods:
            meta = pod.get("metadata") or {}
            if not admits(pod):
                continue
            try:
                if self._release_pod(core, meta["namespace"], meta["name"], pod):
                    released += 1
            except (ApiException, StillConflicting) as exc:
                log.warning("could not release pod %s/%s: %s", meta.get("namespace"),
                            meta.get("name"), error_text(exc))  # fmt: skip
        return released

    @staticmethod
    def _mark_orphans(core: client.CoreV1Api, known: set[str]) -> int:
        """Annotate (or, once the validation is back, un-annotate) Pods gated for a validation
        not in `known`; the number newly annotated."""
        pods = paged_items(
            core.list_pod_for_all_namespaces, label_selector=LabelKey.GATED_BY.value, page=PAGE
        )
        marked = 0
        for pod in pods:
            meta = pod.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            validation = annotations.get(AnnotationKey.REQUIRE_HEALTHY)
            if not has_fabric_gate(pod.get("spec")) or not isinstance(validation, str):
                continue
            message = None if validation in known else orphan_message(validation)
            if annotations.get(AnnotationKey.GATE_MESSAGE) == message:
                continue
            patch = {"metadata": {"annotations": {AnnotationKey.GATE_MESSAGE.value: message}}}
            try:
                core.patch_namespaced_pod(
                    meta["name"], meta["namespace"], patch,
                    _content_type="application/merge-patch+json",
                )  # fmt: skip
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("could not annotate pod %s/%s: %s", meta.get("namespace"),
                                meta.get("name"), exc.reason)  # fmt: skip
                continue
            if message is not None:
                marked += 1
        return marked

    @staticmethod
    def _release_pod(
        core: client.CoreV1Api, namespace: str, name: str, pod: dict[str, Any]
    ) -> bool:
        """Release `pod` (as listed); True when it had netval's scheduling gate."""

        def read() -> dict[str, Any]:
            response = core.read_namespaced_pod(name, namespace, _preload_content=False)
            return cast(dict[str, Any], json.loads(cast(Any, response).data))

        def write(patch: dict[str, Any]) -> bool:
            core.patch_namespaced_pod(
                name, namespace, patch, _content_type="application/merge-patch+json"
            )
            return "spec" in patch  # it removed the gate

        done = read_modify_write(
            f"pod {namespace}/{name}", read, _release_patch, write, current=pod
        )
        return isinstance(done, Written) and done.value


def _release_patch(pod: dict[str, Any]) -> dict[str, Any]:
    """Labels, annotation and (if gated) the scheduling gate off, as of `pod`'s version."""
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": pod["metadata"]["resourceVersion"],
            "labels": {LabelKey.GATED_BY.value: None},
            "annotations": {AnnotationKey.GATE_MESSAGE.value: None},
        }
    }
    if has_fabric_gate(pod.get("spec")):
        spec = copy.deepcopy(pod.get("spec") or {})
        set_fabric_gate(spec, False)
        patch["spec"] = {"schedulingGates": spec.get("schedulingGates")}
    return patch
