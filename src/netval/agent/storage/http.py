"""The HTTP/1.1 client of the `s3` and `http` probes: request, status line, headers, verdict.

HEAD of `path` (or `/`). s3: any status below 500 passes, since an unauthenticated S3 request
answers 403. http: with a path, 2xx/3xx passes; without one, any status below 500 (the server
is up). Plain HTTP, except on port 443: TLS (see `target`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from netval.agent.storage.net import Exchange, ProbeFailure, Progress, Stream, show_bytes
from netval.agent.storage.target import Target
from netval.model.spec import StorageProtocol

__all__ = [
    "HttpHead",
    "build_http_request",
    "http_exchange",
    "http_reachable",
    "parse_http_status_line",
    "read_http_head",
]

_HTTP_MAX_HEADER_LINES: Final = 128
_USER_AGENT: Final = "netval-storage-probe"
_HTTP_STATUS_LINE: Final = re.compile(r"^HTTP/\d(?:\.\d)?[ \t]+(\d{3})(?:[ \t]+(.*))?$")


def parse_http_status_line(line: bytes) -> tuple[int, str]:
    """(status, reason) of an HTTP/1.x status line; ValueError if it is not one."""
    text = line.decode("latin-1").rstrip("\r\n")
    match = _HTTP_STATUS_LINE.fullmatch(text)
    if match is None:
        raise ValueError(f"not an HTTP response: {show_bytes(line)}")
    return int(match.group(1)), (match.group(2) or "").strip()


def _parse_http_headers(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw in lines:
        name, sep, value = raw.decode("latin-1").partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


def http_reachable(protocol: StorageProtocol, status: int, *, has_path: bool) -> bool:
    """Whether an HTTP status shows the storage service answering (see the module doc)."""
    if protocol == StorageProtocol.HTTP and has_path:
        return 200 <= status < 400
    return status < 500


def build_http_request(
    method: str, host_header: str, target: str, extra: Mapping[str, str] | None = None
) -> bytes:
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: {host_header}",
        f"User-Agent: {_USER_AGENT}",
        "Accept: */*",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (extra or {}).items()),
        "",
        "",
    ]
    return "\r\n".join(lines).encode("ascii")


@dataclass(frozen=True, slots=True)
class HttpHead:
    status: int
    reason: str
    headers: dict[str, str]

    def said(self, method: str, target: str) -> str:
        return f"{method} {target} answered {self.status} {self.reason}".rstrip()


async def read_http_head(reader: asyncio.StreamReader, address: str) -> HttpHead:
    try:
        status_line = await reader.readline()
        if not status_line:
            raise ProbeFailure(f"{address} closed the connection without an HTTP response")
        status, reason = parse_http_status_line(status_line)
        lines: list[bytes] = []
        for _ in range(_HTTP_MAX_HEADER_LINES):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return HttpHead(status, reason, _parse_http_headers(lines))
            lines.append(line)
    except ValueError as exc:  # not HTTP, or a line beyond the reader's limit
        raise ProbeFailure(f"unexpected response from {address}: {exc}") from None
    raise ProbeFailure(f"more than {_HTTP_MAX_HEADER_LINES} HTTP header lines from {address}")


async def http_exchange(stream: Stream, target: Target, progress: Progress) -> Exchange:
    progress.step = f"waiting for the HTTP response to HEAD {target.shown}"
    stream.writer.write(build_http_request("HEAD", target.host_header, target.request_target))
    await stream.writer.drain()
    head = await read_http_head(stream.reader, stream.address)
    said = head.said("HEAD", target.shown)
    if not http_reachable(target.protocol, head.status, has_path=target.has_path):
        why = "server error" if head.status >= 500 else "a configured path must answer 2xx/3xx"
        raise ProbeFailure(f"{said} from {stream.address} ({why})")
    return Exchange(f"{said} from {stream.address}", {"httpStatus": head.status})
