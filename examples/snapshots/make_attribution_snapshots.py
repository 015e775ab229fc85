"""Generate the bundled snapshots of who `rdma.errors` points at, and of Intel irdma
retransmissions per generation (issue 28); make_snapshots.py calls main(). Deterministic,
stdlib only; it rewrites only the directories in SNAPSHOTS.

- victim-peer-down-roce: healthy-roce's node while a peer of its job died. Every requester
  QP toward the dead node times out and gives up, on both ports: local_ack_timeout_err
  +41/+37, req_transport_retries_exceeded +3/+2 and req_cqe_error +6/+4 (the flushed work
  requests) in 10 s; the node's own links, PHYs, PFC and pause counters are as healthy as
  healthy-roce's. The timeout rate is the order of the public byteps capture (bytedance/
  byteps#179: local_ack_timeout_err 2705 on a mlx5 port). Expected: nothing fails;
  rdma.errors warns on mlx5_0/1 and mlx5_1/1 with attribution `requester`.
- victim-irdma-gen3-retransmits: an Intel irdma GEN_3 device `irdma0` on an IPU E2000
  virtual function (PCI 8086:145C, IDPF_DEV_ID_VF in drivers/net/ethernet/intel/idpf/
  idpf_devids.h; the device's own uevent says DRIVER=idpf), netdev enp0s9, RoCEv2. Its
  hw_counters carry the GEN_3 names of drivers/infiniband/hw/irdma/verbs.c
  (irdma_hw_stat_descs: `RetransSegs`, `RTO`, `Nak Sequence Error`, `Nak Sequence Error
  Implied`, `RNR sent`, `RNR received`, `Rcvd Out of order packets`, `CRC errors`, with
  spaces in the file names). A peer stopped answering: RetransSegs +4000 (400/s), RTO +35,
  Nak Sequence Error +120 in 10 s; the carrier is steady. idpf has no DCB operations
  (dcb/enp0s9.error EOPNOTSUPP) and its ethtool statistics are vport counters only
  (drivers/net/ethernet/intel/idpf/idpf_ethtool.c). Expected: nothing fails; rdma.errors
  warns with attribution `requester` and names driver idpf (never ice); the port-counter
  checks skip saying idpf has no such counter.
- fault-irdma-e810-crc-retransmits: healthy-intel-e810's node (E810-CQDA2, 8086:1592, ice:
  the RDMA device's driver link, as libfabric's psm3 documents for irdma0 in
  prov/psm3/psm3/psm2.h) with a bad optic on ens801f0: rx_crc_errors.nic +2400 in 10 s at
  100 Gb/s (a post-FEC BER of 2.4e-9) and the RoCE traffic of irdma0 retransmitting,
  RetransSegs +4000 (400/s). Expected: link.phy_errors fails on ens801f0 and rdma.errors
  fails on irdma0/1 with attribution `local`, evidence link.phy_errors.

Counter values and addresses are modelled; the names, ids and file formats follow the
sources above and those of make_snapshots.py and make_vendor_snapshots.py.
"""

from __future__ import annotations

from collections.abc import Callable

import make_snapshots as roce
import make_vendor_snapshots as vendor

Files = dict[str, str]


def _peer_down(node: roce.Node) -> None:
    for netdev, (timeouts, exceeded, flushed) in {
        "ens1np0": (41, 3, 6),
        "ens2np0": (37, 2, 4),
    }.items():
        p = roce._port(node, netdev)
        roce._grow(p, "local_ack_timeout_err", timeouts)
        roce._grow(p, "req_transport_retries_exceeded", exceeded)
        roce._grow(p, "req_cqe_error", flushed)


# -- irdma GEN_3 on an idpf virtual function -----------------------------------------------


def _ipu_vf() -> vendor.VPort:
    rx, tx = (41_880_227_118_004, 8_102_004_228), (40_117_118_900_417, 7_911_882_114)
    return vendor.VPort(
        netdev="enp0s9",
        rdma="irdma0",
        driver="idpf",
        pci_id="8086:145C",
        subsys="8086:0000",
        slot="0000:00:09.0",
        pcie=("16.0 GT/s PCIe", 16),
        mac="42:01:c0:a8:40:04",
        ipv4=(192, 168, 64, 4),
        speed=200000,
        rate="200 Gb/sec (4X HDR)",
        fw_ver="1.9",
        board_id="IPU E2000",
        hca_type="IPU",
        # idpf_gstrings_port_stats: vport counters only
        ethtool={
            "rx-csum_errors": (0, 0),
            "rx-hsplit": (0, 0),
            "rx-hsplit_hbo": (0, 0),
            "rx-bad_descs": (0, 0),
            "tx-skb_drops": (0, 0),
            "tx-dma_map_errs": (0, 0),
            "tx-linearized_pkts": (0, 0),
            "tx-busy_events": (0, 0),
            "rx-unicast_pkts": (2_118_004_331, 812_004),
            "rx-multicast_pkts": (4_118, 2),
            "rx-broadcast_pkts": (211, 0),
            "rx-unknown_protocol": (0, 0),
            "tx-unicast_pkts": (2_004_117_902, 788_311),
            "tx-multicast_pkts": (3_902, 2),
            "tx-broadcast_pkts": (198, 0),
        },
        hw={
            "ip4InDiscards": (0, 0),
            "ip4InTruncatedPkts": (0, 0),
            "ip4OutNoRoutes": (0, 0),
            "rxVlanErrors": (0, 0),
            "ip4InOctets": (rx[0], rx[1]),
            "ip4OutOctets": (tx[0], tx[1]),
            "RxUDP": (10_204_117_331, 1_988_004),
            "TxUDP": (9_902_001_228, 1_912_911),
            "InRdmaWrites": (901_447_118, 173_014),
            "OutRdmaWrites": (888_002_413, 167_800),
            "RxECNMrkd": (1_330_118, 377),
            "cnpHandled": (1_204_117, 411),
            "cnpIgnored": (0, 0),
            "cnpSent": (1_312_004, 372),
            "RetransSegs": (18_204, 4_000),
            "InOptErrors": (0, 0),
            "InProtoErrors": (0, 0),
            "RNR sent": (0, 0),
            "RNR received": (0, 0),
            "Nak Sequence Error": (311, 120),
            "Nak Sequence Error Implied": (0, 0),
            "RTO": (17, 35),
            "Rcvd Out of order packets": (0, 0),
            "CRC errors": (0, 0),
        },
    )


def _ipu_files(i: int) -> Files:
    port = _ipu_vf()
    files = vendor.render_port(port, i)
    # idpf has no dcbnl operations: DCB netlink answers EOPNOTSUPP
    del files[f"dcb/{port.netdev}.json"]
    files[f"dcb/{port.netdev}.error"] = "EOPNOTSUPP\n"
    return files


# -- E810 with a bad optic -----------------------------------------------------------------


def _e810_crc(i: int) -> Files:
    ports = vendor.e810()
    bad = ports[0]
    base, _ = bad.ethtool["rx_crc_errors.nic"]
    bad.ethtool["rx_crc_errors.nic"] = (base, 2_400)
    bad.hw["RetransSegs"] = (9_120, 4_000)
    for p in ports[1:]:
        p.hw["RetransSegs"] = (8_877, 0)
    files: Files = {}
    for p in ports:
        files.update(vendor.render_port(p, i))
    return files


def _build_roce(name: str, node_name: str, fault: Callable[[roce.Node], None]) -> int:
    return roce.build(name, node_name, fault)


SNAPSHOTS: dict[str, tuple[str, Callable[[int], Files]]] = {
    "victim-irdma-gen3-retransmits": ("h4d-n02", _ipu_files),
    "fault-irdma-e810-crc-retransmits": ("cpu-s02", _e810_crc),
}


def main() -> None:
    count = _build_roce("victim-peer-down-roce", "gpu-a10", _peer_down)
    print(f"victim-peer-down-roce: {count} files")
    for name, (node_name, render) in SNAPSHOTS.items():
        print(f"{name}: {vendor.build(name, node_name, render)} files")


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
