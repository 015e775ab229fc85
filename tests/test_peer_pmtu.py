"""`peer.path_mtu` calls size the cause only on evidence that size, not loss, is (issue 33).

A scripted responder on loopback (the real wire format, `netval.agent.peers.wire`) plays the
peer: one that answers late (a busy node's responder: its event loop stalled for 100 ms, so
later datagrams wait behind), one on a lossy path, one behind a silent MTU black hole, and
one behind both. The prober is the real `probe_peer`.

The late responder is what failed `peer.path_mtu` on a healthy fabric in the campaign's soak
(docs/detection.md): the wait for the full-size probe's answer was derived from the echoes'
round trips, which leave the responder's turnaround out (50 ms at least), so one late pair
of answers started a search that converged just below the MTU ("the largest DF probe
acknowledged was 8979 bytes").
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from netval.agent.peers.echo import probe_peer
from netval.agent.peers.pmtu import MAX_LOSS_EXPLAINS, SizeEvidence
from netval.agent.peers.session import IPV4_UDP_OVERHEAD
from netval.agent.peers.target import PeerTarget, ProbeSettings
from netval.agent.peers.wire import (
    KIND_MTU,
    KIND_MTU_ACK,
    KIND_PING,
    KIND_PONG,
    UDP_HEADER,
    UDP_MAGIC,
)
from netval.model.ids import CheckId, Status
from netval.model.spec import PeerChecks

pytestmark = pytest.mark.timeout(60)

CHECKS = PeerChecks(enabled=True, max_latency_ms=50.0, max_loss_percent=5.0)
SETTINGS = ProbeSettings(count=50, spacing=0.002)
REPLY: dict[int, int] = {KIND_PING: KIND_PONG, KIND_MTU: KIND_MTU_ACK}
# (kind, IP packet size) -> answer it?  The responder's own stalls are up to the script.
Script = Callable[[int, int], bool]


class ScriptedResponder:
    """A UDP peer that answers echoes and MTU probes as `script` says; it refuses (raises in
    its thread, failing the test) any datagram that is not a netval probe."""

    def __init__(self, script: Script, stall: Callable[[int, int], float] | None = None) -> None:
        self.script = script
        self.stall = stall or (lambda _kind, _size: 0.0)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.errors: list[str] = []
        self.seen: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, source = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            received = time.time_ns()
            magic, kind, _f, _r, seq, token, _size, _t = UDP_HEADER.unpack_from(data)
            if magic != UDP_MAGIC or kind not in REPLY:
                self.errors.append(f"not a netval probe: magic {magic!r} kind {kind}")
                continue
            size = len(data) + IPV4_UDP_OVERHEAD
            self.seen.append((kind, size))
            time.sleep(self.stall(kind, size))
            if self.script(kind, size):
                turnaround = time.time_ns() - received
                reply = UDP_HEADER.pack(UDP_MAGIC, REPLY[kind], 0, 0, seq, token, len(data),
                                        turnaround)  # fmt: skip
                self.sock.sendto(reply, source)

    @contextmanager
    def running(self) -> Iterator[ScriptedResponder]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(5)
            self.sock.close()
            assert not self.errors, self.errors


def probe(responder: ScriptedResponder, mtu: int = 9000) -> dict[CheckId, Any]:
    target = PeerTarget("peer", "127.0.0.1", responder.port, "rack-b")
    with responder.running():
        results = asyncio.run(
            probe_peer(target, checks=CHECKS, mtu=mtu, source="127.0.0.1", settings=SETTINGS)
        )
    return {r.check: r for r in results}


def test_a_late_answer_from_a_busy_responder_is_not_a_black_hole() -> None:
    stalled: list[bool] = []

    def stall(kind: int, size: int) -> float:
        # the first full-size probe finds the responder's loop busy for 100 ms: it and every
        # datagram behind it are answered late, in order
        if kind == KIND_MTU and size >= 9000 and not stalled:
            stalled.append(True)
            return 0.1
        return 0.0

    got = probe(ScriptedResponder(lambda _k, _s: True, stall))
    mtu = got[CheckId.PEER_PATH_MTU]
    assert stalled
    assert (mtu.status, mtu.observed["pathMTU"], mtu.observed["method"]) == (
        Status.PASS, 9000, "echo",
    ), mtu.message  # fmt: skip


def test_loss_at_every_size_gives_no_path_mtu_verdict_and_fails_peer_loss() -> None:
    rng = random.Random(33)
    got = probe(ScriptedResponder(lambda _k, _s: rng.random() >= 0.4))  # 40 % of answers lost
    assert got[CheckId.PEER_LOSS].status is Status.FAIL
    mtu = got[CheckId.PEER_PATH_MTU]
    assert mtu.status in (Status.PASS, Status.SKIP), mtu.message
    if mtu.status is Status.SKIP:
        assert mtu.observed["method"] == "inconclusive"
        assert mtu.message.startswith("not judged: no 9000-byte DF probe to peer was answered")
        assert "loss, not size" in mtu.message


@pytest.mark.parametrize("loss", [0.0, 0.2])
def test_a_silent_black_hole_is_found_with_or_without_loss_on_the_path(loss: float) -> None:
    rng = random.Random(7)

    def script(kind: int, size: int) -> bool:
        return size <= 1500 and rng.random() >= loss  # jumbo frames vanish, no ICMP

    got = probe(ScriptedResponder(script))
    mtu = got[CheckId.PEER_PATH_MTU]
    assert mtu.status is Status.FAIL, mtu.message
    assert mtu.observed["method"] == "blackhole"
    assert mtu.observed["fullAnswered"] == 0 and mtu.observed["probes"] == 8
    assert mtu.observed["pathMTU"] <= 1500
    if loss == 0.0:
        assert mtu.observed["pathMTU"] == 1500 and mtu.observed["smallAnswered"] == 8
    assert "none of 8 more was answered while" in mtu.message


def test_size_is_the_cause_only_when_the_loss_seen_cannot_explain_the_silence() -> None:
    assert SizeEvidence(sent=8, full=0, small=8).size_is_the_cause
    assert SizeEvidence(sent=8, full=0, small=5).size_is_the_cause  # 3 lost: (3/8)^8 ~ 4e-4
    assert not SizeEvidence(sent=8, full=0, small=4).size_is_the_cause  # (1/2)^8 ~ 4e-3
    assert not SizeEvidence(sent=8, full=1, small=8).size_is_the_cause  # one crossed
    assert not SizeEvidence(sent=8, full=0, small=0).size_is_the_cause
    assert SizeEvidence(sent=8, full=0, small=4).loss_explains > MAX_LOSS_EXPLAINS
