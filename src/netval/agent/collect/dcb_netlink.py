"""Read a netdev's IEEE 802.1Qaz DCB state (PFC, APP table) over rtnetlink.

pyroute2 has no DCB support, and the agent must never shell out on the hot path, so this is
a minimal stdlib client for one request: RTM_GETDCB with DCB_CMD_IEEE_GET, the same request
`dcb pfc show` / `lldptool` make. Reading is unprivileged: rtnetlink only requires
CAP_NET_ADMIN for the SET kinds, and dcbnl only for RTM_SETDCB.

Layouts and numbers are those of include/uapi/linux/{netlink,rtnetlink,dcbnl}.h. Netlink is
host byte order, hence the "=" (native order, no implicit padding) struct formats with the
C padding spelled out.

A socket answers for the network namespace it was created in, not the caller's current one:
create the `DcbReader` inside the namespace whose netdevs it should see.
"""

from __future__ import annotations

import errno
import functools
import socket
import struct
from types import TracebackType
from typing import Final, Self, TypeAlias

from netval.model.snapshot import Dcb, DcbApp

__all__ = [
    "REASON_INVALID_NAME",
    "REASON_MALFORMED",
    "REASON_NO_PFC",
    "REASON_TIMEOUT",
    "DcbReader",
    "parse_dcb_reply",
]

Buffer: TypeAlias = bytes | bytearray | memoryview

# include/linux/socket.h (the socket module does not export it)
SOL_NETLINK: Final = 270
# include/uapi/linux/netlink.h
NLMSG_ERROR: Final = 2
NLM_F_REQUEST: Final = 0x01
NETLINK_CAP_ACK: Final = 10  # socket option: error replies omit the echoed request
NLA_TYPE_MASK: Final = ~((1 << 15) | (1 << 14)) & 0xFFFF  # drop NLA_F_NESTED, NLA_F_NET_BYTEORDER
# include/uapi/linux/rtnetlink.h
RTM_GETDCB: Final = 78
# include/uapi/linux/dcbnl.h
DCB_CMD_IEEE_GET: Final = 21
DCB_ATTR_IFNAME: Final = 1
DCB_ATTR_IEEE: Final = 13
DCB_ATTR_IEEE_PFC: Final = 2
DCB_ATTR_IEEE_APP_TABLE: Final = 3
DCB_ATTR_IEEE_APP: Final = 1
# Since Linux 6.3 the APP table also carries non-IEEE selectors (DCB_APP_SEL_PCP = 255) as
# DCB_ATTR_DCB_APP entries with the same struct dcb_app payload.
DCB_ATTR_DCB_APP: Final = 2
IEEE_8021QAZ_MAX_TCS: Final = 8
IFNAMSIZ: Final = 16  # including the NUL; the kernel's policy rejects longer names (EINVAL)

SELECTOR_NAMES: Final[dict[int, str]] = {
    1: "ethertype",  # IEEE_8021QAZ_APP_SEL_ETHERTYPE
    2: "stream",  # IEEE_8021QAZ_APP_SEL_STREAM (TCP/SCTP port)
    3: "dgram",  # IEEE_8021QAZ_APP_SEL_DGRAM (UDP/DCCP port)
    4: "any",  # IEEE_8021QAZ_APP_SEL_ANY
    5: "dscp",  # IEEE_8021QAZ_APP_SEL_DSCP
}

NLMSGHDR: Final = struct.Struct("=IHHII")  # len, type, flags, seq, pid
DCBMSG: Final = struct.Struct("=BBH")  # dcb_family, cmd, dcb_pad
NLATTR: Final = struct.Struct("=HH")  # nla_len, nla_type
NLMSGERR_ERROR: Final = struct.Struct("=i")  # struct nlmsgerr starts with `int error`
# struct ieee_pfc: u8 pfc_cap, pfc_en, mbc; (1 pad) u16 delay; (2 pad so the u64 arrays are
# 8-aligned) u64 requests[8]; u64 indications[8] -> sizeof 136 on every Linux ABI.
IEEE_PFC: Final = struct.Struct("=BBBxH2x8Q8Q")
DCB_APP_STRUCT: Final = struct.Struct("=BBH")  # selector, priority, protocol

RECV_BUFSIZE: Final = 65536  # doit replies are built in an NLMSG_DEFAULT_SIZE (~4 KiB) skb
DEFAULT_TIMEOUT_S: Final = 1.0
APP_TABLE_CACHE_SIZE: Final = 256  # distinct APP tables; one or two per netdev in practice
MAX_STALE_REPLIES: Final = 64  # answers to earlier, timed-out requests that may be queued

# `DcbReader.last_error` values that are not a kernel errno name ("EOPNOTSUPP", "ENODEV", ...).
REASON_NO_PFC: Final = "no IEEE PFC data"
REASON_MALFORMED: Final = "malformed reply"
REASON_TIMEOUT: Final = "timeout"
REASON_INVALID_NAME: Final = "invalid interface name"


def _align4(n: int) -> int:
    return (n + 3) & ~3


def _errno_name(code: int) -> str:
    # errno.errorcode[95] is "ENOTSUP" on Linux (same value); keep the name the kernel
    # source and dcbnl use for "device has no dcbnl_ops".
    if code == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"
    return errno.errorcode.get(code, f"errno {code}")


def _attrs(buf: Buffer, start: int, end: int) -> dict[int, tuple[int, int]] | None:
    """Map attribute type -> (payload start, payload end) within buf[start:end].

    None when an attribute header is inconsistent: a broken length makes every later offset
    meaningless, so the whole container is rejected rather than half-parsed.
    """
    found: dict[int, tuple[int, int]] = {}
    off = start
    while end - off >= NLATTR.size:
        nla_len, nla_type = NLATTR.unpack_from(buf, off)
        if nla_len < NLATTR.size or off + nla_len > end:
            return None
        found.setdefault(nla_type & NLA_TYPE_MASK, (off + NLATTR.size, off + nla_len))
        off += _align4(nla_len)
    return found


# Frozen dataclass construction costs ~1 µs per entry and a DSCP-trusting port carries 64
# entries, while the table itself almost never changes: memoise on the raw attribute bytes.
@functools.lru_cache(maxsize=APP_TABLE_CACHE_SIZE)
def _app_table(table: bytes) -> tuple[DcbApp, ...] | None:
    apps: list[tuple[int, int, int]] = []
    off = 0
    end = len(table)
    while end - off >= NLATTR.size:
        nla_len, nla_type = NLATTR.unpack_from(table, off)
        if nla_len < NLATTR.size or off + nla_len > end:
            return None
        if nla_type & NLA_TYPE_MASK in (DCB_ATTR_IEEE_APP, DCB_ATTR_DCB_APP):
            if nla_len - NLATTR.size < DCB_APP_STRUCT.size:
                return None
            apps.append(DCB_APP_STRUCT.unpack_from(table, off + NLATTR.size))
        off += _align4(nla_len)
    # The kernel walks its global app list, whose order depends on insertion history; sort
    # so that equal configurations compare and serialise identically.
    apps.sort()
    return tuple(
        DcbApp(selector=SELECTOR_NAMES.get(sel, f"sel{sel}"), protocol=proto, priority=prio)
        for sel, prio, proto in apps
    )


def _parse(data: Buffer, size: int) -> Dcb | str:
    """The Dcb of the RTM_GETDCB/DCB_CMD_IEEE_GET reply in data[:size], or why there is none."""
    if size < NLMSGHDR.size + DCBMSG.size:
        return REASON_MALFORMED
    msg_len, msg_type, _flags, _seq, _pid = NLMSGHDR.unpack_from(data)
    if msg_len < NLMSGHDR.size + DCBMSG.size or msg_len > size:
        return REASON_MALFORMED
    if msg_type == NLMSG_ERROR:
        (error,) = NLMSGERR_ERROR.unpack_from(data, NLMSGHDR.size)
        # error 0 is an ACK, which we never ask for: there was no reply to parse.
        return _errno_name(-error) if error < 0 else REASON_MALFORMED
    _family, cmd, _pad = DCBMSG.unpack_from(data, NLMSGHDR.size)
    if msg_type != RTM_GETDCB or cmd != DCB_CMD_IEEE_GET:
        return REASON_MALFORMED
    top = _attrs(data, NLMSGHDR.size + DCBMSG.size, msg_len)
    if top is None:
        return REASON_MALFORMED
    if DCB_ATTR_IEEE not in top:
        return REASON_NO_PFC
    ieee = _attrs(data, *top[DCB_ATTR_IEEE])
    if ieee is None:
        return REASON_MALFORMED
    if DCB_ATTR_IEEE_PFC not in ieee:
        # A driver without ieee_getpfc (or whose ieee_getpfc failed) sends no PFC attribute.
        return REASON_NO_PFC
    pfc_start, pfc_end = ieee[DCB_ATTR_IEEE_PFC]
    if pfc_end - pfc_start < IEEE_PFC.size:
        return REASON_MALFORMED
    fields = IEEE_PFC.unpack_from(data, pfc_start)
    pfc_en: int = fields[1]
    counters: tuple[int, ...] = fields[4:]
    app: tuple[DcbApp, ...] = ()
    if DCB_ATTR_IEEE_APP_TABLE in ieee:
        table_start, table_end = ieee[DCB_ATTR_IEEE_APP_TABLE]
        parsed = _app_table(bytes(data[table_start:table_end]))
        if parsed is None:
            return REASON_MALFORMED
        app = parsed
    return Dcb(
        pfc_enabled=frozenset(p for p in range(IEEE_8021QAZ_MAX_TCS) if pfc_en >> p & 1),
        pfc_requests=counters[:IEEE_8021QAZ_MAX_TCS],
        pfc_indications=counters[IEEE_8021QAZ_MAX_TCS:],
        app=app,
    )


def parse_dcb_reply(data: bytes) -> Dcb | None:
    """Parse one netlink message answering RTM_GETDCB/DCB_CMD_IEEE_GET.

    `data` starts with the nlmsghdr, as received. Returns None for an NLMSG_ERROR, a reply
    without IEEE PFC data, or anything truncated or inconsistent; never raises.
    """
    result = _parse(data, len(data))
    return result if isinstance(result, Dcb) else None


class DcbReader:
    """Reads DCB state over one long-lived NETLINK_ROUTE socket; needs no capability.

    `read()` returns None whenever there is nothing to judge and sets `last_error` to why:
    a kernel errno name ("EOPNOTSUPP": the netdev has no dcbnl ops, e.g. lo, veth;
    "ENODEV": no such netdev in this reader's network namespace; "EINVAL": the kernel
    refused the request), or one of REASON_NO_PFC, REASON_MALFORMED, REASON_TIMEOUT,
    REASON_INVALID_NAME, or "socket error: <ERRNO>". After a successful read it is None.

    The socket lives in the network namespace current when the reader was created. Not
    thread-safe: use one reader per thread. Construction raises OSError if no netlink socket
    can be opened (a setup problem, not a per-interface one), ValueError for timeout <= 0.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.last_error: str | None = None
        self._seq = 0
        self._buf = bytearray(RECV_BUFSIZE)
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        try:
            # Blocking socket + SO_RCVTIMEO: one recv syscall per read, where a Python-level
            # timeout would add a poll() before every recv.
            sock.settimeout(None)
            seconds = int(timeout)
            # A zero timeval means "wait forever": never round a tiny timeout down to it.
            micros = max(int((timeout - seconds) * 1_000_000), 0 if seconds else 1)
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", seconds, micros)
            )
            sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            # Connected to the kernel (port 0), the socket refuses unicasts from other
            # processes' netlink sockets, so every datagram we read is the kernel's.
            sock.connect((0, 0))
        except OSError:
            sock.close()
            raise
        self._sock: socket.socket | None = sock

    def read(self, ifname: str) -> Dcb | None:
        """The DCB state of `ifname`, or None (see `last_error`). Raises only if closed."""
        sock = self._sock
        if sock is None:
            raise ValueError("DcbReader is closed")
        name = ifname.encode(errors="surrogateescape")
        # An embedded NUL would make the kernel read a different, shorter name.
        if not name or b"\0" in name or len(name) >= IFNAMSIZ:
            self.last_error = REASON_INVALID_NAME
            return None
        self._seq = self._seq % 0xFFFFFFFF + 1
        seq = self._seq
        attr_len = NLATTR.size + len(name) + 1
        msg_len = NLMSGHDR.size + DCBMSG.size + _align4(attr_len)
        request = (
            NLMSGHDR.pack(msg_len, RTM_GETDCB, NLM_F_REQUEST, seq, 0)
            + DCBMSG.pack(socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0)
            + NLATTR.pack(attr_len, DCB_ATTR_IFNAME)
            + name
            + b"\0" * (msg_len - NLMSGHDR.size - DCBMSG.size - NLATTR.size - len(name))
        )
        buf = self._buf
        try:
            sock.send(request)
            # The kernel handles the request inside send(), so the answer is normally queued
            # already; anything with another seq is a late answer to a timed-out request.
            for _ in range(MAX_STALE_REPLIES):
                n = sock.recv_into(buf, RECV_BUFSIZE, socket.MSG_TRUNC)
                if n > RECV_BUFSIZE:
                    self.last_error = REASON_MALFORMED
                    return None
                if n >= NLMSGHDR.size and NLMSGHDR.unpack_from(buf)[3] == seq:
                    result = _parse(buf, n)
                    break
            else:
                self.last_error = REASON_MALFORMED
                return None
        except (BlockingIOError, TimeoutError):
            self.last_error = REASON_TIMEOUT
            return None
        except OSError as exc:
            self.last_error = f"socket error: {_errno_name(exc.errno or 0)}"
            return None
        if isinstance(result, Dcb):
            self.last_error = None
            return result
        self.last_error = result
        return None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
