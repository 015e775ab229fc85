"""`peer.path_mtu`: prove the configured MTU crosses to the peer, or find what does.

A probe of the configured MTU (IP packet size) that the responder acknowledges proves the
path. Otherwise the kernel may know better (an ICMP fragmentation-needed arrived now or
earlier, or the local route/interface is smaller): that size is verified with a probe. If
nothing tells (a silent black hole: a switch or a bridge drops the jumbo frame and sends no
ICMP, while small echoes work), the largest acknowledged size is searched with parallel rounds
of DF probes (8 sizes per round, well-known MTUs first).
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from netval.agent.peers.session import UdpSession
from netval.agent.peers.target import PeerTarget, ProbeSettings, peer_result
from netval.agent.peers.wire import KIND_MTU, UDP_HEADER
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult

WELL_KNOWN_MTUS: Final = (1280, 1500, 2048, 4096, 4200, 8192, 9000)


@dataclass(frozen=True, slots=True)
class PathMtu:
    path_mtu: int | None  # largest IP packet size proven (or reported) to cross
    method: str  # echo | kernel | blackhole
    detail: str = ""


async def _probe_sizes(
    session: UdpSession, sizes: Sequence[int], settings: ProbeSettings, wait: float
) -> set[int]:
    """Send DF probes of these IP packet sizes; the sizes the responder acknowledged."""
    by_seq: dict[int, int] = {}
    for size in sizes:
        for _ in range(settings.mtu_tries):
            seq = session.next_seq()
            error = session.send(KIND_MTU, seq, size - session.overhead)
            if error is None:
                by_seq[seq] = size
            elif error.errno == errno.EMSGSIZE:
                break  # the kernel already knows it does not fit; no point repeating

    def all_sizes_answered() -> bool:
        got = {by_seq[s] for s in session.acks if s in by_seq}
        return got >= set(by_seq.values())

    if by_seq:
        await session.wait(all_sizes_answered, wait)
    return {by_seq[s] for s in session.acks if s in by_seq}


def _candidates(lo: int, hi: int, first: bool, k: int = 8) -> list[int]:
    """Up to k sizes strictly between lo and hi: well-known MTUs (first round) + even steps."""
    picks: list[int] = [m for m in WELL_KNOWN_MTUS if lo < m < hi] if first else []
    room = k - len(picks)
    span = hi - lo
    if room > 0 and span > 1:
        step = span / (room + 1)
        picks += [lo + round(step * (i + 1)) for i in range(room)]
    return sorted({p for p in picks if lo < p < hi})[: max(k, len(picks))]


async def find_path_mtu(
    session: UdpSession, mtu: int, settings: ProbeSettings, wait: float
) -> PathMtu:
    smallest = session.overhead + UDP_HEADER.size
    if mtu <= smallest:
        return PathMtu(mtu, "echo")
    if mtu in await _probe_sizes(session, [mtu], settings, wait):
        return PathMtu(mtu, "echo")
    lo, hi = smallest, mtu
    kernel = session.icmp.mtu
    route = session.kernel_path_mtu()
    if route is not None and route < mtu:
        kernel = min(kernel, route) if kernel is not None else route
    if kernel is not None and smallest < kernel < mtu:
        if kernel in await _probe_sizes(session, [kernel], settings, wait):
            return PathMtu(kernel, "kernel", _kernel_source(session))
        hi = kernel
    first = True
    for _ in range(settings.mtu_rounds):
        if hi - lo <= 1:
            break
        sizes = _candidates(lo, hi, first)
        first = False
        acked = await _probe_sizes(session, sizes, settings, wait)
        lo = max([lo, *acked])
        hi = min([hi, *(s for s in sizes if s > lo and s not in acked)])
    if session.icmp.mtu is not None and session.icmp.origin == "icmp":
        return PathMtu(lo, "kernel", _kernel_source(session))
    return PathMtu(lo, "blackhole")


def _kernel_source(session: UdpSession) -> str:
    if session.icmp.origin == "icmp":
        who = f" from {session.icmp.offender}" if session.icmp.offender else ""
        return f"ICMP fragmentation-needed{who}"
    return "the route to it (a path MTU learned earlier, or this node's interface MTU)"


def mtu_result(target: PeerTarget, mtu: int, found: PathMtu) -> CheckResult:
    expected: dict[str, JsonValue] = {"pathMTU": mtu}
    observed: dict[str, JsonValue] = {"pathMTU": found.path_mtu, "method": found.method}
    if found.path_mtu is not None and found.path_mtu >= mtu:
        return peer_result(
            CheckId.PEER_PATH_MTU,
            target,
            Status.PASS,
            f"a {mtu}-byte DF packet reached {target.node} and was acknowledged",
            observed,
            expected,
        )
    size = found.path_mtu
    if found.method == "kernel":
        why = (
            f"path MTU to {target.node} is {size}, expected {mtu} "
            f"(reported by {found.detail}; a {size}-byte DF probe was acknowledged)"
        )
    else:
        why = (
            f"{mtu}-byte packets to {target.node} vanish without an ICMP "
            f"fragmentation-needed (an MTU black hole): the largest DF probe acknowledged "
            f"was {size} bytes, expected {mtu}"
        )
    return peer_result(CheckId.PEER_PATH_MTU, target, Status.FAIL, why, observed, expected)
