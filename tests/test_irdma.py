"""Intel irdma per generation and mode: retransmissions judged as rates, the driver read
from the device (never guessed from its name). Names and ids: tests/data/irdma/ (SOURCE.md).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from netval.agent.checks import run_node_checks
from netval.agent.checks.drivers import INTEL, INTEL_IPU, INTEL_X722, hw_counter_names_for
from netval.agent.checks.rate_policy import REORDER, family_of
from netval.agent.collect.snapshot_dir import load_snapshot
from netval.agent.collect.sysfs import SysfsReader
from netval.model import CheckResult, Checks, Status
from netval.model.snapshot import IWARP_NODE_TYPE, NodeSnapshot, Sample
from node_kit import roce_sample

DATA = json.loads((Path(__file__).parent / "data" / "irdma" / "hw_counter_names.json").read_text())
SNAPSHOTS = Path(__file__).resolve().parent.parent / "examples" / "snapshots"
GEN2 = set(DATA["gen1_gen2_v6_8"]["names"])
GEN3 = set(DATA["gen3_mainline"]["names"])
ICE_PORT = {
    "rx_dropped.nic": 0,
    "link_xoff_rx.nic": 0,
    "link_xoff_tx.nic": 0,
    "rx_crc_errors.nic": 0,
}


def _node(
    hw: dict[str, int],
    *,
    device: str = "irdma0",
    rdma_driver: str | None = "ice",
    netdev_driver: str | None = "ice",
    pci_id: str = "8086:1592",
    ethtool: dict[str, int] | None = None,
    node_type: str = "1: CA",
) -> Sample:
    return roce_sample(
        hw,
        dict(ICE_PORT if ethtool is None else ethtool),
        netdev="ens801f0",
        device=device,
        rdma_driver=rdma_driver,
        netdev_driver=netdev_driver,
        speed_mbps=100_000,
        rate="100 Gb/sec (4X EDR)",
        ecn=False,
        node_type=node_type,
        pci_id=pci_id,
    )


def _run(first: Sample, last: Sample, checks: Checks | None = None) -> list[CheckResult]:
    return run_node_checks(NodeSnapshot("n", "now", 10.0, (first, last)), checks or Checks())


def _errors(results: list[CheckResult]) -> CheckResult:
    (r,) = [r for r in results if r.check.value == "rdma.errors"]
    return r


def test_every_irdma_error_name_the_kernel_prints_is_read_and_classified() -> None:
    """The maps read exactly the error and congestion names of the kernel's table: the
    GEN_1/2 names on ice and i40e, the GEN_3 names (spaces included) on idpf."""
    congestion = {"cnpHandled", "cnpIgnored", "cnpSent", "RxECNMrkd"}
    for driver, names in ((INTEL, GEN2 | {"RetransSegs"}), (INTEL_IPU, GEN3)):
        read = driver.hw_counter_names()
        assert read <= names | {"tcpRetransSegs"}, read - names
        assert congestion <= read
    assert {"tcpRetransSegs", "RetransSegs"} <= INTEL_X722.hw_counter_names()
    for name in ("RetransSegs", "tcpRetransSegs", "RTO", "Nak Sequence Error"):
        assert family_of(name).requester, name
    assert family_of("RNR received").key == "receiver"
    assert family_of("Rcvd Out of order packets") is REORDER
    assert family_of("CRC errors").key == "corruption"
    assert "Nak Sequence Error" in hw_counter_names_for("rdmap0s9", "idpf")


@pytest.mark.parametrize(
    ("name", "node_type"),
    [
        ("RetransSegs", "1: CA"),  # E810 RoCEv2, kernels with the GEN_3 rename
        ("tcpRetransSegs", IWARP_NODE_TYPE),  # E810 iWARP, older kernels
    ],
)
def test_400_retransmits_per_second_do_not_pass(name: str, node_type: str) -> None:
    first = _node({name: 1_000, "ip4InDiscards": 0}, node_type=node_type)
    last = _node({name: 5_000, "ip4InDiscards": 0}, node_type=node_type)
    r = _errors(_run(first, last))
    assert r.status is Status.WARN
    assert r.observed["attribution"] == "requester"
    assert r.observed["counters"] == {name: 4000}
    assert r.observed["ratePerSecond"] == 400.0
    assert r.observed["driver"] == "ice"
    assert r.expected["maxRetransmitsPerSecond"] == 10.0
    assert f"{name} +4000 (400/s) in 10s, over retransmit limit 10/s" in r.message


def test_a_few_retransmits_pass_and_the_limit_is_the_spec() -> None:
    first, last = _node({"RetransSegs": 0}), _node({"RetransSegs": 50})  # 5/s
    assert _errors(_run(first, last)).status is Status.PASS
    strict = Checks.model_validate({"rdma": {"maxRetransmitsPerSecond": 1}})
    assert _errors(_run(first, last, strict)).status is Status.WARN


def test_retransmits_with_crc_errors_on_the_port_fail_as_local() -> None:
    first = _node({"RetransSegs": 0})
    last = _node({"RetransSegs": 4_000}, ethtool={**ICE_PORT, "rx_crc_errors.nic": 2_400})
    results = _run(first, last)
    assert {(r.check.value, r.subject) for r in results if r.status.is_bad} == {
        ("link.phy_errors", "ens801f0"),
        ("rdma.errors", "irdma0/1"),
    }
    r = _errors(results)
    assert r.observed["attribution"] == "local"
    assert r.observed["evidence"] == ["link.phy_errors"]


def _gen3(hw: dict[str, int], device: str = "irdma0") -> Sample:
    return _node(
        hw,
        device=device,
        rdma_driver="idpf",
        netdev_driver="idpf",
        pci_id=DATA["ipu_vf_device"]["pci_id"],
        ethtool={"rx-unicast_pkts": 0, "tx-skb_drops": 0},
    )


@pytest.mark.parametrize("device", ["irdma0", "rdmap0s9"])
def test_gen3_on_idpf_is_idpf_never_ice(device: str) -> None:
    """An irdma device on an IPU E2000 VF (the RDMA device's uevent says DRIVER=idpf), under
    its kernel name or renamed: judged with the GEN_3 names, reported as idpf."""
    names = ("RetransSegs", "RTO", "Nak Sequence Error", "Nak Sequence Error Implied")
    first = _gen3(dict.fromkeys(names, 0), device)
    last = _gen3({"RetransSegs": 4_000, "RTO": 35, "Nak Sequence Error": 120}, device)
    results = _run(first, last)
    r = _errors(results)
    assert r.status is Status.WARN
    assert r.observed["driver"] == "idpf"
    assert r.observed["driverFrom"] == f"{device} device/uevent"
    assert r.observed["counters"] == {"RetransSegs": 4000, "Nak Sequence Error": 120, "RTO": 35}
    assert all(r.observed.get("driver") != "ice" for r in results)
    phy = [r for r in results if r.check.value == "link.phy_errors"]
    assert [r.status for r in phy] == [Status.SKIP]
    assert "idpf/irdma has no PHY error counter (an idpf netdev is a vport of the IPU" in (
        phy[0].message
    )


def test_a_driver_that_was_read_is_never_replaced_by_the_name_prefix() -> None:
    """irdma0 whose PCI function says DRIVER=some_new_nic: not mapped, so skipped naming
    that driver; its name no longer makes it an E810."""
    kw: dict[str, Any] = {"rdma_driver": "some_new_nic", "netdev_driver": "some_new_nic"}
    r = _errors(_run(_node({"RetransSegs": 0}, **kw), _node({"RetransSegs": 9_000}, **kw)))
    assert r.status is Status.SKIP
    assert r.observed["driver"] == "some_new_nic"
    assert "driver some_new_nic of irdma0 (irdma0 device/uevent) has no counter map" in r.message


def test_without_any_recorded_driver_the_prefix_names_the_counters_not_the_driver() -> None:
    """A 1.0 snapshot records no driver: the irdma name prefix picks the counter names, and
    the result says so instead of claiming a driver."""
    kw: dict[str, Any] = {"rdma_driver": None, "netdev_driver": None}
    r = _errors(_run(_node({"RetransSegs": 0}, **kw), _node({"RetransSegs": 9_000}, **kw)))
    assert r.status is Status.WARN
    assert r.observed["driver"] is None
    assert r.observed["driverFrom"] == (
        "RDMA device name prefix of irdma0 (ice/irdma names; no driver recorded)"
    )


def test_the_e810_driver_link_of_a_public_capture_selects_ice() -> None:
    e810 = DATA["e810_irdma0_device"]
    pci_id = f"{e810['vendor'][2:]}:{e810['device'][2:]}".upper()
    sample = _node({"RetransSegs": 0}, rdma_driver=e810["driver"], pci_id=pci_id)
    r = _errors(_run(sample, replace(sample)))
    assert (r.status, r.observed["driver"]) == (Status.PASS, "ice")


def test_bundled_gen3_snapshot_reads_counter_files_with_spaces() -> None:
    snap = load_snapshot(SNAPSHOTS / "victim-irdma-gen3-retransmits")
    port = snap.last.rdma["irdma0"].ports[1]
    assert port.hw_counters["Nak Sequence Error"] == 431
    assert snap.last.rdma["irdma0"].driver == "idpf"
    r = _errors(run_node_checks(snap, Checks()))
    assert (r.status, r.observed["attribution"], r.observed["driver"]) == (
        Status.WARN,
        "requester",
        "idpf",
    )


def test_live_reader_takes_the_pci_functions_driver_link(tmp_path: Path) -> None:
    """Live, an RDMA device whose PCI function's uevent has no DRIVER= (an unusual kernel or
    a sandbox's copy of sysfs) still names its driver: the function's `driver` link, as
    udev-renamed `rdmap0s9` on an IPU VF shows it."""
    pci = tmp_path / "devices" / "pci0000:00" / "0000:00:09.0"
    pci.mkdir(parents=True)
    (pci / "uevent").write_text("PCI_ID=8086:145C\nPCI_SLOT_NAME=0000:00:09.0\n")
    drivers = tmp_path / "bus" / "pci" / "drivers" / "idpf"
    drivers.mkdir(parents=True)
    (pci / "driver").symlink_to(drivers)
    ib = tmp_path / "class" / "infiniband" / "rdmap0s9"
    (ib / "ports" / "1" / "hw_counters").mkdir(parents=True)
    (ib / "device").symlink_to(pci)
    (ib / "ports" / "1" / "hw_counters" / "Nak Sequence Error").write_text("7\n")
    device = SysfsReader(tmp_path, hw_counter_names_for=hw_counter_names_for).read_rdma_device(
        "rdmap0s9"
    )
    assert (device.driver, device.pci_id) == ("idpf", "8086:145C")
    assert device.ports[1].hw_counters == {"Nak Sequence Error": 7}
