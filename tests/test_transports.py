"""Every transport (issue 20): EFA ports get their own expectations, InfiniBand ports are
judged whatever their IPoIB netdevs do, and the reference-topology `select` examples pick
the compute NICs they promise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from netval.agent.checks import run_node_checks
from netval.agent.checks.judged import judged_subjects
from netval.cli import main
from netval.model import Report, Status
from netval.model.results import CheckResult
from netval.model.snapshot import Gid, Netdev, NodeSnapshot, RdmaDevice, RdmaPort, Sample
from netval.model.spec import Checks, NetworkValidationSpec

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "examples" / "snapshots"
EFA_PORTS = {"rdmap16s27/1", "rdmap32s27/1", "rdmap144s27/1", "rdmap160s27/1"}
# Checks that are RoCE- or IB-specific: on an EFA node each says why it does not apply.
ROCE_OR_IB = (
    "mtu.roce", "rdma.gid_roce_v2", "rdma.gid_index", "ib.port_errors", "pfc.priorities",
    "pfc.trust", "pfc.pause_storm", "pfc.discards", "pfc.global_pause", "ecn.np_enabled",
    "ecn.rp_enabled", "ecn.cnp_flow", "link.phy_errors",
)  # fmt: skip


def probe(name: str, capsys: pytest.CaptureFixture[str], config: Path | None = None) -> Report:
    cfg = config or SNAPSHOTS / name / "checks.yaml"
    main(["probe", "--from", str(SNAPSHOTS / name), "--output", "json", "--config", str(cfg)])
    return Report.model_validate_json(capsys.readouterr().out)


def by_check(report: Report, check: str) -> list[CheckResult]:
    return [r for r in report.results if r.check.value == check]


# -- EFA ------------------------------------------------------------------------------------


def test_healthy_efa_passes_with_roce_and_ib_checks_not_applicable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = probe("healthy-efa-p4d", capsys)
    assert report.status is Status.PASS
    for check in ROCE_OR_IB:
        results = by_check(report, check)
        assert results and all(r.status is Status.SKIP for r in results), check
        assert all(r.message.startswith("not applicable: EFA") for r in results), results
    assert not any("unreadable" in r.message for r in report.results)
    layers = by_check(report, "rdma.link_layer")
    assert {r.subject for r in layers} == EFA_PORTS
    for r in layers:
        assert r.status is Status.PASS and r.message == "link layer Unknown (EFA)"
        assert r.observed == {"linkLayer": "Unknown", "transport": "EFA"}
    # The efa counters are judged, the network ones included (all flat on a healthy node).
    errors = by_check(report, "rdma.errors")
    assert {r.subject for r in errors} == EFA_PORTS
    for r in errors:
        assert r.status is Status.PASS
        assert r.observed["retrans_timeout_events"] == 0
        assert r.observed["unresponsive_remote_events"] == 0
        assert r.observed["rx_drops"] == 0
        assert "retrans_pkts" not in r.observed  # SRD's normal retransmissions: no error
    for check in ("rdma.port_state", "rdma.rate"):
        assert {r.status for r in by_check(report, check)} == {Status.PASS}, check


def test_efa_node_judged_as_ethernet_names_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "checks.yaml"
    cfg.write_text("rdma: {minRateGbps: 100}\n")  # linkLayer left at its default, Ethernet
    report = probe("healthy-efa-p4d", capsys, cfg)
    for r in by_check(report, "rdma.link_layer"):
        assert r.status is Status.FAIL
        assert r.message == (
            "link layer Unknown (EFA), expected Ethernet (checks.rdma.linkLayer: EFA)"
        )
    assert {r.check.value for r in report.results if r.status.is_bad} == {"rdma.link_layer"}


def test_efa_retransmission_timeouts_warn_as_requester(capsys: pytest.CaptureFixture[str]) -> None:
    """SRD timeouts and unresponsive peers are requester-side: with nothing wrong on the
    port itself they name the peer or the path (attribution requester), not this node."""
    report = probe("fault-efa-retrans-timeouts", capsys)
    assert [r for r in report.results if r.status.is_bad] == []
    (warn,) = [r for r in report.results if r.status is Status.WARN]
    assert (warn.check.value, warn.subject) == ("rdma.errors", "rdmap144s27/1")
    assert warn.observed["retrans_timeout_events"] == 412
    assert warn.observed["attribution"] == "requester"
    assert warn.observed["counters"] == {
        "retrans_timeout_events": 412,
        "unresponsive_remote_events": 23,
        "impaired_remote_conn_events": 61,
    }
    assert warn.observed["ratePerSecond"] == 49.6
    assert "retrans_timeout_events +412" in warn.message
    assert "attribution requester" in warn.message


def _efa_sample(driver: str | None, name: str, link_layer: str | None = "Unknown") -> Sample:
    port = RdmaPort(
        device=name,
        port=1,
        state="4: ACTIVE",
        phys_state="5: LinkUp",
        rate="100 Gb/sec (4X EDR)",
        link_layer=link_layer,
        gids=(Gid(0, "fe80:0000:0000:0000:0039:beff:fe6e:0c23", "IB/RoCE v1"),),
        hw_counters={"rx_drops": 0, "unresponsive_remote_events": 0},
    )
    device = RdmaDevice(name, node_type="7: unspecified", ports={1: port}, driver=driver)
    return Sample(netdevs={}, rdma={name: device})


@pytest.mark.parametrize(
    ("driver", "name", "transport"),
    [
        ("efa", "rdmap16s27", "EFA"),
        (None, "efa_0", "EFA"),  # format 1.0: no driver recorded, the kernel's name says it
        ("other_rdma", "xyz0", "unspecified"),
    ],
)
def test_a_link_layer_neither_ethernet_nor_ib_is_not_called_unreadable(
    driver: str | None, name: str, transport: str
) -> None:
    sample = _efa_sample(driver, name)
    snapshot = NodeSnapshot("n1", "now", 10.0, (sample, sample))
    results = run_node_checks(snapshot, Checks.model_validate({"rdma": {"linkLayer": "EFA"}}))
    (layer,) = [r for r in results if r.check.value == "rdma.link_layer"]
    assert layer.observed["transport"] == transport
    assert layer.status is (Status.PASS if transport == "EFA" else Status.FAIL)
    for r in results:
        assert "unreadable" not in r.message, r
        if r.check.value in ROCE_OR_IB:
            assert r.status is Status.SKIP and r.message.startswith("not applicable"), r


def test_an_unreadable_link_layer_is_still_an_error() -> None:
    sample = _efa_sample("efa", "rdmap16s27", link_layer=None)
    results = run_node_checks(NodeSnapshot("n1", "now", 10.0, (sample, sample)), Checks())
    (layer,) = [r for r in results if r.check.value == "rdma.link_layer"]
    assert layer.status is Status.ERROR and "not readable" in layer.message


def test_link_layer_efa_is_in_model_and_crd() -> None:
    checks = Checks.model_validate({"rdma": {"linkLayers": ["InfiniBand", "Ethernet", "EFA"]}})
    assert [v.value for v in checks.rdma.expected_link_layers] == ["InfiniBand", "Ethernet", "EFA"]
    for crd in (
        ROOT / "crds" / "networkvalidations.netval.io.yaml",
        ROOT / "charts" / "netval" / "files" / "crds" / "networkvalidations.netval.io.yaml",
    ):
        text = crd.read_text()
        assert text.count("enum: [Ethernet, InfiniBand, EFA]") == 2, crd


# -- InfiniBand with IPoIB down or left out ---------------------------------------------------


def test_ib_ports_are_judged_with_their_ipoib_down(capsys: pytest.CaptureFixture[str]) -> None:
    report = probe("healthy-ib-ipoib-down", capsys)
    assert report.status is Status.PASS
    for check in ("rdma.port_state", "rdma.rate", "ib.port_errors", "rdma.link_layer"):
        results = by_check(report, check)
        assert {r.subject for r in results} == {"mlx5_0/1", "mlx5_1/1"}, check
        assert {r.status for r in results} == {Status.PASS}, check
    carrier = {r.subject: r for r in by_check(report, "link.carrier")}
    assert set(carrier) == {"ibp26s0", "ibp154s0"}
    assert all(r.status is Status.SKIP and "administratively down" in r.message
               for r in carrier.values())  # fmt: skip
    ipoib = {r.subject: r for r in by_check(report, "mtu.ipoib")}
    assert set(ipoib) == {"ibp26s0", "ibp154s0"}
    assert all(r.message.startswith("not judged: ") for r in ipoib.values())
    assert not any("no RDMA devices" in r.message for r in report.results)


def test_a_down_ib_port_fails_with_its_ipoib_netdev_excluded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = probe("fault-ib-ipoib-down-port-down", capsys)
    bad = [(r.check.value, r.subject) for r in report.results if r.status.is_bad]
    assert bad == [("rdma.port_state", "mlx5_1/1")]
    (state,) = [r for r in by_check(report, "rdma.port_state") if r.subject == "mlx5_1/1"]
    assert state.observed == {"state": "1: DOWN", "physState": "2: Polling"}


def test_ipoib_down_without_select_fails_the_netdev_and_still_judges_the_port(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = tmp_path / "checks.yaml"
    cfg.write_text("rdma: {linkLayer: InfiniBand}\n")  # adminDown: judge (the default)
    report = probe("healthy-ib-ipoib-down", capsys, cfg)
    bad = {(r.check.value, r.subject) for r in report.results if r.status.is_bad}
    assert bad == {("link.carrier", "ibp26s0"), ("link.carrier", "ibp154s0")}
    assert {r.status for r in by_check(report, "rdma.port_state")} == {Status.PASS}


# -- reference topologies --------------------------------------------------------------------

DGX_COMPUTE = {  # DGX H100 User Guide, "Network Modules": RDMA device -> PCI address
    "mlx5_0": "0000:18:00.0", "mlx5_3": "0000:40:00.0", "mlx5_4": "0000:4f:00.0",
    "mlx5_5": "0000:5e:00.0", "mlx5_6": "0000:9a:00.0", "mlx5_9": "0000:c0:00.0",
    "mlx5_10": "0000:ce:00.0", "mlx5_11": "0000:dc:00.0",
}  # fmt: skip
DGX_STORAGE = {  # two dual-port ConnectX-7 in Ethernet mode (addresses modelled)
    "mlx5_1": "0000:29:00.0", "mlx5_2": "0000:29:00.1",
    "mlx5_7": "0000:aa:00.0", "mlx5_8": "0000:aa:00.1",
}  # fmt: skip


def _specs(name: str) -> dict[str, NetworkValidationSpec]:
    docs = list(yaml.safe_load_all((ROOT / "examples" / name).read_text()))
    return {d["metadata"]["name"]: NetworkValidationSpec.model_validate(d["spec"]) for d in docs}


def _netdev(name: str, pci: str, **kw: Any) -> Netdev:
    fields: dict[str, Any] = {"mtu": 9000, "carrier": 1, "operstate": "up", "flags": 0x1003}
    fields.update(kw)
    return Netdev(name=name, pci_address=pci, **fields)


def _dgx_sample(compute_layer: str) -> Sample:
    netdevs: dict[str, Netdev] = {}
    rdma: dict[str, RdmaDevice] = {}
    for dev, pci in {**DGX_COMPUTE, **DGX_STORAGE}.items():
        bus, fn = int(pci[5:7], 16), int(pci[-1])
        compute = dev in DGX_COMPUTE
        layer = compute_layer if compute else "Ethernet"
        ib = layer == "InfiniBand"
        netdev = f"ibp{bus}s0" if ib else f"enp{bus}s0f{fn}np{fn}"
        # IPoIB down on purpose: no IFF_UP, carrier unreadable
        netdevs[netdev] = (
            _netdev(netdev, pci, type=32, mtu=4092, carrier=None, operstate="down", flags=0x1002)
            if ib
            else _netdev(netdev, pci)
        )
        gids = (
            ()
            if ib
            else (Gid(3, f"0000:0000:0000:0000:0000:ffff:0a00:{bus:04x}", "RoCE v2", netdev),)
        )
        port = RdmaPort(dev, 1, "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)" if compute
                        else "200 Gb/sec (4X HDR)", layer, gids)  # fmt: skip
        rdma[dev] = RdmaDevice(dev, "1: CA", ports={1: port}, pci_address=pci,
                               pci_netdevs={netdev: 0}, driver="mlx5_core")  # fmt: skip
    return Sample(netdevs, rdma)


@pytest.mark.parametrize(
    ("validation", "layer"),
    [("dgx-h100-compute", "InfiniBand"), ("dgx-h100-roce-compute", "Ethernet")],
)
def test_dgx_select_judges_the_eight_compute_ports(validation: str, layer: str) -> None:
    spec = _specs("dgx-h100-select.yaml")[validation]
    judged = judged_subjects(_dgx_sample(layer), spec.checks)
    assert {p.device for p in judged.ports} == set(DGX_COMPUTE)
    assert set(judged.excluded or {}) >= set(DGX_STORAGE)
    if layer == "InfiniBand":  # ports judged although every IPoIB netdev is down
        assert judged.ipoib_netdevs == ()


def test_dgx_without_select_judges_storage_against_the_compute_fabric() -> None:
    spec = _specs("dgx-h100-select.yaml")["dgx-h100-compute"]
    bare = spec.checks.model_copy(update={"select": Checks().select})
    sample = _dgx_sample("InfiniBand")
    results = run_node_checks(NodeSnapshot("dgx", "now", 10.0, (sample, sample)), bare)
    bad = {(r.check.value, r.subject) for r in results if r.status.is_bad}
    assert {("rdma.link_layer", f"{d}/1") for d in DGX_STORAGE} <= bad
    with_select = run_node_checks(NodeSnapshot("dgx", "now", 10.0, (sample, sample)), spec.checks)
    assert not [r for r in with_select if r.status.is_bad]


def test_hgx_roce_select_keeps_the_gpu_rails() -> None:
    spec = _specs("hgx-h100-roce-select.yaml")["hgx-h100-roce-compute"]
    netdevs: dict[str, Netdev] = {}
    rdma: dict[str, RdmaDevice] = {}
    names = [f"gpu{k}_eth" for k in range(8)] + ["stor0_eth", "stor1_eth"]
    for k, name in enumerate(names):
        dev = f"mlx5_{k}"
        gid = Gid(3, f"0000:0000:0000:0000:0000:ffff:0a00:01{k:02x}", "RoCE v2", name)
        port = RdmaPort(dev, 1, "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "Ethernet", (gid,))
        rdma[dev] = RdmaDevice(dev, "1: CA", ports={1: port}, driver="mlx5_core")
        netdevs[name] = _netdev(name, f"0000:{k + 16:02x}:00.0")
    judged = judged_subjects(Sample(netdevs, rdma), spec.checks)
    assert judged.rdma_netdevs == tuple(f"gpu{k}_eth" for k in range(8))
    assert {p.device for p in judged.ports} == {f"mlx5_{k}" for k in range(8)}


def test_p5_efa_example_expects_efa() -> None:
    spec = _specs("aws-p5-efa.yaml")["aws-p5-efa"]
    assert [v.value for v in spec.checks.rdma.expected_link_layers] == ["EFA"]
    sample = _efa_sample("efa", "rdmap79s0")
    results = run_node_checks(NodeSnapshot("p5", "now", 10.0, (sample, sample)), spec.checks)
    assert not [r for r in results if r.status.is_bad]


# -- the bundled snapshots are the generator's output, and any link layer text is judged ------


def test_transport_snapshots_are_what_their_generator_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(SNAPSHOTS))
    import make_transport_snapshots as gen

    for name, (node, render, checks) in gen.SNAPSHOTS.items():
        root = SNAPSHOTS / name
        assert (root / "checks.yaml").read_text() == checks, name
        assert f'"node": "{node}"' in (root / "meta.json").read_text(), name
        for i in range(2):
            files = render(i)
            on_disk = {
                str(p.relative_to(root / "samples" / str(i))): p.read_text()
                for p in (root / "samples" / str(i)).rglob("*")
                if p.is_file()
            }
            assert on_disk == files, (name, i)


@settings(max_examples=60, deadline=None)
@given(
    link_layer=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
    driver=st.one_of(st.none(), st.sampled_from(["efa", "mlx5_core", "ena", "x"])),
    name=st.sampled_from(["efa_0", "rdmap16s27", "mlx5_0", "xyz0"]),
)
def test_any_link_layer_text_gets_a_verdict_not_a_crash(
    link_layer: str | None, driver: str | None, name: str
) -> None:
    sample = _efa_sample(driver, name, link_layer=link_layer)
    results = run_node_checks(NodeSnapshot("n1", "now", 10.0, (sample, sample)), Checks())
    assert not any(r.message.startswith("check ") and " raised " in r.message for r in results)
    (layer,) = [r for r in results if r.check.value == "rdma.link_layer"]
    if not link_layer or not link_layer.strip():
        return  # unreadable (the reader strips; None and "" are the same to it)
    transport = layer.observed["transport"]
    assert "unreadable" not in layer.message
    if link_layer not in ("Ethernet", "InfiniBand"):
        assert transport in ("EFA", "unspecified")
        for r in results:
            if r.check.value in ROCE_OR_IB:
                assert r.status is Status.SKIP and "unreadable" not in r.message, r
