"""Typed one-port RoCE samples for the counter-check tests: a netdev and the RDMA port whose
RoCE v2 GID sits on it, with the counters a test gives. Real files come from the bundled
snapshots; these are for judging counter values directly."""

from __future__ import annotations

from netval.model.snapshot import (
    Dcb,
    DcbApp,
    Gid,
    Netdev,
    NodeSnapshot,
    RdmaDevice,
    RdmaPort,
    Sample,
)

IPV4_GID = "0000:0000:0000:0000:0000:ffff:0a00:0001"


def roce_sample(
    hw: dict[str, int],
    ethtool: dict[str, int] | None,
    *,
    netdev: str = "eth0",
    device: str = "rdma0",
    rdma_driver: str | None = "mlx5_core",
    netdev_driver: str | None = "mlx5_core",
    speed_mbps: int | None = 400_000,
    rate: str = "400 Gb/sec (4X NDR)",
    carrier_changes: int = 2,
    ecn: bool = True,
    node_type: str | None = None,
    pci_id: str | None = None,
    board_id: str | None = None,
    gid: str = IPV4_GID,
    link_layer: str = "Ethernet",
) -> Sample:
    """One netdev with PFC and DSCP trust on priority 3 (ECN on 3 when `ecn`) and its RDMA
    port, ACTIVE, with `hw` as hw_counters and `ethtool` as its statistics (`link_layer`
    InfiniBand makes it an IB port bound to that netdev)."""
    nd = Netdev(
        name=netdev,
        mtu=9000,
        carrier=1,
        operstate="up",
        carrier_changes=carrier_changes,
        speed_mbps=speed_mbps,
        driver=netdev_driver,
        ecn_np={p: p == 3 for p in range(8)} if ecn else {},
        ecn_rp={p: p == 3 for p in range(8)} if ecn else {},
        ethtool=ethtool,
        dcb=Dcb(frozenset({3}), app=(DcbApp("dscp", 26, 3),)),
    )
    port = RdmaPort(
        device=device,
        port=1,
        state="4: ACTIVE",
        phys_state="5: LinkUp",
        rate=rate,
        link_layer=link_layer,
        gids=(Gid(3, gid, "RoCE v2", netdev),),
        hw_counters=hw,
    )
    rdma = RdmaDevice(
        device,
        node_type=node_type,
        ports={1: port},
        driver=rdma_driver,
        pci_id=pci_id,
        board_id=board_id,
    )
    return Sample({netdev: nd}, {device: rdma})


def merged(*samples: Sample) -> Sample:
    """One node with the netdevs and RDMA devices of each sample."""
    return Sample(
        {k: v for s in samples for k, v in s.netdevs.items()},
        {k: v for s in samples for k, v in s.rdma.items()},
    )


def window(first: Sample, last: Sample, seconds: float = 10.0) -> NodeSnapshot:
    return NodeSnapshot("n1", "now", seconds, (first, last))
