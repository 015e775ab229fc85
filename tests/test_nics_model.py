"""The report's `nics` section: what the agent sends (from recorded snapshots of mlx5, bnxt,
irdma, ionic, EFA, InfiniBand and a renamed RoCE LAG), its bounds at the trust boundary
(fuzzed), and which NIC a result's subject is about."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from netval.agent.collect.snapshot_dir import load_snapshot
from netval.agent.nics import node_nics
from netval.model import CheckId, CheckResult, Report, Status
from netval.model.nics import MAX_NETDEVS_PER_NIC, MAX_NICS, Nic, SubjectIndex
from netval.operator.ingest.decode import decode_message
from netval.operator.state.nic_health import judge_nics

SNAPSHOTS = Path(__file__).resolve().parents[1] / "examples" / "snapshots"


def _report(nics: object) -> dict[str, object]:
    return {
        "schema": "netval.io/report/v1", "validation": "pool-a", "generation": 1,
        "node": "gpu-1", "startedAt": datetime.now(UTC).isoformat(), "durationMs": 1.0,
        "status": "pass", "results": [], "nics": nics,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        ("healthy-roce", [("mlx5_0", "0000:1a:00.0", ("ens1np0",)),
                          ("mlx5_1", "0000:9a:00.0", ("ens2np0",))]),
        # a RoCE LAG renamed by udev: one RDMA device, its bond and both slaves
        ("healthy-roce-lag-renamed",
         [("rocep129s0f0", "0000:81:00.0", ("bond0", "ens1f0np0", "ens1f1np1"))]),
        ("healthy-infiniband", [("mlx5_0", "0000:1a:00.0", ("ibp26s0",)),
                                ("mlx5_1", "0000:9a:00.0", ("ibp154s0",))]),
        ("healthy-intel-e810", [("irdma0", "0000:3b:00.0", ("ens801f0",)),
                                ("irdma1", "0000:3b:00.1", ("ens801f1",))]),
        ("healthy-bnxt-thor2", [("bnxt_re0", "0000:41:00.0", ("ens1f0np0",)),
                                ("bnxt_re1", "0000:c1:00.0", ("ens2f0np0",))]),
    ],
)  # fmt: skip
def test_the_agent_ties_device_pci_function_and_netdevs(
    snapshot: str, expected: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    nics = node_nics(load_snapshot(SNAPSHOTS / snapshot).last)
    assert [(n.rdma_device, n.pci_address, n.netdevs) for n in nics] == expected


def test_efa_devices_have_their_pci_function_and_no_netdev() -> None:
    nics = node_nics(load_snapshot(SNAPSHOTS / "healthy-efa-p4d").last)
    assert len(nics) == 4
    assert all(n.netdevs == () and n.pci_address for n in nics)


def test_a_report_round_trips_its_nics_and_leaves_them_out_when_absent() -> None:
    doc = _report([{"rdmaDevice": "mlx5_0", "pciAddress": "0000:1A:00.0", "netdevs": ["eth2"]}])
    report = Report.model_validate(doc)
    assert report.nics is not None and report.nics[0].pci_address == "0000:1a:00.0"
    assert json.loads(report.to_json())["nics"][0]["rdmaDevice"] == "mlx5_0"
    older = Report.model_validate({k: v for k, v in doc.items() if k != "nics"})
    assert "nics" not in json.loads(older.to_json())


@pytest.mark.parametrize(
    "nics",
    [
        [{"rdmaDevice": "mlx5_0"}] * 2,  # listed twice
        [{"rdmaDevice": "mlx5/0"}],
        [{"rdmaDevice": "x" * 65}],
        [{"rdmaDevice": "mlx5_0", "pciAddress": "0000:1a:00"}],
        [{"rdmaDevice": "mlx5_0", "pciAddress": "../../etc"}],
        [{"rdmaDevice": "mlx5_0", "netdevs": ["a-netdev-too-long"]}],
        [{"rdmaDevice": "mlx5_0", "netdevs": ["eth 0"]}],
        [{"rdmaDevice": "mlx5_0", "netdevs": [f"e{i}" for i in range(MAX_NETDEVS_PER_NIC + 1)]}],
        [{"rdmaDevice": f"d{i}"} for i in range(MAX_NICS + 1)],
        [{"rdmaDevice": "mlx5_0", "extra": 1}],
        {"rdmaDevice": "mlx5_0"},
    ],
)
def test_a_hostile_nics_section_is_refused_with_the_report(nics: object) -> None:
    with pytest.raises(ValidationError):
        Report.model_validate(_report(nics))


_NAME = st.one_of(st.text(max_size=80), st.from_regex(r"[a-z0-9_]{1,20}", fullmatch=True))
_NIC = st.fixed_dictionaries(
    {"rdmaDevice": _NAME},
    optional={
        "pciAddress": st.one_of(st.none(), _NAME,
                                st.from_regex(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9]",
                                              fullmatch=True)),
        "netdevs": st.lists(_NAME, max_size=12),
        "deep": st.recursive(st.none(), lambda c: st.lists(c, max_size=2), max_leaves=20),
    },
)  # fmt: skip


_RESULT = st.fixed_dictionaries({
    "check": st.sampled_from(["rdma.port_state", "mtu.interface", "pfc.pause_storm", "peer.loss",
                              "storage.reachable"]),
    "subject": st.one_of(st.from_regex(r"(mlx5_[0-3]|ens[0-3]np0|bond0|gpu-1)(/[a-z0-9]{1,5})?",
                                       fullmatch=True), st.text(min_size=1, max_size=30)),
    "status": st.sampled_from(["pass", "warn", "fail", "error", "skip"]),
    "message": st.text(max_size=40),
})  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(nics=st.one_of(st.lists(_NIC, max_size=70), st.integers(), st.text(), st.none()),
       results=st.lists(_RESULT, max_size=20))  # fmt: skip
def test_fuzzed_nics_never_crash_the_decoder(nics: object, results: list[object]) -> None:
    """Decoded as the operator decodes an MQTT payload: a clear refusal or a bounded
    section, never an exception; judged per NIC, every failing result is a NIC's or the
    node's."""
    doc = _report(nics)
    doc["results"] = results
    payload = json.dumps(doc).encode()
    report = decode_message("netval/v1/pool-a/gpu-1/report", payload, now=datetime.now(UTC))
    if isinstance(report, Report) and report.nics is not None:
        assert len(report.nics) <= MAX_NICS
        index = SubjectIndex(report.nics)
        for nic in report.nics:
            assert index.nic_of(nic.rdma_device + "/1") == nic.rdma_device
        health = judge_nics(report)
        assert health is not None and health.count == len(report.nics)
        names = {n.rdma_device for n in report.nics}
        assert {nic for nic, _ in (*health.failing, *health.warning)} <= names
        local_bad = [r for r in report.results if r.status.is_bad and r.check.group.value != "peer"]
        assert bool(local_bad) == bool(health.failing or health.node_level)


def test_subjects_are_tied_to_their_nic() -> None:
    index = SubjectIndex([
        Nic(rdma_device="mlx5_0", pci_address="0000:1a:00.0", netdevs=("ens1np0",)),
        Nic(rdma_device="mlx5_bond_0", netdevs=("bond0", "ens2f0np0", "ens2f1np1")),
        Nic(rdma_device="mlx5_9", netdevs=("shared0",)),
        Nic(rdma_device="mlx5_8", netdevs=("shared0",)),
    ])  # fmt: skip
    assert index.nic_of("mlx5_0") == "mlx5_0"
    assert index.nic_of("mlx5_0/1") == "mlx5_0"
    assert index.nic_of("ens1np0/prio3") == "mlx5_0"
    assert index.nic_of("ens2f1np1/prio3") == "mlx5_bond_0"
    assert index.nic_of("bond0") == "mlx5_bond_0"
    assert index.nic_of("shared0") is None  # two NICs claim it: neither
    assert index.nic_of("datasets") is None  # a storage endpoint
    assert index.nic_of("gpu-1") is None
    assert SubjectIndex(None).nic_of("mlx5_0/1") is None  # an older agent: nothing tied


def test_a_result_subject_of_a_listed_nic_is_checked_by_the_model() -> None:
    result = CheckResult(check=CheckId.RDMA_PORT_STATE, subject="mlx5_0/1", status=Status.FAIL,
                         message="down")  # fmt: skip
    doc = _report([{"rdmaDevice": "mlx5_0"}])
    doc["results"] = [result.model_dump(mode="json")]
    doc["status"] = "fail"
    assert Report.model_validate(doc).results[0].subject == "mlx5_0/1"
