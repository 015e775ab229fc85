"""A minimal HTTP server for `/metrics` (Prometheus text) and `/healthz`, shared by agent and
operator: a few lines of asyncio instead of a web framework in every container."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest

_MAX_REQUEST: Final = 8192
PROMETHEUS_TEXT: Final = "text/plain; version=0.0.4; charset=utf-8"


async def serve_metrics(
    host: str,
    port: int,
    registry: CollectorRegistry,
    healthy: Callable[[], tuple[bool, str]],
) -> asyncio.Server:
    """`healthy()` answers /healthz: (ok, text)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, path, *_ = head[:_MAX_REQUEST].decode("latin-1").split(" ", 2)
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/healthz":
                ok, text = healthy()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain", f"{text}\n".encode()
            elif path == "/metrics":
                status, ctype, body = "200 OK", PROMETHEUS_TEXT, generate_latest(registry)
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + (body if method == "GET" else b"")
            )
            await writer.drain()
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
            ConnectionError,
        ):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=_MAX_REQUEST)


def parse_host_port(text: str, *, variable: str) -> tuple[str, int] | None:
    """A listen address: `HOST:PORT`, `:PORT` (all addresses), or `off` (None)."""
    if text.strip().lower() == "off":
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{variable}: expected HOST:PORT or 'off', got {text!r}")
    # Served on the node like any node exporter's (hostNetwork), so all addresses by default.
    return (host.strip("[]") or "0.0.0.0", int(port))  # noqa: S104
