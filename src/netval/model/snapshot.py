"""The typed node snapshot: what collectors produce and checks judge.

Both the live collector and the recorded-snapshot reader produce these types, so a recorded
snapshot evaluates exactly as the live host did. `None` always means "could not be read"
(EINVAL on a down link's speed, an empty ECN read, DCB unsupported): checks turn it into a
skip or a clear failure, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

SNAPSHOT_FORMAT: Final = "netval-snapshot/1.1"
# Every 1.x reads as 1.x: a minor version only adds files, which older readers ignore.
SNAPSHOT_MAJOR: Final = "netval-snapshot/1"

ZERO_GID: Final = "0000:0000:0000:0000:0000:0000:0000:0000"
IFF_UP: Final = 0x1
ARPHRD_INFINIBAND: Final = 32
IWARP_NODE_TYPE: Final = "4: RNIC"
EFA_DRIVER: Final = "efa"


class Transport(StrEnum):
    """What an RDMA port carries, from the device's node_type and the port's link_layer."""

    ROCE = "RoCE"
    INFINIBAND = "InfiniBand"
    IWARP = "iWARP"
    # AWS Elastic Fabric Adapter: SRD, link_layer "Unknown", no PFC/ECN/RoCE GIDs on the host.
    EFA = "EFA"
    # link_layer "Unknown" from a driver other than efa: neither RoCE nor InfiniBand.
    UNSPECIFIED = "unspecified"
    UNKNOWN = "unknown"  # link_layer unreadable


@dataclass(frozen=True, slots=True)
class DcbApp:
    selector: str  # "dscp", "ethertype", "stream", "dgram", "any", or "sel<N>"
    protocol: int
    priority: int


@dataclass(frozen=True, slots=True)
class Dcb:
    """IEEE 802.1Qaz state of a netdev (DCB_CMD_IEEE_GET)."""

    pfc_enabled: frozenset[int]
    pfc_requests: tuple[int, ...] = ()
    pfc_indications: tuple[int, ...] = ()
    app: tuple[DcbApp, ...] = ()

    @property
    def trust(self) -> str:
        """mlx5 trusts DSCP exactly when the app table maps DSCP values to priorities."""
        return "dscp" if any(a.selector == "dscp" for a in self.app) else "pcp"


@dataclass(frozen=True, slots=True)
class PciePlacement:
    """Where a NIC's PCI function sits: negotiated PCIe link, NUMA node, driver version.

    Read from the PCI device's sysfs files (current_link_speed, current_link_width,
    numa_node) and /sys/module/<driver>/version; each is None when unreadable.
    """

    link_speed: str | None = None  # "16.0 GT/s PCIe" (older kernels: "8 GT/s")
    link_width: int | None = None  # negotiated lanes: 16
    numa_node: int | None = None  # -1: the platform gives the device no NUMA affinity
    driver_version: str | None = None  # only out-of-tree drivers (MLNX_OFED, ...) set one

    @property
    def empty(self) -> bool:
        return (
            self.link_speed is None
            and self.link_width is None
            and self.numa_node is None
            and self.driver_version is None
        )


@dataclass(frozen=True, slots=True)
class Netdev:
    name: str
    mtu: int | None = None
    carrier: int | None = None
    operstate: str | None = None
    carrier_changes: int | None = None
    speed_mbps: int | None = None
    address: str | None = None
    driver: str | None = None
    bond_slaves: tuple[str, ...] = ()
    ecn_np: dict[int, bool] = field(default_factory=dict)
    ecn_rp: dict[int, bool] = field(default_factory=dict)
    ethtool: dict[str, int] | None = None
    dcb: Dcb | None = None
    # -- selection and transports (issue 11); absent from older snapshots: None --
    flags: int | None = None  # IFF_* flags; IFF_UP (0x1) is the admin state
    type: int | None = None  # ARPHRD_*: 1 Ethernet, 32 InfiniBand (IPoIB)
    ipoib_mode: str | None = None  # "datagram" | "connected"
    pci_address: str | None = None  # PCI_SLOT_NAME of device/uevent
    dev_port: int | None = None  # the port of its PCI device, 0-based
    # -- format 1.1 (drivers and counters) --
    # lower_* links: the ports under a bond/team without bonding/slaves.
    lower: tuple[str, ...] = ()
    # Why `dcb` is None, as the DCB netlink reader saw it ("EOPNOTSUPP", "timeout", ...);
    # None also when unknown (a 1.0 snapshot).
    dcb_error: str | None = None
    # -- fleet consistency (issue 22): from the device/uevent already read, no new read --
    pci_id: str | None = None  # PCI_ID "15B3:1021"
    pci_subsys_id: str | None = None  # PCI_SUBSYS_ID
    # -- fleet consistency (issue 22): PCI device files and the driver module's version --
    pcie: PciePlacement | None = None

    @property
    def ports_below(self) -> tuple[str, ...]:
        """The netdevs whose NIC carries this one's traffic (bond slaves, else lower_*)."""
        return self.bond_slaves or self.lower

    @property
    def has_ecn_controls(self) -> bool:
        return bool(self.ecn_np or self.ecn_rp)

    @property
    def admin_up(self) -> bool | None:
        """IFF_UP when flags were read; else inferred: sysfs refuses carrier (EINVAL) exactly
        while the interface is admin down, so an unreadable carrier with operstate down is
        admin down. None: unknown."""
        if self.flags is not None:
            return bool(self.flags & IFF_UP)
        if self.carrier is None and self.operstate == "down":
            return False
        if self.carrier is not None:
            return True
        return None

    @property
    def is_ipoib(self) -> bool:
        return self.type == ARPHRD_INFINIBAND or self.ipoib_mode is not None


@dataclass(frozen=True, slots=True)
class Gid:
    index: int
    gid: str
    type: str | None = None  # "RoCE v2", "IB/RoCE v1"
    ndev: str | None = None

    @property
    def populated(self) -> bool:
        return self.gid != ZERO_GID


@dataclass(frozen=True, slots=True)
class RdmaPort:
    device: str
    port: int
    state: str | None = None  # "4: ACTIVE"
    phys_state: str | None = None  # "5: LinkUp"
    rate: str | None = None  # "400 Gb/sec (4X NDR)"
    link_layer: str | None = None  # "Ethernet" | "InfiniBand" | "Unknown" (EFA)
    gids: tuple[Gid, ...] = ()
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)
    default_roce_tos: int | None = None
    # -- format 1.1 (drivers and counters) --
    # Counter files the kernel answered with a non-number ("N/A (no PMA)" on a device
    # without a performance-management agent): "hw_counters/<name>" -> the text read.
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def rate_gbps(self) -> float | None:
        if not self.rate:
            return None
        try:
            return float(self.rate.split()[0])
        except (ValueError, IndexError):
            return None

    @property
    def netdevs(self) -> tuple[str, ...]:
        """Netdevs this port's populated GIDs are bound to, in GID order."""
        return tuple(dict.fromkeys(g.ndev for g in self.gids if g.populated and g.ndev))


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    name: str
    node_type: str | None = None
    fw_ver: str | None = None
    board_id: str | None = None
    netdev_hint: str | None = None  # from /sys/class/net/<if>/device/infiniband
    ports: dict[int, RdmaPort] = field(default_factory=dict)
    # -- selection and port binding (issue 11) --
    pci_address: str | None = None  # PCI_SLOT_NAME of device/uevent
    # netdevs of the same PCI device (device/net/<name>) and their dev_port (0-based)
    pci_netdevs: dict[str, int | None] = field(default_factory=dict)

    @property
    def is_iwarp(self) -> bool:
        return self.node_type == IWARP_NODE_TYPE

    def transport(self, port: RdmaPort) -> Transport:
        if self.is_iwarp:
            return Transport.IWARP
        if port.link_layer == "InfiniBand":
            return Transport.INFINIBAND
        if port.link_layer == "Ethernet":
            return Transport.ROCE
        if not port.link_layer:
            return Transport.UNKNOWN
        # ib_core writes "Unknown" for IB_LINK_LAYER_UNSPECIFIED (drivers/infiniband/core/
        # sysfs.c link_layer_show): the efa driver's answer.
        return Transport.EFA if self.is_efa else Transport.UNSPECIFIED

    @property
    def is_efa(self) -> bool:
        """The efa driver's device: its PCI driver, else (format 1.0 snapshots, which do not
        record it) the kernel's default name efa_<n>."""
        if self.driver:
            return self.driver == EFA_DRIVER
        return self.name.startswith("efa_")

    # -- format 1.1 (drivers and counters) --
    # The PCI driver of the RDMA device's own device (device/uevent DRIVER= or the
    # device/driver link): names the counter set even when udev renamed the device.
    driver: str | None = None
    # -- fleet consistency (issue 22): from the device/uevent already read, no new read --
    pci_id: str | None = None  # PCI_ID "15B3:1021"
    pci_subsys_id: str | None = None  # PCI_SUBSYS_ID
    # -- fleet consistency (issue 22): PCI device files and the driver module's version --
    pcie: PciePlacement | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    netdevs: dict[str, Netdev]
    rdma: dict[str, RdmaDevice]


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node: str
    captured_at: str
    interval_seconds: float
    samples: tuple[Sample, ...]

    @property
    def first(self) -> Sample:
        return self.samples[0]

    @property
    def last(self) -> Sample:
        return self.samples[-1]

    @property
    def elapsed_seconds(self) -> float:
        return self.interval_seconds * (len(self.samples) - 1)

    @property
    def has_deltas(self) -> bool:
        return len(self.samples) >= 2
