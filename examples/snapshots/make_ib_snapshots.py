"""Generate the bundled InfiniBand and spare-port snapshots (issue 11); make_snapshots.py
calls main(). Deterministic and stdlib only. Each directory carries the `checks.yaml` it is
meant to be judged with (`netval probe --from DIR --config DIR/checks.yaml`).

- healthy-infiniband: an NDR InfiniBand GPU node. Two single-port ConnectX-7 HCAs in IB mode
  (hca_type MT4129), RDMA devices mlx5_0/mlx5_1 port 1, link_layer "InfiniBand", state
  "4: ACTIVE", phys_state "5: LinkUp", rate "400 Gb/sec (4X NDR)", LIDs from the SM, one GID
  (subnet prefix fe80::/64 + port GUID) whose gid_attrs/ndevs read fails (IB GIDs have no
  netdev), IPoIB netdevs ibp26s0/ibp154s0 (systemd's names for ARPHRD_INFINIBAND, type 32,
  20-byte hardware address) in datagram mode at MTU 4092 (4096 IB MTU - 4-byte IPoIB header),
  dev_port 0 (ipoib sets dev_port = port - 1). No DCB, no ECN, no ethtool -S: IB has credit
  flow control and the IB congestion control of the SM.
- fault-ib-symbol-errors: the same node, mlx5_1's cable degrading: symbol_error +1873 and
  port_rcv_errors +31 in 10 s (corrupted packets dropped at the receiver), link_error_recovery
  +2 (the link retrained twice without going down: link_downed stays). Expected:
  ib.port_errors fails for mlx5_1/1, nothing else.
- excluded-spare-port: healthy-roce's node (gpu-a01 shape) with a third ConnectX-7 port kept
  as a cabled spare, administratively down: flags 0x1002 (no IFF_UP), operstate "down",
  carrier and speed unreadable (EINVAL while down: absent), mlx5_2 port 1 "1: DOWN" /
  "3: Disabled", rate "40 Gb/sec (4X QDR)", only the default link-local GIDs (no address on a
  spare). Judged with `select: {adminDown: skip}` it passes; judged without, it fails
  link.carrier, rdma.port_state and rdma.gid_roce_v2 on the spare.

Sources (torvalds/linux unless noted):
- counters/<name>: Documentation/ABI/stable/sysfs-class-infiniband and
  drivers/infiniband/core/sysfs.c (PORT_PMA_ATTR widths: symbol_error 16 bit,
  link_error_recovery/link_downed 8, local_link_integrity_errors/
  excessive_buffer_overrun_errors 4, VL15_dropped 16; port_xmit_data/port_rcv_data in
  4-byte words; "N/A (no PMA)" without a PMA).
- IPoIB mode and MTU: Documentation/infiniband/ipoib.rst (datagram MTU = IB MTU - 4,
  connected up to 64K, driver maximum 65520).
- Layout and value formats of an mlx5 IB port: prometheus/procfs sysfs fixtures
  (class/infiniband/mlx5_0/ports/1/{state,phys_state,rate,lid,sm_lid,counters/*}).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import make_snapshots as roce

HERE = Path(__file__).resolve().parent
Counter = tuple[int, int]  # (value in sample 0, growth per interval)
U32 = 1 << 32


def at(c: Counter, i: int) -> int:
    return c[0] + c[1] * i


@dataclass
class IbPort:
    rdma: str
    netdev: str
    guid: str  # port GUID (node GUID on ConnectX: one port per function)
    pci_slot: str
    lid: int
    ipv4: tuple[int, int, int, int]
    ifindex: int
    # PortCounters (error counters saturate; data counters are 64-bit PortCountersExtended)
    errors: dict[str, Counter] = field(default_factory=dict)
    xmit_data_words: Counter = (0, 0)
    rcv_data_words: Counter = (0, 0)
    xmit_packets: Counter = (0, 0)
    rcv_packets: Counter = (0, 0)
    xmit_wait: Counter = (0, 0)
    hw: dict[str, Counter] = field(default_factory=dict)


def _errors(**old: int) -> dict[str, Counter]:
    names = (
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
    )
    return {n: (old.get(n, 0), 0) for n in names}


def _ib_hw(**old: int) -> dict[str, Counter]:
    # mlx5_ib Q counters on an IB port (drivers/infiniband/hw/mlx5/counters.c basic/retrans
    # /extended sets; the roce_* and congestion counters are RoCE-only).
    names = (
        "rx_write_requests",
        "rx_read_requests",
        "rx_atomic_requests",
        "out_of_buffer",
        "out_of_sequence",
        "duplicate_request",
        "rnr_nak_retry_err",
        "packet_seq_err",
        "implied_nak_seq_err",
        "local_ack_timeout_err",
        "resp_local_length_error",
        "resp_cqe_error",
        "req_cqe_error",
        "req_remote_invalid_request",
        "req_remote_access_errors",
        "resp_remote_access_errors",
        "resp_cqe_flush_error",
        "req_cqe_flush_error",
        "req_transport_retries_exceeded",
        "req_rnr_retries_exceeded",
    )
    return {n: (old.get(n, 0), 0) for n in names}


def healthy_ib() -> list[IbPort]:
    p1 = IbPort(
        rdma="mlx5_0",
        netdev="ibp26s0",
        guid="9c63:c003:00ab:ed5a",
        pci_slot="0000:1a:00.0",
        lid=0x1A,
        ipv4=(10, 20, 1, 11),
        ifindex=4,
        # link_downed 1: the first training after boot; the rest an old incident
        errors=_errors(symbol_error=12, link_downed=1, link_error_recovery=1, VL15_dropped=3),
        # ~60 Gb/s each way over 10 s
        xmit_data_words=(1_030_217_884_102_113, 18_750_000_000),
        rcv_data_words=(998_340_119_877_021, 18_112_000_000),
        xmit_packets=(252_115_900_332, 18_310_547),
        rcv_packets=(244_311_872_119, 17_687_500),
        xmit_wait=(4_118_227_003, 1_204_332),
        hw=_ib_hw(
            out_of_sequence=311,
            packet_seq_err=97,
            local_ack_timeout_err=4,
            rx_write_requests=2_114_876_001,
            rx_read_requests=310_227_118,
        ),
    )
    p2 = IbPort(
        rdma="mlx5_1",
        netdev="ibp154s0",
        guid="9c63:c003:00ab:f122",
        pci_slot="0000:9a:00.0",
        lid=0x1B,
        ipv4=(10, 20, 2, 11),
        ifindex=5,
        errors=_errors(symbol_error=4, link_downed=1),
        xmit_data_words=(1_011_884_201_337_554, 18_437_500_000),
        rcv_data_words=(1_004_006_112_876_300, 18_310_000_000),
        xmit_packets=(247_530_331_904, 18_005_371),
        rcv_packets=(245_611_077_812, 17_880_859),
        xmit_wait=(3_877_120_512, 1_118_764),
        hw=_ib_hw(
            out_of_sequence=277,
            packet_seq_err=81,
            local_ack_timeout_err=2,
            rx_write_requests=2_090_114_338,
            rx_read_requests=301_775_420,
        ),
    )
    return [p1, p2]


def fault_symbol_errors(ports: list[IbPort]) -> None:
    p = next(p for p in ports if p.rdma == "mlx5_1")
    p.errors["symbol_error"] = (p.errors["symbol_error"][0], 1_873)
    p.errors["port_rcv_errors"] = (p.errors["port_rcv_errors"][0], 31)
    p.errors["link_error_recovery"] = (p.errors["link_error_recovery"][0], 2)


def _ib_address(p: IbPort) -> str:
    # IPoIB hardware address: 4 bytes flags+QPN, then the 16-byte port GID
    gid = "fe80000000000000" + p.guid.replace(":", "")
    raw = "00000109" + gid
    return ":".join(raw[k : k + 2] for k in range(0, len(raw), 2))


def render_ib(ports: list[IbPort], i: int) -> dict[str, str]:
    files: dict[str, str] = {}
    line = roce._line
    # an OFED node (the IB fleets' usual stack); HCAs split over the two sockets
    files["sys/module/mlx5_core/version"] = line(roce.OFED_MLX5_VERSION)
    for n, p in enumerate(ports):
        net = f"sys/class/net/{p.netdev}"
        uevent = roce._uevent("mlx5_core", "15B3:1021", "15B3:0040", p.pci_slot, "20700")
        numa = 0 if n < len(ports) // 2 else 1
        files.update(roce.pci_files(f"{net}/device", roce.CX7_PCIE, numa))
        files.update(roce.pci_files(f"sys/class/infiniband/{p.rdma}/device", roce.CX7_PCIE, numa))
        files.update(
            {
                f"{net}/mtu": "4092\n",
                f"{net}/carrier": "1\n",
                f"{net}/operstate": "up\n",
                f"{net}/carrier_changes": "2\n",
                f"{net}/speed": "400000\n",
                f"{net}/address": line(_ib_address(p)),
                f"{net}/ifindex": line(p.ifindex),
                f"{net}/type": "32\n",
                f"{net}/flags": "0x1003\n",
                f"{net}/mode": "datagram\n",
                f"{net}/dev_port": "0\n",
                f"{net}/device/uevent": uevent,
            }
        )
        ib = f"sys/class/infiniband/{p.rdma}"
        files.update(
            {
                f"{ib}/node_type": "1: CA\n",
                f"{ib}/fw_ver": "28.39.1002\n",
                f"{ib}/board_id": "MT_0000000838\n",
                f"{ib}/hca_type": "MT4129\n",
                f"{ib}/node_guid": line(p.guid),
                f"{ib}/sys_image_guid": line(p.guid),
                f"{ib}/device/uevent": uevent,
                f"{ib}/device/net/{p.netdev}/dev_port": "0\n",
            }
        )
        port = f"{ib}/ports/1"
        files.update(
            {
                f"{port}/state": "4: ACTIVE\n",
                f"{port}/phys_state": "5: LinkUp\n",
                f"{port}/rate": "400 Gb/sec (4X NDR)\n",
                f"{port}/link_layer": "InfiniBand\n",
                f"{port}/lid": line(f"0x{p.lid:x}"),
                f"{port}/sm_lid": "0x1\n",
                f"{port}/sm_sl": "0\n",
                f"{port}/lid_mask_count": "0\n",
                f"{port}/cap_mask": "0xa651e848\n",
                f"{port}/gids/0": line("fe80:0000:0000:0000:" + p.guid),
                f"{port}/gid_attrs/types/0": "IB/RoCE v1\n",
            }
        )
        for idx in range(1, 4):
            files[f"{port}/gids/{idx}"] = line(roce.ZERO_GID)
        for name, c in p.errors.items():
            files[f"{port}/counters/{name}"] = line(at(c, i))
        files[f"{port}/counters/port_xmit_data"] = line(at(p.xmit_data_words, i))
        files[f"{port}/counters/port_rcv_data"] = line(at(p.rcv_data_words, i))
        files[f"{port}/counters/port_xmit_packets"] = line(at(p.xmit_packets, i))
        files[f"{port}/counters/port_rcv_packets"] = line(at(p.rcv_packets, i))
        files[f"{port}/counters/port_xmit_wait"] = line(at(p.xmit_wait, i))
        for name, c in p.hw.items():
            files[f"{port}/hw_counters/{name}"] = line(at(c, i) % U32)
        files[f"{port}/hw_counters/lifespan"] = "10\n"
    # management LOM, as on the RoCE node: not an RDMA netdev, not judged
    files.update({k: v for k, v in roce.render_sample(roce.Node("x", []), i).items()})
    return files


IB_CHECKS = """\
# An InfiniBand node: ports are IB, IPoIB runs in datagram mode (MTU 4092 by default).
rdma:
  linkLayer: InfiniBand
  minRateGbps: 400
"""


# -- the spare port ---------------------------------------------------------------------------

SPARE = "ens3np0"
# the Q counters make_snapshots._hw takes a history for: all zero on a port never used
SPARE_ERROR_COUNTERS = (
    "out_of_sequence",
    "duplicate_request",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_cqe_error",
    "req_cqe_error",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "req_transport_retries_exceeded",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
)


def spare_node() -> roce.Node:
    node = roce.healthy()
    spare = roce.Port(
        netdev=SPARE,
        rdma="mlx5_2",
        mac="9c:63:c0:ab:f4:90",
        guid="9c63:c003:00ab:f490",
        ipv4=(0, 0, 0, 0),  # never configured
        pci_slot="0000:ba:00.0",
        numa=1,
        ifindex=6,
        carrier=0,
        operstate="down",
        carrier_changes=(0, 0),
        speed=-1,
        duplex="unknown",
        link_down_events=(0, 0),
        rdma_state="1: DOWN",
        phys_state="3: Disabled",
        rate="40 Gb/sec (4X QDR)",
        pause=roce.Pause((0, 0), (0, 0), (0, 0), (0, 0), (0, 0)),
        hw=roce._hw(
            errors=dict.fromkeys(SPARE_ERROR_COUNTERS, 0),
            cong={n: (0, 0) for n in roce.CONG_COUNTERS if n != "rx_icrc_encapsulated"},
            requests={"rx_write_requests": (0, 0), "rx_read_requests": (0, 0)},
        ),
    )
    node.ports.append(spare)
    return node


def render_spare(node: roce.Node, i: int) -> dict[str, str]:
    files = roce.render_sample(node, i)
    for p in node.ports:
        up = p.netdev != SPARE
        files[f"sys/class/net/{p.netdev}/flags"] = "0x1003\n" if up else "0x1002\n"
    net = f"sys/class/net/{SPARE}"
    for gone in ("carrier", "speed", "duplex"):  # EINVAL while admin down
        del files[f"{net}/{gone}"]
    port = "sys/class/infiniband/mlx5_2/ports/1"
    # only the default (link-local) GIDs: the IPv4-mapped pair belongs to an address it lacks
    for idx in (2, 3):
        files[f"{port}/gids/{idx}"] = roce._line(roce.ZERO_GID)
        del files[f"{port}/gid_attrs/types/{idx}"]
        del files[f"{port}/gid_attrs/ndevs/{idx}"]
    return files


SPARE_CHECKS = """\
# mlx5_2 (ens3np0) is a cabled spare, kept administratively down: not a fault.
select:
  adminDown: skip
"""


# -- writing ----------------------------------------------------------------------------------


def write(name: str, node_name: str, render: Callable[[int], dict[str, str]], checks: str) -> int:
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    meta = {
        "format": "netval-snapshot/1.1",  # flags, dev_port, mode, device/net/<if>/dev_port
        "node": node_name,
        "captured_at": roce.CAPTURED_AT,
        "interval_seconds": roce.INTERVAL,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="ascii")
    (out / "checks.yaml").write_text(checks, encoding="ascii")
    count = 2
    for i in range(roce.SAMPLES):
        for rel, content in sorted(render(i).items()):
            path = out / "samples" / str(i) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode("ascii"))
            count += 1
    return count


def _ib(fault: Callable[[list[IbPort]], None] | None) -> Callable[[int], dict[str, str]]:
    ports = healthy_ib()
    if fault is not None:
        fault(ports)
    return lambda i: render_ib(copy.deepcopy(ports), i)


SNAPSHOTS: dict[str, tuple[str, Callable[[int], dict[str, str]], str]] = {
    "healthy-infiniband": ("gpu-ib01", _ib(None), IB_CHECKS),
    "fault-ib-symbol-errors": ("gpu-ib02", _ib(fault_symbol_errors), IB_CHECKS),
    "excluded-spare-port": (
        "gpu-a10",
        lambda i: render_spare(spare_node(), i),
        SPARE_CHECKS,
    ),
}


def main() -> None:
    for name, (node_name, render, checks) in SNAPSHOTS.items():
        print(f"{name}: {write(name, node_name, render, checks)} files")


if __name__ == "__main__":
    main()
