"""Echo samples to a peer during a load window, over the responder's UDP echo
(`netval.agent.peers.session`, the same probe as `peer.latency`: kernel receive timestamps,
the responder's turnaround subtracted)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Final

from netval.agent.peers.session import open_session
from netval.agent.peers.target import PeerTarget
from netval.agent.peers.wire import KIND_PING
from netval.model.loadplan import MAX_LATENCY_SAMPLES, LatencyResult, LatencyTask

ECHO_SIZE: Final = 64
REPLY_GRACE_SECONDS: Final = 0.5  # replies still counted after the last echo


def subsample(values: list[float], keep: int = MAX_LATENCY_SAMPLES) -> list[float]:
    """At most `keep` values, evenly spread over the list (first and last kept)."""
    if len(values) <= keep:
        return values
    if keep <= 1:
        return values[:keep]
    step = (len(values) - 1) / (keep - 1)
    return [values[round(i * step)] for i in range(keep)]


async def echo_samples(
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
    except OSError:
        return empty
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
    rtts = [round(session.pongs[s] / 1e6, 4) for s in seqs if s in session.pongs]
    return LatencyResult(
        window=task.window,
        peer=task.peer,
        loaded=task.loaded,
        sent=len(seqs),
        received=len(rtts),
        samples_ms=subsample([min(r, 60_000.0) for r in rtts]),
    )
