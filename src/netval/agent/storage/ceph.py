"""The `ceph` probe: read the messenger banner a Ceph daemon sends on accept.

msgr2 `ceph v2\\n` + le16 payload length + le64 supported + le64 required features
(`CEPH_BANNER_V2_PREFIX`, ceph src/include/msgr.h and ProtocolV2::_banner_exchange), or the
legacy msgr1 `ceph v027` (`CEPH_BANNER`). Default port 3300 (IANA msgr2); the legacy monitor
port is 6789.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Final, Literal

from netval.agent.storage.net import Exchange, ProbeFailure, Progress, Stream, show_bytes
from netval.agent.storage.target import Target

__all__ = [
    "CEPH_MSGR1_BANNER",
    "CEPH_MSGR2_PREFIX",
    "ceph_exchange",
    "classify_ceph_banner",
    "decode_msgr2_features",
    "encode_msgr2_banner",
]

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


def _unexpected_banner(data: bytes) -> str:
    message = (
        f"unexpected banner {show_bytes(data)}: not a Ceph messenger "
        f"(msgr2 sends {CEPH_MSGR2_PREFIX!r}, msgr1 {CEPH_MSGR1_BANNER!r})"
    )
    if data.startswith((b"HTTP/", b"<")):
        message += "; this looks like an HTTP server"
    return message


async def ceph_exchange(stream: Stream, target: Target, progress: Progress) -> Exchange:
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
            raise ProbeFailure(_unexpected_banner(exc.partial)) from None
        raise
    kind = classify_ceph_banner(head)
    if kind is None:
        # Whatever else already arrived makes the culprit easier to recognise.
        with contextlib.suppress(TimeoutError, OSError):
            head += await asyncio.wait_for(reader.read(64), 0.05)
        raise ProbeFailure(f"{_unexpected_banner(head)} (from {stream.address})")
    if kind == "msgr1":
        return Exchange(f"Ceph msgr1 banner from {stream.address}", {"banner": "msgr1"})
    length_bytes = head[len(CEPH_MSGR2_PREFIX) :] + await reader.readexactly(1)
    (length,) = struct.unpack("<H", length_bytes)
    if not _MSGR2_FEATURES_LEN <= length <= _MSGR2_MAX_PAYLOAD:
        raise ProbeFailure(f"malformed msgr2 banner from {stream.address}: payload length {length}")
    supported, required = decode_msgr2_features(await reader.readexactly(length))
    return Exchange(
        f"Ceph msgr2 banner from {stream.address} "
        f"(features supported {supported:#x}, required {required:#x})",
        {"banner": "msgr2", "msgr2Supported": supported, "msgr2Required": required},
    )
