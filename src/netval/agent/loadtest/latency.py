"""Round trips to a peer during a load window, every one of them in the result.

- `echo_histogram`: the responder's UDP echo (`netval.agent.peers.session`, the probe of
  `peer.latency`: kernel receive timestamps, the responder's turnaround subtracted), every
  `interval_ms`, on the first rail (the responder's address).
- `perftest_histogram`: `ib_write_lat` against the peer's server on the task's rail, paced
  so its round trips spread over the window (`netval.agent.loadtest.perftest`).

Either way the result holds a histogram of every round trip (1%-wide buckets,
`netval.model.loadplan.latency_bucket`), not a sample: the operator's p99 is of every echo.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Final

from netval.agent.loadtest import perftest
from netval.agent.loadtest.engine_process import run_engine
from netval.agent.loadtest.engines import IB_WRITE_LAT, EngineUnavailable, find_binary
from netval.agent.loadtest.flows import Context, Ran, rdma_rail
from netval.agent.peers.session import open_session
from netval.agent.peers.target import PeerTarget
from netval.agent.peers.wire import KIND_PING
from netval.model.loadplan import (
    SERVE_TAIL_SECONDS,
    LatencyEngine,
    LatencyResult,
    LatencyTask,
    latency_bucket,
)

ECHO_SIZE: Final = 64
REPLY_GRACE_SECONDS: Final = 0.5  # replies still counted after the last echo


def _pairs(buckets: Counter[int]) -> list[tuple[int, int]]:
    return sorted(buckets.items())


async def echo_histogram(
    task: LatencyTask, target: PeerTarget, source: str | None, start: float, halt: asyncio.Event
) -> LatencyResult:
    """Echo `target` every `task.interval_ms` from `start` (epoch) for `task.seconds`, or
    until `halt`; never raises for network problems (they are lost echoes)."""
    empty = LatencyResult(window=task.window, peer=task.peer, loaded=task.loaded, sent=0,
                          received=0)  # fmt: skip
    try:
        await asyncio.wait_for(halt.wait(), max(0.0, start - time.time()))
        return empty
    except TimeoutError:
        pass
    try:
        session = open_session(target, source)
    except OSError as exc:
        return empty.model_copy(update={"error": f"cannot echo: {exc.strerror or exc}"[:256]})
    seqs: list[int] = []
    try:
        end = start + task.seconds
        spacing = task.interval_ms / 1000
        next_at = time.time()
        while not halt.is_set() and (now := time.time()) < end:
            if now >= next_at:
                seq = session.next_seq()
                seqs.append(seq)
                session.send(KIND_PING, seq, ECHO_SIZE)
                next_at += spacing
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(halt.wait(), max(0.0, min(next_at, end) - time.time()))
        if not halt.is_set():
            await session.wait(lambda: all(s in session.pongs for s in seqs), REPLY_GRACE_SECONDS)
    finally:
        session.close()
    buckets = Counter(latency_bucket(session.pongs[s] / 1e6) for s in seqs if s in session.pongs)
    return LatencyResult(
        window=task.window,
        peer=task.peer,
        loaded=task.loaded,
        sent=len(seqs),
        received=sum(buckets.values()),
        histogram=_pairs(buckets),
    )


async def perftest_histogram(task: LatencyTask, ctx: Context, halt: asyncio.Event) -> Ran:
    """`ib_write_lat` to the peer's server on the task's rail (port `task.port`)."""

    def failed(error: str) -> LatencyResult:
        return LatencyResult(window=task.window, peer=task.peer, loaded=task.loaded,
                             engine=LatencyEngine.PERFTEST, sent=0, received=0,
                             error=error[:256])  # fmt: skip

    rail = ctx.rail
    if rail is None or rail.address is None or ctx.peer_address is None or task.port is None:
        return Ran(failed(f"no address or port for rail {task.rail} of this pair"))
    try:
        binary = find_binary(IB_WRITE_LAT, ctx.which)
        target = rdma_rail(rail, ctx.checks)
    except EngineUnavailable as exc:
        return Ran(failed(f"EngineUnavailable: {exc.what}"), unavailable=exc.what)
    version = await ctx.versions.of(binary)
    iterations, gap = perftest.lat_iterations(task.seconds)
    argv = perftest.lat_argv(binary, target, tcp_port=task.port, seconds=task.seconds,
                             server=ctx.peer_address, source=rail.address)  # fmt: skip
    start = task.start.timestamp()
    run = await run_engine(
        argv, start_at=start, deadline=start + task.seconds + SERVE_TAIL_SECONDS, halt=halt
    )
    engine = ("perftest", version)
    if run.error is not None:
        return Ran(failed(run.error), engine)
    try:
        buckets = perftest.parse_lat_histogram(run.stdout + run.stderr, gap)
    except EngineUnavailable as exc:
        return Ran(failed(f"EngineUnavailable: {exc.what}"), engine, exc.what)
    except perftest.PerftestError as exc:
        return Ran(failed("stopped early" if run.killed == "stopped" else str(exc)), engine)
    received = sum(buckets.values())
    result = LatencyResult(
        window=task.window, peer=task.peer, loaded=task.loaded, engine=LatencyEngine.PERFTEST,
        sent=max(iterations, received), received=received, histogram=_pairs(buckets),
    )  # fmt: skip
    return Ran(result, engine)
