"""The `nfs` probe: an ONC RPC (RFC 5531) NULL call to the NFS program.

Program 100003 version 3 (retried as version 4 when the server answers PROG_MISMATCH and
offers 4), over TCP with record marking (RFC 5531 section 11); default port 2049. Only an
accepted reply with SUCCESS and the call's xid passes.
"""

from __future__ import annotations

import asyncio
import secrets
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from netval.agent.storage.net import Exchange, ProbeFailure, Progress, Stream
from netval.agent.storage.target import Target

__all__ = [
    "NFS_PROGRAM",
    "AcceptStat",
    "RejectStat",
    "RpcReply",
    "decode_record_mark",
    "decode_rpc_reply",
    "describe_rpc_reply",
    "encode_rpc_null_call",
    "nfs_exchange",
]

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


async def _read_rpc_record(reader: asyncio.StreamReader, address: str) -> bytes:
    fragments: list[bytes] = []
    total = 0
    while True:
        last, length = decode_record_mark(await reader.readexactly(4))
        total += length
        if total > _RPC_MAX_REPLY_BYTES:
            raise ProbeFailure(
                f"reply from {address} is not an ONC RPC record (fragment length {length}); "
                "is this an NFS server?"
            )
        fragments.append(await reader.readexactly(length))
        if last:
            return b"".join(fragments)


async def _rpc_null(stream: Stream, version: int) -> RpcReply:
    xid = secrets.randbits(32)
    stream.writer.write(encode_rpc_null_call(xid, NFS_PROGRAM, version))
    await stream.writer.drain()
    try:
        reply = decode_rpc_reply(await _read_rpc_record(stream.reader, stream.address))
    except ValueError as exc:
        raise ProbeFailure(f"malformed RPC reply from {stream.address}: {exc}") from None
    if reply.xid != xid:
        raise ProbeFailure(
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


async def nfs_exchange(stream: Stream, target: Target, progress: Progress) -> Exchange:
    version = _NFS_VERSION
    progress.step = f"waiting for the NFS v{version} NULL reply from {stream.address}"
    reply = await _rpc_null(stream, version)
    if _offers_fallback(reply):
        # NFSv4-only servers answer v3 with PROG_MISMATCH; the service is there, so ask in v4.
        version = _NFS_FALLBACK_VERSION
        progress.step = f"waiting for the NFS v{version} NULL reply from {stream.address}"
        reply = await _rpc_null(stream, version)
    if not reply.success:
        raise ProbeFailure(
            f"NFS v{version} NULL call to {stream.address}: {describe_rpc_reply(reply)}"
        )
    return Exchange(
        f"NFS v{version} NULL call answered by {stream.address}", {"nfsVersion": version}
    )
