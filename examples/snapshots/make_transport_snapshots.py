"""Generate the bundled EFA and IPoIB-down InfiniBand snapshots (issue 20); make_snapshots.py
calls main(). Deterministic and stdlib only. Each directory carries the `checks.yaml` it is
meant to be judged with (`netval probe --from DIR --config DIR/checks.yaml`).

- healthy-efa-p4d: an AWS p4d.24xlarge-shaped node: four EFA devices (PCI 1D0F:EFA0, driver
  efa) named by rdma-core's udev rules after their PCI address (rdmap16s27 = bus 0x10, slot
  27), one port each, link_layer "Unknown" (the kernel's IB_LINK_LAYER_UNSPECIFIED),
  node_type "7: unspecified", state "4: ACTIVE", phys_state "5: LinkUp" and rate
  "100 Gb/sec (4X EDR)" (efa_query_port reports a fixed 4X EDR for a 100 Gb/s EFA), one GID
  (the device address, fe80::/64) of type "IB/RoCE v1" without a netdev, no PortCounters
  (no PMA), and the efa port hw_counters: basic (tx/rx bytes and packets, rx_drops),
  messages, RDMA read/write and the network stats (retrans_*, unresponsive_remote_events,
  impaired_remote_conn_events). The EFA functions have no netdev; the node's VPC traffic runs
  on the ENA interface ens32 (driver ena, MTU 9001), named in checks.yaml for link and MTU.
  Busy NCCL all-reduce over 10 s: ~80 Gb/s per EFA, a few thousand SRD retransmissions
  (normal on a sprayed fabric), no drops, no timeouts. Expected: passes; PFC/ECN, RoCE GID,
  RoCE MTU and IB counter checks say "not applicable: EFA ...".
- fault-efa-retrans-timeouts: the same node with one path failing behind rdmap144s27: SRD
  retransmission timeouts (+412), unresponsive peers (+23) and impaired connections (+61) in
  10 s, retransmitted packets up 2 million. Expected: rdma.errors warns on rdmap144s27/1
  with attribution requester: SRD timeouts toward peers that stopped answering are counted by
  the sender, and nothing on the port itself fails (docs/checks.md, Attribution).
- healthy-ib-ipoib-down: healthy-infiniband's node (two NDR ConnectX-7 HCAs in IB mode) whose
  IPoIB netdevs ibp26s0/ibp154s0 are administratively down on purpose (flags 0x1002,
  operstate "down", carrier and speed unreadable: EINVAL while down). Judged with
  `select: {adminDown: skip}`: the IPoIB netdevs are skipped, the IB ports are still judged
  (state, rate, PortCounters) and pass.
- fault-ib-ipoib-down-port-down: the same, its IPoIB netdevs left out by
  `select.netdevs.exclude`, and mlx5_1's cable pulled before the capture: port 1 "1: DOWN",
  "2: Polling". Expected: rdma.port_state fails on mlx5_1/1 (the port is judged although its
  only netdev is left out).

Sources (public captures and the code that writes each file):
- link_layer "Unknown" on efa_0 and `ibv_devinfo` of an EFA device (transport unspecified,
  vendor_part_id 61344 = 0xEFA0, PORT_ACTIVE, active_mtu 4096): linux-rdma/rdma-core#884.
  `ibstat` of efa_0 (State Active, Physical state LinkUp, Rate 100, Link layer Unknown, LMC
  1, SM lid 0): amzn/amzn-drivers#114. rdmap16s27 naming and `ibv_devinfo` on a current
  AMI: uccl-project/uccl#163.
- node_type "7: unspecified", link_layer "Unknown", rate text: torvalds/linux
  drivers/infiniband/core/sysfs.c (node_type_show, link_layer_show, rate_show).
- efa_query_port (state, phys_state, 4X EDR), the GID from the device address, and the
  hw_counters names: drivers/infiniband/hw/efa/efa_verbs.c (EFA_DEFINE_PORT_STATS,
  EFA_DEFINE_DEVICE_STATS) and "[PATCH for-next] RDMA/efa: Add Network HW statistics
  counters" (linux-rdma, 2025-07-06: retrans_bytes, retrans_pkts, retrans_timeout_events,
  unresponsive_remote_events, impaired_remote_conn_events).
- The IB node and its IPoIB files: make_ib_snapshots.py (prometheus/procfs fixtures, the
  kernel's IPoIB documentation).
Values (byte counts, addresses, the ENA PCI slot) are modelled, not copied from a host.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import make_ib_snapshots as ib
import make_snapshots as roce

Counter = tuple[int, int]  # (value in sample 0, growth per interval)
Files = dict[str, str]

# -- EFA --------------------------------------------------------------------------------------

EFA_PORT_STATS = (
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)
EFA_DEVICE_STATS = (
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
)
EFA_MTU = 8928  # the SRD payload MTU EFA reports (dev_attr.mtu), as libfabric logs it
GB = 1_000_000_000


@dataclass
class Efa:
    rdma: str  # rdmap<bus>s<slot>
    pci_slot: str
    gid_tail: str  # last 64 bits of the device address
    hw: dict[str, Counter] = field(default_factory=dict)


def _efa_hw(seed: int) -> dict[str, Counter]:
    """A p4d EFA after days of training: ~80 Gb/s each way in 10 s, mostly RDMA write."""
    tx = 100 * GB  # bytes per 10 s at 80 Gb/s
    hw: dict[str, Counter] = {
        "tx_bytes": (812_334_118_002_117 + seed, tx),
        "rx_bytes": (809_117_201_993_450 + seed, tx - 3_114_000),
        "rdma_write_bytes": (701_118_203_441_008 + seed, tx * 9 // 10),
        "rdma_write_recv_bytes": (699_887_120_334_112 + seed, tx * 9 // 10),
        "rdma_read_bytes": (41_220_118_003_221 + seed, tx // 20),
        "rdma_read_resp_bytes": (41_007_331_201_876 + seed, tx // 20),
        "send_bytes": (70_115_227_311_054 + seed, tx // 20),
        "recv_bytes": (69_998_104_227_310 + seed, tx // 20),
        "retrans_pkts": (9_113_227 + seed, 3_112),
        "retrans_timeout_events": (3, 0),  # a maintenance event weeks ago
        "unresponsive_remote_events": (1, 0),
        "impaired_remote_conn_events": (0, 0),
        "rx_drops": (17, 0),
        "rdma_read_wr_err": (0, 0),
        "rdma_write_wr_err": (0, 0),
    }
    hw["tx_pkts"] = (hw["tx_bytes"][0] // EFA_MTU, tx // EFA_MTU)
    hw["rx_pkts"] = (hw["rx_bytes"][0] // EFA_MTU, hw["rx_bytes"][1] // EFA_MTU)
    hw["retrans_bytes"] = (hw["retrans_pkts"][0] * EFA_MTU, hw["retrans_pkts"][1] * EFA_MTU)
    for name, size in (("send", 65_536), ("recv", 65_536), ("rdma_write", 1 << 20)):
        total = hw[f"{name}_bytes"]
        hw[f"{name}_wrs"] = (total[0] // size, total[1] // size)
    hw["rdma_read_wrs"] = (hw["rdma_read_bytes"][0] // (1 << 20), tx // 20 // (1 << 20))
    assert set(hw) == set(EFA_PORT_STATS)
    return hw


def p4d() -> list[Efa]:
    slots = ((16, "0000:10:1b.0"), (32, "0000:20:1b.0"), (144, "0000:90:1b.0"))
    devices = [*slots, (160, "0000:a0:1b.0")]
    return [
        Efa(
            rdma=f"rdmap{bus}s27",
            pci_slot=slot,
            gid_tail=f"0{k}39:beff:fe6e:0c{23 + k:02x}",
            hw=_efa_hw(k * 7_919),
        )
        for k, (bus, slot) in enumerate(devices)
    ]


def fault_retrans_timeouts(devices: list[Efa]) -> None:
    d = next(d for d in devices if d.rdma == "rdmap144s27")
    for name, growth in (
        ("retrans_timeout_events", 412),
        ("unresponsive_remote_events", 23),
        ("impaired_remote_conn_events", 61),
        ("retrans_pkts", 2_031_877),
    ):
        d.hw[name] = (d.hw[name][0], growth)
    d.hw["retrans_bytes"] = (d.hw["retrans_bytes"][0], 2_031_877 * EFA_MTU)


def _uevent(driver: str, pci_id: str, slot: str) -> str:
    v, d = pci_id.split(":")
    return (
        f"DRIVER={driver}\nPCI_CLASS=20000\nPCI_ID={pci_id}\nPCI_SUBSYS_ID={pci_id}\n"
        f"PCI_SLOT_NAME={slot}\nMODALIAS=pci:v0000{v}d0000{d}sv0000{v}sd0000{d}bc02sc00i00\n"
    )


def render_efa(devices: list[Efa], i: int) -> Files:
    line = roce._line
    ena = "sys/class/net/ens32"  # the primary ENA interface: VPC traffic, not EFA's
    files: Files = {
        f"{ena}/mtu": "9001\n",
        f"{ena}/carrier": "1\n",
        f"{ena}/operstate": "up\n",
        f"{ena}/carrier_changes": "1\n",
        f"{ena}/address": "0a:3b:21:9c:4e:11\n",
        f"{ena}/ifindex": "2\n",
        f"{ena}/type": "1\n",
        f"{ena}/flags": "0x1003\n",
        f"{ena}/device/uevent": _uevent("ena", "1D0F:EC20", "0000:10:1c.0"),
    }
    for n, d in enumerate(devices):
        base = f"sys/class/infiniband/{d.rdma}"
        files[f"{base}/node_type"] = "7: unspecified\n"
        files[f"{base}/node_guid"] = "0000:0000:0000:0000\n"
        files[f"{base}/device/uevent"] = _uevent("efa", "1D0F:EFA0", d.pci_slot)
        # Only numa_node (buses 10/20 on socket 0, 90/a0 on socket 1): p4d shows its EFAs
        # behind an emulated 440FX host bridge (lspci in aws/aws-ofi-nccl#64), without a
        # PCIe capability, so pci-sysfs hides current_link_speed/width; in-tree efa sets no
        # MODULE_VERSION. Those fingerprint keys are absent, not guessed.
        files.update(roce.pci_files(f"{base}/device", None, 0 if n < 2 else 1))
        for name in EFA_DEVICE_STATS:
            files[f"{base}/hw_counters/{name}"] = "0\n"
        files[f"{base}/hw_counters/submitted_cmds"] = line(18_114 + n + 40 * i)
        files[f"{base}/hw_counters/completed_cmds"] = line(18_114 + n + 40 * i)
        files[f"{base}/hw_counters/keep_alive_rcvd"] = line(1_208_331 + 10 * i)
        files[f"{base}/hw_counters/lifespan"] = "10\n"
        port = f"{base}/ports/1"
        files.update(
            {
                f"{port}/state": "4: ACTIVE\n",
                f"{port}/phys_state": "5: LinkUp\n",
                f"{port}/rate": "100 Gb/sec (4X EDR)\n",
                f"{port}/link_layer": "Unknown\n",
                f"{port}/lid": "0x0\n",
                f"{port}/sm_lid": "0x0\n",
                f"{port}/lid_mask_count": "1\n",
                f"{port}/cap_mask": "0x00000000\n",
                f"{port}/gids/0": line("fe80:0000:0000:0000:" + d.gid_tail),
                f"{port}/gid_attrs/types/0": "IB/RoCE v1\n",
                f"{port}/hw_counters/lifespan": "10\n",
            }
        )
        for name, c in d.hw.items():
            files[f"{port}/hw_counters/{name}"] = line(ib.at(c, i))
    return files


EFA_CHECKS = """\
# An AWS EFA node (p4d-style): the EFA ports' link layer reads "Unknown"; they carry SRD, so
# PFC/ECN, RoCE GID/MTU and IB counter checks do not apply. ens32 (ENA) carries VPC traffic.
rdma:
  linkLayer: EFA
  minRateGbps: 100
link:
  interfaces: [ens32]
mtu:
  interfaces: [ens32]
  interfaceMTU: 9001
"""

# -- InfiniBand with IPoIB down ---------------------------------------------------------------


def render_ipoib_down(ports: list[ib.IbPort], i: int, *, pulled: str | None = None) -> Files:
    files = ib.render_ib(ports, i)
    for p in ports:
        net = f"sys/class/net/{p.netdev}"
        files[f"{net}/flags"] = "0x1002\n"  # IFF_UP cleared: ip link set ibX down
        files[f"{net}/operstate"] = "down\n"
        for gone in ("carrier", "speed"):  # EINVAL while admin down
            del files[f"{net}/{gone}"]
        if p.rdma == pulled:
            port = f"sys/class/infiniband/{p.rdma}/ports/1"
            files[f"{port}/state"] = "1: DOWN\n"
            files[f"{port}/phys_state"] = "2: Polling\n"  # no cable: the port polls
            files[f"{port}/rate"] = "40 Gb/sec (4X QDR)\n"  # what an untrained port reads
    return files


IPOIB_DOWN_SKIP = (
    ib.IB_CHECKS
    + """\
# IPoIB is down on purpose (jobs use the IB ports through verbs only): not a fault.
select:
  adminDown: skip
"""
)
IPOIB_EXCLUDED = (
    ib.IB_CHECKS
    + """\
# The IPoIB netdevs are left out; the IB ports are still judged through their RDMA device.
select:
  netdevs:
    exclude: ["ibp*"]
"""
)

# -- writing ----------------------------------------------------------------------------------


def _efa(fault: Callable[[list[Efa]], None] | None) -> Callable[[int], Files]:
    devices = p4d()
    if fault is not None:
        fault(devices)
    return lambda i: render_efa(copy.deepcopy(devices), i)


def _ipoib_down(pulled: str | None) -> Callable[[int], Files]:
    ports = ib.healthy_ib()
    return lambda i: render_ipoib_down(copy.deepcopy(ports), i, pulled=pulled)


SNAPSHOTS: dict[str, tuple[str, Callable[[int], Files], str]] = {
    "healthy-efa-p4d": ("ip-10-0-12-34.ec2.internal", _efa(None), EFA_CHECKS),
    "fault-efa-retrans-timeouts": (
        "ip-10-0-12-35.ec2.internal",
        _efa(fault_retrans_timeouts),
        EFA_CHECKS,
    ),
    "healthy-ib-ipoib-down": ("gpu-ib03", _ipoib_down(None), IPOIB_DOWN_SKIP),
    "fault-ib-ipoib-down-port-down": ("gpu-ib04", _ipoib_down("mlx5_1"), IPOIB_EXCLUDED),
}


def main() -> None:
    for name, (node_name, render, checks) in SNAPSHOTS.items():
        print(f"{name}: {ib.write(name, node_name, render, checks)} files")


if __name__ == "__main__":
    main()
