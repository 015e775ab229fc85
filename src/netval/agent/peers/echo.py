"""Probes from this node to one peer's responder (`netval.agent.peers.responder`):
`probe_peer` sends N UDP echoes (round-trip latency p50/p99, jitter, loss) and finds the path
MTU (`netval.agent.peers.pmtu`), as `peer.latency`, `peer.loss` and `peer.path_mtu` results.

Latency uses the kernel's receive timestamp (SO_TIMESTAMPNS) and subtracts the responder's
own turnaround (its receive-to-send time, carried in the reply), so event-loop delays on
either side do not count as network latency. The verdict uses p50 (a Python agent's p99 on a
busy node is dominated by scheduling); p99 and jitter are reported.

Every network failure becomes a result, never an exception out of these functions.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from netval.agent.peers.pmtu import find_path_mtu, mtu_result
from netval.agent.peers.session import UdpSession, open_session
from netval.agent.peers.target import PeerTarget, ProbeSettings, describe, peer_result
from netval.agent.peers.wire import KIND_PING
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import PeerChecks


@dataclass(frozen=True, slots=True)
class _Echoes:
    sent: int
    rtts_ms: list[float]  # in send order

    @property
    def received(self) -> int:
        return len(self.rtts_ms)

    @property
    def loss_percent(self) -> float:
        return 100.0 * (self.sent - self.received) / self.sent


async def _echoes(session: UdpSession, settings: ProbeSettings) -> _Echoes:
    seqs: list[int] = []
    for i in range(settings.count):
        seq = session.next_seq()
        seqs.append(seq)
        session.send(KIND_PING, seq, settings.echo_size)
        if i + 1 < settings.count:
            await asyncio.sleep(settings.spacing)
    await session.wait(lambda: all(s in session.pongs for s in seqs), settings.reply_timeout)
    rtts = [session.pongs[s] / 1e6 for s in seqs if s in session.pongs]
    return _Echoes(sent=len(seqs), rtts_ms=rtts)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def jitter(values: Sequence[float]) -> float:
    """Mean absolute difference of consecutive round trips (RFC 3550 style, unsmoothed)."""
    if len(values) < 2:
        return 0.0
    return statistics.fmean(abs(b - a) for a, b in itertools.pairwise(values))


def _ms(value: float) -> float:
    return round(value, 4)


def _failure_results(
    target: PeerTarget, checks: PeerChecks, mtu: int, status: Status, why: str, sent: int
) -> list[CheckResult]:
    return [
        peer_result(
            CheckId.PEER_LATENCY,
            target,
            status,
            why,
            {"sent": sent, "received": 0},
            {"maxLatencyMs": checks.max_latency_ms},
        ),
        peer_result(
            CheckId.PEER_LOSS,
            target,
            status,
            why,
            {"lossPercent": 100.0, "sent": sent, "received": 0},
            {"maxLossPercent": checks.max_loss_percent},
        ),
        peer_result(
            CheckId.PEER_PATH_MTU,
            target,
            Status.SKIP,
            "not measured: the peer does not answer echoes",
            expected={"pathMTU": mtu},
        ),
    ]


def _unanswered(session: UdpSession, settings: ProbeSettings) -> tuple[Status, str]:
    where = describe(session.target)
    if session.refused:
        return (
            Status.ERROR,
            f"no echo from {where}: port unreachable (ICMP), the peer's netval responder is "
            "not running",
        )
    if session.errors:
        reasons = ", ".join(f"{k} x{v}" for k, v in sorted(session.errors.items()))
        return Status.FAIL, f"cannot reach {where}: {reasons}"
    return (
        Status.FAIL,
        f"unreachable: none of {settings.count} echoes to {where} answered within "
        f"{settings.reply_timeout:g} s",
    )


def _latency_result(target: PeerTarget, checks: PeerChecks, echoes: _Echoes) -> CheckResult:
    rtts = echoes.rtts_ms
    p50, p99 = statistics.median(rtts), percentile(rtts, 99)
    observed: dict[str, JsonValue] = {
        "p50Ms": _ms(p50),
        "p99Ms": _ms(p99),
        "jitterMs": _ms(jitter(rtts)),
        "minMs": _ms(min(rtts)),
        "maxMs": _ms(max(rtts)),
        "samples": len(rtts),
    }
    limit = checks.max_latency_ms
    too_slow = p50 > limit
    summary = (
        f"round trip to {target.node}: p50 {p50:.3f} ms, p99 {p99:.3f} ms, jitter "
        f"{jitter(rtts):.3f} ms over {len(rtts)} echoes"
    )
    return peer_result(
        CheckId.PEER_LATENCY,
        target,
        Status.FAIL if too_slow else Status.PASS,
        f"{summary}; p50 {'exceeds' if too_slow else 'within'} the maximum of {limit:g} ms",
        observed,
        {"maxLatencyMs": limit},
    )


def _loss_result(target: PeerTarget, checks: PeerChecks, echoes: _Echoes) -> CheckResult:
    loss = echoes.loss_percent
    limit = checks.max_loss_percent
    bad = loss > limit
    return peer_result(
        CheckId.PEER_LOSS,
        target,
        Status.FAIL if bad else Status.PASS,
        f"{echoes.sent - echoes.received} of {echoes.sent} echoes to {target.node} lost "
        f"({loss:.2f}%); {'above' if bad else 'within'} the maximum of {limit:g}%",
        {"lossPercent": round(loss, 3), "sent": echoes.sent, "received": echoes.received},
        {"maxLossPercent": limit},
    )


async def probe_peer(
    target: PeerTarget,
    *,
    checks: PeerChecks,
    mtu: int,
    source: str | None = None,
    settings: ProbeSettings | None = None,
) -> list[CheckResult]:
    """`peer.latency`, `peer.loss`, `peer.path_mtu` for one peer, in that order.

    `mtu` is the configured fabric MTU (IP packet size); `source` the local fabric address
    to send from. Never raises for network problems.
    """
    settings = settings or ProbeSettings()
    try:
        session = open_session(target, source)
    except OSError as exc:
        why = f"cannot open a socket to {describe(target)}: {exc.strerror or exc}"
        return _failure_results(target, checks, mtu, Status.FAIL, why, 0)
    try:
        echoes = await _echoes(session, settings)
        if echoes.received == 0:
            status, why = _unanswered(session, settings)
            return _failure_results(target, checks, mtu, status, why, echoes.sent)
        wait = min(
            settings.mtu_wait_max,
            max(settings.mtu_wait_min, 10 * percentile(echoes.rtts_ms, 99) / 1e3),
        )
        found = await find_path_mtu(session, mtu, settings, wait)
        return [
            _latency_result(target, checks, echoes),
            _loss_result(target, checks, echoes),
            mtu_result(target, mtu, found),
        ]
    finally:
        session.close()
