"""Generate the bundled netval-snapshot/1.1 example of an AMD Pensando (ionic) RoCE node.

Called by make_snapshots.py (and runnable alone); deterministic, stdlib only. It owns the
directory in IONIC_SNAPSHOTS and rewrites only that; the port model and the writer are
make_vendor_snapshots.py's.

- healthy-ionic-pollara: two AMD Pensando Pollara 400 AI NICs (400GbE, PCIe Gen5 x16, PCI
  vendor 1DD8 = PCI_VENDOR_ID_PENSANDO, device 1002 = PCI_DEVICE_ID_PENSANDO_IONIC_ETH_PF in
  drivers/net/ethernet/pensando/ionic/ionic.h), netdevs enp65s0np0/enp193s0np0 (ionic), RDMA
  ionic_0/ionic_1 (ionic_rdma, drivers/infiniband/hw/ionic, linux v6.18), PFC + DSCP trust
  on priority 3, DCQCN in firmware (ionic has no ecn/ sysfs: the ECN enable checks skip and
  the CNP flow is judged from hw_counters, as on bnxt).
  ethtool names are the port stats of drivers/net/ethernet/pensando/ionic/ionic_stats.c
  (struct ionic_port_stats in ionic_if.h: `frames_rx_pause`, `frames_rx_bad_fcs`,
  `rx_pripause_3_1us_count`, `rx_pause_1us_count`, ...) and its LIF stats (`hw_rx_dropped`,
  `hw_tx_dropped`). The RDMA hw_counters are named by the firmware and listed by
  ionic_hw_stats.c; the names are those netval's IONIC map reads (`tx_rdma_cnp_pkts`,
  `rx_rdma_cnp_pkts`, `rx_rdma_ecn_pkts`, `req_rx_pkt_seq_err`, ...).
  The ionic_rdma device exposes `hw_rev` and `hca_type` but no `board_id` (only mlx4/mlx5
  define one), and in-tree ionic sets no MODULE_VERSION: both are absent here.

The subsystem id, firmware version and counter values are modelled (not a capture), on the
healthy ConnectX node's 10 s busy all-reduce window; the ionic pause counters are in
microseconds like bnxt's.
"""

from __future__ import annotations

from collections.abc import Callable

from make_vendor_snapshots import Counter, Files, VPort, build, render_port


def _ionic_ethtool(rx_bytes: Counter, tx_bytes: Counter, pause_us: Counter) -> dict[str, Counter]:
    frames_rx = (rx_bytes[0] // 4_200, rx_bytes[1] // 4_200)
    frames_tx = (tx_bytes[0] // 4_200, tx_bytes[1] // 4_200)
    stats: dict[str, Counter] = {
        "tx_packets": frames_tx,
        "tx_bytes": tx_bytes,
        "rx_packets": frames_rx,
        "rx_bytes": rx_bytes,
        "hw_tx_dropped": (0, 0),
        "hw_rx_dropped": (0, 0),
        "frames_rx_ok": frames_rx,
        "frames_rx_all": frames_rx,
        "frames_rx_bad_fcs": (2, 0),  # from cabling day; judged as deltas
        "frames_rx_bad_all": (2, 0),
        "octets_rx_ok": rx_bytes,
        "frames_rx_pause": (0, 0),  # 802.3x link-level pause: off on a PFC port
        "frames_rx_pripause": (1_711_004, 261),
        "frames_rx_dropped": (0, 0),
        "frames_tx_ok": frames_tx,
        "frames_tx_all": frames_tx,
        "frames_tx_bad": (0, 0),
        "octets_tx_ok": tx_bytes,
        "frames_tx_pause": (0, 0),
        "frames_tx_pripause": (802_118, 120),
        "rx_pause_1us_count": (0, 0),
        "tx_pause_1us_count": (0, 0),
    }
    for p in range(8):
        rx = pause_us if p == 3 else (0, 0)
        tx = (pause_us[0] // 2, pause_us[1] // 2) if p == 3 else (0, 0)
        stats[f"rx_pripause_{p}_1us_count"] = rx
        stats[f"tx_pripause_{p}_1us_count"] = tx
    return stats


def _ionic_hw(marked: Counter, sent: Counter, handled: Counter) -> dict[str, Counter]:
    return {
        "tx_rdma_ucast_pkts": (85_102_447_001, 1_590_114),
        "tx_rdma_ucast_bytes": (361_004_228_117_004, 68_811_204_096),
        "rx_rdma_ucast_pkts": (87_990_112_418, 1_601_887),
        "rx_rdma_ucast_bytes": (370_881_004_227_118, 71_102_447_104),
        "tx_rdma_cnp_pkts": sent,
        "rx_rdma_cnp_pkts": handled,
        "rx_rdma_ecn_pkts": marked,
        "req_rx_pkt_seq_err": (377, 0),
        "req_rx_rnr_retry_err": (0, 0),
        "req_rx_impl_nak_seq_err": (3, 0),
        "req_rx_cqe_err": (0, 0),
        "req_tx_retry_excd_err": (0, 0),
        "resp_rx_outouf_seq": (1_044, 0),
        "resp_rx_outof_buf": (0, 0),
        "resp_rx_cqe_err": (0, 0),
        "tx_rdma_ack_timeout": (27, 0),
    }


def pollara() -> list[VPort]:
    ports = []
    for n, (slot, mac, ip) in enumerate(
        [
            ("0000:41:00.0", "04:90:81:3c:12:a0", (10, 40, 1, 41)),
            ("0000:c1:00.0", "04:90:81:3c:5e:c8", (10, 40, 2, 41)),
        ]
    ):
        ports.append(
            VPort(
                netdev=f"enp{65 + 128 * n}s0np0",
                rdma=f"ionic_{n}",
                driver="ionic",
                pci_id="1DD8:1002",
                subsys="1DD8:5201",
                slot=slot,
                numa=n,  # one card per socket
                mac=mac,
                ipv4=ip,
                speed=400000,
                rate="400 Gb/sec (4X NDR)",
                fw_ver="1.110.0-a-79",
                board_id="",  # dropped below: ionic_rdma has no board_id attribute
                hca_type="AMD Pensando RoCE HCA",
                # ~3.6 ms of pause per 10 s: the share a healthy lossless class sees
                ethtool=_ionic_ethtool(
                    (370_881_004_227_118, 71_102_447_104),
                    (361_004_228_117_004, 68_811_204_096),
                    (104_228_117_004, 3_611),
                ),
                hw=_ionic_hw(
                    marked=(70_118_004, 39_880),
                    sent=(67_441_228, 37_902),
                    handled=(88_907_114, 46_228),
                ),
                pfc_requests=(802_118, 120),
                pfc_indications=(1_711_004, 261),
            )
        )
    return ports


def ionic_files(i: int) -> Files:
    files: Files = {}
    for p in pollara():
        files.update(render_port(p, i))
    return {rel: text for rel, text in files.items() if not rel.endswith("/board_id")}


IONIC_SNAPSHOTS: dict[str, tuple[str, Callable[[int], Files]]] = {
    "healthy-ionic-pollara": ("gpu-p01", ionic_files),
}


def main() -> None:
    for name, (node_name, render) in IONIC_SNAPSHOTS.items():
        print(f"{name}: {build(name, node_name, render)} files")


if __name__ == "__main__":
    main()
