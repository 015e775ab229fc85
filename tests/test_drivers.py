"""Driver discovery, per-driver counter maps, ECN mode and odd sysfs input, on snapshots.

Each case starts from a bundled snapshot (or a copy of one, edited the way a real node
differs) and runs the checks through the snapshot loader, as `netval probe --from` does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netval.agent.checks import run_node_checks
from netval.agent.collect.snapshot_dir import SnapshotError, load_snapshot
from netval.cli import main
from netval.model import (
    CheckResult,
    Checks,
    Netdev,
    NodeSnapshot,
    Sample,
    Status,
)
from node_kit import roce_sample

SNAPSHOTS = Path(__file__).resolve().parent.parent / "examples" / "snapshots"
LAG = "healthy-roce-lag-renamed"
COUNTER_CHECKS = ("rdma.errors", "ecn.cnp_flow")


def _by(results: list[CheckResult], check: str) -> list[CheckResult]:
    return [r for r in results if r.check.value == check]


def _bad(results: list[CheckResult]) -> set[tuple[str, str]]:
    return {(r.check.value, r.subject) for r in results if r.status.is_bad}


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(SNAPSHOTS / name, dst)
    return dst


def _samples(root: Path) -> list[Path]:
    return sorted((root / "samples").iterdir())


def _run(root: Path, checks: Checks | None = None) -> list[CheckResult]:
    return run_node_checks(load_snapshot(root), checks or Checks())


# -- driver discovery -----------------------------------------------------------------------


def test_renamed_lag_device_is_judged_from_its_own_pci_device() -> None:
    results = _run(SNAPSHOTS / LAG)
    for check in COUNTER_CHECKS:
        (r,) = _by(results, check)
        assert r.subject == "rocep129s0f0/1"
        assert r.status is Status.PASS, r
    (cnp,) = _by(results, "ecn.cnp_flow")
    assert cnp.observed["driver"] == "mlx5_core"
    assert cnp.observed["driverFrom"] == "rocep129s0f0 device/uevent"
    # PFC/ECN live on the slaves, link and MTU on the bond.
    assert {r.subject for r in _by(results, "pfc.priorities")} == {"ens1f0np0", "ens1f1np1"}
    assert {r.subject for r in _by(results, "mtu.interface")} == {"bond0"}


def test_lag_without_rdma_device_driver_falls_back_to_bond_slaves(tmp_path: Path) -> None:
    """A 1.0 recording has no RDMA device/uevent; the bond has no device: the slaves say."""
    root = _copy(tmp_path, LAG)
    for sample in _samples(root):
        (sample / "sys/class/infiniband/rocep129s0f0/device/uevent").unlink()
    results = _run(root)
    (cnp,) = _by(results, "ecn.cnp_flow")
    assert cnp.status is Status.PASS
    assert cnp.observed["driverFrom"] == "ens1f0np0 device/uevent (slave of bond0)"


def test_lag_with_nothing_to_go_on_skips_saying_what_was_looked_at(tmp_path: Path) -> None:
    root = _copy(tmp_path, LAG)
    for sample in _samples(root):
        (sample / "sys/class/infiniband/rocep129s0f0/device/uevent").unlink()
        (sample / "sys/class/net/bond0/bonding/slaves").write_bytes(b"\n")  # empty
    results = _run(root)
    assert _bad(results) == set()
    (cnp,) = _by(results, "ecn.cnp_flow")
    assert cnp.status is Status.SKIP
    assert "rocep129s0f0 has no device/uevent DRIVER=" in cnp.message
    assert "netdev bond0 has no device" in cnp.message
    assert "bond0 lists no bond slaves or lower_* links" in cnp.message


def test_lower_links_stand_in_for_bonding_slaves(tmp_path: Path) -> None:
    root = _copy(tmp_path, LAG)
    for sample in _samples(root):
        (sample / "sys/class/infiniband/rocep129s0f0/device/uevent").unlink()
        (sample / "sys/class/net/bond0/bonding/slaves").unlink()
        for slave in ("ens1f0np0", "ens1f1np1"):
            (sample / "sys/class/net/bond0" / f"lower_{slave}").mkdir()
    snap = load_snapshot(root)
    assert snap.last.netdevs["bond0"].lower == ("ens1f0np0", "ens1f1np1")
    (cnp,) = _by(run_node_checks(snap, Checks()), "ecn.cnp_flow")
    assert cnp.observed["driverFrom"] == "ens1f0np0 device/uevent (slave of bond0)"


def test_old_format_snapshot_still_loads_and_new_minors_are_read(tmp_path: Path) -> None:
    assert json.loads((SNAPSHOTS / "healthy-roce/meta.json").read_text())["format"] == (
        "netval-snapshot/1"
    )
    assert load_snapshot(SNAPSHOTS / "healthy-roce").last.rdma["mlx5_0"].driver is None
    root = _copy(tmp_path, "healthy-intel-e810")
    meta = json.loads((root / "meta.json").read_text())
    for fmt, ok in [("netval-snapshot/1.9", True), ("netval-snapshot/2", False),
                    ("netval-snapshot/1.x", False), ("netval-snapshot/10", False)]:  # fmt: skip
        (root / "meta.json").write_text(json.dumps({**meta, "format": fmt}))
        if ok:
            assert load_snapshot(root).node == "cpu-s01"
        else:
            with pytest.raises(SnapshotError, match="unsupported"):
                load_snapshot(root)


# -- per-driver counter maps ----------------------------------------------------------------


def test_bnxt_old_and_mlx5_style_names_are_both_judged() -> None:
    old = _run(SNAPSHOTS / "healthy-bnxt-thor2")
    new = _run(SNAPSHOTS / "fault-bnxt-ecn-np-disabled")
    for results in (old, new):
        for r in _by(results, "rdma.errors"):
            assert r.status is Status.PASS, r
    (cnp_old,) = [r for r in _by(old, "ecn.cnp_flow") if r.subject == "bnxt_re0/1"]
    assert cnp_old.observed["counters"] == ["rx_ecn_marked_pkts", "tx_cnp_pkts", "rx_cnp_pkts"]
    assert cnp_old.observed["cnpIgnored"] is None  # bnxt_re has no such counter
    bad = [r for r in _by(new, "ecn.cnp_flow") if r.status is Status.FAIL]
    assert [r.subject for r in bad] == ["bnxt_re0/1"]
    assert bad[0].observed["counters"] == [
        "np_ecn_marked_roce_packets",
        "np_cnp_pkts",
        "rp_cnp_handled",
    ]
    (pause,) = [r for r in _by(old, "pfc.pause_storm") if r.subject == "ens1f0np0/prio3"]
    assert pause.status is Status.PASS and pause.observed["rxPausePercent"] == 0.039


def test_intel_e810_skips_what_ice_cannot_measure_by_name() -> None:
    results = _run(SNAPSHOTS / "healthy-intel-e810")
    (pause,) = [r for r in _by(results, "pfc.pause_storm") if r.subject == "ens801f0/prio3"]
    assert pause.status is Status.SKIP
    assert "ice/irdma has no per-priority pause-duration counter" in pause.message
    for check in ("pfc.discards", "pfc.global_pause", "link.phy_errors", "ecn.cnp_flow"):
        assert {r.status for r in _by(results, check)} == {Status.PASS}, check


def test_global_pause_fails_with_zero_drops(tmp_path: Path) -> None:
    """802.3x pause on an E810: drops stay zero, the link is stalled 20 % of the time."""
    root = _copy(tmp_path, "healthy-intel-e810")
    path = _samples(root)[1] / "ethtool/ens801f1.json"
    stats = json.loads(path.read_text())
    stats["link_xoff_rx.nic"] += 61_035  # 2 s of pause quanta at 100G
    path.write_text(json.dumps(stats))
    results = _run(root)
    assert _bad(results) == {("pfc.global_pause", "ens801f1")}
    (r,) = [r for r in _by(results, "pfc.global_pause") if r.status is Status.FAIL]
    assert "link_xoff_rx.nic +61035" in r.message and "stops every traffic class" in r.message
    assert {x.status for x in _by(results, "pfc.discards")} == {Status.PASS}


def test_mlx5_global_pause_duration_is_a_share_of_the_window(tmp_path: Path) -> None:
    root = _copy(tmp_path, "healthy-roce")
    for n, sample in enumerate(_samples(root)):
        path = sample / "ethtool/ens1np0.json"
        stats = json.loads(path.read_text())
        stats.update(rx_global_pause=1000 + 9_000 * n, tx_global_pause=0,
                     rx_global_pause_duration=50_000 + 2_000_000 * n,
                     tx_global_pause_duration=0)  # fmt: skip
        path.write_text(json.dumps(stats))
    (r,) = [r for r in _by(_run(root), "pfc.global_pause") if r.subject == "ens1np0"]
    assert r.status is Status.FAIL
    assert r.observed["pausePercent"] == 20.0
    assert "paused 20% of the window" in r.message


def _typed_node(driver: str, rdma: str, hw: dict[str, int], ethtool: dict[str, int]) -> Sample:
    return roce_sample(
        hw,
        ethtool,
        netdev="enp1s0",
        device=rdma,
        rdma_driver=driver,
        netdev_driver=driver,
        ecn=False,
    )


def _snap(first: Sample, last: Sample) -> NodeSnapshot:
    return NodeSnapshot("n1", "now", 10.0, (first, last))


def test_ionic_firmware_names_are_matched_and_missing_ones_named() -> None:
    hw0 = {"rx_rdma_ecn_pkts": 10, "tx_rdma_cnp_pkts": 9, "rx_rdma_cnp_pkts": 5}
    hw1 = {"rx_rdma_ecn_pkts": 5_010, "tx_rdma_cnp_pkts": 4_700, "rx_rdma_cnp_pkts": 905}
    pause = {"rx_pripause_3_1us_count": 0, "tx_pripause_3_1us_count": 0}
    results = run_node_checks(
        _snap(_typed_node("ionic", "rocep1s0", hw0, pause),
              _typed_node("ionic", "rocep1s0", hw1, pause)), Checks()
    )  # fmt: skip
    (cnp,) = _by(results, "ecn.cnp_flow")
    assert cnp.status is Status.PASS and cnp.observed["cnpSent"] == 4_691
    # A firmware that calls its CNP counter something else: skip, naming the counter.
    del hw1["tx_rdma_cnp_pkts"]
    del hw0["tx_rdma_cnp_pkts"]
    results = run_node_checks(
        _snap(_typed_node("ionic", "rocep1s0", hw0, pause),
              _typed_node("ionic", "rocep1s0", hw1, pause)), Checks()
    )  # fmt: skip
    (cnp,) = _by(results, "ecn.cnp_flow")
    assert cnp.status is Status.SKIP
    assert "ionic congestion counter(s) tx_rdma_cnp_pkts not readable" in cnp.message


def test_efa_says_pfc_and_ecn_do_not_apply() -> None:
    node = _typed_node("efa", "rdmap16s27", {"rx_drops": 0}, {"tx_timeout": 0})
    results = run_node_checks(_snap(node, node), Checks())
    for check in ("pfc.pause_storm", "pfc.global_pause", "ecn.cnp_flow", "ecn.np_enabled"):
        for r in _by(results, check):
            assert r.status is Status.SKIP and "not applicable: EFA" in r.message, r


def test_representor_and_vf_skip_saying_why() -> None:
    vport = {"vport_rx_packets": 10, "vport_tx_packets": 10, "rx_packets": 10}
    node = _typed_node("mlx5_core", "mlx5_3", {"out_of_sequence": 0}, vport)
    results = run_node_checks(_snap(node, node), Checks())
    (r,) = _by(results, "pfc.discards")
    assert r.status is Status.SKIP and "switchdev representor or virtual function" in r.message
    (cnp,) = _by(results, "ecn.cnp_flow")
    assert cnp.status is Status.SKIP
    assert "no congestion counters at all: a VF or representor" in cnp.message


# -- ECN mode and PFC-only / ECN-only fabrics -----------------------------------------------


def test_ecn_mode_none_accepts_zero_cnps() -> None:
    none = Checks.model_validate({"ecn": {"mode": "none"}})
    results = _run(SNAPSHOTS / "fault-ecn-np-disabled", none)
    assert not {c for c, _ in _bad(results)} & {"ecn.np_enabled", "ecn.cnp_flow"}
    for r in _by(results, "ecn.np_enabled"):
        assert r.status is Status.SKIP and "checks.ecn.mode is none" in r.message
    assert {r.status for r in _by(results, "ecn.cnp_flow")} == {Status.PASS}
    assert _by(results, "ecn.cnp_flow")[0].expected["mode"] == "none"


def test_ecn_only_fabric_is_expressible() -> None:
    ecn_only = Checks.model_validate({"pfc": {"priorities": []}, "ecn": {"priorities": [3]}})
    results = _run(SNAPSHOTS / "healthy-intel-e810", ecn_only)
    # The node runs PFC on 3 but the spec says lossy: PFC is then the finding, and drops
    # on a lossy fabric are not.
    assert {c for c, _ in _bad(results)} == {"pfc.priorities"}
    for r in _by(results, "pfc.discards"):
        assert r.status is Status.SKIP and "lossy fabric" in r.message


# -- DCB wording ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "text"),
    [
        ("EOPNOTSUPP", "DCB netlink returned EOPNOTSUPP for enp1s0"),
        ("timeout", "DCB netlink read of enp1s0 failed: timeout"),
        (None, "DCB state of enp1s0 not recorded"),
    ],
)
def test_dcb_skip_says_what_happened(error: str | None, text: str) -> None:
    node = _typed_node("bnxt_en", "bnxt_re0", {}, {})
    netdev = node.netdevs["enp1s0"]
    netdev = Netdev(**{**{f: getattr(netdev, f) for f in netdev.__slots__},
                       "dcb": None, "dcb_error": error})  # fmt: skip
    node = Sample({"enp1s0": netdev}, node.rdma)
    (r,) = _by(run_node_checks(_snap(node, node), Checks()), "pfc.priorities")
    assert r.status is Status.SKIP and text in r.message
    assert "has no DCB netlink support" not in r.message


def test_recorded_dcb_error_reaches_the_check() -> None:
    snap = load_snapshot(SNAPSHOTS / LAG)
    assert snap.last.netdevs["bond0"].dcb_error == "EOPNOTSUPP"


# -- odd sysfs files ------------------------------------------------------------------------


def test_no_pma_counter_skips_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy(tmp_path, "healthy-roce")
    for sample in _samples(root):
        hw = sample / "sys/class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"
        hw.write_bytes(b"N/A (no PMA)\n")
    code = main(["probe", "--from", str(root), "--output", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    (r,) = [r for r in report["results"] if r["check"] == "ecn.cnp_flow" and
            r["subject"] == "mlx5_0/1"]  # fmt: skip
    assert r["status"] == "skip"
    assert "hw_counters/np_cnp_sent reads 'N/A (no PMA)'" in r["message"]


def test_doubled_newlines_and_missing_device_are_not_faults(tmp_path: Path) -> None:
    root = _copy(tmp_path, "healthy-bnxt-thor2")
    for sample in _samples(root):
        (sample / "sys/class/net/ens1f0np0/mtu").write_bytes(b"9000\n\n")
        shutil.rmtree(sample / "sys/class/net/ens2f0np0/device")
    results = _run(root)
    assert _bad(results) == set()
    (r,) = [r for r in _by(results, "pfc.discards") if r.subject == "ens2f0np0"]
    assert r.status is Status.SKIP and "ens2f0np0 has no device/uevent DRIVER=" in r.message
    # The RDMA device's own PCI device still names the driver for its counters.
    (cnp,) = [r for r in _by(results, "ecn.cnp_flow") if r.subject == "bnxt_re1/1"]
    assert cnp.status is Status.PASS and cnp.observed["driverFrom"] == "bnxt_re1 device/uevent"


_BASELINE = {(r.check.value, r.subject, r.status) for r in _run(SNAPSHOTS / "healthy-bnxt-thor2")}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=st.one_of(st.binary(max_size=40), st.text(max_size=30).map(str.encode)),
       counter=st.sampled_from(["rx_cnp_pkts", "to_retransmits", "rx_bytes"]),
       sample=st.integers(0, 1))  # fmt: skip
def test_fuzzed_counter_file_never_crashes_or_fails_elsewhere(
    tmp_path: Path, content: bytes, counter: str, sample: int
) -> None:
    root = tmp_path / "fuzz"  # one copy for all examples; the fuzzed file is restored
    if not root.exists():
        shutil.copytree(SNAPSHOTS / "healthy-bnxt-thor2", root)
    path = _samples(root)[sample] / "sys/class/infiniband/bnxt_re0/ports/1/hw_counters" / counter
    original = path.read_bytes()
    path.write_bytes(content)
    try:
        snap = load_snapshot(root)
    except SnapshotError as exc:
        assert counter in str(exc)  # names the file
        return
    finally:
        path.write_bytes(original)
    results = run_node_checks(snap, Checks())
    others = {(r.check.value, r.subject, r.status) for r in results if r.subject != "bnxt_re0/1"}
    assert others == {x for x in _BASELINE if x[1] != "bnxt_re0/1"}
