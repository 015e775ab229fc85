"""rdma.gid_roce_v2 needs a routable RoCE v2 GID; rdma.gid_index reports a GID that moved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netval.agent.checks import run_node_checks
from netval.agent.checks.gid import is_routable
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import Gid, Netdev, NodeSnapshot, RdmaDevice, RdmaPort, Sample
from netval.model.spec import Checks

LINK_LOCAL = "fe80:0000:0000:0000:9e63:c0ff:feab:ed5a"
V4_MAPPED = "0000:0000:0000:0000:0000:ffff:0a0a:010b"  # 10.10.1.11
GLOBAL_V6 = "2001:0db8:0010:0001:0000:0000:0000:000b"
ULA_V6 = "fd00:0010:0001:0000:0000:0000:0000:000b"


def v1v2(index: int, gid: str, ndev: str = "ens1np0") -> tuple[Gid, Gid]:
    return Gid(index, gid, "IB/RoCE v1", ndev), Gid(index + 1, gid, "RoCE v2", ndev)


def sample(gids: tuple[Gid, ...], node_type: str = "1: CA", link_layer: str = "Ethernet") -> Sample:
    port = RdmaPort("mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", link_layer,
                    gids)  # fmt: skip
    netdev = Netdev("ens1np0", mtu=9000, carrier=1, operstate="up", carrier_changes=2)
    device = RdmaDevice("mlx5_0", node_type=node_type, ports={1: port})
    return Sample(netdevs={"ens1np0": netdev}, rdma={"mlx5_0": device})


def judge(check: CheckId, *samples: Sample, **rdma: Any) -> CheckResult:
    snap = NodeSnapshot("gpu-a01", "2025-06-12T08:30:00Z", 10.0, tuple(samples))
    results = run_node_checks(snap, Checks.model_validate({"rdma": rdma}))
    (one,) = [r for r in results if r.check is check]
    return one


def test_link_local_only_v2_gids_fail_with_the_reason() -> None:
    s = sample(v1v2(0, LINK_LOCAL))
    r = judge(CheckId.RDMA_GID_ROCE_V2, s, s)
    assert r.status is Status.FAIL
    assert "link-local only" in r.message
    assert "no IP address on the netdev ens1np0" in r.message
    assert r.observed["routableRoceV2Gids"] == 0 and r.observed["roceV2Gids"] == 1


@pytest.mark.parametrize("gid", [V4_MAPPED, GLOBAL_V6, ULA_V6])
def test_an_ip_gid_is_routable(gid: str) -> None:
    s = sample(v1v2(0, LINK_LOCAL) + v1v2(2, gid))
    r = judge(CheckId.RDMA_GID_ROCE_V2, s, s)
    assert r.status is Status.PASS, r.message
    assert "index 3" in r.message


def test_routability() -> None:
    assert is_routable(Gid(3, V4_MAPPED, "RoCE v2"))
    assert not is_routable(Gid(1, LINK_LOCAL, "RoCE v2"))
    # an IPv4 link-local (169.254/16) address does not route either
    assert not is_routable(Gid(3, "0000:0000:0000:0000:0000:ffff:a9fe:0101", "RoCE v2"))
    assert not is_routable(Gid(3, "not-a-gid", "RoCE v2"))


@given(st.text(max_size=60))
def test_any_gid_text_is_judged_without_crashing(text: str) -> None:
    s = sample((Gid(1, text, "RoCE v2", "ens1np0"),))
    r = judge(CheckId.RDMA_GID_ROCE_V2, s, s)
    assert r.status in (Status.PASS, Status.FAIL)


def test_iwarp_and_infiniband_ports_are_not_applicable() -> None:
    s = sample((), node_type="4: RNIC")
    for check in (CheckId.RDMA_GID_ROCE_V2, CheckId.RDMA_GID_INDEX, CheckId.MTU_ROCE):
        r = judge(check, s, s)
        assert r.status is Status.SKIP
        assert r.message.startswith("not applicable: iWARP port"), r.message
    ib = sample((Gid(0, LINK_LOCAL),), link_layer="InfiniBand")
    r = judge(CheckId.RDMA_GID_ROCE_V2, ib, ib, linkLayer="InfiniBand")
    assert r.status is Status.SKIP and r.message.startswith("not applicable: InfiniBand port")


def test_a_gid_that_moved_after_a_flap_is_reported() -> None:
    before = sample(v1v2(0, LINK_LOCAL) + v1v2(2, V4_MAPPED))
    # after the flap the kernel re-added the address after a second one: index 3 -> 5
    other = "0000:0000:0000:0000:0000:ffff:0a0a:010c"
    after = sample(v1v2(0, LINK_LOCAL) + v1v2(2, other) + v1v2(4, V4_MAPPED))
    r = judge(CheckId.RDMA_GID_INDEX, before, after)
    assert r.status is Status.WARN
    assert "moved from index 3 to 5" in r.message
    assert r.observed == {"gidIndex": 5, "previousGidIndex": 3, "gid": "10.10.1.11"}
    # a new address at a new index is reported too
    renumbered = sample(v1v2(0, LINK_LOCAL) + v1v2(6, other))
    r = judge(CheckId.RDMA_GID_INDEX, before, renumbered)
    assert r.status is Status.WARN and "changed from 10.10.1.11 at index 3" in r.message


def test_a_stable_gid_passes_and_a_stated_index_is_enforced() -> None:
    s = sample(v1v2(0, LINK_LOCAL) + v1v2(2, V4_MAPPED))
    assert judge(CheckId.RDMA_GID_INDEX, s, s).status is Status.PASS
    assert judge(CheckId.RDMA_GID_INDEX, s, s, roceV2GidIndex=3).status is Status.PASS
    r = judge(CheckId.RDMA_GID_INDEX, s, s, roceV2GidIndex=1)
    assert r.status is Status.FAIL
    assert "GID index 1 holds RoCE v2 fe80::9e63:c0ff:feab:ed5a" in r.message
    assert "NCCL_IB_GID_INDEX=1" in r.message


def test_gid_index_needs_two_samples_unless_an_index_is_stated() -> None:
    s = sample(v1v2(0, LINK_LOCAL) + v1v2(2, V4_MAPPED))
    assert judge(CheckId.RDMA_GID_INDEX, s).status is Status.SKIP
    assert judge(CheckId.RDMA_GID_INDEX, s, roceV2GidIndex=3).status is Status.PASS


def test_no_routable_gid_leaves_the_index_to_gid_roce_v2() -> None:
    s = sample(v1v2(0, LINK_LOCAL))
    r = judge(CheckId.RDMA_GID_INDEX, s, s, roceV2GidIndex=3)
    assert r.status is Status.SKIP and "rdma.gid_roce_v2" in r.message


def test_live_collector_finds_a_gid_that_moved_between_rescans(tmp_path: Path) -> None:
    """Between full GID-table scans the collector re-reads only the slots it saw populated;
    a slot that emptied (the GID moved after a flap) makes it scan the table again."""
    from netval.agent.collect.live import LiveCollector

    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    for f, v in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("link_layer", "Ethernet")):
        (port / f).write_text(v + "\n")

    def put(index: int, gid: str, typ: str | None) -> None:
        (port / f"gids/{index}").write_text(gid + "\n")
        for sub, value in (("types", typ), ("ndevs", "ens1np0" if typ else None)):
            path = port / f"gid_attrs/{sub}/{index}"
            if value is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(value + "\n")

    zero = "0000:0000:0000:0000:0000:0000:0000:0000"
    for i in range(8):
        put(i, zero, None)
    put(0, LINK_LOCAL, "IB/RoCE v1")
    put(1, LINK_LOCAL, "RoCE v2")
    put(2, V4_MAPPED, "IB/RoCE v1")
    put(3, V4_MAPPED, "RoCE v2")
    collector = LiveCollector(sys_root=tmp_path, rdma_cm_root=None, gid_rescan_every=100)
    before = collector.sample()
    put(2, zero, None)
    put(3, zero, None)
    put(4, V4_MAPPED, "IB/RoCE v1")
    put(5, V4_MAPPED, "RoCE v2")
    after = collector.sample()
    collector.close()
    r = judge(CheckId.RDMA_GID_INDEX, before, after)
    assert r.status is Status.WARN and "moved from index 3 to 5" in r.message
