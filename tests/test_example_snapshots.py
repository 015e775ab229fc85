"""Every bundled snapshot fails exactly the checks its fault explains, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netval.cli import main
from netval.model import Report, Status

SNAPSHOTS = Path(__file__).resolve().parent.parent / "examples" / "snapshots"

# Each fault and the checks it must fail (fail or error), nothing more, nothing less.
EXPECTED_FAILING = {
    "healthy-roce": set(),
    "fault-mtu-1500": {"mtu.interface", "mtu.roce"},
    # Without PFC the lossless class drops: discards grow and RoCE retransmits.
    "fault-pfc-disabled": {"pfc.priorities", "pfc.discards", "rdma.errors"},
    "fault-ecn-np-disabled": {"ecn.np_enabled", "ecn.cnp_flow"},
    "fault-ecn-rp-disabled": {"ecn.rp_enabled", "ecn.cnp_flow"},
    # QPs on the dead port time out (local_ack_timeout_err) while the link flaps.
    "fault-link-down": {
        "link.carrier",
        "link.flaps",
        "link.phy_errors",  # link_down_events_phy
        "rdma.port_state",
        "rdma.errors",
    },
    "fault-roce-v1-only": {"rdma.gid_roce_v2"},
    "fault-degraded-rate": {"rdma.rate"},
    "fault-pause-storm": {"pfc.pause_storm"},
    # issue 11: judged with the checks.yaml in their directory
    "healthy-infiniband": set(),
    "fault-ib-symbol-errors": {"ib.port_errors"},
    "excluded-spare-port": set(),
    # Broadcom, Intel and RoCE LAG nodes (examples/snapshots/make_vendor_snapshots.py)
    "healthy-bnxt-thor2": set(),
    # Firmware NP off on bnxt_re0 (newer bnxt_re, mlx5-style counter names)
    "fault-bnxt-ecn-np-disabled": {"ecn.cnp_flow"},
    "healthy-intel-e810": set(),
    "healthy-roce-lag-renamed": set(),
    # EFA and IPoIB-down InfiniBand nodes (examples/snapshots/make_transport_snapshots.py)
    "healthy-efa-p4d": set(),
    # SRD timeouts toward unresponsive peers, nothing wrong on the port: a warning naming
    # the requester side (EXPECTED_ATTRIBUTION), no failure.
    "fault-efa-retrans-timeouts": set(),
    "healthy-ib-ipoib-down": set(),
    "fault-ib-ipoib-down-port-down": {"rdma.port_state"},
    # AMD Pensando Pollara 400 (examples/snapshots/make_ionic_snapshot.py)
    "healthy-ionic-pollara": set(),
    # Who rdma.errors points at (examples/snapshots/make_attribution_snapshots.py): a peer
    # died, so this node's requester QPs time out; nothing on its own ports fails.
    "victim-peer-down-roce": set(),
    "victim-irdma-gen3-retransmits": set(),
    # 400 retransmits/s on irdma0 and a bad optic on its port: the port explains them.
    "fault-irdma-e810-crc-retransmits": {"link.phy_errors", "rdma.errors"},
}
# The subject each fault is expected to pin the failure on.
EXPECTED_SUBJECTS = {
    "fault-mtu-1500": {"ens2np0", "mlx5_1/1"},
    "fault-ecn-np-disabled": {"ens1np0/prio3", "mlx5_0/1"},
    "fault-ecn-rp-disabled": {"ens1np0/prio3", "mlx5_0/1"},
    "fault-link-down": {"ens2np0", "mlx5_1/1"},
    "fault-roce-v1-only": {"mlx5_0/1"},
    "fault-degraded-rate": {"mlx5_1/1"},
    "fault-ib-symbol-errors": {"mlx5_1/1"},
    "fault-bnxt-ecn-np-disabled": {"bnxt_re0/1"},
    "fault-ib-ipoib-down-port-down": {"mlx5_1/1"},
    "fault-irdma-e810-crc-retransmits": {"ens801f0", "irdma0/1"},
}

# rdma.errors per subject: (status, observed.attribution, observed.evidence) where it is not
# a pass (docs/checks.md, "Attribution").
EXPECTED_ATTRIBUTION: dict[str, dict[str, tuple[str, str, list[str] | None]]] = {
    "fault-pfc-disabled": {
        "mlx5_0/1": ("fail", "local", ["pfc.discards"]),
        "mlx5_1/1": ("fail", "local", ["pfc.discards"]),
    },
    "fault-link-down": {
        "mlx5_1/1": (
            "fail",
            "local",
            ["rdma.port_state", "link.carrier", "link.flaps", "link.phy_errors"],
        ),
    },
    "fault-efa-retrans-timeouts": {"rdmap144s27/1": ("warn", "requester", None)},
    "victim-peer-down-roce": {
        "mlx5_0/1": ("warn", "requester", None),
        "mlx5_1/1": ("warn", "requester", None),
    },
    "victim-irdma-gen3-retransmits": {"irdma0/1": ("warn", "requester", None)},
    "fault-irdma-e810-crc-retransmits": {"irdma0/1": ("fail", "local", ["link.phy_errors"])},
}


def probe_json(
    name: str, capsys: pytest.CaptureFixture[str], *, bundled_config: bool = True
) -> tuple[int, Report]:
    """Judge a bundled snapshot, with the checks.yaml it carries (if any)."""
    config = SNAPSHOTS / name / "checks.yaml"
    extra = ["--config", str(config)] if bundled_config and config.exists() else []
    code = main(["probe", "--from", str(SNAPSHOTS / name), "--output", "json", *extra])
    out = capsys.readouterr().out
    return code, Report.model_validate_json(out)


def test_every_bundled_snapshot_is_covered() -> None:
    bundled = {p.name for p in SNAPSHOTS.iterdir() if (p / "meta.json").exists()}
    assert bundled == set(EXPECTED_FAILING)


@pytest.mark.parametrize("name", sorted(EXPECTED_FAILING))
def test_snapshot_fails_exactly_its_checks(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = probe_json(name, capsys)
    failing = {r.check.value for r in report.results if r.status.is_bad}
    assert failing == EXPECTED_FAILING[name]
    assert code == (1 if failing else 0)
    warned = any(r.status is Status.WARN for r in report.results)
    assert report.status == (Status.FAIL if failing else Status.WARN if warned else Status.PASS)
    if name in EXPECTED_SUBJECTS:
        assert {r.subject for r in report.results if r.status.is_bad} == EXPECTED_SUBJECTS[name]
    for r in report.results:
        if r.status.is_bad:
            # Every non-pass result says what was seen and what was expected.
            assert r.message and r.expected, r


@pytest.mark.parametrize("name", sorted(EXPECTED_ATTRIBUTION))
def test_rdma_errors_name_who_they_point_at(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, report = probe_json(name, capsys)
    seen = {
        r.subject: (r.status.value, r.observed.get("attribution"), r.observed.get("evidence"))
        for r in report.results
        if r.check.value == "rdma.errors" and r.status is not Status.PASS
    }
    assert seen == EXPECTED_ATTRIBUTION[name]


def test_healthy_node_passes_everything_without_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = probe_json("healthy-roce", capsys)
    # The InfiniBand-only checks do not apply to a RoCE node, and say so.
    not_applicable = {"mtu.ipoib", "ib.port_errors"}
    statuses = {r.status for r in report.results if r.check.value not in not_applicable}
    assert statuses == {Status.PASS}
    assert {r.status for r in report.results if r.check.value in not_applicable} == {Status.SKIP}
    judged = {r.check.value for r in report.results if r.status is Status.PASS}
    assert judged == {
        "link.carrier", "link.flaps", "link.phy_errors", "mtu.interface", "mtu.roce",
        "rdma.devices", "rdma.port_state", "rdma.link_layer", "rdma.rate", "rdma.gid_roce_v2",
        "rdma.gid_index", "rdma.errors", "pfc.priorities", "pfc.trust", "pfc.pause_storm", "pfc.discards",
        "pfc.global_pause", "ecn.np_enabled", "ecn.rp_enabled", "ecn.cnp_flow",
    }  # fmt: skip
    subjects = {r.subject for r in report.results}
    assert {"ens1np0", "ens2np0", "mlx5_0/1", "mlx5_1/1", "ens1np0/prio3"} <= subjects
    assert report.node == "gpu-a01"


def test_json_output_is_the_report_schema(capsys: pytest.CaptureFixture[str]) -> None:
    main(["probe", "--from", str(SNAPSHOTS / "fault-mtu-1500"), "--output", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "netval.io/report/v1"
    assert set(doc) == {
        "schema", "validation", "generation", "node", "startedAt", "durationMs", "status",
        "results", "traceparent", "facts",
    }  # fmt: skip
    mtu = next(r for r in doc["results"] if r["check"] == "mtu.interface" and r["status"] == "fail")
    assert mtu == {
        "check": "mtu.interface",
        "subject": "ens2np0",
        "status": "fail",
        "message": "MTU 1500, expected 9000",
        "observed": {"mtu": 1500},
        "expected": {"mtu": 9000},
    }
    roce = next(r for r in doc["results"] if r["check"] == "mtu.roce" and r["status"] == "fail")
    assert roce["observed"]["roceMTU"] == 1024


def test_table_output_groups_by_device(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["probe", "--from", str(SNAPSHOTS / "fault-ecn-np-disabled")])
    out = capsys.readouterr().out
    assert code == 1
    lines = out.splitlines()
    assert "ens1np0" in lines and "mlx5_0" in lines
    assert any("ecn.cnp_flow" in line and "[port 1]" in line for line in lines)
    fail_lines = [line for line in lines if "FAIL" in line and "ecn." in line]
    assert any("ecn.np_enabled" in line and "[prio3]" in line for line in fail_lines)
    assert "\x1b[" not in out  # no colour codes when stdout is not a terminal
    assert lines[-1].startswith("FAIL: ")


def test_config_changes_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same snapshot judged against a 1500-byte fabric: now the 9000 port is wrong."""
    cfg = tmp_path / "nv.yaml"
    cfg.write_text(
        "apiVersion: netval.io/v1alpha1\nkind: NetworkValidation\nmetadata: {name: pool-a}\n"
        "spec:\n  checks:\n    mtu: {interfaceMTU: 1500, roceMTU: 1024}\n"
    )
    code = main(
        ["probe", "--from", str(SNAPSHOTS / "fault-mtu-1500"), "--config", str(cfg),
         "--output", "json"]
    )  # fmt: skip
    report = Report.model_validate_json(capsys.readouterr().out)
    assert code == 1
    assert report.validation == "pool-a"
    bad = {(r.check.value, r.subject) for r in report.results if r.status.is_bad}
    assert bad == {("mtu.interface", "ens1np0")}


def test_pfc_and_ecn_on_different_priorities_is_a_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Healthy node (PFC and ECN on 3) judged by a spec that moves PFC to 4: both break."""
    cfg = tmp_path / "checks.yaml"
    cfg.write_text("pfc: {priorities: [4]}\n")
    main(["probe", "--from", str(SNAPSHOTS / "healthy-roce"), "--config", str(cfg),
          "--output", "json"])  # fmt: skip
    report = Report.model_validate_json(capsys.readouterr().out)
    bad = {(r.check.value, r.subject) for r in report.results if r.status.is_bad}
    assert ("pfc.priorities", "ens1np0") in bad
    assert ("ecn.np_enabled", "ens1np0/prio4") in bad
    assert ("ecn.rp_enabled", "ens2np0/prio4") in bad


# -- issue 11: InfiniBand and selection snapshots --------------------------------------------


def test_infiniband_node_is_judged_by_ib_checks(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = probe_json("healthy-infiniband", capsys)
    by = {(r.check.value, r.subject): r for r in report.results}
    assert by[("ib.port_errors", "mlx5_0/1")].status is Status.PASS
    ipoib = by[("mtu.ipoib", "ibp154s0")]
    assert ipoib.status is Status.PASS and ipoib.observed == {"mtu": 4092, "mode": "datagram"}
    # the IPoIB netdevs are not held to the Ethernet interfaceMTU (9000)
    assert not any(r.check.value == "mtu.interface" and r.subject.startswith("ibp")
                   for r in report.results)  # fmt: skip
    for check in ("mtu.roce", "rdma.gid_roce_v2", "pfc.priorities", "ecn.cnp_flow"):
        skips = [r for r in report.results if r.check.value == check]
        assert skips and all(r.status is Status.SKIP for r in skips), check
        assert all(r.message.startswith("not applicable: InfiniBand port") for r in skips), skips


def test_symbol_error_burst_names_the_counters(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = probe_json("fault-ib-symbol-errors", capsys)
    (bad,) = [r for r in report.results if r.status.is_bad]
    assert bad.observed["symbol_error"] == 1873
    assert bad.observed["port_rcv_errors"] == 31
    assert bad.expected["maxCounterDeltas"]["symbol_error"] == 10  # type: ignore[index,call-overload]
    assert "symbol_error +1873 (max 10)" in bad.message


def test_infiniband_node_without_its_config_fails_only_the_link_layer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = probe_json("healthy-infiniband", capsys, bundled_config=False)
    assert {r.check.value for r in report.results if r.status.is_bad} == {"rdma.link_layer"}


def test_spare_port_fails_the_node_unless_admin_down_is_excused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, report = probe_json("excluded-spare-port", capsys, bundled_config=False)
    bad = {(r.check.value, r.subject) for r in report.results if r.status.is_bad}
    assert bad == {
        ("link.carrier", "ens3np0"),
        ("rdma.port_state", "mlx5_2/1"),
        ("rdma.gid_roce_v2", "mlx5_2/1"),  # link-local GIDs only: no address on a spare
    }
    gid = next(
        r for r in report.results if (r.check.value, r.subject) == ("rdma.gid_roce_v2", "mlx5_2/1")
    )
    assert "no IP address on the netdev ens3np0" in gid.message
    _, report = probe_json("excluded-spare-port", capsys)
    skips = [r for r in report.results if r.status is Status.SKIP and "mlx5_2" in r.subject]
    assert [r.check.value for r in skips] == ["rdma.port_state"]
    assert "administratively down" in skips[0].message


def test_every_node_check_id_has_its_section_in_the_checks_reference() -> None:
    from netval.agent.checks import NODE_CHECKS

    doc = (SNAPSHOTS.parent.parent / "docs" / "checks.md").read_text(encoding="utf-8")
    missing = [c.value for c in NODE_CHECKS if f"\n## {c.value}\n" not in doc]
    assert missing == []
