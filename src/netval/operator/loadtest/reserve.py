"""`spec.reserveNodes`: the participants of a run are tainted `netval.io/load-test=<run>:
NoSchedule` while it runs, so no new pod lands on a node under full-rate load; the taint is
always removed: at the run's end, at its abort, and by the next leadership term (a run lost
to a failover or restart cannot be resumed: the new term's first sweep removes every
load-test taint of a run it does not hold).

Writes go through a worker of their own (`run`), at most `CONCURRENCY` at a time, so the
coordinator's tick never waits on 10,000 Node patches: tainting is best effort while the
run starts (the per-stage re-check still leaves out a node that turned busy), removal is
retried until it is done. Cost: two Node writes per participant per run (read-modify-write
of the taint list, other taints untouched).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from netval.model.keys import TaintKey
from netval.operator.kube.api import KubeApi, error_text

log = logging.getLogger("netval.operator.loadtest")

CONCURRENCY: Final = 16
RETRY_SECONDS: Final = 5.0
KEY: Final = TaintKey.LOAD_TEST.value


class NodeReservations:
    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self._wanted: dict[str, str | None] = {}  # node -> run id to taint with, None: remove
        self._held: dict[str, str] = {}  # node -> run id its taint says (as written)
        self._active: set[str] = set()  # runs that hold reservations
        self._wake = asyncio.Event()
        self.swept = False
        self.failures = 0

    def reserve(self, run_id: str, nodes: set[str]) -> None:
        self._active.add(run_id)
        for node in nodes:
            self._wanted[node] = run_id
        self._wake.set()

    def release(self, run_id: str) -> None:
        """Remove the run's taints (its end or abort)."""
        self._active.discard(run_id)
        held = [node for node, run in self._held.items() if run == run_id]
        pending = [node for node, want in self._wanted.items() if want == run_id]
        for node in (*held, *pending):
            self._wanted[node] = None
        self._wake.set()

    def reserved(self, run_id: str) -> int:
        return sum(1 for run in self._held.values() if run == run_id)

    def pending(self) -> int:
        return len(self._wanted)

    async def sweep(self) -> None:
        """Every load-test taint of a run this term does not hold is removed."""
        found = await self.kube.nodes_with_taint(KEY)
        for node, run in found.items():
            self._held[node] = run
            if run not in self._active and self._wanted.get(node) is None:
                self._wanted[node] = None
        self.swept = True
        self._wake.set()

    async def run(self) -> None:
        limit = asyncio.Semaphore(CONCURRENCY)
        while True:
            if not self.swept:
                try:
                    await self.sweep()
                except Exception as exc:
                    log.warning("load-test taints: cannot list nodes: %s", error_text(exc))
            batch = dict(self._wanted)
            failed = False

            async def one(node: str, run: str | None) -> bool:
                async with limit:
                    try:
                        await self.kube.set_node_taint(node, KEY, run)
                    except Exception as exc:
                        self.failures += 1
                        log.warning("load-test taint on %s: %s", node, error_text(exc))
                        return False
                if self._wanted.get(node, run) == run:
                    self._wanted.pop(node, None)
                if run is None:
                    self._held.pop(node, None)
                else:
                    self._held[node] = run
                return True

            if batch:
                done = await asyncio.gather(*(one(n, r) for n, r in batch.items()))
                failed = not all(done)
            self._wake.clear()
            if self._wanted and not failed:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), RETRY_SECONDS)
