"""Fingerprint facts from every NIC family's bundled snapshot, and the facts section at the
trust boundary (hostile but valid facts are bounded; garbage is refused with a clear error).

Where the snapshots come from: examples/snapshots/make_*.py (their docstrings cite the kernel
sources and public captures each file follows). What each family cannot give, and why:

- mlx5 RoCE (ConnectX-7, format 1.0 recording): everything but rdma_driver (the 1.0 format
  does not record the RDMA device's own uevent; the netdev's names the model) and ipoib_mode.
- bnxt_re (Thor2) and irdma (E810): no ecn_np/ecn_rp (no ecn/ sysfs: ECN lives in firmware
  or in the driver's DCB).
- InfiniBand (ConnectX-7 HCA): no PFC/trust/DSCP/ECN/RoCE keys (the subnet manager's QoS,
  not DCB); netdev_speed_mbps absent while IPoIB is down.
- EFA (p4d): no fw_ver, board_id, netdev, QoS or RoCE keys (the efa device exposes none).
- driver_version: only from out-of-tree drivers (/sys/module/<drv>/version: the mlx5 RoCE,
  LAG and InfiniBand nodes are modelled as DOCA-OFED nodes); in-tree bnxt_en, ice and efa
  set no MODULE_VERSION (ethtool -i answers the kernel release: isc-projects/ethq#33).
- EFA (p4d): no pcie_link_speed/pcie_link_width either (its functions sit behind an
  emulated 440FX host bridge without a PCIe capability: lspci in aws/aws-ofi-nccl#64).
- ionic (AMD Pensando): no bundled capture; its facts are not tested here.
- kernel_release only from a live agent (uname(2)); never from a recording.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netval.agent.collect.snapshot_dir import load_snapshot, record_sample
from netval.agent.collect.sysfs import SysfsReader
from netval.agent.facts import node_facts
from netval.model.facts import MAX_FACT_VALUE, MAX_FACTS, FactKey
from netval.model.ids import Status
from netval.model.results import Report
from netval.model.snapshot import Sample
from netval.model.topics import DropReason, TopicKind, topic
from netval.operator.consistency.fingerprint import Fleet, observe
from netval.operator.consistency.fold import refresh
from netval.operator.ingest.decode import Dropped, decode_message
from test_ingest_fuzz import POOL, assert_patch_is_json, counted, world

SNAPSHOTS = Path(__file__).resolve().parent.parent / "examples" / "snapshots"
ALL = set(FactKey)
QOS = {
    FactKey.PFC_ENABLED,
    FactKey.TRUST,
    FactKey.DSCP_MAP,
    FactKey.ECN_NP_ENABLED,
    FactKey.ECN_RP_ENABLED,
}
ROCE = {FactKey.ROCE_MTU_ACTIVE, FactKey.ROCE_V2_GID, FactKey.DEFAULT_ROCE_TOS}
LIVE_ONLY = {FactKey.KERNEL_RELEASE}
IN_TREE = {FactKey.DRIVER_VERSION}  # in-tree drivers set no MODULE_VERSION
NO_PCIE = {FactKey.PCIE_LINK_SPEED, FactKey.PCIE_LINK_WIDTH}

# family snapshot -> the keys it cannot give (all others must be present)
FAMILIES: dict[str, set[FactKey]] = {
    "healthy-roce": LIVE_ONLY | {FactKey.RDMA_DRIVER, FactKey.IPOIB_MODE},
    "healthy-roce-lag-renamed": LIVE_ONLY | {FactKey.IPOIB_MODE},
    "healthy-bnxt-thor2": LIVE_ONLY
    | IN_TREE
    | {FactKey.IPOIB_MODE, FactKey.ECN_NP_ENABLED, FactKey.ECN_RP_ENABLED},
    "healthy-intel-e810": LIVE_ONLY
    | IN_TREE
    | {FactKey.IPOIB_MODE, FactKey.ECN_NP_ENABLED, FactKey.ECN_RP_ENABLED},
    "healthy-infiniband": LIVE_ONLY | QOS | ROCE,
    "healthy-ib-ipoib-down": LIVE_ONLY | QOS | ROCE | {FactKey.NETDEV_SPEED_MBPS},
    "healthy-efa-p4d": LIVE_ONLY
    | QOS
    | ROCE
    | IN_TREE
    | NO_PCIE
    | {
        FactKey.FW_VER,
        FactKey.BOARD_ID,
        FactKey.IPOIB_MODE,
        FactKey.MTU,
        FactKey.NETDEV_DRIVER,
        FactKey.NETDEV_SPEED_MBPS,
    },
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_exposes_its_keys_and_only_those(name: str) -> None:
    facts = node_facts(load_snapshot(SNAPSHOTS / name).last)
    assert set(facts) == {k.value for k in ALL - FAMILIES[name]}
    Report.model_validate(_report(facts))  # what the agent derives, the operator accepts


def test_a_live_agent_reaches_twenty_keys_on_roce() -> None:
    for name in ("healthy-roce", "healthy-bnxt-thor2", "healthy-intel-e810"):
        facts = node_facts(load_snapshot(SNAPSHOTS / name).last, kernel_release="6.8.0-1")
        assert len(facts) >= 20, name


def test_values_are_the_snapshot_values() -> None:
    facts = node_facts(load_snapshot(SNAPSHOTS / "healthy-bnxt-thor2").last)
    assert facts["nic_model"] == "14E4:1760"
    assert facts["fw_ver"] == "230.2.49.0"
    assert facts["pfc_enabled"] == "3"
    assert facts["trust"] == "dscp"
    assert facts["dscp_map"] == "26:3,48:6"
    lag = node_facts(load_snapshot(SNAPSHOTS / "healthy-roce-lag-renamed").last)
    assert lag["netdev_speed_mbps"] == "200000;400000"  # two values on one node: both kept


def test_pcie_placement_values_per_family() -> None:
    roce = node_facts(load_snapshot(SNAPSHOTS / "healthy-roce").last)
    assert (roce["pcie_link_speed"], roce["pcie_link_width"]) == ("32.0 GT/s", "x16")
    assert roce["numa_node"] == "0;1"  # one card per socket
    assert roce["driver_version"] == "24.10-1.1.4"
    e810 = node_facts(load_snapshot(SNAPSHOTS / "healthy-intel-e810").last)
    assert (e810["pcie_link_speed"], e810["numa_node"]) == ("16.0 GT/s", "0")
    efa = node_facts(load_snapshot(SNAPSHOTS / "healthy-efa-p4d").last)
    assert efa["numa_node"] == "0;1"


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_pcie_files_in_every_kernel_format_and_unreadable_ones(tmp_path: Path) -> None:
    """A sysfs fixture: the pre-5.4 "8 GT/s" and the newer "8.0 GT/s PCIe" are one value;
    "Unknown" speed and a 0-lane width (no link status) are absent keys, not values."""
    dev = "class/infiniband/mlx5_0/device"
    _write(tmp_path, {f"{dev}/uevent": "DRIVER=mlx5_core\nPCI_ID=15B3:101D\n",
                      f"{dev}/current_link_speed": "8 GT/s\n",
                      f"{dev}/current_link_width": "8\n", f"{dev}/numa_node": "-1\n",
                      "module/mlx5_core/version": "5.8-1.0.1\n"})  # fmt: skip
    old = SysfsReader(tmp_path, strict=True).read_rdma_device("mlx5_0")
    facts = node_facts(Sample(netdevs={}, rdma={"mlx5_0": old}))
    assert facts["pcie_link_speed"] == "8.0 GT/s" and facts["pcie_link_width"] == "x8"
    assert facts["numa_node"] == "-1" and facts["driver_version"] == "5.8-1.0.1"
    _write(tmp_path, {f"{dev}/current_link_speed": "8.0 GT/s PCIe\n"})
    new = SysfsReader(tmp_path, strict=True).read_rdma_device("mlx5_0")
    assert node_facts(Sample(netdevs={}, rdma={"mlx5_0": new})) == facts
    _write(tmp_path, {f"{dev}/current_link_speed": "Unknown\n",
                      f"{dev}/current_link_width": "0\n"})  # fmt: skip
    (tmp_path / "module/mlx5_core/version").unlink()
    gone = SysfsReader(tmp_path, strict=True).read_rdma_device("mlx5_0")
    facts = node_facts(Sample(netdevs={}, rdma={"mlx5_0": gone}))
    assert not {"pcie_link_speed", "pcie_link_width", "driver_version"} & set(facts)
    assert facts["numa_node"] == "-1"


def test_the_recorder_keeps_the_pcie_files(tmp_path: Path) -> None:
    """Record a bundled snapshot's sysfs as if it were live, load the recording: same facts."""
    src = SNAPSHOTS / "healthy-roce" / "samples" / "1"
    sample = load_snapshot(SNAPSHOTS / "healthy-roce").last
    record_sample(tmp_path / "s", sample, sys_root=src / "sys", rdma_cm_root=src / "rdma_cm")
    reader = SysfsReader(tmp_path / "s" / "sys", strict=True)
    again = {n: reader.read_netdev(n, ethtool=d.ethtool, dcb=d.dcb)
             for n, d in sample.netdevs.items()}  # fmt: skip
    rdma = {n: reader.read_rdma_device(n) for n in sample.rdma}
    keys = {"pcie_link_speed", "pcie_link_width", "numa_node", "driver_version"}
    recorded = node_facts(Sample(netdevs={n: d for n, d in again.items() if d},
                                 rdma=rdma))  # fmt: skip
    expected = node_facts(sample)
    assert {k: recorded[k] for k in keys} == {k: expected[k] for k in keys}


@pytest.mark.parametrize(
    ("fault", "key"),
    [("fault-degraded-rate", "link_rate_gbps"), ("fault-mtu-1500", "mtu")],
)
def test_one_faulty_recording_among_nine_healthy_is_the_outlier(fault: str, key: str) -> None:
    healthy = node_facts(load_snapshot(SNAPSHOTS / "healthy-roce").last)
    odd = node_facts(load_snapshot(SNAPSHOTS / fault).last)
    fleet = Fleet()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(9):
        observe(fleet, f"n{i}", healthy, None, now)
    observe(fleet, "odd", odd, None, now)
    verdicts = refresh(fleet, set(fleet.nodes), now)
    odd_verdict = verdicts["odd"]
    assert odd_verdict is not None and odd_verdict.status is Status.WARN
    assert f"Outlier {key}=" in odd_verdict.message
    assert {n for n, v in verdicts.items() if v is not None and v.status is Status.WARN} == {"odd"}


# -- the trust boundary --------------------------------------------------------------------

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
TOPIC = topic("val", "n1", TopicKind.REPORT)
fact_names = st.from_regex(r"\A[a-z][a-z0-9_]{0,47}\Z")
fact_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=256)


def _report(facts: object) -> dict[str, object]:
    return {
        "schema": "netval.io/report/v1",
        "validation": "val",
        "generation": 1,
        "node": "n1",
        "startedAt": NOW.isoformat(),
        "durationMs": 1.0,
        "status": "pass",
        "results": [],
        "facts": facts,
    }


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(fact_names, fact_values, max_size=MAX_FACTS))
def test_hostile_but_valid_facts_are_accepted_and_bounded(facts: dict[str, str]) -> None:
    decoded = decode_message(TOPIC, json.dumps(_report(facts)).encode(), now=NOW)
    assert isinstance(decoded, Report)
    assert decoded.facts == facts
    fleet = Fleet()
    observe(fleet, "n1", decoded.facts, None, NOW)
    refresh(fleet, {"n1"}, NOW)  # judged without error, whatever the values


garbage = st.one_of(
    st.dictionaries(fact_names, fact_values, min_size=MAX_FACTS + 1, max_size=MAX_FACTS + 3),
    st.dictionaries(st.text(min_size=1).filter(lambda k: not k.isascii()), fact_values, min_size=1),
    st.dictionaries(fact_names, st.text(min_size=MAX_FACT_VALUE + 1), min_size=1, max_size=2),
    st.dictionaries(fact_names, st.text(st.characters(max_codepoint=0x1F), min_size=1), min_size=1),
    st.dictionaries(fact_names, st.integers() | st.lists(st.integers()) | st.none(), min_size=1),
    st.lists(fact_values) | st.integers() | fact_values,
)


@settings(max_examples=200, deadline=None)
@given(garbage)
def test_garbage_facts_are_refused_with_a_clear_error(facts: object) -> None:
    decoded = decode_message(TOPIC, json.dumps(_report(facts)).encode(), now=NOW)
    assert isinstance(decoded, Dropped)
    assert decoded.reason is DropReason.INVALID_REPORT
    assert "facts" in decoded.detail


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.dictionaries(fact_names, fact_values, max_size=MAX_FACTS),
            garbage,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_hostile_facts_through_the_whole_ingest_path(sections: list[object]) -> None:
    """Through the operator's ingest (decode, store, fold) and a status computation: every
    message counted, accepted or dropped as invalid, never an internal error."""
    store, ingest = world()
    node = "gpu-c"
    for facts in sections:
        body = {**_report(facts), "validation": POOL, "node": node,
                "startedAt": datetime.now(UTC).isoformat()}  # fmt: skip
        ingest.handle(f"netval/v1/{POOL}/{node}/report", json.dumps(body).encode(), retained=False)
    assert counted(ingest) == len(sections)
    assert set(ingest.stats.dropped) <= {DropReason.INVALID_REPORT}
    assert_patch_is_json(store)


def test_an_agent_cannot_report_the_fleet_verdict_itself() -> None:
    body = _report({})
    body["results"] = [{"check": "fleet.consistency", "subject": "n1", "status": "pass",
                        "message": "I am consistent"}]  # fmt: skip
    decoded = decode_message(TOPIC, json.dumps(body).encode(), now=NOW)
    assert isinstance(decoded, Dropped) and "judged by the operator" in decoded.detail


def test_an_agent_cannot_report_the_topology_verdict_itself() -> None:
    body = _report({})
    body["results"] = [{"check": "topology.agreement", "subject": "ens1np0", "status": "pass",
                        "message": "my labels are right"}]  # fmt: skip
    decoded = decode_message(TOPIC, json.dumps(body).encode(), now=NOW)
    assert isinstance(decoded, Dropped) and "judged by the operator" in decoded.detail
