"""`storage.reachable` measured: connect, then the endpoint protocol's exchange, timed.

The latency is the time from the start of the TCP connect to the end of that exchange (TLS
handshake included), so it measures the service, not just the SYN/ACK; DNS time is not
included. For NFS servers without version 3 it includes the retried call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pydantic import JsonValue

from netval.agent.storage.ceph import ceph_exchange
from netval.agent.storage.http import http_exchange
from netval.agent.storage.net import (
    ExchangeFn,
    Progress,
    Stream,
    close_writer,
    connect,
    network_failure,
    tcp_exchange,
)
from netval.agent.storage.nfs import nfs_exchange
from netval.agent.storage.target import Target
from netval.model.spec import StorageProtocol

__all__ = [
    "Reach",
    "reach_target",
]


@dataclass(frozen=True, slots=True)
class Reach:
    ok: bool
    message: str
    latency_ms: float | None = None
    connect_ms: float | None = None
    observed: dict[str, JsonValue] = field(default_factory=dict)


_EXCHANGES: Final[Mapping[StorageProtocol, ExchangeFn]] = {
    StorageProtocol.TCP: tcp_exchange,
    StorageProtocol.CEPH: ceph_exchange,
    StorageProtocol.NFS: nfs_exchange,
    StorageProtocol.S3: http_exchange,
    StorageProtocol.HTTP: http_exchange,
}


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


async def reach_target(target: Target, phase_timeout: float) -> Reach:
    progress = Progress("before connecting")
    stream: Stream | None = None
    try:
        async with asyncio.timeout(phase_timeout):
            stream = await connect(target, progress)
            exchange = await _EXCHANGES[target.protocol](stream, target, progress)
            total_seconds = time.perf_counter() - stream.started
    except Exception as exc:
        message = network_failure(exc, progress, phase_timeout)
        if message is None:
            raise
        return Reach(ok=False, message=message, observed=_where(progress))
    finally:
        if stream is not None:
            await close_writer(stream.writer)
    return Reach(
        ok=True,
        message=exchange.summary,
        latency_ms=_ms(total_seconds),
        connect_ms=_ms(stream.connect_seconds),
        observed={"address": stream.address, **exchange.observed},
    )


def _where(progress: Progress) -> dict[str, JsonValue]:
    return {"address": progress.address} if progress.address else {}
