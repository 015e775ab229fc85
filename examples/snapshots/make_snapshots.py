"""Generate the bundled netval-snapshot/1 examples: one healthy RoCEv2 GPU node and one
snapshot per fault. Deterministic and stdlib only; run from anywhere:

    python examples/snapshots/make_snapshots.py

It deletes and rewrites only the snapshot directories it owns (SNAPSHOTS below), next to
this file. The layout is documented in docs/snapshot-format.md.

The node: two single-port 400GbE ConnectX-7 cards (MCX75310AAS-NEAT, PSID MT_0000000838,
PCI 15b3:1021), netdevs ens1np0/ens2np0 (mlx5_core), RDMA devices mlx5_0/mlx5_1 (port 1),
MTU 9000, RoCE traffic on priority 3 (DSCP 26, lossless: PFC on 3, ECN on 3), CNPs on
DSCP 48 / priority 6, DSCP trust. A Broadcom LOM (eno8303, tg3, MTU 1500) is the
management NIC: it is not an RDMA netdev, so netval must not judge it unless named.

Every sysfs file holds exactly what the kernel prints, trailing newline included. A read that
fails on real hardware is absent (types/ndevs of empty GID slots: EINVAL). Counters grow
between the two samples as they would over 10 s on a busy link; netval judges deltas, so old
non-zero error counts are deliberately present and must not fail anything.

Sources for names and formats (torvalds/linux):
- ethtool -S names: drivers/net/ethernet/mellanox/mlx5/core/en_stats.c and
  Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst
  (rx_prio<p>_pause/_pause_duration/_pause_transition and tx_prio<p>_pause/_pause_duration
  are only listed for priorities with PFC enabled; there is no tx_prio<p>_pause_transition).
- hw_counters: drivers/infiniband/hw/mlx5/counters.c (Q counters are 32-bit; the
  congestion counters are 64-bit).
- RoCE port attributes: drivers/infiniband/hw/mlx5/main.c mlx5_query_port_roce (a port
  whose netdev has no carrier is "1: DOWN" / "3: Disabled", and its rate falls back to the
  4X QDR default: "40 Gb/sec (4X QDR)").
- netdev speed: net/core/net-sysfs.c speed_show + mlx5 get_speed_duplex: an admin-up
  netdev without carrier prints SPEED_UNKNOWN, "-1"; only an admin-down one fails (EINVAL).
- ECN enables (ecn/roce_np|roce_rp/enable/<p>) are the MLNX_OFED/DOCA-OFED mlx5_core sysfs.
- PCIe placement (fleet consistency, issue 22): device/current_link_speed is
  pci_speed_string() of drivers/pci/pci.c ("32.0 GT/s PCIe" for Gen5; kernels before v5.4
  printed "32 GT/s"), current_link_width the negotiated lanes (drivers/pci/pci-sysfs.c);
  the ConnectX-7 MCX75310AAS-NEAT is a PCIe Gen5 x16 card (NVIDIA's ConnectX-7 adapter
  user manual). /sys/module/mlx5_core/version: DOCA-OFED's mlx5_core sets MODULE_VERSION to
  its release (24.10-1.1.4 here); in-tree mlx5_core has no such file.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMAT = "netval-snapshot/1"
CAPTURED_AT = "2025-06-12T08:30:00Z"
INTERVAL = 10
SAMPLES = 2
GID_SLOTS = 8  # real tables have 255 slots; a few empty ones are enough to exercise readers
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
U32 = 1 << 32

# Wire sizes (bytes, FCS included, as the _phy/prio counters count them).
ROCE_HDR = 14 + 20 + 8 + 12 + 4 + 4  # eth + ipv4 + udp + bth + icrc + fcs
ACK_FRAME = 66  # eth + ipv4 + udp + bth + aeth + icrc + fcs
CNP_FRAME = 78  # eth + ipv4 + udp + bth + 16 reserved + icrc + fcs
TCP_FRAME = 1130  # average over 9000-byte segments and pure ACKs

Counter = tuple[int, int]  # (value in sample 0, growth per interval)


def at(c: Counter, i: int) -> int:
    return c[0] + c[1] * i


def roce_mtu(netdev_mtu: int) -> int:
    """Active RoCE MTU: the largest IB MTU that fits in the netdev MTU minus RoCE headers."""
    return max((m for m in (256, 512, 1024, 2048, 4096) if m <= netdev_mtu - 96), default=256)


@dataclass
class Pause:
    """PFC counters of the one lossless priority (per en_stats.c pport_per_prio_pfc)."""

    rx_pause: Counter
    rx_pause_duration: Counter  # microseconds the far end paused us
    rx_pause_transition: Counter
    tx_pause: Counter
    tx_pause_duration: Counter  # microseconds we paused the far end
    storm_warning: Counter = (0, 0)
    storm_error: Counter = (0, 0)


@dataclass
class Port:
    netdev: str
    rdma: str
    mac: str
    guid: str
    ipv4: tuple[int, int, int, int]
    pci_slot: str
    numa: int
    ifindex: int
    # link
    mtu: int = 9000
    carrier: int = 1
    operstate: str = "up"
    carrier_changes: Counter = (2, 0)  # one carrier-off at open + one carrier-on
    speed: int = 400000
    duplex: str = "full"
    link_down_events: Counter = (1, 0)
    rdma_state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = "400 Gb/sec (4X NDR)"
    # QoS
    pfc_enabled: list[int] = field(default_factory=lambda: [3])
    ecn_np: dict[int, int] = field(default_factory=lambda: {p: int(p == 3) for p in range(8)})
    ecn_rp: dict[int, int] = field(default_factory=lambda: {p: int(p == 3) for p in range(8)})
    roce_v2: bool = True
    # traffic: RoCE data bytes on prio 3 and TCP bytes on prio 0, per direction
    rdma_rx: Counter = (0, 0)
    rdma_tx: Counter = (0, 0)
    tcp_rx: Counter = (0, 0)
    tcp_tx: Counter = (0, 0)
    history_mtu: int = 9000  # MTU the counters' base values were accumulated with
    pause: Pause | None = None
    rx_discards_phy: Counter = (0, 0)
    tx_discards_phy: Counter = (0, 0)
    rx_prio3_discards: Counter = (0, 0)
    rx_buffer_passed_thres: Counter = (0, 0)
    rx_out_of_buffer: Counter = (0, 0)
    hw: dict[str, Counter] = field(default_factory=dict)


@dataclass
class Node:
    name: str
    ports: list[Port]


# --------------------------------------------------------------------------------------
# The healthy node
# --------------------------------------------------------------------------------------


def _hw(
    errors: dict[str, int], cong: dict[str, Counter], requests: dict[str, Counter]
) -> dict[str, Counter]:
    """mlx5_ib hw_counters in the driver's order: Q counters, congestion, ext PPCNT."""
    hw: dict[str, Counter] = {}
    hw.update(
        {
            "rx_write_requests": requests["rx_write_requests"],
            "rx_read_requests": requests["rx_read_requests"],
            "rx_atomic_requests": (0, 0),
            "rx_dct_connect": (0, 0),
            "out_of_buffer": (0, 0),
            "out_of_sequence": (errors["out_of_sequence"], 0),
            "duplicate_request": (errors["duplicate_request"], 0),
            "rnr_nak_retry_err": (0, 0),
            "packet_seq_err": (errors["packet_seq_err"], 0),
            "implied_nak_seq_err": (errors["implied_nak_seq_err"], 0),
            "local_ack_timeout_err": (errors["local_ack_timeout_err"], 0),
            "resp_local_length_error": (0, 0),
            "resp_cqe_error": (errors["resp_cqe_error"], 0),
            "req_cqe_error": (errors["req_cqe_error"], 0),
            "req_remote_invalid_request": (0, 0),
            "req_remote_access_errors": (0, 0),
            "resp_remote_access_errors": (0, 0),
            "resp_cqe_flush_error": (errors["resp_cqe_flush_error"], 0),
            "req_cqe_flush_error": (errors["req_cqe_flush_error"], 0),
            "req_transport_retries_exceeded": (errors["req_transport_retries_exceeded"], 0),
            "req_rnr_retries_exceeded": (0, 0),
            "roce_adp_retrans": (errors["roce_adp_retrans"], 0),
            "roce_adp_retrans_to": (errors["roce_adp_retrans_to"], 0),
            "roce_slow_restart": (errors["roce_slow_restart"], 0),
            "roce_slow_restart_cnps": (errors["roce_slow_restart_cnps"], 0),
            "roce_slow_restart_trans": (errors["roce_slow_restart_trans"], 0),
        }
    )
    hw.update(cong)
    hw["rx_icrc_encapsulated"] = (0, 0)
    return hw


# Q counters are 32-bit in the device (be32 in query_q_counter_out) and wrap; the congestion
# counters and rx_icrc_encapsulated are 64-bit.
CONG_COUNTERS = frozenset(
    {
        "rp_cnp_ignored",
        "rp_cnp_handled",
        "np_ecn_marked_roce_packets",
        "np_cnp_sent",
        "rx_icrc_encapsulated",
    }
)


def healthy() -> Node:
    p1 = Port(
        netdev="ens1np0",
        rdma="mlx5_0",
        mac="9c:63:c0:ab:ed:5a",
        guid="9c63:c003:00ab:ed5a",
        ipv4=(10, 10, 1, 11),
        pci_slot="0000:1a:00.0",
        numa=0,
        ifindex=4,
        # ~57 Gb/s of RoCE each way over 10 s: a busy all-reduce phase on a 400G port
        rdma_rx=(4_118_302_775_129_088, 71_204_388_352),
        rdma_tx=(3_984_551_203_877_120, 68_930_112_640),
        tcp_rx=(2_204_918_337_121, 148_902_311),
        tcp_tx=(1_873_440_129_876, 121_774_208),
        # a little PFC is normal: 3.2 ms and 1.9 ms of pause in 10 s (0.03 %, 0.02 %)
        pause=Pause(
            rx_pause=(18_204_331, 688),
            rx_pause_duration=(92_113_408_277, 3_211),
            rx_pause_transition=(9_094_118, 341),
            tx_pause=(7_730_062, 412),
            tx_pause_duration=(40_317_952_116, 1_874),
        ),
        # 1287 drops from an incident weeks ago: judged as deltas, so not a fault today
        rx_discards_phy=(1_287, 0),
        rx_prio3_discards=(1_287, 0),
        rx_buffer_passed_thres=(48_211, 12),
        hw=_hw(
            errors={
                "out_of_sequence": 1_843,
                "duplicate_request": 208,
                "packet_seq_err": 412,
                "implied_nak_seq_err": 96,
                "local_ack_timeout_err": 27,
                "resp_cqe_error": 2,
                "req_cqe_error": 14,
                "resp_cqe_flush_error": 377,
                "req_cqe_flush_error": 380,
                "req_transport_retries_exceeded": 3,
                "roce_adp_retrans": 1_377,
                "roce_adp_retrans_to": 27,
                "roce_slow_restart": 3,
                "roce_slow_restart_cnps": 0,
                "roce_slow_restart_trans": 0,
            },
            # ECN marks seen by the NP and CNPs sent track each other (the NP rate-limits
            # CNPs per QP, so slightly fewer CNPs than marks); CNPs received are handled.
            cong={
                "rp_cnp_ignored": (0, 0),
                "rp_cnp_handled": (117_245_880, 61_275),
                "np_ecn_marked_roce_packets": (92_440_117, 52_340),
                "np_cnp_sent": (88_906_553, 49_118),
            },
            requests={
                "rx_write_requests": (3_127_450_118, 16_890),
                "rx_read_requests": (402_118_760, 2_311),
            },
        ),
    )
    p2 = Port(
        netdev="ens2np0",
        rdma="mlx5_1",
        mac="9c:63:c0:ab:f1:22",
        guid="9c63:c003:00ab:f122",
        ipv4=(10, 10, 2, 11),
        pci_slot="0000:9a:00.0",
        numa=1,
        ifindex=5,
        rdma_rx=(3_990_114_208_554_496, 66_718_220_288),
        rdma_tx=(4_071_226_930_110_464, 70_114_562_048),
        tcp_rx=(1_960_332_774_018, 97_441_902),
        tcp_tx=(2_011_875_400_311, 103_882_117),
        pause=Pause(
            rx_pause=(16_990_412, 512),
            rx_pause_duration=(88_420_115_902, 2_487),
            rx_pause_transition=(8_377_021, 255),
            tx_pause=(6_914_880, 377),
            tx_pause_duration=(37_002_841_554, 1_602),
        ),
        rx_buffer_passed_thres=(44_902, 9),
        hw=_hw(
            errors={
                "out_of_sequence": 1_502,
                "duplicate_request": 171,
                "packet_seq_err": 388,
                "implied_nak_seq_err": 71,
                "local_ack_timeout_err": 19,
                "resp_cqe_error": 0,
                "req_cqe_error": 9,
                "resp_cqe_flush_error": 301,
                "req_cqe_flush_error": 305,
                "req_transport_retries_exceeded": 1,
                "roce_adp_retrans": 1_114,
                "roce_adp_retrans_to": 19,
                "roce_slow_restart": 1,
                "roce_slow_restart_cnps": 0,
                "roce_slow_restart_trans": 0,
            },
            cong={
                "rp_cnp_ignored": (0, 0),
                "rp_cnp_handled": (109_880_412, 58_904),
                "np_ecn_marked_roce_packets": (87_120_559, 47_908),
                "np_cnp_sent": (83_774_102, 45_337),
            },
            requests={
                "rx_write_requests": (2_874_220_914, 15_802),
                "rx_read_requests": (377_902_118, 2_196),
            },
        ),
    )
    return Node(name="gpu-a01", ports=[p1, p2])


# --------------------------------------------------------------------------------------
# Faults: each is healthy() with only that fault's signature changed
# --------------------------------------------------------------------------------------


def _port(node: Node, netdev: str) -> Port:
    return next(p for p in node.ports if p.netdev == netdev)


def _grow(p: Port, name: str, delta: int) -> None:
    base, _ = p.hw[name]
    p.hw[name] = (base, delta)


def fault_mtu_1500(node: Node) -> None:
    # ens2np0 was reset to MTU 1500 (e.g. a netplan/NM profile without mtu: 9000). The active
    # RoCE MTU of mlx5_1 follows the netdev: 1500 - 96 fits 1024, not 4096, so the same bytes
    # now take ~4x the packets. Expected: mtu.interface fails for ens2np0, mtu.roce fails for
    # mlx5_1/1 (1024 < 4096). Nothing else changes.
    _port(node, "ens2np0").mtu = 1500


def fault_pfc_disabled(node: Node) -> None:
    # PFC was switched off on both ports (mlnx_qos --pfc 0,0,0,0,0,0,0,0 / a DCBX mismatch),
    # global pause stays off, so priority 3 is lossy:
    # - dcb pfc_enabled [] on both netdevs; pfc_requests/indications freeze (mlx5 reports
    #   the per-priority pause counters there, and no pause frames flow any more);
    # - the rx_prio3_pause*/tx_prio3_pause* ethtool stats disappear: mlx5 lists them only for
    #   priorities with PFC enabled (tx_pause_storm_* stay, they depend on capabilities);
    # - the NIC's receive buffer overflows instead of pausing: rx_discards_phy and
    #   rx_prio3_discards grow, rx_buffer_passed_thres_phy grows faster;
    # - the switch drops what we no longer pause for, so RC transport recovers by NAKs and
    #   timeouts: out_of_sequence, packet_seq_err, implied_nak_seq_err, duplicate_request,
    #   local_ack_timeout_err, roce_adp_retrans(_to), roce_slow_restart grow on both devices.
    # Expected: pfc.priorities fails (both netdevs), pfc.discards fails (both), rdma.errors
    # fails (mlx5_0/1 and mlx5_1/1); pfc.pause_storm has no PFC counters to judge.
    drops = {"ens1np0": 184_532, "ens2np0": 171_206}
    errors = {
        "ens1np0": {
            "out_of_sequence": 9_412,
            "packet_seq_err": 3_870,
            "implied_nak_seq_err": 406,
            "duplicate_request": 1_204,
            "local_ack_timeout_err": 118,
            "roce_adp_retrans": 2_915,
            "roce_adp_retrans_to": 118,
            "roce_slow_restart": 21,
        },
        "ens2np0": {
            "out_of_sequence": 8_877,
            "packet_seq_err": 3_512,
            "implied_nak_seq_err": 351,
            "duplicate_request": 1_097,
            "local_ack_timeout_err": 104,
            "roce_adp_retrans": 2_640,
            "roce_adp_retrans_to": 104,
            "roce_slow_restart": 17,
        },
    }
    for p in node.ports:
        p.pfc_enabled = []
        p.rx_discards_phy = (p.rx_discards_phy[0], drops[p.netdev])
        p.rx_prio3_discards = (p.rx_prio3_discards[0], drops[p.netdev])
        p.rx_buffer_passed_thres = (p.rx_buffer_passed_thres[0], 2_144)
        for name, delta in errors[p.netdev].items():
            _grow(p, name, delta)


def fault_ecn_np_disabled(node: Node) -> None:
    # The notification point is off on priority 3 of ens1np0 (roce_np/enable/3 = 0): ECN-marked
    # RoCE packets still arrive and are counted (np_ecn_marked_roce_packets +52340) but mlx5_0
    # sends no CNP (np_cnp_sent flat, tx_prio6 CNP traffic flat), so the senders never slow
    # down. Expected: ecn.np_enabled fails for ens1np0/prio3, ecn.cnp_flow fails for mlx5_0/1.
    p = _port(node, "ens1np0")
    p.ecn_np[3] = 0
    _grow(p, "np_cnp_sent", 0)


def fault_ecn_rp_disabled(node: Node) -> None:
    # The reaction point is off on priority 3 of ens1np0 (roce_rp/enable/3 = 0): CNPs from the
    # receivers still arrive (rx_prio6 traffic unchanged) but mlx5_0 ignores them:
    # rp_cnp_ignored +61275, rp_cnp_handled flat. Expected: ecn.rp_enabled fails for
    # ens1np0/prio3, ecn.cnp_flow fails for mlx5_0/1 (rp_cnp_ignored growing).
    p = _port(node, "ens1np0")
    p.ecn_rp[3] = 0
    handled = p.hw["rp_cnp_handled"][1]
    _grow(p, "rp_cnp_handled", 0)
    _grow(p, "rp_cnp_ignored", handled)


def fault_link_down(node: Node) -> None:
    # ens2np0 is flapping (bad OSFP/cable) and down at both samples; the interface is
    # administratively up, so:
    # - carrier "0", operstate "down", carrier_changes 7 -> 13 (+6: three up/down flaps),
    #   carrier_up_count/down_count 3/4 -> 6/7, link_down_events_phy +3;
    # - speed "-1" (SPEED_UNKNOWN: mlx5 reports it without carrier; sysfs only fails with
    #   EINVAL when the netdev is admin down), duplex "unknown";
    # - mlx5_1 port 1: state "1: DOWN", phys_state "3: Disabled" (what mlx5_query_port_roce
    #   reports for a netdev without carrier), rate "40 Gb/sec (4X QDR)" (its default when
    #   no Ethernet protocol is operational);
    # - almost no traffic; the QPs on mlx5_1 time out: local_ack_timeout_err +36,
    #   roce_adp_retrans_to +36, req_transport_retries_exceeded +4.
    # GIDs stay (carrier loss does not remove addresses). Expected: link.carrier and
    # link.flaps fail for ens2np0; rdma.port_state, rdma.rate and rdma.errors fail for mlx5_1/1.
    p = _port(node, "ens2np0")
    p.carrier = 0
    p.operstate = "down"
    p.carrier_changes = (7, 6)
    p.speed = -1
    p.duplex = "unknown"
    p.link_down_events = (3, 3)
    p.rdma_state = "1: DOWN"
    p.phys_state = "3: Disabled"
    p.rate = "40 Gb/sec (4X QDR)"
    p.rdma_rx = (p.rdma_rx[0], 1_228_800)
    p.rdma_tx = (p.rdma_tx[0], 1_351_680)
    p.tcp_rx = (p.tcp_rx[0], 18_204)
    p.tcp_tx = (p.tcp_tx[0], 20_331)
    assert p.pause is not None
    p.pause = Pause(
        rx_pause=(p.pause.rx_pause[0], 0),
        rx_pause_duration=(p.pause.rx_pause_duration[0], 0),
        rx_pause_transition=(p.pause.rx_pause_transition[0], 0),
        tx_pause=(p.pause.tx_pause[0], 0),
        tx_pause_duration=(p.pause.tx_pause_duration[0], 0),
    )
    p.rx_buffer_passed_thres = (p.rx_buffer_passed_thres[0], 0)
    for name in ("rp_cnp_handled", "np_ecn_marked_roce_packets", "np_cnp_sent"):
        _grow(p, name, 0)
    _grow(p, "rx_write_requests", 3)
    _grow(p, "rx_read_requests", 0)
    _grow(p, "local_ack_timeout_err", 36)
    _grow(p, "roce_adp_retrans_to", 36)
    _grow(p, "req_transport_retries_exceeded", 4)


def fault_roce_v1_only(node: Node) -> None:
    # mlx5_0 offers RoCE v1 only (the device advertises no RoCE v2 support, so the core adds
    # one GID per address instead of a v1/v2 pair): index 0 = link-local "IB/RoCE v1",
    # index 1 = IPv4-mapped "IB/RoCE v1", the rest empty; rdma_cm default_roce_mode follows.
    # Expected: rdma.gid_roce_v2 fails for mlx5_0/1.
    _port(node, "ens1np0").roce_v2 = False


def fault_degraded_rate(node: Node) -> None:
    # ens2np0 trained at 200G (200GAUI-4: a marginal lane/cable, or the switch port forced to
    # 200G): speed 200000 and mlx5_1 rate "200 Gb/sec (4X HDR)". Traffic (~57 Gb/s) still
    # fits. Expected: rdma.rate fails (or warns, per minRateGbps) for mlx5_1/1.
    p = _port(node, "ens2np0")
    p.speed = 200000
    p.rate = "200 Gb/sec (4X HDR)"


def fault_pause_storm(node: Node) -> None:
    # ens1np0 is pausing its switch port most of the time (host receive path stalled): in
    # 10 s it sent 174816 PFC frames on priority 3 totalling 7.34 s of pause (73 %), and the
    # device's stall detector crossed its minor watermark 3 times
    # (tx_pause_storm_warning_events +3; not yet the critical one, so
    # tx_pause_storm_error_events is flat). Received RoCE traffic falls to ~11 Gb/s and the
    # receive buffer sits above 85 % (rx_buffer_passed_thres_phy +2930). No drops (PFC holds)
    # and no transport errors here. Expected: pfc.pause_storm fails for ens1np0/prio3.
    p = _port(node, "ens1np0")
    assert p.pause is not None
    p.pause.tx_pause = (p.pause.tx_pause[0], 174_816)
    p.pause.tx_pause_duration = (p.pause.tx_pause_duration[0], 7_342_118)
    p.pause.storm_warning = (2, 3)
    p.rdma_rx = (p.rdma_rx[0], 14_208_729_088)
    p.rx_buffer_passed_thres = (p.rx_buffer_passed_thres[0], 2_930)
    _grow(p, "rx_write_requests", 3_371)
    _grow(p, "rx_read_requests", 462)


Fault = Callable[[Node], None]

SNAPSHOTS: dict[str, tuple[str, Fault | None]] = {
    "healthy-roce": ("gpu-a01", None),
    "fault-mtu-1500": ("gpu-a02", fault_mtu_1500),
    "fault-pfc-disabled": ("gpu-a03", fault_pfc_disabled),
    "fault-ecn-np-disabled": ("gpu-a04", fault_ecn_np_disabled),
    "fault-ecn-rp-disabled": ("gpu-a05", fault_ecn_rp_disabled),
    "fault-link-down": ("gpu-a06", fault_link_down),
    "fault-roce-v1-only": ("gpu-a07", fault_roce_v1_only),
    "fault-degraded-rate": ("gpu-a08", fault_degraded_rate),
    "fault-pause-storm": ("gpu-a09", fault_pause_storm),
}


# --------------------------------------------------------------------------------------
# Rendering one sample
# --------------------------------------------------------------------------------------


def _line(value: object) -> str:
    return f"{value}\n"


def _packets(c: Counter, history_mtu: int, mtu: int, frame_overhead: int) -> Counter:
    """Data packets for a byte counter: history at the old MTU, growth at the current one."""
    old = roce_mtu(history_mtu) + frame_overhead
    new = roce_mtu(mtu) + frame_overhead
    return (c[0] // old, c[1] // new)


def _traffic(p: Port, i: int) -> dict[str, int]:
    """Per-priority wire counters (FCS included) derived from the port's traffic model."""
    rx_data = _packets(p.rdma_rx, p.history_mtu, p.mtu, ROCE_HDR)
    tx_data = _packets(p.rdma_tx, p.history_mtu, p.mtu, ROCE_HDR)
    # RC ACKs: roughly one per 16 data packets of the opposite direction
    rx_acks = at(tx_data, i) // 16
    tx_acks = at(rx_data, i) // 16
    rx3_pkts = at(rx_data, i) + rx_acks
    tx3_pkts = at(tx_data, i) + tx_acks
    rx3_bytes = at(p.rdma_rx, i) + rx_acks * ACK_FRAME
    tx3_bytes = at(p.rdma_tx, i) + tx_acks * ACK_FRAME
    # CNPs ride priority 6 (DSCP 48): we send what our NP sends, receive what our RP sees
    tx6_pkts = at(p.hw["np_cnp_sent"], i)
    rx6_pkts = at(p.hw["rp_cnp_handled"], i) + at(p.hw["rp_cnp_ignored"], i)
    rx0_bytes, tx0_bytes = at(p.tcp_rx, i), at(p.tcp_tx, i)
    return {
        "rx0_bytes": rx0_bytes,
        "rx0_pkts": rx0_bytes // TCP_FRAME,
        "tx0_bytes": tx0_bytes,
        "tx0_pkts": tx0_bytes // TCP_FRAME,
        "rx3_bytes": rx3_bytes,
        "rx3_pkts": rx3_pkts,
        "tx3_bytes": tx3_bytes,
        "tx3_pkts": tx3_pkts,
        "rx6_bytes": rx6_pkts * CNP_FRAME,
        "rx6_pkts": rx6_pkts,
        "tx6_bytes": tx6_pkts * CNP_FRAME,
        "tx6_pkts": tx6_pkts,
    }


def _ethtool(p: Port, i: int) -> dict[str, int]:
    """A realistic subset of `ethtool -S` for mlx5_core, in the driver's group order."""
    t = _traffic(p, i)
    pause = p.pause
    pfc_on = 3 in p.pfc_enabled and pause is not None
    rx_pause = at(pause.rx_pause, i) if pause else 0
    tx_pause = at(pause.tx_pause, i) if pause else 0
    rx_phy_pkts = t["rx0_pkts"] + t["rx3_pkts"] + t["rx6_pkts"]
    tx_phy_pkts = t["tx0_pkts"] + t["tx3_pkts"] + t["tx6_pkts"]
    rx_phy_bytes = t["rx0_bytes"] + t["rx3_bytes"] + t["rx6_bytes"]
    tx_phy_bytes = t["tx0_bytes"] + t["tx3_bytes"] + t["tx6_bytes"]
    rx_rdma_pkts = t["rx3_pkts"] + t["rx6_pkts"]
    tx_rdma_pkts = t["tx3_pkts"] + t["tx6_pkts"]
    s: dict[str, int] = {
        # software (kernel) traffic only: RoCE bypasses the netdev, FCS not counted
        "rx_packets": t["rx0_pkts"],
        "rx_bytes": t["rx0_bytes"] - 4 * t["rx0_pkts"],
        "tx_packets": t["tx0_pkts"],
        "tx_bytes": t["tx0_bytes"] - 4 * t["tx0_pkts"],
        "tx_tso_packets": t["tx0_pkts"] // 9,
        "tx_tso_bytes": (t["tx0_bytes"] // 10) * 9,
        "rx_csum_complete": t["rx0_pkts"],
        "tx_csum_partial": t["tx0_pkts"] // 3,
        "tx_queue_stopped": 0,
        "tx_queue_wake": 0,
        "tx_queue_dropped": 0,
        "rx_wqe_err": 0,
        "rx_buff_alloc_err": 0,
        "rx_out_of_buffer": at(p.rx_out_of_buffer, i),
        # vport
        "rx_vport_unicast_packets": t["rx0_pkts"],
        "rx_vport_unicast_bytes": t["rx0_bytes"] - 4 * t["rx0_pkts"],
        "tx_vport_unicast_packets": t["tx0_pkts"],
        "tx_vport_unicast_bytes": t["tx0_bytes"] - 4 * t["tx0_pkts"],
        "rx_vport_rdma_unicast_packets": rx_rdma_pkts,
        "rx_vport_rdma_unicast_bytes": t["rx3_bytes"] + t["rx6_bytes"] - 4 * rx_rdma_pkts,
        "tx_vport_rdma_unicast_packets": tx_rdma_pkts,
        "tx_vport_rdma_unicast_bytes": t["tx3_bytes"] + t["tx6_bytes"] - 4 * tx_rdma_pkts,
        "rx_steer_missed_packets": 0,
        # physical port
        "rx_packets_phy": rx_phy_pkts,
        "tx_packets_phy": tx_phy_pkts,
        "rx_bytes_phy": rx_phy_bytes,
        "tx_bytes_phy": tx_phy_bytes,
        "rx_crc_errors_phy": 0,
        "rx_in_range_len_errors_phy": 0,
        "rx_out_of_range_len_phy": 0,
        "rx_oversize_pkts_phy": 0,
        "rx_symbol_err_phy": 0,
        # PFC frames are MAC control frames; rx/tx_pause_ctrl_phy count global pause only
        "rx_mac_control_phy": rx_pause,
        "tx_mac_control_phy": tx_pause,
        "rx_pause_ctrl_phy": 0,
        "tx_pause_ctrl_phy": 0,
        "rx_unsupported_op_phy": 0,
        "rx_discards_phy": at(p.rx_discards_phy, i),
        "tx_discards_phy": at(p.tx_discards_phy, i),
        "tx_errors_phy": 0,
        "rx_undersize_pkts_phy": 0,
        "rx_fragments_phy": 0,
        "rx_jabbers_phy": 0,
        "link_down_events_phy": at(p.link_down_events, i),
        "rx_pcs_symbol_err_phy": 0,
        "rx_corrected_bits_phy": 1_204_118 * p.ifindex + 37 * i,
        "rx_buffer_passed_thres_phy": at(p.rx_buffer_passed_thres, i),
    }
    # per-priority traffic: all eight priorities, five counters each
    for prio in range(8):
        s[f"rx_prio{prio}_bytes"] = t.get(f"rx{prio}_bytes", 0)
        s[f"rx_prio{prio}_packets"] = t.get(f"rx{prio}_pkts", 0)
        s[f"rx_prio{prio}_discards"] = at(p.rx_prio3_discards, i) if prio == 3 else 0
        s[f"tx_prio{prio}_bytes"] = t.get(f"tx{prio}_bytes", 0)
        s[f"tx_prio{prio}_packets"] = t.get(f"tx{prio}_pkts", 0)
    # PFC counters exist only for priorities with PFC enabled (no tx_..._pause_transition)
    if pfc_on and pause is not None:
        s["rx_prio3_pause"] = at(pause.rx_pause, i)
        s["rx_prio3_pause_duration"] = at(pause.rx_pause_duration, i)
        s["tx_prio3_pause"] = at(pause.tx_pause, i)
        s["tx_prio3_pause_duration"] = at(pause.tx_pause_duration, i)
        s["rx_prio3_pause_transition"] = at(pause.rx_pause_transition, i)
    s["tx_pause_storm_warning_events"] = at(pause.storm_warning, i) if pause else 0
    s["tx_pause_storm_error_events"] = at(pause.storm_error, i) if pause else 0
    s["module_unplug"] = 0
    s["module_bus_stuck"] = 0
    s["module_high_temp"] = 0
    s["module_bad_shorted"] = 0
    return s


def _json_lines(doc: dict[str, object]) -> str:
    """JSON with one key per line and one list item per line for lists of objects."""
    parts = []
    for key, value in doc.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = ",\n".join(f"  {json.dumps(v)}" for v in value)
            parts.append(f" {json.dumps(key)}: [\n{items}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _dcb(p: Port, i: int) -> dict[str, object]:
    # mlx5 reports requests = tx pause, indications = rx pause, per priority
    # (mlx5e_dcbnl_ieee_getpfc). With trust DSCP mlx5 publishes the whole DSCP->priority map
    # (default dscp >> 3) as 64 APP entries: DSCP 26 -> 3 (RoCE), DSCP 48 -> 6 (CNPs).
    requests = [0] * 8
    indications = [0] * 8
    if p.pause is not None:
        # counters freeze once PFC is off: show the value they had (growth only while on)
        step = i if 3 in p.pfc_enabled else 0
        requests[3] = at(p.pause.tx_pause, step)
        indications[3] = at(p.pause.rx_pause, step)
    return {
        "pfc_enabled": sorted(p.pfc_enabled),
        "pfc_requests": requests,
        "pfc_indications": indications,
        "app": [{"selector": "dscp", "protocol": d, "priority": d >> 3} for d in range(64)],
    }


def _gids(p: Port) -> list[tuple[str, str | None]]:
    """(gid, type) per slot, as mlx5/ib_core fill a RoCE port with one IPv4 address."""
    mac = [int(b, 16) for b in p.mac.split(":")]
    eui = [mac[0] ^ 0x02, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]]
    link_local = "fe80:0000:0000:0000:" + ":".join(
        f"{eui[k]:02x}{eui[k + 1]:02x}" for k in range(0, 8, 2)
    )
    a, b, c, d = p.ipv4
    v4 = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    types = ("IB/RoCE v1", "RoCE v2") if p.roce_v2 else ("IB/RoCE v1",)
    slots: list[tuple[str, str | None]] = [(g, t) for g in (link_local, v4) for t in types]
    slots += [(ZERO_GID, None)] * (GID_SLOTS - len(slots))
    return slots


PORT_COUNTER_NAMES = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)


def _port_counters(p: Port, i: int, ethtool: dict[str, int]) -> dict[str, int]:
    # RoCE PMA counters come from the vport RDMA counters; *_data are in 4-byte words
    values = dict.fromkeys(PORT_COUNTER_NAMES, 0)
    values["port_rcv_data"] = ethtool["rx_vport_rdma_unicast_bytes"] // 4
    values["port_xmit_data"] = ethtool["tx_vport_rdma_unicast_bytes"] // 4
    values["port_rcv_packets"] = ethtool["rx_vport_rdma_unicast_packets"]
    values["port_xmit_packets"] = ethtool["tx_vport_rdma_unicast_packets"]
    values["unicast_rcv_packets"] = ethtool["rx_vport_rdma_unicast_packets"]
    values["unicast_xmit_packets"] = ethtool["tx_vport_rdma_unicast_packets"]
    return values


CX7_PCIE = ("32.0 GT/s PCIe", 16)
OFED_MLX5_VERSION = "24.10-1.1.4"


def pci_files(device_dir: str, link: tuple[str, int] | None, numa: int) -> dict[str, str]:
    """A PCI function's placement files (link None: no PCIe capability, files absent)."""
    files = {f"{device_dir}/numa_node": _line(numa)}
    if link is not None:
        files[f"{device_dir}/current_link_speed"] = _line(link[0])
        files[f"{device_dir}/current_link_width"] = _line(link[1])
    return files


def _uevent(driver: str, pci_id: str, subsys: str, slot: str, pci_class: str) -> str:
    v, d = pci_id.split(":")
    sv, sd = subsys.split(":")
    cls = pci_class.rjust(6, "0")
    modalias = f"pci:v0000{v}d0000{d}sv0000{sv}sd0000{sd}bc{cls[0:2]}sc{cls[2:4]}i{cls[4:6]}"
    return (
        f"DRIVER={driver}\nPCI_CLASS={pci_class}\nPCI_ID={pci_id}\nPCI_SUBSYS_ID={subsys}\n"
        f"PCI_SLOT_NAME={slot}\nMODALIAS={modalias}\n"
    )


def render_sample(node: Node, i: int) -> dict[str, str]:
    files: dict[str, str] = {"sys/module/mlx5_core/version": _line(OFED_MLX5_VERSION)}
    for p in node.ports:
        net = f"sys/class/net/{p.netdev}"
        changes = at(p.carrier_changes, i)
        files.update(
            {
                f"{net}/mtu": _line(p.mtu),
                f"{net}/carrier": _line(p.carrier),
                f"{net}/operstate": _line(p.operstate),
                f"{net}/carrier_changes": _line(changes),
                f"{net}/carrier_up_count": _line(changes // 2),
                f"{net}/carrier_down_count": _line(changes - changes // 2),
                f"{net}/speed": _line(p.speed),
                f"{net}/duplex": _line(p.duplex),
                f"{net}/address": _line(p.mac),
                f"{net}/ifindex": _line(p.ifindex),
                f"{net}/type": _line(1),
                **pci_files(f"{net}/device", CX7_PCIE, p.numa),
                f"{net}/device/uevent": _uevent(
                    "mlx5_core", "15B3:1021", "15B3:0041", p.pci_slot, "20000"
                ),
                f"{net}/ecn/roce_np/cnp_dscp": _line(48),
                f"{net}/ecn/roce_np/cnp_802p_prio": _line(6),
            }
        )
        for prio in range(8):
            files[f"{net}/ecn/roce_np/enable/{prio}"] = _line(p.ecn_np[prio])
            files[f"{net}/ecn/roce_rp/enable/{prio}"] = _line(p.ecn_rp[prio])

        ethtool = _ethtool(p, i)
        files[f"ethtool/{p.netdev}.json"] = json.dumps(ethtool, indent=1) + "\n"
        files[f"dcb/{p.netdev}.json"] = _json_lines(_dcb(p, i))

        ib = f"sys/class/infiniband/{p.rdma}"
        files.update(
            {
                f"{ib}/node_type": "1: CA\n",
                f"{ib}/fw_ver": "28.39.1002\n",
                f"{ib}/board_id": "MT_0000000838\n",
                f"{ib}/hca_type": "MT4129\n",
                f"{ib}/hw_rev": "0x0\n",
                f"{ib}/node_guid": _line(p.guid),
                f"{ib}/sys_image_guid": _line(p.guid),
            }
        )
        port = f"{ib}/ports/1"
        files.update(
            {
                f"{port}/state": _line(p.rdma_state),
                f"{port}/phys_state": _line(p.phys_state),
                f"{port}/rate": _line(p.rate),
                f"{port}/link_layer": "Ethernet\n",
                f"{port}/lid": "0x0\n",
                f"{port}/sm_lid": "0x0\n",
                f"{port}/lid_mask_count": "0\n",
                f"{port}/cap_mask": "0x04010000\n",
            }
        )
        for idx, (gid, gid_type) in enumerate(_gids(p)):
            files[f"{port}/gids/{idx}"] = _line(gid)
            if gid_type is not None:  # empty slots: reading types/ndevs fails with EINVAL
                files[f"{port}/gid_attrs/types/{idx}"] = _line(gid_type)
                files[f"{port}/gid_attrs/ndevs/{idx}"] = _line(p.netdev)
        for name, value in _port_counters(p, i, ethtool).items():
            files[f"{port}/counters/{name}"] = _line(value)
        for name, c in p.hw.items():
            value = at(c, i) if name in CONG_COUNTERS else at(c, i) % U32
            files[f"{port}/hw_counters/{name}"] = _line(value)
        files[f"{port}/hw_counters/lifespan"] = "10\n"

        cm = f"rdma_cm/{p.rdma}/ports/1"
        files[f"{cm}/default_roce_tos"] = "106\n"  # DSCP 26 << 2 | ECT(0)
        files[f"{cm}/default_roce_mode"] = "RoCE v2\n" if p.roce_v2 else "IB/RoCE v1\n"

    # The management LOM: not bound to an RDMA device, no DCB (tg3 has no dcbnl), no ECN.
    mgmt = "sys/class/net/eno8303"
    files.update(
        {
            f"{mgmt}/mtu": "1500\n",
            f"{mgmt}/carrier": "1\n",
            f"{mgmt}/operstate": "up\n",
            f"{mgmt}/carrier_changes": "2\n",
            f"{mgmt}/carrier_up_count": "1\n",
            f"{mgmt}/carrier_down_count": "1\n",
            f"{mgmt}/speed": "1000\n",
            f"{mgmt}/duplex": "full\n",
            f"{mgmt}/address": "c8:4b:d6:3e:21:f0\n",
            f"{mgmt}/ifindex": "2\n",
            f"{mgmt}/type": "1\n",
            f"{mgmt}/device/numa_node": "0\n",
            f"{mgmt}/device/uevent": _uevent(
                "tg3", "14E4:165F", "1028:0B37", "0000:04:00.0", "20000"
            ),
        }
    )
    files["ethtool/eno8303.json"] = (
        json.dumps(
            {
                "rx_octets": 88_120_447_102 + 41_288_310 * i,
                "rx_ucast_packets": 102_774_118 + 31_877 * i,
                "rx_mcast_packets": 1_204_377 + 12 * i,
                "rx_bcast_packets": 3_118_402 + 41 * i,
                "tx_octets": 61_447_902_118 + 29_004_116 * i,
                "tx_ucast_packets": 97_330_211 + 28_114 * i,
                "tx_mcast_packets": 40_211,
                "tx_bcast_packets": 2_119,
                "rx_discards": 0,
                "rx_errors": 0,
                "tx_discards": 0,
                "tx_errors": 0,
            },
            indent=1,
        )
        + "\n"
    )
    return files


def build(name: str, node_name: str, fault: Fault | None) -> int:
    node = healthy()
    node.name = node_name
    if fault is not None:
        fault(node)
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    meta = {
        "format": FORMAT,
        "node": node.name,
        "captured_at": CAPTURED_AT,
        "interval_seconds": INTERVAL,
    }
    out.mkdir(parents=True)
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="ascii")
    count = 1
    for i in range(SAMPLES):
        for rel, content in sorted(render_sample(copy.deepcopy(node), i).items()):
            path = out / "samples" / str(i) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode("ascii"))
            count += 1
    return count


def main() -> None:
    for name, (node_name, fault) in SNAPSHOTS.items():
        count = build(name, node_name, fault)
        print(f"{name}: {count} files")
    # InfiniBand and spare-port snapshots live in their own module (issue 11).
    import make_ib_snapshots

    make_ib_snapshots.main()
    # Broadcom, Intel and RoCE LAG nodes (format 1.1) live in their own generator.
    import make_vendor_snapshots

    make_vendor_snapshots.main()
    # EFA and IPoIB-down InfiniBand nodes (issue 20).
    import make_transport_snapshots

    make_transport_snapshots.main()
    # AMD Pensando (ionic) node: the fingerprint of the last driver family in the table.
    import make_ionic_snapshot

    make_ionic_snapshot.main()
    # Who rdma.errors points at, and Intel irdma per generation (issue 28).
    import make_attribution_snapshots

    make_attribution_snapshots.main()


if __name__ == "__main__":
    main()
