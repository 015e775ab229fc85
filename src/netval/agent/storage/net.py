"""DNS, TCP and TLS for the storage probes: resolve, connect, close, and name what failed.

A `Progress` records what the probe was doing, so a timeout or a reset says where it
happened; `network_failure` turns any network-level exception into the operator's words.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final, NamedTuple

from pydantic import JsonValue

from netval.agent.storage.target import Target

__all__ = [
    "Exchange",
    "ExchangeFn",
    "ProbeFailure",
    "Progress",
    "Stream",
    "close_writer",
    "connect",
    "network_failure",
    "show_bytes",
    "tcp_exchange",
]

_CLOSE_GRACE_SECONDS: Final = 1.0


class ProbeFailure(Exception):
    """A failure whose message is already written for the operator."""


class Progress:
    """What the probe was doing, so a timeout or reset says where it happened."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.address = ""


@dataclass(slots=True)
class Stream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    address: str
    connect_seconds: float
    started: float


@dataclass(frozen=True, slots=True)
class Exchange:
    summary: str
    observed: dict[str, JsonValue] = field(default_factory=dict)


ExchangeFn = Callable[[Stream, Target, Progress], Awaitable[Exchange]]


@cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class _Address(NamedTuple):
    family: int
    proto: int
    sockaddr: tuple[Any, ...]

    def __str__(self) -> str:
        host, port = self.sockaddr[0], self.sockaddr[1]
        return f"[{host}]:{port}" if self.family == socket.AF_INET6 else f"{host}:{port}"


async def _resolve(target: Target, progress: Progress) -> list[_Address]:
    progress.step = f"resolving {target.host!r} (DNS)"
    try:
        ipaddress.ip_address(target.host)
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ProbeFailure(f"DNS lookup of {target.host!r} failed: {exc.strerror}") from None
    else:
        # A literal needs no resolver thread; getaddrinfo still yields the IPv6 scope id.
        infos = socket.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )
    if not infos:
        raise ProbeFailure(f"DNS lookup of {target.host!r} returned no addresses")
    return [_Address(family, proto, tuple(addr)) for family, _t, proto, _n, addr in infos]


async def connect(target: Target, progress: Progress) -> Stream:
    """Connect to the first address that accepts; the last address's error is raised."""
    addresses = await _resolve(target, progress)
    loop = asyncio.get_running_loop()
    last_error: OSError | None = None
    for address in addresses:
        progress.address = str(address)
        progress.step = f"connecting to {address}"
        sock = socket.socket(address.family, socket.SOCK_STREAM, address.proto)
        sock.setblocking(False)
        started = time.perf_counter()
        try:
            await loop.sock_connect(sock, address.sockaddr)
        except OSError as exc:
            sock.close()
            last_error = exc
            continue
        except BaseException:
            sock.close()
            raise
        connect_seconds = time.perf_counter() - started
        tls = _tls_context() if target.tls else None
        if tls is not None:
            progress.step = f"in the TLS handshake with {address}"
        # From here the transport owns the socket and closes it on failure.
        reader, writer = await asyncio.open_connection(
            sock=sock, ssl=tls, server_hostname=target.host if tls is not None else None
        )
        return Stream(reader, writer, str(address), connect_seconds, started)
    assert last_error is not None
    raise last_error


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), _CLOSE_GRACE_SECONDS)
    except OSError:  # TimeoutError and ssl.SSLError included
        # A peer that never finishes the TLS close (or already reset) must not stall the cycle.
        writer.transport.abort()


def network_failure(exc: Exception, progress: Progress, timeout: float) -> str | None:
    """The operator-facing message for a network-level failure; None if `exc` is not one."""
    where = progress.address or "the endpoint"
    if isinstance(exc, ProbeFailure):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout:g} s {progress.step}"
    if isinstance(exc, asyncio.IncompleteReadError):
        got = f"{len(exc.partial)} bytes" if exc.partial else "nothing"
        return f"{where} closed the connection {progress.step} (received {got})"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed for {where}: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error with {where}: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {where} (nothing listening, or a firewall rejects it)"
    if isinstance(exc, ConnectionResetError):
        return f"connection reset by {where} {progress.step}"
    if isinstance(exc, OSError):
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0) or str(exc)
        return f"{reason} {progress.step}"
    return None


def show_bytes(data: bytes, limit: int = 32) -> str:
    shown = repr(data[:limit])
    return shown + ("..." if len(data) > limit else "")


async def tcp_exchange(stream: Stream, target: Target, progress: Progress) -> Exchange:
    return Exchange(f"TCP connect to {stream.address} succeeded")
