"""Pure checks on typed snapshots: deltas, LAG, unknown drivers, missing data."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from netval.agent.checks import run_node_checks
from netval.agent.checks.counters import delta
from netval.agent.checks.mtu import active_roce_mtu
from netval.agent.collect.snapshot_dir import load_snapshot
from netval.model import (
    CheckResult,
    Checks,
    Dcb,
    DcbApp,
    Gid,
    Netdev,
    NetworkValidationSpec,
    NodeSnapshot,
    RdmaDevice,
    RdmaPort,
    Sample,
    Status,
)
from netval.model.duration import parse_duration

SNAPSHOTS = Path(__file__).resolve().parent.parent / "examples" / "snapshots"


@pytest.mark.parametrize(
    ("first", "last", "width", "expected"),
    [
        (10, 15, 64, 5),
        (5, 5, 64, 0),
        (None, 5, 64, None),
        (5, None, 64, None),
        # a 32-bit counter wrapped: 0xFFFFFFF0 -> 0x10 is 0x20 of growth
        (0xFFFF_FFF0, 0x10, 32, 0x20),
        # a 32-bit counter whose "wrap" would be over half its range was reset instead
        (1000, 7, 32, 7),
        # a 64-bit counter that went backwards was reset (driver reload): count what we know
        (1000, 7, 64, 7),
        ((1 << 40), 7, 64, 7),
    ],
)
def test_counter_delta(
    first: int | None, last: int | None, width: int, expected: int | None
) -> None:
    assert delta(first, last, width=width) == expected


@pytest.mark.parametrize(
    ("mtu", "roce"), [(9000, 4096), (4200, 4096), (4191, 2048), (1500, 1024), (1280, 1024),
                      (1120, 1024), (1119, 512), (300, None)]
)  # fmt: skip
def test_active_roce_mtu(mtu: int, roce: int | None) -> None:
    assert active_roce_mtu(mtu) == roce


def _bad(results: list[CheckResult]) -> set[tuple[str, str]]:
    return {(r.check.value, r.subject) for r in results if r.status.is_bad}


def _by(results: list[CheckResult], check: str) -> list[CheckResult]:
    return [r for r in results if r.check.value == check]


def _roce_port(device: str, ndev: str, hw: dict[str, int]) -> RdmaPort:
    return RdmaPort(
        device=device,
        port=1,
        state="4: ACTIVE",
        phys_state="5: LinkUp",
        rate="400 Gb/sec (4X NDR)",
        link_layer="Ethernet",
        gids=(Gid(3, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2", ndev),),
        hw_counters=hw,
    )


def _slave(name: str, driver: str | None, ethtool: dict[str, int], ecn: bool = True) -> Netdev:
    return Netdev(
        name=name,
        mtu=9000,
        carrier=1,
        operstate="up",
        carrier_changes=2,
        driver=driver,
        ecn_np={p: p == 3 for p in range(8)} if ecn else {},
        ecn_rp={p: p == 3 for p in range(8)} if ecn else {},
        ethtool=ethtool,
        dcb=Dcb(frozenset({3}), app=(DcbApp("dscp", 26, 3),)),
    )


def _lag_sample(discards: int, ignored: int, prio_discards: int = 0) -> Sample:
    stats = {
        "rx_discards_phy": discards,
        "tx_discards_phy": 0,
        "rx_prio3_discards": prio_discards,
        "rx_prio3_pause_duration": 0,
        "tx_prio3_pause_duration": 0,
        "tx_pause_storm_warning_events": 0,
        "tx_pause_storm_error_events": 0,
    }
    hw = {
        "np_ecn_marked_roce_packets": 0,
        "np_cnp_sent": 0,
        "rp_cnp_handled": 0,
        "rp_cnp_ignored": ignored,
    }
    bond = Netdev(
        name="bond0", mtu=9000, carrier=1, operstate="up", carrier_changes=4,
        bond_slaves=("ens1f0np0", "ens1f1np1"),
    )  # fmt: skip
    return Sample(
        netdevs={
            "bond0": bond,
            "ens1f0np0": _slave("ens1f0np0", "mlx5_core", stats),
            "ens1f1np1": _slave(
                "ens1f1np1", "mlx5_core", dict(stats, rx_discards_phy=0, rx_prio3_discards=0)
            ),
        },
        rdma={
            "mlx5_bond_0": RdmaDevice(
                "mlx5_bond_0", ports={1: _roce_port("mlx5_bond_0", "bond0", hw)}
            )
        },
    )


def test_roce_lag_judges_bond_for_link_and_slaves_for_qos() -> None:
    snap = NodeSnapshot("n1", "now", 10.0, (_lag_sample(0, 0), _lag_sample(25, 3, 25)))
    results = run_node_checks(snap, Checks())
    assert {r.subject for r in _by(results, "link.carrier")} == {"bond0"}
    assert {r.subject for r in _by(results, "mtu.interface")} == {"bond0"}
    assert {r.subject for r in _by(results, "pfc.priorities")} == {"ens1f0np0", "ens1f1np1"}
    assert {r.subject for r in _by(results, "ecn.np_enabled")} == {
        "ens1f0np0/prio3",
        "ens1f1np1/prio3",
    }
    # the discards happened on one slave, the ignored CNPs on the LAG's RDMA port
    assert _bad(results) == {("pfc.discards", "ens1f0np0"), ("ecn.cnp_flow", "mlx5_bond_0/1")}
    discards = next(r for r in _by(results, "pfc.discards") if r.subject == "ens1f0np0")
    assert discards.observed["rx_prio3_discards"] == 25
    assert "rx_prio3_discards +25" in discards.message


def test_unknown_driver_counter_checks_skip_never_fail() -> None:
    def sample(discards: int) -> Sample:
        # HiSilicon hns3/hns_roce: a real RoCE NIC without a counter map.
        netdev = _slave("eth5", "hns3", {"rx_discards_phy": discards}, ecn=False)
        port = _roce_port("hns_0", "eth5", {})
        return Sample({"eth5": netdev}, {"hns_0": RdmaDevice("hns_0", ports={1: port})})

    results = run_node_checks(NodeSnapshot("n1", "now", 10.0, (sample(0), sample(999))), Checks())
    assert _bad(results) == set()
    for check in ("pfc.discards", "pfc.pause_storm", "rdma.errors", "ecn.cnp_flow",
                  "ecn.np_enabled"):  # fmt: skip
        (r,) = _by(results, check)
        assert r.status is Status.SKIP, r
    assert "driver hns3" in _by(results, "pfc.discards")[0].message


def test_single_sample_skips_counter_checks_with_reason() -> None:
    snap = load_snapshot(SNAPSHOTS / "fault-pfc-disabled")
    one = NodeSnapshot(snap.node, snap.captured_at, snap.interval_seconds, snap.samples[-1:])
    results = run_node_checks(one, Checks())
    assert _bad(results) == {("pfc.priorities", "ens1np0"), ("pfc.priorities", "ens2np0")}
    assert all(
        r.status is Status.SKIP and "two samples" in r.message
        for r in _by(results, "rdma.errors") + _by(results, "pfc.discards")
    )


def test_trust_follows_the_dcb_app_table() -> None:
    assert Dcb(frozenset({3}), app=(DcbApp("dscp", 26, 3),)).trust == "dscp"
    assert Dcb(frozenset({3}), app=(DcbApp("ethertype", 0x8915, 3),)).trust == "pcp"
    assert Dcb(frozenset()).trust == "pcp"


def test_rate_judged_against_stated_minimum() -> None:
    snap = load_snapshot(SNAPSHOTS / "healthy-roce")
    results = run_node_checks(snap, Checks.model_validate({"rdma": {"minRateGbps": 800}}))
    assert _bad(results) == {("rdma.rate", "mlx5_0/1"), ("rdma.rate", "mlx5_1/1")}
    assert (
        "expected at least 800 Gb/s (checks.rdma.minRateGbps)"
        in _by(results, "rdma.rate")[0].message
    )


def test_missing_expected_rdma_device_fails() -> None:
    snap = load_snapshot(SNAPSHOTS / "healthy-roce")
    results = run_node_checks(
        snap, Checks.model_validate({"rdma": {"devices": ["mlx5_0", "mlx5_4"]}})
    )
    assert _bad(results) == {("rdma.devices", "mlx5_4")}


def test_infiniband_expectation_on_roce_ports() -> None:
    snap = load_snapshot(SNAPSHOTS / "healthy-roce")
    results = run_node_checks(snap, Checks.model_validate({"rdma": {"linkLayer": "InfiniBand"}}))
    assert _bad(results) == {("rdma.link_layer", "mlx5_0/1"), ("rdma.link_layer", "mlx5_1/1")}


def test_host_without_rdma_skips_with_reasons_and_judges_named() -> None:
    eth0 = Netdev(name="eth0", mtu=1500, carrier=1, operstate="up", carrier_changes=1)
    snap = NodeSnapshot("vm", "now", 1.0, (Sample({"eth0": eth0}, {}), Sample({"eth0": eth0}, {})))
    plain = run_node_checks(snap, Checks())
    assert {r.status for r in plain} == {Status.SKIP}
    assert {r.subject for r in plain} == {"vm"}
    named = run_node_checks(
        snap, Checks.model_validate({"mtu": {"interfaces": ["eth0"], "interfaceMTU": 1500},
                                     "link": {"interfaces": ["eth0"]}})
    )  # fmt: skip
    assert {(r.check.value, r.status) for r in named if r.subject == "eth0"} == {
        ("link.carrier", Status.PASS),
        ("link.flaps", Status.PASS),
        ("mtu.interface", Status.PASS),
    }


def test_spec_bounds_and_defaults() -> None:
    spec = NetworkValidationSpec.model_validate({})
    assert spec.interval_seconds == 30
    assert spec.checks.ecn_priorities == [3]
    assert spec.checks.mtu.interface_mtu == 9000
    assert parse_duration("1m30s") == 90
    for bad in ({"interval": "4s"}, {"interval": "soon"}, {"checks": {"pfc": {"trust": "cos"}}},
                {"gating": {"maxUnhealthyPercent": 101}}, {"checks": {"storage": {"endpoints": [
                    {"name": "a", "protocol": "tcp", "host": "h"},
                    {"name": "a", "protocol": "nfs", "host": "h"}]}}}):  # fmt: skip
        with pytest.raises(ValidationError):
            NetworkValidationSpec.model_validate(bad)


def test_lossy_class_drops_do_not_fail_the_lossless_check() -> None:
    """Port-level drops with clean per-priority counters: reported, not judged."""
    snap = NodeSnapshot("n1", "now", 10.0, (_lag_sample(0, 0), _lag_sample(500, 0)))
    results = run_node_checks(snap, Checks())
    discards = next(r for r in _by(results, "pfc.discards") if r.subject == "ens1f0np0")
    # _lag_sample grows rx_discards_phy only: the lossless priority's own counter is flat
    assert discards.status is Status.PASS
    assert discards.observed["rx_discards_phy"] == 500
    assert discards.observed["total"] == 0


def test_rate_compares_only_ports_of_the_same_card_model() -> None:
    def device(name: str, board: str, rate: str, ndev: str) -> RdmaDevice:
        port = RdmaPort(
            device=name, port=1, state="4: ACTIVE", phys_state="5: LinkUp", rate=rate,
            link_layer="Ethernet", gids=(Gid(1, "fe80:0000:0000:0000:0000:0000:0000:0001",
                                         "RoCE v2", ndev),),
        )  # fmt: skip
        return RdmaDevice(name, board_id=board, ports={1: port})

    rdma = {
        "mlx5_0": device("mlx5_0", "MT_0000000838", "400 Gb/sec (4X NDR)", "ens1np0"),
        "mlx5_1": device("mlx5_1", "MT_0000000838", "200 Gb/sec (4X HDR)", "ens2np0"),
        "mlx5_2": device("mlx5_2", "MT_0000000359", "200 Gb/sec (4X HDR)", "ens3np0"),
    }
    snap = NodeSnapshot("n1", "now", 10.0, (Sample({}, rdma), Sample({}, rdma)))
    rate = {r.subject: r.status for r in _by(run_node_checks(snap, Checks()), "rdma.rate")}
    assert rate == {"mlx5_0/1": Status.PASS, "mlx5_1/1": Status.FAIL, "mlx5_2/1": Status.PASS}


def test_carrier_up_but_not_operationally_up() -> None:
    v0 = Netdev(name="v0", mtu=9000, carrier=1, operstate="dormant", carrier_changes=2)
    snap = NodeSnapshot("n1", "now", 1.0, (Sample({"v0": v0}, {}), Sample({"v0": v0}, {})))
    results = run_node_checks(snap, Checks.model_validate({"link": {"interfaces": ["v0"]}}))
    (carrier,) = _by(results, "link.carrier")
    assert carrier.status is Status.FAIL
    assert carrier.message == "carrier up but operstate dormant; expected operstate up"
