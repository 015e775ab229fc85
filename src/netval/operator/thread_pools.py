"""The operator's worker threads: one bounded, named pool per concern, never asyncio's default
executor (tests/test_thread_pools.py checks that no call site under `netval.operator` uses it).

The Kubernetes client, the TokenReviews of enrollment and the broker ACL probe block; each
runs in threads. Shared, a concern that hangs (an apiserver that stops answering holds each
call until its 15 s read timeout) fills the pool and the others queue behind it: 16 hung
TokenReviews of an enrollment storm held every thread of asyncio's default executor (cpu + 4
threads, 6 on a 2-core pod), where aiomqtt connects and asyncio resolves names, so the
ingest could not reconnect after the broker restart that caused the storm. Apart, a
concern's hang stays its own: its queue grows, the others' do not.

Three owners:
- a term's `KubeApi` owns a `ThreadPools(TERM_CONCERNS)`, closed with it at the term's end
  (a hung call in one of them must not outlive the term that made it);
- `PROCESS_POOLS` (concerns that outlive a term: a standby enrolls agents and answers
  admission reviews) is closed when the operator process stops (`OperatorProcess.run`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import Any, Final, TypeVar

T = TypeVar("T")


class Concern(StrEnum):
    """A kind of blocking work with a pool of its own (the value names its threads)."""

    STATUS = "kube-status"  # status patches of validations and load tests
    NODES = "kube-nodes"  # Node labels and taints (gating, topology labels)
    OTHER = "kube-other"  # the rest of KubeApi: applies, Events, lists
    GATES = "kube-gates"  # the gate releaser's Pod lists and patches
    KUEUE = "kube-kueue"  # Kueue Workloads and AdmissionChecks
    DEVICES = "kube-devices"  # the ResourceSlice lists and watches (device taints)
    ENROLL = "enroll-review"  # enrollment: TokenReviews, Pod and DaemonSet reads
    ADMISSION = "admission"  # the webhook's validation lookups, its configuration writes
    BROKER_PROBE = "broker-probe"  # the broker ACL check (a blocking paho session)
    LEASE = "lease"  # leader election's Lease reads and writes


# Threads per concern: the most calls a concern has in flight at once, so its own calls do
# not queue behind each other (only behind a hang of their own).
SIZES: Final[Mapping[Concern, int]] = {
    Concern.STATUS: 4,  # one patch per validation per window, one attempt each
    Concern.NODES: 16,  # the gating round's concurrency (gating.node_writer)
    Concern.OTHER: 4,  # applies and lists are serial per handler; Events are few
    Concern.GATES: 2,  # one pass at a time: a validation's release, the orphan marking
    Concern.KUEUE: 4,  # Workload syncs of one admission round
    Concern.DEVICES: 8,  # one watch per configured DRA driver (at most 8), each up to 60 s
    Concern.ENROLL: 16,  # enroll_server.MAX_ACTIVE requests, each one blocking call at a time
    Concern.ADMISSION: 4,  # lookups are coalesced per validation; one configuration writer
    Concern.BROKER_PROBE: 1,  # one check per term (and one for the identity service)
    Concern.LEASE: 4,  # a call abandoned at its caller's deadline keeps its thread until
    # its own timeout: room for a few while the elector goes on
}
TERM_CONCERNS: Final = frozenset(
    {Concern.STATUS, Concern.NODES, Concern.OTHER, Concern.GATES, Concern.KUEUE, Concern.DEVICES}
)
PROCESS_CONCERNS: Final = frozenset({Concern.ENROLL, Concern.ADMISSION, Concern.BROKER_PROBE})


class PoolsClosed(RuntimeError):
    """A call submitted to closed pools (its term ended)."""


class ThreadPools:
    """One `ThreadPoolExecutor` per concern of `concerns`, made on first use, of `SIZES`
    threads named after the concern. `close()` drops queued calls (one running ends within
    its own timeout); with `reopen`, a later call makes fresh pools (the process's pools: a
    test process runs several operators in turn), else it raises `PoolsClosed`."""

    def __init__(self, concerns: Iterable[Concern], *, reopen: bool = False) -> None:
        self.concerns = frozenset(concerns)
        self.reopen = reopen
        self._pools: dict[Concern, ThreadPoolExecutor] = {}
        self._closed = False
        self._lock = threading.Lock()  # submit() comes from worker threads too

    def executor(self, concern: Concern) -> ThreadPoolExecutor:
        if concern not in self.concerns:
            raise ValueError(f"{concern} is not one of these pools' concerns")
        with self._lock:
            if self._closed and not self.reopen:
                raise PoolsClosed(f"{concern}: the pools were closed")
            self._closed = False
            pool = self._pools.get(concern)
            if pool is None:
                pool = ThreadPoolExecutor(SIZES[concern], thread_name_prefix=f"netval-{concern}")
                self._pools[concern] = pool
            return pool

    async def run(self, concern: Concern, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in the pool of `concern`."""
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kwargs)
        return await loop.run_in_executor(self.executor(concern), call)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)


PROCESS_POOLS: Final = ThreadPools(PROCESS_CONCERNS, reopen=True)
