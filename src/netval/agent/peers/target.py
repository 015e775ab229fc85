"""What an east-west probe aims at and how: the peer, the probe settings, the result shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from netval.agent.checks.context import result
from netval.agent.peers.wire import UDP_HEADER
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult

MIN_THROUGHPUT_BYTES: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class PeerTarget:
    node: str
    address: str
    port: int
    domain: str | None = None


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    count: int = 50  # echoes per peer per cycle
    spacing: float = 0.005  # seconds between echoes
    echo_size: int = 64  # UDP payload bytes of an echo
    reply_timeout: float = 0.5  # seconds to wait for replies after the last echo
    mtu_tries: int = 2  # copies of each DF probe size
    # a full-size probe unanswered: size or loss? (netval.agent.peers.pmtu.SizeEvidence)
    mtu_confirm_batches: int = 4  # batches of mtu_tries full-size and small probes
    mtu_confirm_spacing: float = 0.05  # seconds between batches
    mtu_rounds: int = 8  # search rounds (8 sizes each) for a silent black hole
    mtu_wait_min: float = 0.05
    mtu_wait_max: float = 0.3
    throughput_seconds: float = 1.0  # sending time of one throughput sample
    throughput_max_bytes: int = 1 << 30
    throughput_timeout: float = 3.0  # connect / per-operation / final answer bound

    @property
    def echo_seconds(self) -> float:
        """How long the echoes to a peer (and a path MTU that crosses) take."""
        return self.count * self.spacing + self.reply_timeout + self.mtu_wait_max

    def __post_init__(self) -> None:
        if self.count < 1 or self.spacing < 0 or self.reply_timeout <= 0:
            raise ValueError("count >= 1, spacing >= 0 and reply_timeout > 0 are required")
        if self.mtu_tries < 1 or self.mtu_confirm_batches < 1 or self.mtu_confirm_spacing < 0:
            raise ValueError("mtu_tries >= 1, mtu_confirm_batches >= 1 and spacing >= 0")
        if self.echo_size < UDP_HEADER.size or self.echo_size > 1024:
            raise ValueError(f"echo_size must be in {UDP_HEADER.size}..1024")
        if self.throughput_seconds <= 0 or self.throughput_max_bytes < MIN_THROUGHPUT_BYTES:
            raise ValueError("throughput_seconds > 0 and throughput_max_bytes >= 64 KiB required")


def peer_result(
    check: CheckId,
    target: PeerTarget,
    status: Status,
    message: str,
    observed: dict[str, JsonValue] | None = None,
    expected: dict[str, JsonValue] | None = None,
) -> CheckResult:
    base: dict[str, JsonValue] = {"domain": target.domain, "address": target.address}
    return result(
        check, target.node, status, message[:1024], {**base, **(observed or {})}, expected
    )


def describe(target: PeerTarget) -> str:
    return f"{target.node} ({target.address}:{target.port})"
