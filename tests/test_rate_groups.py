"""rdma.rate without a stated minimum: ports are compared within (link layer, board id, PCI
device id), so a VPI card's InfiniBand and Ethernet ports, or an Ethernet VF beside its PF,
are not held to each other's rate (docs/checks.md, rdma.rate)."""

from __future__ import annotations

from netval.agent.checks import run_node_checks
from netval.model import CheckResult, Checks, Status
from netval.model.snapshot import NodeSnapshot, Sample
from node_kit import merged, roce_sample

CX7 = "MT_0000000838"
PF, VF = "15B3:1021", "15B3:101E"  # ConnectX-7 PF / VF (drivers/net/ethernet/mellanox/mlx5)


def _device(
    name: str, rate: str, link_layer: str, *, board: str | None = CX7, pci_id: str | None = PF
) -> Sample:
    return roce_sample(
        {},
        None,
        netdev=f"{name}-net",
        device=name,
        rate=rate,
        link_layer=link_layer,
        board_id=board,
        pci_id=pci_id,
    )


def _rates(*devices: Sample) -> dict[str, CheckResult]:
    sample = merged(*devices)
    checks = Checks.model_validate({"rdma": {"linkLayers": ["Ethernet", "InfiniBand"]}})
    results = run_node_checks(NodeSnapshot("n", "now", 10.0, (sample, sample)), checks)
    return {r.subject: r for r in results if r.check.value == "rdma.rate"}


def test_vpi_infiniband_and_ethernet_ports_are_not_compared() -> None:
    rates = _rates(
        _device("mlx5_0", "400 Gb/sec (4X NDR)", "InfiniBand"),
        _device("mlx5_1", "200 Gb/sec (2X NDR)", "Ethernet"),
    )
    assert {s: r.status for s, r in rates.items()} == {
        "mlx5_0/1": Status.PASS,
        "mlx5_1/1": Status.PASS,
    }
    assert rates["mlx5_1/1"].observed["rateGroup"] == {
        "linkLayer": "RoCE",
        "boardId": CX7,
        "pciId": PF,
    }


def test_an_ethernet_vf_is_not_held_to_the_pf_rate() -> None:
    rates = _rates(
        _device("mlx5_0", "400 Gb/sec (4X NDR)", "Ethernet"),
        _device("mlx5_2", "100 Gb/sec (4X EDR)", "Ethernet", pci_id=VF),
    )
    assert {r.status for r in rates.values()} == {Status.PASS}


def test_ports_of_one_card_and_link_layer_are_still_compared() -> None:
    rates = _rates(
        _device("mlx5_0", "400 Gb/sec (4X NDR)", "Ethernet"),
        _device("mlx5_1", "200 Gb/sec (2X NDR)", "Ethernet"),
    )
    assert rates["mlx5_1/1"].status is Status.FAIL
    assert rates["mlx5_1/1"].expected == {"minRateGbps": 400.0}
    assert "the fastest port of the same card and link layer on this node" in (
        rates["mlx5_1/1"].message
    )


def test_unknown_cards_are_compared_with_each_other_per_link_layer() -> None:
    rates = _rates(
        _device("x0", "400 Gb/sec (4X NDR)", "InfiniBand", board=None, pci_id=None),
        _device("x1", "200 Gb/sec (4X HDR)", "InfiniBand", board=None, pci_id=None),
        _device("x2", "100 Gb/sec (4X EDR)", "Ethernet", board=None, pci_id=None),
    )
    assert {s: r.status for s, r in rates.items()} == {
        "x0/1": Status.PASS,
        "x1/1": Status.FAIL,
        "x2/1": Status.PASS,
    }
