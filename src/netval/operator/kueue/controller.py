"""`KueueController`: our AdmissionChecks and the Workloads naming them, reconciled per
Workload in the controller-runtime manner.

- A work queue keyed by (namespace, name) (`kube.work_queue.WorkQueue`: dedup, per-item
  backoff) feeds `workers` reconcilers. Keys come from watch events of the Workload, from an
  AdmissionCheck that became ours or changed its validation (the Workloads naming it), and
  from the validations' verdicts as a tick reads them every `interval`.
- The tick (`_tick`) reads each judging validation's view once (`runtime.validation_view`,
  the node verdict as the gating round recorded it) and compares it with the view before: a
  change of the validation's own state (Healthy, Usable, the healthy-node count, the policy)
  requeues the Workloads it judges that such a change can move (not admitted ones, or ones
  with an entry of ours still Pending); a change of some nodes' verdicts requeues only the
  Workloads placed on those nodes (`assignments.Assignments`). An admitted Workload is thus
  reconciled only when an event or a verdict change of its assigned nodes touches it.
- The tick also keeps our AdmissionChecks' Active condition (a handful of objects).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from netval.infra.task_stop import cancel_and_wait
from netval.operator.kube.work_queue import WorkQueue
from netval.operator.kueue.admission_checks import AdmissionCheck, AdmissionChecks
from netval.operator.kueue.assignments import Assignments, Key
from netval.operator.kueue.workloads import Workloads
from netval.operator.term_runtime import OperatorRuntime, ValidationView

log = logging.getLogger("netval.operator.kueue")

KUEUE_MEMO_KEY: Final = "kueue"
RUNTIME_MEMO_KEY: Final = "runtime"
WARN_EVERY: Final = 30.0
WORKERS: Final = 4  # Workload reconciles at once (their API calls share Concern.KUEUE's pool)
BACKOFF_BASE: Final = 0.5  # seconds before a failed Workload is reconciled again, doubling
BACKOFF_CAP: Final = 30.0


class KueueController:
    """Caches our AdmissionChecks and the Workloads naming them (fed by Kopf's watch events)
    and brings each Workload's entries in line with the runtime's view when it, or the
    verdict of a node it is placed on, changes."""

    def __init__(
        self, memo: Mapping[str, Any], *, interval: float = 1.0, workers: int = WORKERS
    ) -> None:
        self.memo = memo
        self.interval = interval
        self.workers = workers
        self._wake = asyncio.Event()
        self.queue: WorkQueue[Key] = WorkQueue(base_delay=BACKOFF_BASE, max_delay=BACKOFF_CAP)
        self.admission_checks = AdmissionChecks(self._check_changed)
        self.workload_cache = Workloads(self.admission_checks.checks, self.queue.add)
        self.assignments = Assignments()
        self.views: dict[str, ValidationView | None] = {}  # as the last tick read them
        self.reconciles = 0
        self._runtime: OperatorRuntime | None = None
        self._warned = -WARN_EVERY
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def checks(self) -> dict[str, AdmissionCheck]:
        return self.admission_checks.checks

    @property
    def workloads(self) -> dict[Key, dict[str, Any]]:
        return self.workload_cache.workloads

    @property
    def patches(self) -> int:
        """Status writes so far (AdmissionChecks and Workloads)."""
        return self.admission_checks.patches + self.workload_cache.patches

    # -- watch events (Kopf handlers in `handlers`) ------------------------------------------

    def on_admission_check(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        self.admission_checks.on_event(event_type, body)

    def on_workload(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        self.workload_cache.on_event(event_type, body)

    def on_event(self, plural: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event of `admissionchecks` or `workloads`."""
        if plural == "admissionchecks":
            self.on_admission_check(event_type, body)
        elif plural == "workloads":
            self.on_workload(event_type, body)

    def _check_changed(self, name: str, judging: bool) -> None:
        self._wake.set()  # its Active condition
        if judging:
            for key in self.workload_cache.checks_changed([name]):
                self.queue.add(key)

    # -- the tasks --------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self.run(), name="netval-kueue")] + [
            asyncio.create_task(self.work(), name=f"netval-kueue-{i}") for i in range(self.workers)
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self.queue.close()

    async def run(self) -> None:
        """The tick: AdmissionChecks, the Nodes' labels, the validations' views."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
            self._wake.clear()
            runtime = self._current_runtime()
            if runtime is None:
                continue
            try:
                await self._tick(runtime)
            except Exception:  # a bug, not the API: the syncs handle API failures
                log.exception("Kueue admission checks: tick failed; retrying")

    async def work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(key)
            except Exception as exc:
                delay = self.queue.add_rate_limited(key)
                self._warn(f"Workload {key[0]}/{key[1]}: status write failed: {_reason(exc)}"
                           f" (again in {delay:.1f}s, backing off)")  # fmt: skip
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)

    def _current_runtime(self) -> OperatorRuntime | None:
        runtime = self.memo.get(RUNTIME_MEMO_KEY)
        if not isinstance(runtime, OperatorRuntime):
            return None
        if runtime is not self._runtime:  # a new term: its own state, everything again
            self._runtime = runtime
            self.views.clear()
            self.assignments = Assignments()
            for key in [*self.workloads, *self.workload_cache.others]:
                self.queue.add(key)
        return runtime

    async def _tick(self, runtime: OperatorRuntime) -> None:
        for check in list(self.checks.values()):
            try:
                await self.admission_checks.sync(runtime, check)
            except Exception as exc:
                self._warn(f"AdmissionCheck {check.name}: status write failed: {_reason(exc)}")
        if self.assignments.labels_changed(runtime.node_labels):
            for key in self.assignments.reindex(runtime.node_labels):
                self.queue.add(key)
        self._refresh_views(runtime)

    def _refresh_views(self, runtime: OperatorRuntime) -> None:
        names = {c.validation for c in self.checks.values() if c.validation is not None}
        for name in set(self.views) - names:
            del self.views[name]
        for name in names:
            known = name in self.views
            old, new = self.views.get(name), runtime.validation_view(name)
            self.views[name] = new
            if not known:
                continue  # first read: the Workloads were queued by their events
            if _summary(old) != _summary(new):
                for key, workload in self.workloads.items():
                    if not self.workload_cache.settled(workload) and (
                        name in self.workload_cache.validations(workload)
                    ):
                        self.queue.add(key)
            nodes = _changed_nodes(old, new)
            if nodes:
                for key in self.assignments.on_nodes(nodes):
                    self.queue.add(key)

    def _view_of(self, runtime: OperatorRuntime) -> Callable[[str], ValidationView | None]:
        """Each validation's view as it is now, read once per reconcile. Not the tick's: a
        Workload created right after a node's verdict changed (its label written) would be
        judged on a view up to one tick older, and a `Retry` is not taken back."""
        fresh: dict[str, ValidationView | None] = {}

        def view_of(name: str) -> ValidationView | None:
            if name not in fresh:
                fresh[name] = runtime.validation_view(name)
            return fresh[name]

        return view_of

    # -- one Workload -----------------------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        runtime = self._current_runtime()
        if runtime is None:
            return  # the term that comes requeues every Workload
        self.reconciles += 1
        cache = self.workload_cache
        if key not in cache.workloads and cache.wanted(key):
            version = next(iter(self.checks.values())).api_version
            await cache.fetch(runtime, key, version)
        workload = cache.workloads.get(key)
        if workload is None or not cache.relevant(workload):
            self.assignments.forget(key)
            return
        labels = runtime.node_labels
        await cache.sync(
            runtime,
            workload,
            lambda current: self.assignments.place(key, current, labels),
            self._view_of(runtime),
        )

    def _warn(self, message: str) -> None:
        """A warning, at most one per WARN_EVERY seconds (an API outage fails every call)."""
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            log.warning("%s", message)


def _summary(view: ValidationView | None) -> tuple[Any, ...] | None:
    """What of a view judges a Workload beside its nodes' verdicts."""
    if view is None:
        return None
    return (view.healthy, view.healthy_message, view.admission, view.policy, view.usable,
            view.usable_message, view.healthy_nodes, view.failures)  # fmt: skip


def _changed_nodes(old: ValidationView | None, new: ValidationView | None) -> set[str]:
    """The nodes whose verdict (excluded, admissible) differs between two views."""
    if old is None or new is None:
        return set()  # the summary differs: every Workload it judges was requeued
    if old.decisions is new.decisions and old.excluded == new.excluded:
        return set()
    out = set(old.excluded ^ new.excluded)
    before, after = old.decisions, new.decisions
    for node, decision in after.items():
        was = before.get(node)
        if was is None or was.admissible != decision.admissible:
            out.add(node)
    out.update(node for node in before if node not in after)
    return out


def _reason(exc: Exception) -> str:
    return str(exc.reason) if isinstance(exc, ApiException) else str(exc) or repr(exc)
