"""`peer.path_mtu`: prove the configured MTU crosses to the peer, or find what does.

A probe of the configured MTU (IP packet size) that the responder acknowledges proves the
path, even when the acknowledgement comes late. Otherwise the kernel may know better (an
ICMP fragmentation-needed arrived now or earlier, or the local route/interface is smaller):
that size is verified with a probe. If nothing tells, the probe's silence is size or loss:
the full size is sent again, `mtu_confirm_batches` times `mtu_tries` copies spread over the
batches, each next to as many small probes of the same kind (`SizeEvidence`). Size is the
cause (a silent black hole: a switch or a bridge drops the jumbo frame and sends no ICMP,
while small packets cross) only when no full-size probe was answered while the small ones
were, so that the loss they saw explains the silence with a chance below
`MAX_LOSS_EXPLAINS`; then the largest acknowledged size is searched with parallel rounds of
DF probes (8 sizes per round, well-known MTUs first). Otherwise the verdict is not given
(`inconclusive`: loss, not size, may explain it; `peer.loss` judges the loss).

Why (issue 33): one unanswered pair of full-size probes used to be the verdict. On a busy
node the peer's responder may answer a few tens of milliseconds late, beyond the wait
derived from the echoes' round trips (which leave the responder's own turnaround out), and
under loss both copies may be lost; the search then converged just below the configured MTU
and a healthy path failed with "the largest DF probe acknowledged was 8979 bytes".
"""

from __future__ import annotations

import asyncio
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
# Size is called the cause only when the loss the small probes saw would drop every
# full-size probe by chance less often than this.
MAX_LOSS_EXPLAINS: Final = 0.001


@dataclass(frozen=True, slots=True)
class SizeEvidence:
    """The confirmation: `sent` full-size probes and as many small ones, side by side."""

    sent: int
    full: int  # full-size probes answered
    small: int  # small probes answered

    @property
    def loss_explains(self) -> float:
        """The chance that the loss the small probes saw drops every full-size probe."""
        if self.sent == 0:
            return 1.0
        return float((1.0 - self.small / self.sent) ** self.sent)

    @property
    def size_is_the_cause(self) -> bool:
        return self.full == 0 and self.loss_explains < MAX_LOSS_EXPLAINS


@dataclass(frozen=True, slots=True)
class PathMtu:
    path_mtu: int | None  # largest IP packet size proven (or reported) to cross
    method: str  # echo | kernel | blackhole | inconclusive
    detail: str = ""
    evidence: SizeEvidence | None = None


def _send_sizes(session: UdpSession, sizes: Sequence[int], tries: int) -> dict[int, int]:
    """DF probes of these IP packet sizes, `tries` copies each: seq -> size of those sent."""
    by_seq: dict[int, int] = {}
    for size in sizes:
        for _ in range(tries):
            seq = session.next_seq()
            error = session.send(KIND_MTU, seq, size - session.overhead)
            if error is None:
                by_seq[seq] = size
            elif error.errno == errno.EMSGSIZE:
                break  # the kernel already knows it does not fit; no point repeating
    return by_seq


async def _probe_sizes(
    session: UdpSession,
    sizes: Sequence[int],
    settings: ProbeSettings,
    wait: float,
    sent: dict[int, int] | None = None,
) -> set[int]:
    """Send DF probes of these IP packet sizes; the sizes the responder acknowledged.
    `sent` (if given) collects seq -> size of every probe sent."""
    by_seq = _send_sizes(session, sizes, settings.mtu_tries)
    if sent is not None:
        sent.update(by_seq)

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


async def _confirm(
    session: UdpSession, mtu: int, smallest: int, settings: ProbeSettings, sent: dict[int, int]
) -> SizeEvidence:
    """Full-size probes again, each batch next to as many small ones; one wait at the end."""
    small: set[int] = set()
    for batch in range(settings.mtu_confirm_batches):
        if batch:
            await asyncio.sleep(settings.mtu_confirm_spacing)
        sent.update(_send_sizes(session, [mtu], settings.mtu_tries))
        small.update(_send_sizes(session, [smallest], settings.mtu_tries))
    full = {s for s, size in sent.items() if size == mtu}  # the first probe's copies too

    def answered() -> bool:
        # The responder answers in arrival order and each small probe follows full-size
        # ones: once every small one is answered, a full-size answer would be here too.
        return bool(full & session.acks.keys()) or small <= session.acks.keys()

    await session.wait(answered, settings.reply_timeout)
    return SizeEvidence(
        sent=settings.mtu_confirm_batches * settings.mtu_tries,
        full=len(full & session.acks.keys()),
        small=len(small & session.acks.keys()),
    )


async def find_path_mtu(
    session: UdpSession, mtu: int, settings: ProbeSettings, wait: float
) -> PathMtu:
    smallest = session.overhead + UDP_HEADER.size
    if mtu <= smallest:
        return PathMtu(mtu, "echo")
    sent: dict[int, int] = {}
    if mtu in await _probe_sizes(session, [mtu], settings, wait, sent):
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
    evidence = None
    if kernel is None:  # nothing told: size or loss?
        evidence = await _confirm(session, mtu, smallest, settings, sent)
        if evidence.full:
            return PathMtu(mtu, "echo")  # it crossed, if late
        if not evidence.size_is_the_cause:
            return PathMtu(None, "inconclusive", evidence=evidence)
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
    return PathMtu(lo, "blackhole", evidence=evidence)


def _kernel_source(session: UdpSession) -> str:
    if session.icmp.origin == "icmp":
        who = f" from {session.icmp.offender}" if session.icmp.offender else ""
        return f"ICMP fragmentation-needed{who}"
    return "the route to it (a path MTU learned earlier, or this node's interface MTU)"


def mtu_result(target: PeerTarget, mtu: int, found: PathMtu) -> CheckResult:
    expected: dict[str, JsonValue] = {"pathMTU": mtu}
    observed: dict[str, JsonValue] = {"pathMTU": found.path_mtu, "method": found.method}
    evidence = found.evidence
    if evidence is not None:
        observed |= {"probes": evidence.sent, "fullAnswered": evidence.full,
                     "smallAnswered": evidence.small}  # fmt: skip
    if found.method == "inconclusive" and evidence is not None:
        lost = evidence.sent - evidence.small
        return peer_result(
            CheckId.PEER_PATH_MTU,
            target,
            Status.SKIP,
            f"not judged: no {mtu}-byte DF probe to {target.node} was answered, and {lost} of "
            f"{evidence.sent} small probes sent with them were lost too: loss, not size, may "
            "explain it (peer.loss judges the loss)",
            observed,
            expected,
        )
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
        seen = (
            f"none of {evidence.sent} more was answered while {evidence.small} of "
            f"{evidence.sent} small probes sent with them were; "
            if evidence is not None
            else ""
        )
        why = (
            f"{mtu}-byte packets to {target.node} vanish without an ICMP "
            f"fragmentation-needed (an MTU black hole): {seen}the largest DF probe "
            f"acknowledged was {size} bytes, expected {mtu}"
        )
    return peer_result(CheckId.PEER_PATH_MTU, target, Status.FAIL, why, observed, expected)
