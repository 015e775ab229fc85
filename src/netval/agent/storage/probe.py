"""Storage reachability probes: `storage.reachable`, `storage.latency`, `storage.throughput`.

One short, protocol-aware exchange per endpoint proves that the storage service itself answers,
not only that some kernel accepted a TCP connection (a hung daemon behind a live socket is the
failure that matters):

- `tcp`: TCP connect; the endpoint must name a port.
- `ceph`: read the messenger banner a Ceph daemon sends on accept: msgr2 `ceph v2\\n` + le16
  payload length + le64 supported + le64 required features (`CEPH_BANNER_V2_PREFIX`, ceph
  src/include/msgr.h and ProtocolV2::_banner_exchange), or the legacy msgr1 `ceph v027`
  (`CEPH_BANNER`). Default port 3300 (IANA msgr2); the legacy monitor port is 6789.
- `nfs`: ONC RPC (RFC 5531) NULL call, program 100003 version 3 (retried as version 4 when the
  server answers PROG_MISMATCH and offers 4), over TCP with record marking (RFC 5531 section 11);
  default port 2049. Only an accepted reply with SUCCESS and the call's xid passes.
- `s3` / `http`: HTTP/1.1 HEAD of `path` (or `/`). s3: any status below 500 passes, since an
  unauthenticated S3 request answers 403. http: with a path, 2xx/3xx passes; without one, any
  status below 500 (the server is up). Plain HTTP, except on port 443: TLS with the system trust
  store and host name verification. Default port 80.

`storage.latency` is the time from the start of the TCP connect to the end of that exchange
(TLS handshake included), so it measures the service, not just the SYN/ACK; DNS time is not
included. For NFS servers without version 3 it includes the retried call.

`storage.throughput` (s3/http endpoints with `path` and `minThroughputMBps`, on the cycles the
caller asks for) reads up to `THROUGHPUT_MAX_BYTES` of the object with a ranged GET, for at most
`THROUGHPUT_MAX_SECONDS`, and reports MB/s = 10^6 bytes per second over the body transfer.

Host names and paths come from users: they are validated and never reach a shell; paths are
percent-encoded so they cannot inject header lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import re
import secrets
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cache
from typing import Any, Final, Literal, NamedTuple
from urllib.parse import quote

from pydantic import JsonValue

from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import StorageChecks, StorageEndpoint, StorageProtocol

__all__ = [
    "CEPH_MSGR1_BANNER",
    "CEPH_MSGR2_PREFIX",
    "DEFAULT_PORTS",
    "DEFAULT_TIMEOUT_SECONDS",
    "NFS_PROGRAM",
    "THROUGHPUT_MAX_BYTES",
    "THROUGHPUT_MAX_SECONDS",
    "THROUGHPUT_MIN_BYTES",
    "TLS_PORT",
    "AcceptStat",
    "RejectStat",
    "RpcReply",
    "classify_ceph_banner",
    "decode_msgr2_features",
    "decode_record_mark",
    "decode_rpc_reply",
    "describe_rpc_reply",
    "encode_msgr2_banner",
    "encode_rpc_null_call",
    "http_reachable",
    "http_request_target",
    "parse_http_status_line",
    "probe_endpoint",
    "probe_storage",
    "throughput_due",
    "validate_host",
]

DEFAULT_TIMEOUT_SECONDS: Final = 5.0
DEFAULT_PORTS: Final[Mapping[StorageProtocol, int | None]] = {
    StorageProtocol.TCP: None,
    StorageProtocol.CEPH: 3300,
    StorageProtocol.NFS: 2049,
    StorageProtocol.S3: 80,
    StorageProtocol.HTTP: 80,
}
TLS_PORT: Final = 443
_HTTP_PROTOCOLS: Final = frozenset({StorageProtocol.S3, StorageProtocol.HTTP})

# Throughput is bounded both ways so a probe never turns into load nor runs into the next cycle;
# MB/s comes from whatever arrived when either bound is reached.
THROUGHPUT_MAX_BYTES: Final = 64 * 1024 * 1024
THROUGHPUT_MAX_SECONDS: Final = 10.0
# Below this, TCP slow start and request latency dominate and MB/s says little about the path.
THROUGHPUT_MIN_BYTES: Final = 1024 * 1024
_MEGABYTE: Final = 1_000_000
_READ_CHUNK: Final = 256 * 1024

CEPH_MSGR2_PREFIX: Final = b"ceph v2\n"
CEPH_MSGR1_BANNER: Final = b"ceph v027"
# Both banners are at least this long, so reading it never blocks on a healthy Ceph daemon.
_CEPH_HEAD_LEN: Final = len(CEPH_MSGR1_BANNER)
# msgr2 payload today is two le64 feature masks; the bound only stops a hostile length.
_MSGR2_FEATURES_LEN: Final = 16
_MSGR2_MAX_PAYLOAD: Final = 4096
# Ceph speaks first; request/response servers (HTTP...) stay silent until spoken to. After this
# long without a banner we send our own msgr2 banner, as a msgr2 client does anyway, so a
# wrong service on the port answers with something we can name instead of timing out.
_CEPH_SPEAK_FIRST_WAIT: Final = 0.2

NFS_PROGRAM: Final = 100003
_NFS_VERSION: Final = 3
_NFS_FALLBACK_VERSION: Final = 4
_RPC_VERSION: Final = 2
_RPC_CALL: Final = 0
_RPC_REPLY: Final = 1
_RPC_MSG_ACCEPTED: Final = 0
_RPC_MSG_DENIED: Final = 1
_AUTH_NONE: Final = 0
_RPC_LAST_FRAGMENT: Final = 0x8000_0000
_RPC_MAX_REPLY_BYTES: Final = 64 * 1024
_RPC_MAX_OPAQUE_AUTH: Final = 400  # RFC 5531: opaque body<400>

_HTTP_MAX_HEADER_LINES: Final = 128
_USER_AGENT: Final = "netval-storage-probe"
_CLOSE_GRACE_SECONDS: Final = 1.0
_MAX_MESSAGE: Final = 1024

_HOST_CHARS: Final = re.compile(r"^[A-Za-z0-9._:%\[\]-]+$")
_HOST_NAME: Final = re.compile(
    r"^(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$"
)
_HTTP_STATUS_LINE: Final = re.compile(r"^HTTP/\d(?:\.\d)?[ \t]+(\d{3})(?:[ \t]+(.*))?$")
# RFC 3986 pchar plus "/" and "?", and "%" so an already-encoded path (a presigned S3 URL's
# query) passes unchanged; everything else, notably CR/LF and spaces, gets percent-encoded.
_PATH_SAFE: Final = "/?%:@!$&'()*+,;=-._~"


# ---------------------------------------------------------------- pure helpers: validation


def validate_host(host: str) -> str:
    """The host to connect to (IPv6 without brackets); ValueError says what is wrong."""
    if not _HOST_CHARS.fullmatch(host):
        raise ValueError(f"invalid host {host!r}: only a DNS name or an IP address is allowed")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if bare is not host or not _HOST_NAME.fullmatch(host):
            raise ValueError(
                f"invalid host {host!r}: only a DNS name or an IP address is allowed"
            ) from None
    return bare


def http_request_target(path: str | None) -> str:
    """The origin-form request target for `path`; ValueError unless it starts with "/"."""
    if path is None:
        return "/"
    if not path.startswith("/"):
        raise ValueError(f"path must start with '/', got {path!r}")
    return quote(path, safe=_PATH_SAFE)


def throughput_due(cycle: int, every_cycles: int) -> bool:
    """Throughput runs on cycle 0 and every `every_cycles` after it."""
    return cycle % every_cycles == 0


# ---------------------------------------------------------------- pure helpers: Ceph banner


def encode_msgr2_banner(supported: int = 0, required: int = 0) -> bytes:
    """A msgr2 banner as ProtocolV2::_banner_exchange writes it."""
    payload = struct.pack("<QQ", supported, required)
    return CEPH_MSGR2_PREFIX + struct.pack("<H", len(payload)) + payload


def classify_ceph_banner(head: bytes) -> Literal["msgr2", "msgr1"] | None:
    """Which messenger sent these first bytes (at least 9 of them), None if not Ceph."""
    if head.startswith(CEPH_MSGR2_PREFIX):
        return "msgr2"
    if head.startswith(CEPH_MSGR1_BANNER):
        return "msgr1"
    return None


def decode_msgr2_features(payload: bytes) -> tuple[int, int]:
    """(supported, required) msgr2 feature masks from the banner payload."""
    if len(payload) < _MSGR2_FEATURES_LEN:
        raise ValueError(f"msgr2 banner payload is {len(payload)} bytes, expected 16")
    supported, required = struct.unpack_from("<QQ", payload)
    return int(supported), int(required)


def _show_bytes(data: bytes, limit: int = 32) -> str:
    shown = repr(data[:limit])
    return shown + ("..." if len(data) > limit else "")


def _unexpected_banner(data: bytes) -> str:
    message = (
        f"unexpected banner {_show_bytes(data)}: not a Ceph messenger "
        f"(msgr2 sends {CEPH_MSGR2_PREFIX!r}, msgr1 {CEPH_MSGR1_BANNER!r})"
    )
    if data.startswith((b"HTTP/", b"<")):
        message += "; this looks like an HTTP server"
    return message


# ---------------------------------------------------------------- pure helpers: ONC RPC


class AcceptStat(IntEnum):
    SUCCESS = 0
    PROG_UNAVAIL = 1
    PROG_MISMATCH = 2
    PROC_UNAVAIL = 3
    GARBAGE_ARGS = 4
    SYSTEM_ERR = 5


class RejectStat(IntEnum):
    RPC_MISMATCH = 0
    AUTH_ERROR = 1


@dataclass(frozen=True, slots=True)
class RpcReply:
    """A decoded RPC reply header; `stat` is an accept_stat or reject_stat value."""

    xid: int
    accepted: bool
    stat: int
    low: int | None = None  # supported version range of PROG_MISMATCH / RPC_MISMATCH
    high: int | None = None
    auth_stat: int | None = None

    @property
    def success(self) -> bool:
        return self.accepted and self.stat == AcceptStat.SUCCESS


def encode_rpc_null_call(xid: int, program: int, version: int) -> bytes:
    """A record-marked RPC call of procedure 0 (NULL) with AUTH_NONE credentials."""
    body = struct.pack(
        ">10I",
        xid,
        _RPC_CALL,
        _RPC_VERSION,
        program,
        version,
        0,  # procedure NULL
        _AUTH_NONE,
        0,  # credential body length
        _AUTH_NONE,
        0,  # verifier body length
    )
    return struct.pack(">I", _RPC_LAST_FRAGMENT | len(body)) + body


def decode_record_mark(header: bytes) -> tuple[bool, int]:
    """(last fragment?, fragment length) from a 4-byte record mark."""
    (word,) = struct.unpack(">I", header)
    return bool(word & _RPC_LAST_FRAGMENT), word & ~_RPC_LAST_FRAGMENT


def decode_rpc_reply(message: bytes) -> RpcReply:
    """Decode the header of a reassembled RPC reply; ValueError if it is not one."""
    try:
        xid, msg_type, reply_stat = struct.unpack_from(">3I", message, 0)
        if msg_type != _RPC_REPLY:
            raise ValueError(f"RPC message type is {msg_type}, expected REPLY (1)")
        if reply_stat == _RPC_MSG_ACCEPTED:
            _flavor, verf_len = struct.unpack_from(">2I", message, 12)
            if verf_len > _RPC_MAX_OPAQUE_AUTH:
                raise ValueError(f"RPC verifier of {verf_len} bytes exceeds 400")
            offset = 20 + (verf_len + 3) // 4 * 4
            (stat,) = struct.unpack_from(">I", message, offset)
            if stat == AcceptStat.PROG_MISMATCH:
                low, high = struct.unpack_from(">2I", message, offset + 4)
                return RpcReply(xid, accepted=True, stat=stat, low=low, high=high)
            return RpcReply(xid, accepted=True, stat=stat)
        if reply_stat == _RPC_MSG_DENIED:
            (stat,) = struct.unpack_from(">I", message, 12)
            if stat == RejectStat.RPC_MISMATCH:
                low, high = struct.unpack_from(">2I", message, 16)
                return RpcReply(xid, accepted=False, stat=stat, low=low, high=high)
            if stat == RejectStat.AUTH_ERROR:
                (auth_stat,) = struct.unpack_from(">I", message, 16)
                return RpcReply(xid, accepted=False, stat=stat, auth_stat=auth_stat)
            raise ValueError(f"unknown reject_stat {stat}")
        raise ValueError(f"unknown reply_stat {reply_stat}")
    except struct.error:
        raise ValueError(f"truncated RPC reply ({len(message)} bytes)") from None


def describe_rpc_reply(reply: RpcReply) -> str:
    """Why a reply is not a successful NULL call, in an operator's words."""
    if reply.accepted:
        try:
            name = AcceptStat(reply.stat).name
        except ValueError:
            name = f"accept_stat {reply.stat}"
        if reply.stat == AcceptStat.PROG_MISMATCH:
            return f"RPC accepted but {name}: NFS versions {reply.low}..{reply.high} offered"
        if reply.stat == AcceptStat.PROG_UNAVAIL:
            return f"RPC accepted but {name}: no NFS service (program {NFS_PROGRAM}) on this port"
        return f"RPC accepted but {name}"
    if reply.stat == RejectStat.RPC_MISMATCH:
        return f"RPC denied (MSG_DENIED, RPC_MISMATCH: versions {reply.low}..{reply.high})"
    if reply.stat == RejectStat.AUTH_ERROR:
        return f"RPC denied (MSG_DENIED, AUTH_ERROR auth_stat {reply.auth_stat})"
    return f"RPC denied (MSG_DENIED, reject_stat {reply.stat})"


# ---------------------------------------------------------------- pure helpers: HTTP


def parse_http_status_line(line: bytes) -> tuple[int, str]:
    """(status, reason) of an HTTP/1.x status line; ValueError if it is not one."""
    text = line.decode("latin-1").rstrip("\r\n")
    match = _HTTP_STATUS_LINE.fullmatch(text)
    if match is None:
        raise ValueError(f"not an HTTP response: {_show_bytes(line)}")
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


def _build_http_request(
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


# ---------------------------------------------------------------- targets and results


class _ProbeFailure(Exception):
    """A failure whose message is already written for the operator."""


@dataclass(frozen=True, slots=True)
class _Target:
    protocol: StorageProtocol
    host: str
    port: int
    tls: bool
    request_target: str
    has_path: bool

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = TLS_PORT if self.tls else 80
        return host if self.port == default else f"{host}:{self.port}"


def _target(endpoint: StorageEndpoint) -> _Target:
    host = validate_host(endpoint.host)
    port = endpoint.port if endpoint.port is not None else DEFAULT_PORTS[endpoint.protocol]
    if port is None:
        raise ValueError(f"{endpoint.protocol.value} endpoint needs a port (no default exists)")
    return _Target(
        protocol=endpoint.protocol,
        host=host,
        port=port,
        tls=endpoint.protocol in _HTTP_PROTOCOLS and port == TLS_PORT,
        request_target=http_request_target(endpoint.path),
        has_path=endpoint.path is not None,
    )


@dataclass(frozen=True, slots=True)
class _Exchange:
    summary: str
    observed: dict[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Reach:
    ok: bool
    message: str
    latency_ms: float | None = None
    connect_ms: float | None = None
    observed: dict[str, JsonValue] = field(default_factory=dict)


def _clip(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."


def _result(
    check: CheckId,
    endpoint: StorageEndpoint,
    status: Status,
    message: str,
    observed: dict[str, JsonValue] | None = None,
    expected: dict[str, JsonValue] | None = None,
) -> CheckResult:
    return CheckResult(
        check=check,
        subject=endpoint.name,
        status=status,
        message=_clip(message),
        observed=observed or {},
        expected=expected or {},
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


# ---------------------------------------------------------------- I/O: connections


class _Progress:
    """What the probe was doing, so a timeout or reset says where it happened."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.address = ""


@dataclass(slots=True)
class _Stream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    address: str
    connect_seconds: float
    started: float


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


async def _resolve(target: _Target, progress: _Progress) -> list[_Address]:
    progress.step = f"resolving {target.host!r} (DNS)"
    try:
        ipaddress.ip_address(target.host)
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise _ProbeFailure(f"DNS lookup of {target.host!r} failed: {exc.strerror}") from None
    else:
        # A literal needs no resolver thread; getaddrinfo still yields the IPv6 scope id.
        infos = socket.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )
    if not infos:
        raise _ProbeFailure(f"DNS lookup of {target.host!r} returned no addresses")
    return [_Address(family, proto, tuple(addr)) for family, _t, proto, _n, addr in infos]


async def _connect(target: _Target, progress: _Progress) -> _Stream:
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
        return _Stream(reader, writer, str(address), connect_seconds, started)
    assert last_error is not None
    raise last_error


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), _CLOSE_GRACE_SECONDS)
    except OSError:  # TimeoutError and ssl.SSLError included
        # A peer that never finishes the TLS close (or already reset) must not stall the cycle.
        writer.transport.abort()


def _network_failure(exc: Exception, progress: _Progress, timeout: float) -> str | None:
    """The operator-facing message for a network-level failure; None if `exc` is not one."""
    where = progress.address or "the endpoint"
    if isinstance(exc, _ProbeFailure):
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


# ---------------------------------------------------------------- I/O: protocol exchanges

_ExchangeFn = Callable[[_Stream, _Target, _Progress], Awaitable[_Exchange]]


async def _tcp_exchange(stream: _Stream, target: _Target, progress: _Progress) -> _Exchange:
    return _Exchange(f"TCP connect to {stream.address} succeeded")


async def _ceph_exchange(stream: _Stream, target: _Target, progress: _Progress) -> _Exchange:
    progress.step = f"waiting for the Ceph messenger banner from {stream.address}"
    reader = stream.reader
    try:
        try:
            # readexactly consumes nothing until all bytes are there: cancelling it loses nothing.
            head = await asyncio.wait_for(
                reader.readexactly(_CEPH_HEAD_LEN), _CEPH_SPEAK_FIRST_WAIT
            )
        except TimeoutError:
            stream.writer.write(encode_msgr2_banner())
            await stream.writer.drain()
            head = await reader.readexactly(_CEPH_HEAD_LEN)
    except asyncio.IncompleteReadError as exc:
        if exc.partial and not (
            CEPH_MSGR2_PREFIX.startswith(exc.partial[: len(CEPH_MSGR2_PREFIX)])
            or CEPH_MSGR1_BANNER.startswith(exc.partial)
        ):
            raise _ProbeFailure(_unexpected_banner(exc.partial)) from None
        raise
    kind = classify_ceph_banner(head)
    if kind is None:
        # Whatever else already arrived makes the culprit easier to recognise.
        with contextlib.suppress(TimeoutError, OSError):
            head += await asyncio.wait_for(reader.read(64), 0.05)
        raise _ProbeFailure(f"{_unexpected_banner(head)} (from {stream.address})")
    if kind == "msgr1":
        return _Exchange(f"Ceph msgr1 banner from {stream.address}", {"banner": "msgr1"})
    length_bytes = head[len(CEPH_MSGR2_PREFIX) :] + await reader.readexactly(1)
    (length,) = struct.unpack("<H", length_bytes)
    if not _MSGR2_FEATURES_LEN <= length <= _MSGR2_MAX_PAYLOAD:
        raise _ProbeFailure(
            f"malformed msgr2 banner from {stream.address}: payload length {length}"
        )
    supported, required = decode_msgr2_features(await reader.readexactly(length))
    return _Exchange(
        f"Ceph msgr2 banner from {stream.address} "
        f"(features supported {supported:#x}, required {required:#x})",
        {"banner": "msgr2", "msgr2Supported": supported, "msgr2Required": required},
    )


async def _read_rpc_record(reader: asyncio.StreamReader, address: str) -> bytes:
    fragments: list[bytes] = []
    total = 0
    while True:
        last, length = decode_record_mark(await reader.readexactly(4))
        total += length
        if total > _RPC_MAX_REPLY_BYTES:
            raise _ProbeFailure(
                f"reply from {address} is not an ONC RPC record (fragment length {length}); "
                "is this an NFS server?"
            )
        fragments.append(await reader.readexactly(length))
        if last:
            return b"".join(fragments)


async def _rpc_null(stream: _Stream, version: int) -> RpcReply:
    xid = secrets.randbits(32)
    stream.writer.write(encode_rpc_null_call(xid, NFS_PROGRAM, version))
    await stream.writer.drain()
    try:
        reply = decode_rpc_reply(await _read_rpc_record(stream.reader, stream.address))
    except ValueError as exc:
        raise _ProbeFailure(f"malformed RPC reply from {stream.address}: {exc}") from None
    if reply.xid != xid:
        raise _ProbeFailure(
            f"RPC reply from {stream.address} has xid {reply.xid:#010x}, "
            f"expected {xid:#010x} (not an answer to our call)"
        )
    return reply


def _offers_fallback(reply: RpcReply) -> bool:
    return (
        reply.accepted
        and reply.stat == AcceptStat.PROG_MISMATCH
        and reply.low is not None
        and reply.high is not None
        and reply.low <= _NFS_FALLBACK_VERSION <= reply.high
    )


async def _nfs_exchange(stream: _Stream, target: _Target, progress: _Progress) -> _Exchange:
    version = _NFS_VERSION
    progress.step = f"waiting for the NFS v{version} NULL reply from {stream.address}"
    reply = await _rpc_null(stream, version)
    if _offers_fallback(reply):
        # NFSv4-only servers answer v3 with PROG_MISMATCH; the service is there, so ask in v4.
        version = _NFS_FALLBACK_VERSION
        progress.step = f"waiting for the NFS v{version} NULL reply from {stream.address}"
        reply = await _rpc_null(stream, version)
    if not reply.success:
        raise _ProbeFailure(
            f"NFS v{version} NULL call to {stream.address}: {describe_rpc_reply(reply)}"
        )
    return _Exchange(
        f"NFS v{version} NULL call answered by {stream.address}", {"nfsVersion": version}
    )


@dataclass(frozen=True, slots=True)
class _HttpHead:
    status: int
    reason: str
    headers: dict[str, str]

    def said(self, method: str, target: str) -> str:
        return f"{method} {target} answered {self.status} {self.reason}".rstrip()


async def _read_http_head(reader: asyncio.StreamReader, address: str) -> _HttpHead:
    try:
        status_line = await reader.readline()
        if not status_line:
            raise _ProbeFailure(f"{address} closed the connection without an HTTP response")
        status, reason = parse_http_status_line(status_line)
        lines: list[bytes] = []
        for _ in range(_HTTP_MAX_HEADER_LINES):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return _HttpHead(status, reason, _parse_http_headers(lines))
            lines.append(line)
    except ValueError as exc:  # not HTTP, or a line beyond the reader's limit
        raise _ProbeFailure(f"unexpected response from {address}: {exc}") from None
    raise _ProbeFailure(f"more than {_HTTP_MAX_HEADER_LINES} HTTP header lines from {address}")


async def _http_exchange(stream: _Stream, target: _Target, progress: _Progress) -> _Exchange:
    progress.step = f"waiting for the HTTP response to HEAD {target.request_target}"
    stream.writer.write(_build_http_request("HEAD", target.host_header, target.request_target))
    await stream.writer.drain()
    head = await _read_http_head(stream.reader, stream.address)
    said = head.said("HEAD", target.request_target)
    if not http_reachable(target.protocol, head.status, has_path=target.has_path):
        why = "server error" if head.status >= 500 else "a configured path must answer 2xx/3xx"
        raise _ProbeFailure(f"{said} from {stream.address} ({why})")
    return _Exchange(f"{said} from {stream.address}", {"httpStatus": head.status})


_EXCHANGES: Final[Mapping[StorageProtocol, _ExchangeFn]] = {
    StorageProtocol.TCP: _tcp_exchange,
    StorageProtocol.CEPH: _ceph_exchange,
    StorageProtocol.NFS: _nfs_exchange,
    StorageProtocol.S3: _http_exchange,
    StorageProtocol.HTTP: _http_exchange,
}


async def _reach(target: _Target, phase_timeout: float) -> _Reach:
    progress = _Progress("before connecting")
    stream: _Stream | None = None
    try:
        async with asyncio.timeout(phase_timeout):
            stream = await _connect(target, progress)
            exchange = await _EXCHANGES[target.protocol](stream, target, progress)
            total_seconds = time.perf_counter() - stream.started
    except Exception as exc:
        message = _network_failure(exc, progress, phase_timeout)
        if message is None:
            raise
        return _Reach(ok=False, message=message, observed=_where(progress))
    finally:
        if stream is not None:
            await _close(stream.writer)
    return _Reach(
        ok=True,
        message=exchange.summary,
        latency_ms=_ms(total_seconds),
        connect_ms=_ms(stream.connect_seconds),
        observed={"address": stream.address, **exchange.observed},
    )


def _where(progress: _Progress) -> dict[str, JsonValue]:
    return {"address": progress.address} if progress.address else {}


# ---------------------------------------------------------------- I/O: throughput


@dataclass(frozen=True, slots=True)
class _Transfer:
    received: int
    seconds: float
    time_capped: bool
    http_status: int


async def _read_body(
    reader: asyncio.StreamReader, limit: int, stall_timeout: float
) -> tuple[int, bool]:
    """(bytes read, stopped by THROUGHPUT_MAX_SECONDS); a stall raises _ProbeFailure."""
    loop = asyncio.get_running_loop()
    end = loop.time() + THROUGHPUT_MAX_SECONDS
    received = 0
    stall_guard = False
    try:
        async with asyncio.timeout(None) as guard:
            while received < limit:
                now = loop.time()
                if now >= end:
                    return received, True
                stall_guard = now + stall_timeout < end
                guard.reschedule(min(now + stall_timeout, end))
                chunk = await reader.read(min(_READ_CHUNK, limit - received))
                if not chunk:
                    break
                received += len(chunk)
    except TimeoutError:
        if stall_guard:
            raise _ProbeFailure(
                f"transfer stalled: no data for {stall_timeout:g} s after {received} bytes"
            ) from None
        return received, True
    return received, False


async def _transfer(target: _Target, phase_timeout: float, progress: _Progress) -> _Transfer:
    stream: _Stream | None = None
    try:
        async with asyncio.timeout(phase_timeout):
            stream = await _connect(target, progress)
            progress.step = f"waiting for the HTTP response to GET {target.request_target}"
            stream.writer.write(
                _build_http_request(
                    "GET",
                    target.host_header,
                    target.request_target,
                    {
                        "Range": f"bytes=0-{THROUGHPUT_MAX_BYTES - 1}",
                        # a compressed body would overstate the path's bandwidth
                        "Accept-Encoding": "identity",
                    },
                )
            )
            await stream.writer.drain()
            head = await _read_http_head(stream.reader, stream.address)
        if head.status not in (200, 206):
            hint = (
                "; the object must be readable without credentials (public, or a presigned path)"
                if head.status in (401, 403)
                else ""
            )
            raise _ProbeFailure(f"{head.said('GET', target.request_target)}{hint}")
        limit = THROUGHPUT_MAX_BYTES
        length = head.headers.get("content-length", "")
        if length.isdigit():
            limit = min(limit, int(length))
        progress.step = f"reading {target.request_target}"
        started = time.perf_counter()
        # With Connection: close a chunked body ends at EOF; its framing bytes count, which is
        # noise next to the megabytes measured.
        received, time_capped = await _read_body(stream.reader, limit, phase_timeout)
        seconds = time.perf_counter() - started
    finally:
        if stream is not None:
            await _close(stream.writer)
    return _Transfer(received, seconds, time_capped, head.status)


def _throughput_skip_reason(
    endpoint: StorageEndpoint, *, measure: bool, reachable: bool
) -> str | None:
    if endpoint.min_throughput_m_bps is None:
        return "not measured: no minThroughputMBps set"
    if endpoint.protocol not in _HTTP_PROTOCOLS:
        return (
            f"not measured: throughput is measured for s3 and http endpoints only, "
            f"not {endpoint.protocol.value}"
        )
    if endpoint.path is None:
        return "not measured: no path set (throughput reads the object at path)"
    if not measure:
        return "not measured this cycle (throughput runs every throughputEveryCycles cycles)"
    if not reachable:
        return "not measured: endpoint unreachable"
    return None


async def _throughput_result(
    endpoint: StorageEndpoint,
    target: _Target,
    reach: _Reach,
    *,
    measure: bool,
    phase_timeout: float,
) -> CheckResult:
    check = CheckId.STORAGE_THROUGHPUT
    reason = _throughput_skip_reason(endpoint, measure=measure, reachable=reach.ok)
    if reason is not None:
        return _result(check, endpoint, Status.SKIP, reason)
    minimum = endpoint.min_throughput_m_bps
    assert minimum is not None
    expected: dict[str, JsonValue] = {"minThroughputMBps": minimum}
    progress = _Progress("before connecting")
    try:
        transfer = await _transfer(target, phase_timeout, progress)
    except Exception as exc:
        message = _network_failure(exc, progress, phase_timeout)
        if message is None:
            raise
        return _result(check, endpoint, Status.FAIL, message, expected=expected)
    if transfer.received == 0:
        return _result(
            check,
            endpoint,
            Status.FAIL,
            f"GET {target.request_target} returned no data",
            expected=expected,
        )
    mbps = transfer.received / _MEGABYTE / max(transfer.seconds, 1e-9)
    observed: dict[str, JsonValue] = {
        "MBps": round(mbps, 3),
        "bytes": transfer.received,
        "seconds": round(transfer.seconds, 4),
        "httpStatus": transfer.http_status,
    }
    read = f"{mbps:.1f} MB/s reading {transfer.received} bytes of {target.request_target}"
    if transfer.received < THROUGHPUT_MIN_BYTES and not transfer.time_capped:
        return _result(
            check,
            endpoint,
            Status.WARN,
            f"{read}: the object is too small for a meaningful rate "
            f"(use one of at least {THROUGHPUT_MIN_BYTES} bytes)",
            observed,
            expected,
        )
    if mbps < minimum:
        return _result(
            check,
            endpoint,
            Status.FAIL,
            f"{read}, below the minimum of {minimum:g} MB/s",
            observed,
            expected,
        )
    return _result(
        check, endpoint, Status.PASS, f"{read} (minimum {minimum:g} MB/s)", observed, expected
    )


# ---------------------------------------------------------------- results and public API


def _unjudged(endpoint: StorageEndpoint, why: str) -> list[CheckResult]:
    return [
        _result(CheckId.STORAGE_LATENCY, endpoint, Status.SKIP, f"not measured: {why}"),
        _result(CheckId.STORAGE_THROUGHPUT, endpoint, Status.SKIP, f"not measured: {why}"),
    ]


def _reach_results(endpoint: StorageEndpoint, reach: _Reach) -> list[CheckResult]:
    reachable = _result(
        CheckId.STORAGE_REACHABLE,
        endpoint,
        Status.PASS if reach.ok else Status.FAIL,
        reach.message,
        {"reachable": reach.ok, "protocol": endpoint.protocol.value, **reach.observed},
        {"reachable": True},
    )
    if not reach.ok or reach.latency_ms is None:
        return [
            reachable,
            _result(
                CheckId.STORAGE_LATENCY, endpoint, Status.SKIP, "not measured: endpoint unreachable"
            ),
        ]
    observed: dict[str, JsonValue] = {"latencyMs": reach.latency_ms, "connectMs": reach.connect_ms}
    expected: dict[str, JsonValue] = {"maxLatencyMs": endpoint.max_latency_ms}
    too_slow = reach.latency_ms > endpoint.max_latency_ms
    latency = _result(
        CheckId.STORAGE_LATENCY,
        endpoint,
        Status.FAIL if too_slow else Status.PASS,
        f"{reach.latency_ms:g} ms (connect {reach.connect_ms:g} ms) "
        f"{'exceeds' if too_slow else 'within'} the maximum of {endpoint.max_latency_ms:g} ms",
        observed,
        expected,
    )
    return [reachable, latency]


async def _probe(
    endpoint: StorageEndpoint, *, measure_throughput: bool, phase_timeout: float
) -> list[CheckResult]:
    try:
        target = _target(endpoint)
    except ValueError as exc:
        return [
            _result(
                CheckId.STORAGE_REACHABLE,
                endpoint,
                Status.ERROR,
                f"invalid endpoint: {exc}",
            ),
            *_unjudged(endpoint, "invalid endpoint"),
        ]
    reach = await _reach(target, phase_timeout)
    throughput = await _throughput_result(
        endpoint, target, reach, measure=measure_throughput, phase_timeout=phase_timeout
    )
    return [*_reach_results(endpoint, reach), throughput]


async def probe_endpoint(
    endpoint: StorageEndpoint,
    *,
    measure_throughput: bool,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 - a per-phase bound, not one deadline
) -> list[CheckResult]:
    """storage.reachable, storage.latency and storage.throughput for one endpoint, in that order.

    `timeout` bounds each network phase (the reachability exchange; the throughput request up
    to its response headers, and any stall while reading the body). Never raises for network
    or endpoint problems: they are fail/error results.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    try:
        return await _probe(endpoint, measure_throughput=measure_throughput, phase_timeout=timeout)
    except Exception as exc:  # the contract: a probe bug is a result, not a dead agent cycle
        return [
            _result(
                CheckId.STORAGE_REACHABLE,
                endpoint,
                Status.ERROR,
                f"probe failed unexpectedly: {type(exc).__name__}: {exc}",
            ),
            *_unjudged(endpoint, "the probe failed"),
        ]


async def probe_storage(
    checks: StorageChecks,
    *,
    cycle: int,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 - see probe_endpoint
) -> list[CheckResult]:
    """All endpoints concurrently, results in endpoint order; throughput on due cycles only."""
    measure = throughput_due(cycle, checks.throughput_every_cycles)
    per_endpoint = await asyncio.gather(
        *(
            probe_endpoint(endpoint, measure_throughput=measure, timeout=timeout)
            for endpoint in checks.endpoints
        )
    )
    return [result for results in per_endpoint for result in results]
