"""`storage.throughput` reads in this node's wall-clock slots (`netval.model.storage_slots`).

- `on_message` takes this node's retained ``assignment`` from the operator: its storage
  ``position`` among the ``of`` targeted nodes. The payload is untrusted: validated with
  pydantic; a bad one is dropped, logged and counted (`dropped`) and the agent stops reading
  (no slot it can trust), never raises. Without an assignment the agent does not read.
- `run(stop)` waits for each slot boundary (plus the guard), reads the endpoints whose turn it
  is for this node, concurrently, and cuts every read off the guard before the slot ends, so
  the endpoint never has more than `maxConcurrentProbes` readers of this validation at once.
- `kept(endpoint)` / `waiting(...)` are what a probe cycle reports: the last figure measured
  in a slot (its age in the message), so the check keeps its verdict between slots, or a skip
  saying when the first slot comes.

The figure is what this node read with at most N-1 others: a per-node verdict. Figures under
load (the whole fleet reading together) are `NetworkLoadTest`'s (docs/checks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

import aiomqtt
from pydantic import ValidationError

from netval.agent.storage.judge import endpoint_result
from netval.agent.storage.target import target_of
from netval.agent.storage.throughput import measure_throughput, throughput_skip_reason
from netval.model.ids import CheckId, Status
from netval.model.peer_assignment import MAX_ASSIGNMENT_BYTES  # shared with the peer sets
from netval.model.results import CheckResult
from netval.model.spec import NetworkValidationSpec, StorageChecks, StorageEndpoint
from netval.model.storage_slots import (
    SLOT_GUARD_SECONDS,
    SLOT_SECONDS,
    StorageAssignment,
    StorageSlot,
    min_period_slots,
    next_read_slot,
    period_slots,
    reads_in,
)
from netval.model.topics import TopicKind, topic

__all__ = ["MAX_ASSIGNMENT_BYTES", "SlotReader"]

log = logging.getLogger("netval.agent.storage")

DEFAULT_PHASE_TIMEOUT: Final = 5.0


def _at(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SlotReader:
    """This node's storage slot (from the operator) and the reads made in it."""

    def __init__(
        self,
        validation: str,
        node: str,
        *,
        clock: Callable[[], float] = time.time,
        slot_seconds: float = SLOT_SECONDS,
        guard_seconds: float = SLOT_GUARD_SECONDS,
        phase_timeout: float = DEFAULT_PHASE_TIMEOUT,
    ) -> None:
        if not 0 <= 2 * guard_seconds < slot_seconds:
            raise ValueError("the guards must leave part of the slot to read in")
        self.topic = topic(validation, node, TopicKind.ASSIGNMENT)
        self.clock = clock
        self.slot_seconds = slot_seconds
        self.guard_seconds = guard_seconds
        self.phase_timeout = phase_timeout
        self.assignment: StorageSlot | None = None
        self.dropped = 0
        self.reads = 0
        self._measured: dict[str, tuple[CheckResult, float]] = {}
        # True while a load-test plan runs (netval.agent.loadtest): its slots are skipped
        self.paused: Callable[[], bool] = lambda: False

    # -- the operator's assignment ---------------------------------------------------------

    def on_message(self, message: aiomqtt.Message) -> None:
        if message.topic.value != self.topic:
            return
        payload = message.payload
        self.handle_assignment(
            payload if isinstance(payload, bytes) else str(payload or "").encode()
        )

    def handle_assignment(self, payload: bytes) -> None:
        """This node's retained assignment (empty: cleared); never raises for bad input."""
        slot: StorageSlot | None = None
        problem = ""
        if len(payload) > MAX_ASSIGNMENT_BYTES:
            problem = f"{len(payload)} bytes, more than {MAX_ASSIGNMENT_BYTES}"
        elif payload:
            try:
                slot = StorageAssignment.model_validate_json(payload).storage
            except ValidationError as exc:
                problem = str(exc).splitlines()[0][:200]
        if problem:
            self.dropped += 1
            log.warning("dropped a bad storage assignment (no reads until a good one): %s", problem)
        if slot != self.assignment:
            log.info("storage slot: %s -> %s", self.assignment, slot)
            self.assignment = slot

    # -- the schedule ----------------------------------------------------------------------

    def period(self, checks: StorageChecks, interval_seconds: float) -> int | None:
        """Slots per period for this node, None without an assignment."""
        if self.assignment is None:
            return None
        spacing = min_period_slots(
            checks.throughput_every_cycles, interval_seconds, self.slot_seconds
        )
        return period_slots(self.assignment.of, checks.max_concurrent_probes, spacing)

    def due(
        self, slot: int, checks: StorageChecks, interval_seconds: float
    ) -> list[StorageEndpoint]:
        """The endpoints this node reads in `slot`."""
        period = self.period(checks, interval_seconds)
        if period is None or self.assignment is None:
            return []
        position = self.assignment.position
        return [
            e
            for e in checks.endpoints
            if throughput_skip_reason(e) is None and reads_in(position, period, e.name, slot)
        ]

    # -- reading ---------------------------------------------------------------------------

    async def run(self, current: Callable[[], NetworkValidationSpec], stop: asyncio.Event) -> None:
        """Read in this node's slots until `stop`; `current` gives the spec in force."""
        while not stop.is_set():
            slot = math.floor(self.clock() / self.slot_seconds) + 1
            begin = slot * self.slot_seconds + self.guard_seconds
            # loop time and the wall clock may drift apart: re-read the clock after a sleep
            while (left := begin - self.clock()) > 0 and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), left)
            if stop.is_set():
                return
            spec = current()
            await self.read_slot(slot, spec.checks.storage, spec.interval_seconds)

    async def read_slot(
        self, slot: int, checks: StorageChecks, interval_seconds: float
    ) -> list[CheckResult]:
        """Read the endpoints due in `slot`, all ending before its guard."""
        due = self.due(slot, checks, interval_seconds)
        if not due or self.paused():
            return []
        loop = asyncio.get_running_loop()
        end = (slot + 1) * self.slot_seconds - self.guard_seconds
        left = end - self.clock()
        if left < (self.slot_seconds - 2 * self.guard_seconds) / 2:
            # woken late (a stalled loop, a clock step): a cut-short read would understate
            # the path, so the last figure stands until the next slot
            log.warning("storage slot %d missed: woke %.1f s before its end", slot, left)
            return []
        deadline = loop.time() + left
        results = await asyncio.gather(*(self._read(e, deadline) for e in due))
        measured_at = self.clock()
        for endpoint, result in zip(due, results, strict=True):
            self._measured[endpoint.name] = (result, measured_at)
        self.reads += len(due)
        return list(results)

    async def _read(self, endpoint: StorageEndpoint, deadline: float) -> CheckResult:
        try:
            target = target_of(endpoint)
            return await measure_throughput(
                endpoint, target, phase_timeout=self.phase_timeout, deadline=deadline
            )
        except Exception as exc:  # a probe bug or a bad endpoint is a result, not a dead task
            return endpoint_result(
                CheckId.STORAGE_THROUGHPUT,
                endpoint,
                Status.ERROR,
                f"throughput read failed: {type(exc).__name__}: {exc}",
            )

    # -- what a cycle reports --------------------------------------------------------------

    def kept(self, endpoint: StorageEndpoint) -> CheckResult | None:
        """The last figure measured in a slot, its age in the message."""
        if endpoint.name not in self._measured:
            return None
        result, at = self._measured[endpoint.name]
        age = max(0.0, self.clock() - at)
        return result.model_copy(
            update={"message": f"{result.message} (measured in this node's slot {age:.0f} s ago)"}
        )

    def waiting(
        self, endpoint: StorageEndpoint, checks: StorageChecks, interval_seconds: float
    ) -> CheckResult:
        """The skip of an endpoint not measured yet, saying what it waits for."""
        period = self.period(checks, interval_seconds)
        if period is None or self.assignment is None:
            why = "not measured yet: waiting for this node's storage slot from the operator"
        else:
            now_slot = math.floor(self.clock() / self.slot_seconds) + 1
            first = next_read_slot(self.assignment.position, period, endpoint.name, now_slot)
            why = (
                f"not measured yet: this node's storage slot for it starts at "
                f"{_at(first * self.slot_seconds)} (one slot of {self.slot_seconds:g} s every "
                f"{period} slots, at most {checks.max_concurrent_probes} readers at once)"
            )
        return endpoint_result(CheckId.STORAGE_THROUGHPUT, endpoint, Status.SKIP, why)
