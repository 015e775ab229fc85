"""`KueueController`: our AdmissionChecks and the Workloads, brought in line with the
operator's runtime on each watch event and every `interval`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from netval.infra.task_stop import cancel_and_wait
from netval.operator.kueue.admission_checks import AdmissionCheck, AdmissionChecks
from netval.operator.kueue.workloads import Workloads
from netval.operator.term_runtime import OperatorRuntime, ValidationView

log = logging.getLogger("netval.operator.kueue")

KUEUE_MEMO_KEY: Final = "kueue"
RUNTIME_MEMO_KEY: Final = "runtime"
WARN_EVERY: Final = 30.0


class KueueController:
    """Caches our AdmissionChecks and the Workloads (fed by Kopf's watch events) and, on each
    event and every `interval`, brings their status in line with the runtime's view."""

    def __init__(self, memo: Mapping[str, Any], *, interval: float = 1.0) -> None:
        self.memo = memo
        self.interval = interval
        self._wake = asyncio.Event()
        self.admission_checks = AdmissionChecks(self._wake.set)
        self.workload_cache = Workloads(self.admission_checks.checks, self._wake.set)
        self._warned = -WARN_EVERY
        self._task: asyncio.Task[None] | None = None

    @property
    def checks(self) -> dict[str, AdmissionCheck]:
        return self.admission_checks.checks

    @property
    def workloads(self) -> dict[tuple[str, str], dict[str, Any]]:
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
                await self.admission_checks.sync(runtime, check)
            except Exception as exc:
                self._warn(f"AdmissionCheck {check.name}: status write failed: {_reason(exc)}")
        views: dict[str, ValidationView | None] = {}  # one view per validation per round
        for key in list(self.workloads):
            workload = self.workloads.get(key)
            if workload is None or not self.workload_cache.relevant(workload):
                continue
            try:
                await self.workload_cache.sync(runtime, workload, views)
            except Exception as exc:
                self._warn(f"Workload {key[0]}/{key[1]}: status write failed: {_reason(exc)}")

    def _warn(self, message: str) -> None:
        """A warning, at most one per WARN_EVERY seconds (an API outage fails every round)."""
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            log.warning("%s (retrying every round)", message)


def _reason(exc: Exception) -> str:
    return str(exc.reason) if isinstance(exc, ApiException) else str(exc) or repr(exc)
