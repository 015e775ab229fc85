"""Generate the bundled netval-snapshot/1.1 examples for non-ConnectX fleets and RoCE LAGs.

Called by make_snapshots.py (and runnable alone); deterministic, stdlib only. It owns the
directories in VENDOR_SNAPSHOTS and rewrites only those.

- healthy-bnxt-thor2: two Broadcom BCM57608 (Thor2, PCI 14E4:1760) 400GbE ports,
  ens1f0np0/ens2f0np0 (bnxt_en), RDMA bnxt_re0/bnxt_re1, PFC + DSCP trust on priority 3,
  ECN/DCQCN configured in firmware (bnxt has no ecn/ sysfs: the ECN enable checks skip and
  the CNP flow is judged from hw_counters). hw_counters use the names of
  drivers/infiniband/hw/bnxt_re/hw_counters.c up to v6.17 (`tx_cnp_pkts`, `rx_cnp_pkts`,
  `rx_ecn_marked_pkts`, `to_retransmits`, `oos_drop_count`, ...); ethtool names are
  drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c (`pfc_pri3_rx_duration_us`,
  `rx_pfc_ena_frames_pri3`, `rx_pause_frames`, `rx_stat_discard`, `rx_pcs_symbol_err`,
  `rx_corrected_bits`, `continuous_roce_pause_events`).
- fault-bnxt-ecn-np-disabled: the same node on a newer bnxt_re that uses the mlx5-style names
  ("RDMA/bnxt_re: RoCE related hardware counters update", linux-rdma 2025-08-14:
  `np_ecn_marked_roce_packets`, `np_cnp_pkts`, `rp_cnp_handled`, `local_ack_timeout_err`,
  `out_of_sequence`, ...), with the notification point disabled in firmware on bnxt_re0:
  ECN-marked packets arrive, no CNP leaves. Fails ecn.cnp_flow only.
- healthy-intel-e810: two Intel E810-CQDA2 (PCI 8086:1592) 100GbE ports ens801f0/ens801f1
  (ice), RDMA irdma0/irdma1 in RoCEv2 mode, PFC on 3 via software DCB. ethtool names are
  drivers/net/ethernet/intel/ice/ice_ethtool.c (`rx_priority_3_xoff.nic`,
  `link_xoff_rx.nic`, `rx_dropped.nic`, `rx_crc_errors.nic`); hw_counters are irdma's
  (drivers/infiniband/hw/irdma/verbs.c: `cnpSent`, `cnpHandled`, `cnpIgnored`, `RxECNMrkd`,
  `ip4InDiscards`, ...). ice has no pause-duration counter: that part skips, by name.
- healthy-roce-lag-renamed: a dual-port ConnectX-7 (0000:81:00.0/.1) in a RoCE LAG: bond0
  over ens1f0np0/ens1f1np1 (802.3ad), one RDMA device named by rdma-core's udev rules
  `rocep129s0f0` (not mlx5_bond_0), its GIDs on bond0 (which has no `device`); the RDMA
  device's own device/uevent says DRIVER=mlx5_core. DCB netlink on the bond answers
  EOPNOTSUPP (bonding has no dcbnl ops), recorded as dcb/bond0.error.

Values are modelled on the healthy ConnectX node (10 s window, busy all-reduce traffic) with
each vendor's own counter set; where a vendor's counter semantics differ (bnxt pause in
microseconds, ice without durations), the comments say so.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMAT = "netval-snapshot/1.1"
CAPTURED_AT = "2025-06-12T08:30:00Z"
INTERVAL = 10
SAMPLES = 2
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"

Counter = tuple[int, int]  # (value in sample 0, growth per interval)
Files = dict[str, str]


def _line(value: object) -> str:
    return f"{value}\n"


def pci_files(device_dir: str, link: tuple[str, int], numa: int) -> Files:
    """PCIe placement (issue 22): pci_speed_string() of drivers/pci/pci.c, the negotiated
    width, numa_node (drivers/pci/pci-sysfs.c). Thor2 BCM57608 is a PCIe Gen5 x16 part
    (Broadcom's BCM957608 product brief), the E810-CQDA2 a PCIe 4.0 x16 card (Intel's
    E810 product brief)."""
    return {
        f"{device_dir}/current_link_speed": _line(link[0]),
        f"{device_dir}/current_link_width": _line(link[1]),
        f"{device_dir}/numa_node": _line(numa),
    }


def _uevent(driver: str, pci_id: str, subsys: str, slot: str) -> str:
    v, d = pci_id.split(":")
    sv, sd = subsys.split(":")
    return (
        f"DRIVER={driver}\nPCI_CLASS=20000\nPCI_ID={pci_id}\nPCI_SUBSYS_ID={subsys}\n"
        f"PCI_SLOT_NAME={slot}\nMODALIAS=pci:v0000{v}d0000{d}sv0000{sv}sd0000{sd}bc02sc00i00\n"
    )


def _gid_v4(ip: tuple[int, int, int, int]) -> str:
    a, b, c, d = ip
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def _gid_ll(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 0x02
    return (
        f"fe80:0000:0000:0000:{b[0]:02x}{b[1]:02x}:{b[2]:02x}ff:fe{b[3]:02x}:{b[4]:02x}{b[5]:02x}"
    )


@dataclass
class VPort:
    netdev: str
    rdma: str
    driver: str
    pci_id: str
    subsys: str
    slot: str
    mac: str
    ipv4: tuple[int, int, int, int]
    speed: int
    rate: str
    fw_ver: str
    board_id: str
    hca_type: str
    ethtool: dict[str, Counter]
    hw: dict[str, Counter]
    mtu: int = 9000
    carrier_changes: int = 2
    dcb_pfc: list[int] = field(default_factory=lambda: [3])
    pfc_requests: Counter = (0, 0)
    pfc_indications: Counter = (0, 0)
    # PCIe placement (issue 22); in-tree bnxt_en and ice set no MODULE_VERSION: no version
    pcie: tuple[str, int] = ("32.0 GT/s PCIe", 16)
    numa: int = 0


def _dcb(p: VPort, i: int) -> str:
    req = [0] * 8
    ind = [0] * 8
    req[3] = p.pfc_requests[0] + p.pfc_requests[1] * i
    ind[3] = p.pfc_indications[0] + p.pfc_indications[1] * i
    app = [{"selector": "dscp", "protocol": 26, "priority": 3}]
    app.append({"selector": "dscp", "protocol": 48, "priority": 6})
    doc = {"pfc_enabled": p.dcb_pfc, "pfc_requests": req, "pfc_indications": ind, "app": app}
    return json.dumps(doc, indent=1) + "\n"


def render_port(p: VPort, i: int, gid_ndev: str | None = None) -> Files:
    files: Files = {}
    net = f"sys/class/net/{p.netdev}"
    files.update(
        {
            f"{net}/mtu": _line(p.mtu),
            f"{net}/carrier": "1\n",
            f"{net}/operstate": "up\n",
            f"{net}/carrier_changes": _line(p.carrier_changes),
            f"{net}/speed": _line(p.speed),
            f"{net}/duplex": "full\n",
            f"{net}/address": _line(p.mac),
            f"{net}/device/uevent": _uevent(p.driver, p.pci_id, p.subsys, p.slot),
            **pci_files(f"{net}/device", p.pcie, p.numa),
        }
    )
    stats = {k: c[0] + c[1] * i for k, c in p.ethtool.items()}
    files[f"ethtool/{p.netdev}.json"] = json.dumps(stats, indent=1) + "\n"
    files[f"dcb/{p.netdev}.json"] = _dcb(p, i)
    ib = f"sys/class/infiniband/{p.rdma}"
    files.update(
        {
            f"{ib}/node_type": "1: CA\n",
            f"{ib}/fw_ver": _line(p.fw_ver),
            f"{ib}/board_id": _line(p.board_id),
            f"{ib}/hca_type": _line(p.hca_type),
            # The RDMA device's parent is the NIC's PCI function (format 1.1 records it).
            f"{ib}/device/uevent": _uevent(p.driver, p.pci_id, p.subsys, p.slot),
            **pci_files(f"{ib}/device", p.pcie, p.numa),
        }
    )
    port = f"{ib}/ports/1"
    files.update(
        {
            f"{port}/state": "4: ACTIVE\n",
            f"{port}/phys_state": "5: LinkUp\n",
            f"{port}/rate": _line(p.rate),
            f"{port}/link_layer": "Ethernet\n",
        }
    )
    ndev = gid_ndev or p.netdev
    gids = [
        (_gid_ll(p.mac), "IB/RoCE v1"),
        (_gid_ll(p.mac), "RoCE v2"),
        (_gid_v4(p.ipv4), "IB/RoCE v1"),
        (_gid_v4(p.ipv4), "RoCE v2"),
        (ZERO_GID, None),
        (ZERO_GID, None),
    ]
    for idx, (gid, kind) in enumerate(gids):
        files[f"{port}/gids/{idx}"] = _line(gid)
        if kind is not None:
            files[f"{port}/gid_attrs/types/{idx}"] = _line(kind)
            files[f"{port}/gid_attrs/ndevs/{idx}"] = _line(ndev)
    for name, c in p.hw.items():
        files[f"{port}/hw_counters/{name}"] = _line(c[0] + c[1] * i)
    files[f"rdma_cm/{p.rdma}/ports/1/default_roce_tos"] = "106\n"
    return files


# -- Broadcom Thor2 -------------------------------------------------------------------------


def _bnxt_ethtool(rx_bytes: Counter, tx_bytes: Counter, pause_us: Counter) -> dict[str, Counter]:
    frames_rx = (rx_bytes[0] // 4_200, rx_bytes[1] // 4_200)
    frames_tx = (tx_bytes[0] // 4_200, tx_bytes[1] // 4_200)
    return {
        "rx_total_discard_pkts": (0, 0),
        "tx_total_discard_pkts": (0, 0),
        "rx_total_frames": frames_rx,
        "rx_fcs_err_frames": (3, 0),  # from cabling day; judged as deltas
        "rx_pause_frames": (0, 0),  # 802.3x link-level pause: off on a PFC port
        "rx_pfc_frames": (1_904_226, 288),
        "rx_pfc_ena_frames_pri3": (1_904_226, 288),
        "rx_bytes": rx_bytes,
        "rx_stat_discard": (0, 0),
        "rx_stat_err": (0, 0),
        "tx_total_frames": frames_tx,
        "tx_pause_frames": (0, 0),
        "tx_pfc_frames": (880_417, 131),
        "tx_pfc_ena_frames_pri3": (880_417, 131),
        "tx_bytes": tx_bytes,
        "tx_stat_discard": (0, 0),
        "tx_stat_error": (0, 0),
        "link_down_events": (1, 0),
        "continuous_pause_events": (0, 0),
        "resume_pause_events": (0, 0),
        "continuous_roce_pause_events": (0, 0),
        "resume_roce_pause_events": (0, 0),
        "pfc_pri3_rx_duration_us": pause_us,
        "pfc_pri3_rx_transitions": (952_113, 144),
        "pfc_pri3_tx_duration_us": (pause_us[0] // 2, pause_us[1] // 2),
        "pfc_pri3_tx_transitions": (440_208, 65),
        "rx_bits": (rx_bytes[0] * 8, rx_bytes[1] * 8),
        "rx_buffer_passed_threshold": (20_117, 4),
        "rx_pcs_symbol_err": (0, 0),
        "rx_corrected_bits": (3_880_112, 61),
    }


def _bnxt_hw(
    new_names: bool, marked: Counter, sent: Counter, handled: Counter
) -> dict[str, Counter]:
    base: dict[str, Counter] = {
        "active_pds": (4, 0),
        "active_qps": (131, 0),
        "rx_pkts": (88_201_774_102, 1_604_223),
        "rx_bytes": (371_918_442_110_874, 71_204_388_352),
        "tx_pkts": (85_912_330_871, 1_588_102),
        "tx_bytes": (362_771_004_118_221, 68_930_112_640),
        "recoverable_errors": (0, 0),
        "rx_roce_errors": (0, 0),
        "rx_roce_discards": (0, 0),
    }
    if not new_names:
        base.update(
            {
                "to_retransmits": (31, 0),
                "seq_err_naks_rcvd": (418, 0),
                "max_retry_exceeded": (0, 0),
                "rnr_naks_rcvd": (0, 0),
                "missing_resp": (2, 0),
                "unrecoverable_err": (0, 0),
                "dup_req": (211, 0),
                "oos_drop_count": (1_207, 0),
                "rx_out_of_buffer": (0, 0),
                "rx_ecn_marked_pkts": marked,
                "tx_cnp_pkts": sent,
                "rx_cnp_pkts": handled,
            }
        )
    else:
        base.update(
            {
                "local_ack_timeout_err": (31, 0),
                "packet_seq_err": (418, 0),
                "max_retry_exceeded": (0, 0),
                "rnr_nak_retry_err": (0, 0),
                "implied_nak_seq_err": (2, 0),
                "unrecoverable_err": (0, 0),
                "duplicate_request": (211, 0),
                "out_of_sequence": (1_207, 0),
                "out_of_buffer": (0, 0),
                "np_ecn_marked_roce_packets": marked,
                "np_cnp_pkts": sent,
                "rp_cnp_handled": handled,
                "req_cqe_error": (5, 0),
                "resp_cqe_error": (0, 0),
                "resp_remote_access_errors": (0, 0),
            }
        )
    return base


def thor2(new_names: bool = False) -> list[VPort]:
    ports = []
    for n, (slot, mac, ip) in enumerate(
        [
            ("0000:41:00.0", "84:16:0c:a2:31:40", (10, 20, 1, 21)),
            ("0000:c1:00.0", "84:16:0c:a2:4f:e0", (10, 20, 2, 21)),
        ]
    ):
        ports.append(
            VPort(
                netdev=f"ens{n + 1}f0np0",
                rdma=f"bnxt_re{n}",
                driver="bnxt_en",
                pci_id="14E4:1760",
                subsys="14E4:9161",
                slot=slot,
                numa=n,  # one card per socket
                mac=mac,
                ipv4=ip,
                speed=400000,
                rate="400 Gb/sec (4X NDR)",
                fw_ver="230.2.49.0",
                board_id="BCM957608-P2200G",
                hca_type="Broadcom NetXtreme-E",
                # ~3.9 ms of pause per 10 s: the 0.04 % a healthy lossless class sees
                ethtool=_bnxt_ethtool(
                    (371_918_442_110_874, 71_204_388_352),
                    (362_771_004_118_221, 68_930_112_640),
                    (118_402_004_112, 3_904),
                ),
                hw=_bnxt_hw(
                    new_names,
                    marked=(71_408_112, 40_227),
                    sent=(68_002_917, 38_114),
                    handled=(90_118_443, 47_001),
                ),
                pfc_requests=(880_417, 131),
                pfc_indications=(1_904_226, 288),
            )
        )
    return ports


# -- Intel E810 -----------------------------------------------------------------------------


def e810() -> list[VPort]:
    ports = []
    for n, (mac, ip) in enumerate(
        [("b4:96:91:d2:7a:10", (10, 30, 1, 31)), ("b4:96:91:d2:7a:11", (10, 30, 2, 31))]
    ):
        rx, tx = (81_220_447_118_004, 15_801_004_228), (79_442_118_900_417, 15_211_882_114)
        ports.append(
            VPort(
                netdev=f"ens801f{n}",
                rdma=f"irdma{n}",
                driver="ice",
                pci_id="8086:1592",
                subsys="8086:0002",
                slot=f"0000:3b:00.{n}",
                pcie=("16.0 GT/s PCIe", 16),
                mac=mac,
                ipv4=ip,
                speed=100000,
                rate="100 Gb/sec (4X EDR)",
                fw_ver="1.3",
                board_id="E810-CQDA2",
                hca_type="E810",
                ethtool={
                    "rx_unicast": (19_330_211_004, 3_760_118),
                    "tx_unicast": (18_902_117_338, 3_619_004),
                    "rx_bytes": (rx[0], rx[1]),
                    "tx_bytes": (tx[0], tx[1]),
                    "rx_dropped": (0, 0),
                    "rx_bytes.nic": (rx[0] + 4_118_220, rx[1] + 812),
                    "tx_bytes.nic": (tx[0] + 3_902_117, tx[1] + 640),
                    "rx_unicast.nic": (19_330_211_004, 3_760_118),
                    "tx_unicast.nic": (18_902_117_338, 3_619_004),
                    "tx_errors.nic": (0, 0),
                    "link_xon_rx.nic": (0, 0),
                    "link_xon_tx.nic": (0, 0),
                    "link_xoff_rx.nic": (0, 0),
                    "link_xoff_tx.nic": (0, 0),
                    "tx_dropped_link_down.nic": (0, 0),
                    "rx_undersize.nic": (0, 0),
                    "rx_oversize.nic": (0, 0),
                    "rx_length_errors.nic": (0, 0),
                    "rx_dropped.nic": (412, 0),  # a buffer-full burst at boot, weeks ago
                    "rx_crc_errors.nic": (0, 0),
                    "illegal_bytes.nic": (0, 0),
                    "mac_local_faults.nic": (2, 0),
                    "mac_remote_faults.nic": (1, 0),
                    "rx_priority_3_xon.nic": (401_226, 77),
                    "rx_priority_3_xoff.nic": (402_118, 77),
                    "tx_priority_3_xon.nic": (188_402, 31),
                    "tx_priority_3_xoff.nic": (188_977, 31),
                },
                hw={
                    "ip4InDiscards": (0, 0),
                    "ip4InTruncatedPkts": (0, 0),
                    "ip6InDiscards": (0, 0),
                    "ip4OutNoRoutes": (0, 0),
                    "rxVlanErrors": (0, 0),
                    "ip4InOctets": (rx[0] - 2_004_117, rx[1] - 604),
                    "ip4InPkts": (19_330_004_117, 3_760_001),
                    "ip4OutOctets": (tx[0] - 1_877_002, tx[1] - 512),
                    "ip4OutPkts": (18_902_001_228, 3_618_911),
                    "RxUDP": (19_330_004_117, 3_760_001),
                    "TxUDP": (18_902_001_228, 3_618_911),
                    "InRdmaWrites": (1_201_447_118, 233_014),
                    "OutRdmaWrites": (1_188_002_413, 227_800),
                    "cnpHandled": (8_204_117, 4_411),
                    "cnpIgnored": (0, 0),
                    "cnpSent": (7_912_004, 4_102),
                    "RxECNMrkd": (8_330_118, 4_377),
                },
                pfc_requests=(188_977, 31),
                pfc_indications=(402_118, 77),
            )
        )
    return ports


# -- RoCE LAG with udev-renamed device ------------------------------------------------------


def lag_files(i: int) -> Files:
    import make_snapshots as base  # the ConnectX-7 traffic model; imported here: no cycle

    node = base.healthy()
    renames = {"ens1np0": "ens1f0np0", "ens2np0": "ens1f1np1"}
    for n, p in enumerate(node.ports):
        p.netdev = renames[p.netdev]
        p.pci_slot = f"0000:81:00.{n}"
        p.numa = 1
        p.speed = 200000
        p.rate = "200 Gb/sec (2X NDR)"
    files = base.render_sample(copy.deepcopy(node), i)
    out: Files = {}
    ib_old, ib_new = "sys/class/infiniband/mlx5_0/", "sys/class/infiniband/rocep129s0f0/"
    for rel, content in files.items():
        # A LAG has one RDMA device; the second port's RDMA device is gone.
        if "/mlx5_1/" in rel or rel.startswith("rdma_cm/mlx5_1"):
            continue
        rel = rel.replace(ib_old, ib_new).replace("rdma_cm/mlx5_0/", "rdma_cm/rocep129s0f0/")
        if "/gid_attrs/ndevs/" in rel:
            content = "bond0\n"
        out[rel] = content
    slaves = "ens1f0np0 ens1f1np1"
    bond = "sys/class/net/bond0"
    out.update(
        {
            f"{bond}/mtu": "9000\n",
            f"{bond}/carrier": "1\n",
            f"{bond}/operstate": "up\n",
            f"{bond}/carrier_changes": "1\n",
            f"{bond}/speed": "400000\n",
            f"{bond}/duplex": "full\n",
            f"{bond}/address": "9c:63:c0:ab:ed:5a\n",
            f"{bond}/bonding/slaves": slaves + "\n",
            f"{bond}/bonding/mode": "802.3ad 4\n",
            # bonding has no dcbnl ops: DCB netlink answers EOPNOTSUPP
            "dcb/bond0.error": "EOPNOTSUPP\n",
            f"{ib_new}device/uevent": _uevent(
                "mlx5_core", "15B3:1021", "15B3:0041", "0000:81:00.0"
            ),
            **pci_files(f"{ib_new}device", base.CX7_PCIE, 1),
        }
    )
    return out


# -- writing --------------------------------------------------------------------------------


def _node_files(ports: list[VPort], i: int) -> Files:
    files: Files = {}
    for p in ports:
        files.update(render_port(p, i))
    return files


def _bnxt_ecn_fault(i: int) -> Files:
    ports = thor2(new_names=True)
    # Firmware CC on bnxt_re0 has the NP role off: marks arrive, no CNP is generated, and
    # the far end's RP, never told, keeps sending at line rate into the congested queue.
    ports[0].hw["np_cnp_pkts"] = (0, 0)
    return _node_files(ports, i)


VENDOR_SNAPSHOTS: dict[str, tuple[str, Callable[[int], Files]]] = {
    "healthy-bnxt-thor2": ("gpu-b01", lambda i: _node_files(thor2(), i)),
    "fault-bnxt-ecn-np-disabled": ("gpu-b02", _bnxt_ecn_fault),
    "healthy-intel-e810": ("cpu-s01", lambda i: _node_files(e810(), i)),
    "healthy-roce-lag-renamed": ("gpu-c01", lag_files),
}


def build(name: str, node_name: str, render: Callable[[int], Files]) -> int:
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    meta = {
        "format": FORMAT,
        "node": node_name,
        "captured_at": CAPTURED_AT,
        "interval_seconds": INTERVAL,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="ascii")
    count = 1
    for i in range(SAMPLES):
        for rel, content in sorted(render(i).items()):
            path = out / "samples" / str(i) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode("ascii"))
            count += 1
    return count


def main() -> None:
    for name, (node_name, render) in VENDOR_SNAPSHOTS.items():
        print(f"{name}: {build(name, node_name, render)} files")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(HERE))
    main()
