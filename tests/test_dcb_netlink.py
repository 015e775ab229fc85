"""DCB netlink reader: parsing of kernel-shaped replies, and the real kernel's answers.

Replies are built the way net/dcb/dcbnl.c:dcbnl_ieee_fill() lays them out; struct ieee_pfc
is built with ctypes so its padding comes from the C ABI rather than from the code under
test. The real-kernel tests use no mocks: no netdev here has dcbnl ops, so the positive
path is covered by the parse tests and the kernel tests cover the refusal paths.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from netval.agent.collect.dcb_netlink import (
    IEEE_PFC,
    REASON_INVALID_NAME,
    DcbReader,
    parse_dcb_reply,
)
from netval.model.snapshot import Dcb, DcbApp

RTM_GETDCB = 78
NLMSG_ERROR = 2
DCB_CMD_IEEE_GET = 21
DCB_ATTR_IFNAME = 1
DCB_ATTR_IEEE = 13
DCB_ATTR_DCBX = 14
DCB_ATTR_IEEE_ETS = 1
DCB_ATTR_IEEE_PFC = 2
DCB_ATTR_IEEE_APP_TABLE = 3
DCB_ATTR_IEEE_PEER_PFC = 5
DCB_ATTR_DCB_APP_TRUST_TABLE = 11  # inside DCB_ATTR_IEEE, Linux 6.3+
DCB_ATTR_DCB_REWR_TABLE = 12  # inside DCB_ATTR_IEEE, Linux 6.3+
DCB_ATTR_IEEE_APP = 1
DCB_ATTR_DCB_APP = 2
NLA_F_NESTED = 1 << 15
SEL_ETHERTYPE = 1
SEL_DSCP = 5
SEL_PCP = 255
ROCE_V1_ETHERTYPE = 0x8915

IS_ROOT = os.geteuid() == 0


class IeeePfc(ctypes.Structure):
    """struct ieee_pfc from include/uapi/linux/dcbnl.h, laid out by the C ABI."""

    _fields_ = [
        ("pfc_cap", ctypes.c_uint8),
        ("pfc_en", ctypes.c_uint8),
        ("mbc", ctypes.c_uint8),
        ("delay", ctypes.c_uint16),
        ("requests", ctypes.c_uint64 * 8),
        ("indications", ctypes.c_uint64 * 8),
    ]


def nla(nla_type: int, payload: bytes) -> bytes:
    """One attribute, padded to NLA_ALIGNTO like nla_put(); nla_len excludes the padding."""
    attr = struct.pack("=HH", 4 + len(payload), nla_type) + payload
    return attr + b"\0" * (-len(attr) % 4)


def pfc_payload(pfc_en: int, requests: list[int], indications: list[int]) -> bytes:
    pfc = IeeePfc(pfc_cap=8, pfc_en=pfc_en, mbc=0, delay=0xBEEF)
    pfc.requests[:] = requests
    pfc.indications[:] = indications
    return bytes(pfc)


def app_entry(selector: int, priority: int, protocol: int, attr: int = DCB_ATTR_IEEE_APP) -> bytes:
    return nla(attr, struct.pack("=BBH", selector, priority, protocol))


def reply(ieee_attrs: bytes | None, *, ifname: str = "eth12", seq: int = 7) -> bytes:
    """A complete RTM_GETDCB reply: nlmsghdr, dcbmsg, IFNAME, the IEEE nest, DCBX."""
    body = struct.pack("=BBH", socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0)
    body += nla(DCB_ATTR_IFNAME, ifname.encode() + b"\0")
    if ieee_attrs is not None:
        body += nla(DCB_ATTR_IEEE, ieee_attrs)  # nla_nest_start_noflag: no NLA_F_NESTED
    body += nla(DCB_ATTR_DCBX, b"\x04")  # DCB_CAP_DCBX_VER_IEEE
    return struct.pack("=IHHII", 16 + len(body), RTM_GETDCB, 0, seq, 4242) + body


ETS = nla(DCB_ATTR_IEEE_ETS, bytes(59))  # sizeof(struct ieee_ets) = 59: exercises padding
REQUESTS = [0, 0, 0, 1234, 0, 0, 0, 0]
INDICATIONS = [0, 0, 0, 2**40 + 5, 0, 0, 0, 0]
PFC_PRIO3 = nla(DCB_ATTR_IEEE_PFC, pfc_payload(1 << 3, REQUESTS, INDICATIONS))
PEER_PFC = nla(DCB_ATTR_IEEE_PEER_PFC, pfc_payload(0xFF, [9] * 8, [9] * 8))


def full_reply(app_table: bytes | None) -> bytes:
    ieee = ETS + PFC_PRIO3
    if app_table is not None:
        ieee += nla(DCB_ATTR_IEEE_APP_TABLE, app_table)
    # Decoys that reuse the APP attribute numbers in other nests: the trust table holds
    # one-byte selectors, the rewrite table dcb_app entries that are not priority maps.
    trust = nla(DCB_ATTR_DCB_APP_TRUST_TABLE | NLA_F_NESTED, nla(DCB_ATTR_IEEE_APP, b"\x05"))
    rewr = nla(DCB_ATTR_DCB_REWR_TABLE | NLA_F_NESTED, app_entry(SEL_PCP, 3, 5, DCB_ATTR_DCB_APP))
    return reply(ieee + trust + rewr + PEER_PFC)


DSCP_AND_ETHERTYPE = app_entry(SEL_ETHERTYPE, 3, ROCE_V1_ETHERTYPE) + app_entry(SEL_DSCP, 3, 26)


# --- parsing ---------------------------------------------------------------------------------


def test_ieee_pfc_struct_matches_c_layout() -> None:
    assert IEEE_PFC.size == ctypes.sizeof(IeeePfc) == 136
    assert IeeePfc.delay.offset == 4
    assert IeeePfc.requests.offset == 8


def test_pfc_on_priority_3_with_counters() -> None:
    dcb = parse_dcb_reply(full_reply(None))
    assert dcb == Dcb(
        pfc_enabled=frozenset({3}),
        pfc_requests=tuple(REQUESTS),
        pfc_indications=tuple(INDICATIONS),
        app=(),
    )


def test_app_table_dscp_and_ethertype() -> None:
    dcb = parse_dcb_reply(full_reply(DSCP_AND_ETHERTYPE))
    assert dcb is not None
    assert dcb.app == (
        DcbApp(selector="ethertype", protocol=ROCE_V1_ETHERTYPE, priority=3),
        DcbApp(selector="dscp", protocol=26, priority=3),
    )
    assert dcb.trust == "dscp"
    # The peer's PFC, the trust and the rewrite tables must not leak into the local state.
    assert dcb.pfc_enabled == frozenset({3})


def test_app_order_does_not_depend_on_kernel_list_order() -> None:
    swapped = app_entry(SEL_DSCP, 3, 26) + app_entry(SEL_ETHERTYPE, 3, ROCE_V1_ETHERTYPE)
    assert parse_dcb_reply(full_reply(swapped)) == parse_dcb_reply(full_reply(DSCP_AND_ETHERTYPE))


def test_full_dscp_table_parses_identically_twice() -> None:
    # mlx5 in DSCP trust maps all 64 code points; the second parse comes from the cache.
    table = b"".join(app_entry(SEL_DSCP, dscp >> 3, dscp) for dscp in reversed(range(64)))
    first = parse_dcb_reply(full_reply(table))
    assert first is not None
    assert first.app == tuple(DcbApp("dscp", dscp, dscp >> 3) for dscp in range(64))
    assert parse_dcb_reply(full_reply(table)) == first


def test_empty_app_table() -> None:
    dcb = parse_dcb_reply(full_reply(b""))
    assert dcb is not None
    assert dcb.app == ()
    assert dcb.trust == "pcp"


def test_pcp_and_unknown_selectors_are_named_by_number() -> None:
    table = app_entry(SEL_PCP, 2, 7, DCB_ATTR_DCB_APP) + app_entry(0, 1, 80)
    dcb = parse_dcb_reply(full_reply(table))
    assert dcb is not None
    assert dcb.app == (
        DcbApp(selector="sel0", protocol=80, priority=1),
        DcbApp(selector="sel255", protocol=7, priority=2),
    )
    assert dcb.trust == "pcp"


def test_all_priorities_and_nested_flag() -> None:
    # New kernels open some nests with nla_nest_start(), which sets NLA_F_NESTED.
    pfc = nla(DCB_ATTR_IEEE_PFC, pfc_payload(0xFF, list(range(8)), list(range(8, 16))))
    body = struct.pack("=BBH", socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0)
    body += nla(DCB_ATTR_IEEE | NLA_F_NESTED, pfc)
    data = struct.pack("=IHHII", 16 + len(body), RTM_GETDCB, 0, 1, 0) + body
    dcb = parse_dcb_reply(data)
    assert dcb is not None
    assert dcb.pfc_enabled == frozenset(range(8))
    assert dcb.pfc_requests == tuple(range(8))
    assert dcb.pfc_indications == tuple(range(8, 16))


def test_no_pfc_data_is_none() -> None:
    assert parse_dcb_reply(reply(ETS)) is None  # IEEE nest without PFC (no ieee_getpfc)
    assert parse_dcb_reply(reply(None)) is None  # no IEEE nest at all


def test_error_message_is_none() -> None:
    nlmsgerr = struct.pack("=i", -95) + struct.pack("=IHHII", 28, RTM_GETDCB, 1, 7, 0)
    assert parse_dcb_reply(struct.pack("=IHHII", 36, NLMSG_ERROR, 0x100, 7, 0) + nlmsgerr) is None


def test_wrong_message_type_or_command_is_none() -> None:
    data = bytearray(full_reply(DSCP_AND_ETHERTYPE))
    wrong_type = bytearray(data)
    struct.pack_into("=H", wrong_type, 4, RTM_GETDCB + 1)
    wrong_cmd = bytearray(data)
    wrong_cmd[17] = 22  # dcbmsg.cmd = DCB_CMD_GDCBX
    assert parse_dcb_reply(bytes(wrong_type)) is None
    assert parse_dcb_reply(bytes(wrong_cmd)) is None


def test_truncated_input_is_none() -> None:
    data = full_reply(DSCP_AND_ETHERTYPE)
    assert parse_dcb_reply(data) is not None
    for cut in range(len(data)):
        assert parse_dcb_reply(data[:cut]) is None, cut


def test_short_pfc_attribute_is_none() -> None:
    short = nla(DCB_ATTR_IEEE_PFC, pfc_payload(8, REQUESTS, INDICATIONS)[:100])
    assert parse_dcb_reply(reply(ETS + short)) is None


def test_short_app_entry_is_none() -> None:
    table = nla(DCB_ATTR_IEEE_APP, b"\x05\x03")
    assert parse_dcb_reply(full_reply(table)) is None


def test_corrupted_input_never_raises() -> None:
    data = full_reply(DSCP_AND_ETHERTYPE)
    rng = random.Random(802)
    for _ in range(3000):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        result = parse_dcb_reply(bytes(mutated))
        assert result is None or isinstance(result, Dcb)


# --- the real kernel -------------------------------------------------------------------------


def test_lo_has_no_dcb() -> None:
    with DcbReader() as reader:
        assert reader.read("lo") is None
        assert reader.last_error == "EOPNOTSUPP"


def test_one_socket_serves_many_reads() -> None:
    with DcbReader() as reader:
        for name, reason in [("lo", "EOPNOTSUPP"), ("netval-nx0", "ENODEV")] * 200:
            assert reader.read(name) is None
            assert reader.last_error == reason


def test_read_is_cheap() -> None:
    # A hot-path call per interface per cycle; the bound is loose so CI noise cannot trip it.
    with DcbReader() as reader:
        costs = []
        for _ in range(201):
            start = time.perf_counter()
            reader.read("lo")
            costs.append(time.perf_counter() - start)
    assert statistics.median(costs) < 100e-6


def test_unknown_interface_is_none() -> None:
    with DcbReader() as reader:
        assert reader.read("netval-nx0") is None
        assert reader.last_error == "ENODEV"


@pytest.mark.parametrize("name", ["", "x" * 16, "lo\0x"])
def test_unusable_names_are_refused_before_the_kernel(name: str) -> None:
    # "lo\0x" would otherwise be read by the kernel as "lo".
    with DcbReader() as reader:
        assert reader.read(name) is None
        assert reader.last_error == REASON_INVALID_NAME


def test_late_answer_to_an_earlier_request_is_ignored() -> None:
    with DcbReader() as reader:
        # Queue the kernel's answer to a request the reader did not make (as after a
        # timeout): its ENODEV must not be taken for the answer about lo.
        name = b"netval-nx0\0\0"
        body = struct.pack("=BBH", 0, DCB_CMD_IEEE_GET, 0) + nla(DCB_ATTR_IFNAME, name)
        assert reader._sock is not None
        reader._sock.send(struct.pack("=IHHII", 16 + len(body), RTM_GETDCB, 1, 0xDEAD, 0) + body)
        assert reader.read("lo") is None
        assert reader.last_error == "EOPNOTSUPP"


def test_closed_reader_refuses_reads() -> None:
    reader = DcbReader()
    reader.close()
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.read("lo")


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan")])
def test_timeout_must_be_positive(timeout: float) -> None:
    # SO_RCVTIMEO of zero would block forever on a kernel that never answers.
    with pytest.raises(ValueError, match="timeout"):
        DcbReader(timeout=timeout)


def test_read_needs_no_capability() -> None:
    if not IS_ROOT or shutil.which("setpriv") is None:
        pytest.skip("dropping capabilities with setpriv needs root and util-linux setpriv")
    code = (
        "from netval.agent.collect.dcb_netlink import DcbReader\n"
        "caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
        "r = DcbReader(); print(r.read('lo'), r.last_error, caps[0].split()[1])\n"
    )
    drop_all = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all"]
    out = subprocess.run(
        [*drop_all, sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    # Not EPERM: the kernel got as far as looking at lo's (missing) dcbnl ops.
    assert out.stdout.split() == ["None", "EOPNOTSUPP", "0000000000000000"]


# --- network namespaces ----------------------------------------------------------------------

needs_root = pytest.mark.skipif(not IS_ROOT, reason="creating network namespaces needs root")


@pytest.fixture
def netns_with_veth() -> Iterator[str]:
    """A fresh namespace holding veth pair dcbv0/dcbv1; deleted however the test ends."""
    name = f"netval-dcb-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(
            ["ip", "-n", name, "link", "add", "dcbv0", "type", "veth", "peer", "name", "dcbv1"],
            check=True,
        )
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.mark.netns
@needs_root
def test_veth_in_namespace_has_no_dcb(netns_with_veth: str) -> None:
    from pyroute2 import netns

    netns.pushns(netns_with_veth)
    try:
        reader = DcbReader()
    finally:
        netns.popns()
    # The socket keeps answering for the namespace it was created in.
    with reader, DcbReader() as host_reader:
        assert reader.read("dcbv0") is None
        assert reader.last_error == "EOPNOTSUPP"
        assert reader.read("lo") is None
        assert reader.last_error == "EOPNOTSUPP"
        assert host_reader.read("dcbv0") is None
        assert host_reader.last_error == "ENODEV"


@pytest.mark.netns
@needs_root
def test_reader_inside_namespace_process(netns_with_veth: str) -> None:
    code = (
        "from netval.agent.collect.dcb_netlink import DcbReader\n"
        "with DcbReader() as r:\n"
        "    for n in ('dcbv1', 'lo', 'eth0'):\n"
        "        print(n, r.read(n), r.last_error)\n"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", netns_with_veth, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines() == [
        "dcbv1 None EOPNOTSUPP",
        "lo None EOPNOTSUPP",
        "eth0 None ENODEV",
    ]
