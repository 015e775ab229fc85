"""checks.select: which RDMA devices, ports and netdevs are judged, and port->netdev binding."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from netval.agent.checks import run_node_checks
from netval.agent.checks.judged import judged_subjects
from netval.agent.checks.selection import bound_netdevs
from netval.model.ids import Status
from netval.model.results import CheckResult
from netval.model.snapshot import Gid, Netdev, NodeSnapshot, RdmaDevice, RdmaPort, Sample
from netval.model.spec import Checks


def eth_port(device: str, netdev: str, ip_last: int, port: int = 1, **kw: Any) -> RdmaPort:
    gids = (
        Gid(0, "fe80:0000:0000:0000:9e63:c0ff:feab:ed5a", "IB/RoCE v1", netdev),
        Gid(1, "fe80:0000:0000:0000:9e63:c0ff:feab:ed5a", "RoCE v2", netdev),
        Gid(2, f"0000:0000:0000:0000:0000:ffff:0a0a:01{ip_last:02x}", "IB/RoCE v1", netdev),
        Gid(3, f"0000:0000:0000:0000:0000:ffff:0a0a:01{ip_last:02x}", "RoCE v2", netdev),
    )
    fields: dict[str, Any] = {
        "state": "4: ACTIVE",
        "phys_state": "5: LinkUp",
        "rate": "400 Gb/sec (4X NDR)",
        "link_layer": "Ethernet",
        "gids": gids,
    }
    fields.update(kw)
    return RdmaPort(device=device, port=port, **fields)


def up(name: str, pci: str | None = None, **kw: Any) -> Netdev:
    fields: dict[str, Any] = {
        "mtu": 9000,
        "carrier": 1,
        "operstate": "up",
        "carrier_changes": 2,
        "flags": 0x1003,
        "type": 1,
        "pci_address": pci,
    }
    fields.update(kw)
    return Netdev(name=name, **fields)


def admin_down(name: str, pci: str | None = None) -> Netdev:
    # sysfs refuses carrier while the interface is down; flags lack IFF_UP
    return up(name, pci, carrier=None, operstate="down", flags=0x1002)


def node_sample(spare_down: bool = True) -> Sample:
    """Two GPU rails, a spare second port on the second card, and an Intel E810 irdma."""
    spare_port = eth_port(
        "mlx5_2",
        "ens2f1np1",
        13,
        state="1: DOWN",
        phys_state="3: Disabled",
        rate="40 Gb/sec (4X QDR)",
    )
    return Sample(
        netdevs={
            "ens1np0": up("ens1np0", "0000:1a:00.0"),
            "ens2f0np0": up("ens2f0np0", "0000:9a:00.0"),
            "ens2f1np1": admin_down("ens2f1np1", "0000:9a:00.1")
            if spare_down
            else up("ens2f1np1", "0000:9a:00.1", carrier=0, operstate="down"),
            "ens7f0": up("ens7f0", "0000:3b:00.0", mtu=1500),
        },
        rdma={
            "mlx5_0": RdmaDevice(
                "mlx5_0",
                node_type="1: CA",
                pci_address="0000:1a:00.0",
                ports={1: eth_port("mlx5_0", "ens1np0", 11)},
            ),
            "mlx5_1": RdmaDevice(
                "mlx5_1",
                node_type="1: CA",
                pci_address="0000:9a:00.0",
                ports={1: eth_port("mlx5_1", "ens2f0np0", 12)},
            ),
            "mlx5_2": RdmaDevice(
                "mlx5_2", node_type="1: CA", pci_address="0000:9a:00.1", ports={1: spare_port}
            ),
            "irdma0": RdmaDevice(
                "irdma0",
                node_type="1: CA",
                pci_address="0000:3b:00.0",
                ports={1: eth_port("irdma0", "ens7f0", 20, rate="25 Gb/sec (1X EDR)")},
            ),
        },
    )


def snapshot(sample: Sample) -> NodeSnapshot:
    return NodeSnapshot("gpu-a01", "2025-06-12T08:30:00Z", 10.0, (sample, sample))


def bad(results: list[CheckResult]) -> set[tuple[str, str]]:
    return {(r.check.value, r.subject) for r in results if r.status.is_bad}


def checks(**select: Any) -> Checks:
    return Checks.model_validate({"select": select})


def test_by_default_everything_is_judged_and_the_spare_port_fails() -> None:
    failing = bad(run_node_checks(snapshot(node_sample()), Checks()))
    # the admin-down spare fails (safe default: a rail left down after a reboot must fail)
    assert ("link.carrier", "ens2f1np1") in failing
    assert ("rdma.port_state", "mlx5_2/1") in failing
    # the E810 beside the GPU NICs is held to the GPU NICs' MTU
    assert ("mtu.interface", "ens7f0") in failing


def test_excluding_the_spare_and_the_e810_makes_the_node_pass() -> None:
    spec = checks(devices={"exclude": ["irdma*"]}, adminDown="skip")
    results = run_node_checks(snapshot(node_sample()), spec)
    assert bad(results) == set()
    skips = {(r.check.value, r.subject): r.message for r in results if r.status is Status.SKIP}
    assert "checks.select.devices.exclude 'irdma*'" in skips[("rdma.devices", "irdma0")]
    assert "administratively down" in skips[("rdma.port_state", "mlx5_2/1")]
    assert "administratively down" in skips[("link.carrier", "ens2f1np1")]
    # excluded subjects appear once (rdma.devices / rdma.port_state / link.carrier), not per check
    assert not any(r.subject in ("mlx5_2/1", "ens2f1np1") for r in results if r.check.value
                   not in ("rdma.port_state", "link.carrier"))  # fmt: skip


def test_admin_down_skip_does_not_hide_a_rail_without_carrier() -> None:
    """adminDown: skip only forgives a port someone took down, not a dead link."""
    spec = checks(devices={"exclude": ["irdma*"]}, adminDown="skip")
    failing = bad(run_node_checks(snapshot(node_sample(spare_down=False)), spec))
    assert ("link.carrier", "ens2f1np1") in failing
    assert ("rdma.port_state", "mlx5_2/1") in failing


@pytest.mark.parametrize(
    "select",
    [
        {"devices": {"exclude": ["0000:9a:00.1", "0000:3b:*"]}},  # by PCI address
        {"devices": {"include": ["mlx5_[01]"]}},
        {"ports": {"exclude": ["mlx5_2/*", "irdma*/1"]}},
        {"netdevs": {"exclude": ["ens2f1*", "ens7f0"]}},
        {"netdevs": {"exclude": ["0000:9a:00.1", "0000:3b:00.0"]}},
    ],
)
def test_the_spare_and_the_e810_can_be_left_out_by_any_key(select: dict[str, Any]) -> None:
    results = run_node_checks(snapshot(node_sample()), checks(**select))
    assert bad(results) == set()
    judged = judged_subjects(node_sample(), checks(**select))
    assert [p.subject for p in judged.ports] == ["mlx5_0/1", "mlx5_1/1"]
    assert judged.rdma_netdevs == ("ens1np0", "ens2f0np0")


def test_named_interfaces_are_judged_even_if_a_pattern_excludes_them() -> None:
    spec = Checks.model_validate(
        {"select": {"netdevs": {"exclude": ["ens*"]}}, "link": {"interfaces": ["ens1np0"]}}
    )
    judged = judged_subjects(node_sample(), spec)
    assert "ens1np0" in judged.link_netdevs


def test_patterns_are_validated() -> None:
    with pytest.raises(ValidationError):
        Checks.model_validate({"select": {"devices": {"exclude": ["a b"]}}})
    with pytest.raises(ValidationError):
        Checks.model_validate({"select": {"adminDown": "maybe"}})
    with pytest.raises(ValidationError):
        Checks.model_validate({"select": {"ports": {"exclud": []}}})


@given(
    st.lists(st.from_regex(r"[A-Za-z0-9_.:/*?!\[\]-]{1,20}", fullmatch=True), max_size=4),
    st.lists(st.from_regex(r"[A-Za-z0-9_.:/*?!\[\]-]{1,20}", fullmatch=True), max_size=4),
    st.sampled_from(["judge", "skip"]),
)
def test_any_valid_selection_judges_without_crashing(
    include: list[str], exclude: list[str], admin: str
) -> None:
    """Hostile but schema-valid globs ([, [!], **): never a traceback, never a fail invented
    for an excluded subject."""
    flt = {"include": include, "exclude": exclude}
    spec = checks(devices=flt, ports=flt, netdevs=flt, adminDown=admin)
    results = run_node_checks(snapshot(node_sample()), spec)
    judged = judged_subjects(node_sample(), spec)
    judged_subjects_ = {p.subject for p in judged.ports} | set(judged.link_netdevs)
    judged_subjects_ |= set(judged.rdma_netdevs) | {p.device for p in judged.ports}
    for r in results:
        if r.status.is_bad and r.subject != "gpu-a01":
            assert r.subject.split("/prio")[0] in judged_subjects_ or r.subject in (
                "mlx5_0",
                "mlx5_1",
                "mlx5_2",
                "irdma0",
            ), r


# -- port -> netdev binding -----------------------------------------------------------------


def ib_port(device: str, port: int) -> RdmaPort:
    # IB GIDs have no netdev (gid_attrs/ndevs reads fail): binding comes from dev_port
    gid = Gid(0, f"fe80:0000:0000:0000:0002:c903:00a1:b2c{port}", None, None)
    return RdmaPort(device, port, "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)",
                    "InfiniBand", (gid,))  # fmt: skip


def test_dual_port_hca_binds_each_port_to_its_own_netdev() -> None:
    device = RdmaDevice(
        "mlx4_0",
        node_type="1: CA",
        netdev_hint="ib0",
        ports={1: ib_port("mlx4_0", 1), 2: ib_port("mlx4_0", 2)},
        pci_netdevs={"ib0": 0, "ib1": 1, "ib0.8001": 0},
    )
    assert bound_netdevs(device, device.ports[1]) == ("ib0", "ib0.8001")
    assert bound_netdevs(device, device.ports[2]) == ("ib1",)
    sample = Sample(
        netdevs={
            "ib0": up("ib0", type=32, mtu=4092, ipoib_mode="datagram"),
            "ib1": up("ib1", type=32, mtu=2044, ipoib_mode="datagram"),
            "ib0.8001": up("ib0.8001", type=32, mtu=4092, ipoib_mode="datagram"),
        },
        rdma={"mlx4_0": device},
    )
    spec = Checks.model_validate({"rdma": {"linkLayer": "InfiniBand"}})
    judged = judged_subjects(sample, spec)
    assert judged.port_netdev == {"mlx4_0/1": "ib0", "mlx4_0/2": "ib1"}
    # the second port's netdev is judged (and its wrong MTU found)
    assert bad(run_node_checks(snapshot(sample), spec)) == {("mtu.ipoib", "ib1")}


def test_binding_without_dev_port_falls_back_to_the_device_netdev() -> None:
    """Snapshots recorded before dev_port was recorded bind as they always did."""
    port = ib_port("mlx5_0", 1)
    device = RdmaDevice("mlx5_0", netdev_hint="ib0", ports={1: port}, pci_netdevs={"ib0": None})
    assert bound_netdevs(device, port) == ("ib0",)
    old = RdmaDevice("mlx5_0", netdev_hint="ib0", ports={1: port})
    assert bound_netdevs(old, port) == ("ib0",)


def test_known_dev_ports_never_bind_another_ports_netdev() -> None:
    port2 = ib_port("mlx4_0", 2)
    device = RdmaDevice("mlx4_0", netdev_hint="ib0", ports={2: port2}, pci_netdevs={"ib0": 0})
    assert bound_netdevs(device, port2) == ()


def test_roce_ports_bind_by_gid_netdev() -> None:
    port = eth_port("mlx5_1", "ens2f1np1", 13, port=1)
    device = RdmaDevice("mlx5_1", netdev_hint="ens2f0np0", ports={1: port},
                        pci_netdevs={"ens2f0np0": 0, "ens2f1np1": 1})  # fmt: skip
    assert bound_netdevs(device, port) == ("ens2f1np1",)


# -- hostile but type-valid hardware ----------------------------------------------------------

_text = st.one_of(st.none(), st.text(max_size=30), st.sampled_from(
    ["4: ACTIVE", "1: DOWN", "5: LinkUp", "3: Disabled", "Ethernet", "InfiniBand", "4: RNIC",
     "1: CA", "400 Gb/sec (4X NDR)", "garbage Gb/sec"]))  # fmt: skip
_names = st.sampled_from(["ens1np0", "ib0", "ib1", "bond0", "gone0"])


@st.composite
def _devices(draw: st.DrawFn) -> dict[str, RdmaDevice]:
    out: dict[str, RdmaDevice] = {}
    for name in draw(st.lists(st.sampled_from(["mlx5_0", "irdma0", "rocep1s0"]), max_size=3,
                              unique=True)):  # fmt: skip
        ports = {}
        for n in draw(st.lists(st.integers(1, 3), max_size=2, unique=True)):
            gids = tuple(
                Gid(
                    i,
                    draw(
                        st.sampled_from(
                            [
                                "fe80:0000:0000:0000:0000:0000:0000:0001",
                                "0000:0000:0000:0000:0000:ffff:0a00:0001",
                                "zz",
                                "",
                            ]
                        )
                    ),
                    draw(_text),
                    draw(st.one_of(st.none(), _names)),
                )
                for i in range(draw(st.integers(0, 3)))
            )
            ports[n] = RdmaPort(name, n, draw(_text), draw(_text), draw(_text), draw(_text), gids)
        pci = draw(st.dictionaries(_names, st.one_of(st.none(), st.integers(-1, 3)), max_size=3))
        out[name] = RdmaDevice(name, draw(_text), ports=ports, pci_netdevs=pci,
                               netdev_hint=draw(st.one_of(st.none(), _names)),
                               pci_address=draw(st.one_of(st.none(), st.text(max_size=12))))  # fmt: skip
    return out


@st.composite
def _netdevs(draw: st.DrawFn) -> dict[str, Netdev]:
    out = {}
    for name in draw(st.lists(_names, max_size=4, unique=True)):
        out[name] = Netdev(
            name,
            mtu=draw(st.one_of(st.none(), st.integers(0, 70000))),
            carrier=draw(st.one_of(st.none(), st.integers(-1, 2))),
            operstate=draw(_text),
            flags=draw(st.one_of(st.none(), st.integers(0, 0xFFFF))),
            type=draw(st.one_of(st.none(), st.sampled_from([1, 32, 772]))),
            ipoib_mode=draw(_text),
            bond_slaves=tuple(draw(st.lists(_names, max_size=2))),
        )
    return out


@given(_devices(), _netdevs(), _devices(), st.sampled_from(["judge", "skip"]), st.booleans())
def test_any_hardware_is_judged_without_a_traceback(
    rdma: dict[str, RdmaDevice],
    netdevs: dict[str, Netdev],
    earlier: dict[str, RdmaDevice],
    admin: str,
    iwarp_qos: bool,
) -> None:
    spec = checks(adminDown=admin, qosOnIWARP=iwarp_qos, devices={"exclude": ["irdma*"]})
    snap = NodeSnapshot("n", "t", 10.0, (Sample(netdevs, earlier), Sample(netdevs, rdma)))
    results = run_node_checks(snap, spec)
    assert all(r.message for r in results)
    judged = judged_subjects(snap.last, spec)
    assert not any(p.device == "irdma0" for p in judged.ports)


def test_iwarp_ports_get_no_pfc_or_ecn_intent_checks_unless_asked() -> None:
    """A Chelsio/irdma iWARP port (node_type 4: RNIC) runs over TCP: no RoCE GID, no PFC/ECN."""
    port = eth_port("iw_cxgb4_0", "enp3s0f4", 30, gids=())
    sample = Sample(
        netdevs={"enp3s0f4": up("enp3s0f4", "0000:03:00.4")},
        rdma={
            "iw_cxgb4_0": RdmaDevice(
                "iw_cxgb4_0", node_type="4: RNIC", ports={1: port}, pci_netdevs={"enp3s0f4": 0}
            )
        },
    )
    results = run_node_checks(snapshot(sample), Checks())
    by = {(r.check.value, r.subject): r for r in results}
    assert bad(results) == set()
    for check in ("pfc.priorities", "ecn.np_enabled", "ecn.cnp_flow"):
        r = by[(check, "gpu-a01")]
        assert r.status is Status.SKIP and r.message.startswith("not applicable: iWARP port(s)")
    assert by[("rdma.gid_roce_v2", "iw_cxgb4_0/1")].status is Status.SKIP
    assert by[("mtu.interface", "enp3s0f4")].status is Status.PASS
    assert by[("rdma.link_layer", "iw_cxgb4_0/1")].observed["transport"] == "iWARP"
    # asked: PFC/ECN intent is judged on the iWARP netdev (no DCB here: pfc skips per netdev)
    asked = run_node_checks(snapshot(sample), checks(qosOnIWARP=True))
    pfc = [r for r in asked if r.check.value == "pfc.priorities"]
    assert [r.subject for r in pfc] == ["enp3s0f4"]
