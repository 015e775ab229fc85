"""Parse a sysfs tree (live `/sys`, or a recorded snapshot's copy of it) into typed data.

One parser serves both collectors, so a recorded snapshot yields exactly the typed data the
live host did. Reads are per judged interface: a node with hundreds of pod veths costs the
same as one without them.

Live mode (`strict=False`): a file that cannot be read or parsed is unknown (None).
Recorded mode (`strict=True`): an absent file is still unknown (a failed read on the node),
but a file that is present and malformed is bad input and raises `SnapshotDataError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from netval.model.snapshot import (
    ZERO_GID,
    Dcb,
    Gid,
    Netdev,
    PciePlacement,
    RdmaDevice,
    RdmaPort,
)

PRIORITIES: Final = range(8)
# fleet consistency (issue 22): the PCI function's negotiated link and NUMA node
PCI_DEVICE_FILES: Final = ("current_link_speed", "current_link_width", "numa_node")
# Files copied per netdev / RDMA port when recording; the parser reads the same names.
NETDEV_FILES: Final = (
    "mtu",
    "carrier",
    "operstate",
    "carrier_changes",
    "speed",
    "address",
    "device/uevent",
    "bonding/slaves",
    # selection and transports (issue 11)
    "flags",
    "type",
    "mode",
    "dev_port",
    *(f"device/{n}" for n in PCI_DEVICE_FILES),
)
PORT_FILES: Final = ("state", "phys_state", "rate", "link_layer")
DEVICE_FILES: Final = (
    "node_type",
    "fw_ver",
    "board_id",
    "device/uevent",
    *(f"device/{n}" for n in PCI_DEVICE_FILES),
)
LOWER_PREFIX: Final = "lower_"
NOT_AVAILABLE: Final = "N/A"


class SnapshotDataError(ValueError):
    """A recorded file is present but its content is not what the kernel writes."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


class SysfsReader:
    def __init__(
        self,
        sys_root: Path,
        *,
        rdma_cm_root: Path | None = None,
        strict: bool = False,
        hw_counter_names: Iterable[str] = (),
        port_counter_names: Iterable[str] = (),
        hw_counter_names_for: Callable[[str, str | None], Iterable[str]] | None = None,
    ) -> None:
        self.sys_root = sys_root
        self.net_root = sys_root / "class" / "net"
        self.ib_root = sys_root / "class" / "infiniband"
        self.rdma_cm_root = rdma_cm_root
        self.strict = strict
        # Only the counters checks read: an mlx5 port exposes ~60 counter files and reading
        # them all would cost more than the rest of the cycle.
        self.hw_counter_names = tuple(sorted(set(hw_counter_names)))
        self.port_counter_names = tuple(sorted(set(port_counter_names)))
        # (device, its PCI driver) -> the hw_counters worth reading on it; default: all.
        self.hw_counter_names_for = hw_counter_names_for

    # -- primitive reads -------------------------------------------------------------------

    # Paths are Path or str: the per-counter and per-GID loops join strings, because a
    # pathlib join costs more than the read itself (measured: bench/probe_cost.py).
    def text(self, path: Path | str) -> str | None:
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError:
            return None
        try:
            value = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            if self.strict:
                raise SnapshotDataError(path, "not UTF-8 text") from None
            return None
        # The kernel answers some reads with an empty string (ECN enables on some firmware):
        # that is no value, not the value "".
        return value or None

    def integer(self, path: Path | str) -> int | None:
        value = self.text(path)
        if value is None:
            return None
        return self._parse_int(path, value)

    def _parse_int(self, path: Path | str, value: str) -> int | None:
        try:
            return int(value, 0) if value.startswith("0x") else int(value)
        except ValueError:
            if self.strict:
                raise SnapshotDataError(path, f"not an integer: {value[:40]!r}") from None
            return None

    def listdir(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    # -- netdevs ---------------------------------------------------------------------------

    def netdev_exists(self, name: str) -> bool:
        return (self.net_root / name).is_dir()

    def read_netdev(
        self,
        name: str,
        *,
        ethtool: dict[str, int] | None = None,
        dcb: Dcb | None = None,
        dcb_error: str | None = None,
        read_lower: bool = True,
    ) -> Netdev | None:
        """A netdev's sysfs state; ethtool stats and DCB come from the caller's source."""
        base = self.net_root / name
        mtu = self.integer(base / "mtu")
        operstate = self.text(base / "operstate")
        if mtu is None and operstate is None and not base.is_dir():
            return None
        speed = self.integer(base / "speed")
        slaves = self.text(base / "bonding" / "slaves")
        uevent = self._uevent(base / "device")
        driver = self._driver(base / "device", uevent)
        # A netdev without a device of its own (bond, team, VLAN) names what is below it in
        # lower_* links; only then is the directory listed, so NIC netdevs cost no listdir
        # (and the live collector asks only for netdevs carrying RDMA traffic).
        lower: tuple[str, ...] = ()
        if read_lower and not slaves and driver is None:
            lower = tuple(
                n[len(LOWER_PREFIX) :]
                for n in self.listdir(base)
                if n.startswith(LOWER_PREFIX) and len(n) > len(LOWER_PREFIX)
            )
        return Netdev(
            name=name,
            mtu=mtu,
            carrier=self.integer(base / "carrier"),
            operstate=operstate,
            carrier_changes=self.integer(base / "carrier_changes"),
            # A down link reads -1 (or EINVAL) for speed: unknown either way.
            speed_mbps=speed if speed is not None and speed >= 0 else None,
            address=self.text(base / "address"),
            driver=driver,
            bond_slaves=tuple(slaves.split()) if slaves else (),
            ecn_np=self._ecn(base / "ecn" / "roce_np" / "enable"),
            ecn_rp=self._ecn(base / "ecn" / "roce_rp" / "enable"),
            ethtool=ethtool,
            dcb=dcb,
            flags=self.integer(base / "flags"),
            type=self.integer(base / "type"),
            ipoib_mode=self.text(base / "mode"),
            pci_address=uevent.get("PCI_SLOT_NAME") or None,
            dev_port=self.integer(base / "dev_port"),
            lower=lower,
            dcb_error=dcb_error if dcb is None else None,
            pci_id=uevent.get("PCI_ID") or None,
            pci_subsys_id=uevent.get("PCI_SUBSYS_ID") or None,
            # a bond or VLAN has no device of its own: nothing to read
            pcie=self._pcie(base / "device", driver) if driver is not None else None,
        )

    def _pcie(self, device: Path, driver: str | None) -> PciePlacement | None:
        """The PCI function's link, NUMA node and driver version: four small reads.

        Not cached: a renegotiated link or a reloaded driver must show within one cycle.
        The driver version is the module's own `version` file (MODULE_VERSION), which the
        out-of-tree packages fill (MLNX_OFED mlx5_core, Broadcom's and Intel's own bnxt_en
        and ice); in-tree drivers mostly dropped it, and ETHTOOL_GDRVINFO then answers the
        kernel release (`ethtool -i` on in-tree bnxt_en, 6.6: "version: 6.6.43",
        isc-projects/ethq#33), which kernel_release already says: absent file, absent key.
        """
        base = str(device)
        width = self.integer(f"{base}/current_link_width")
        placement = PciePlacement(
            link_speed=self.text(f"{base}/current_link_speed"),
            # 0 lanes: no PCIe link to report (a virtual function or an emulated device)
            link_width=width if width else None,
            numa_node=self.integer(f"{base}/numa_node"),
            driver_version=(
                self.text(f"{self.sys_root}/module/{driver}/version")
                if driver and "/" not in driver
                else None
            ),
        )
        return None if placement.empty else placement

    def _uevent(self, device: Path) -> dict[str, str]:
        """A device's uevent as KEY -> value (empty values dropped); read once per device
        and cycle, for both its driver and its PCI address."""
        text = self.text(device / "uevent")
        fields: dict[str, str] = {}
        for line in (text or "").splitlines():
            key, sep, value = line.partition("=")
            if sep and value.strip():
                fields[key] = value.strip()
        return fields

    def _driver(self, device: Path, uevent: dict[str, str]) -> str | None:
        """The driver bound to a device directory: its uevent's DRIVER=, else the basename
        of its `driver` link (recorded snapshots keep only the uevent)."""
        if "DRIVER" in uevent:
            return uevent["DRIVER"]
        try:
            target = os.readlink(device / "driver")
        except OSError:
            return None
        return os.path.basename(target) or None

    def _ecn(self, enable_dir: Path) -> dict[int, bool]:
        out: dict[int, bool] = {}
        if not enable_dir.is_dir():
            return out
        base = str(enable_dir)
        for prio in PRIORITIES:
            value = self.integer(f"{base}/{prio}")
            if value is not None:
                out[prio] = value != 0
        return out

    # -- RDMA ------------------------------------------------------------------------------

    def rdma_device_names(self) -> list[str]:
        return self.listdir(self.ib_root)

    def read_rdma_device(
        self,
        name: str,
        *,
        gid_indices: Callable[[str, int, Path], Iterable[int]] | None = None,
    ) -> RdmaDevice:
        """`gid_indices(device, port, gids_dir)` lets the live collector skip empty slots."""
        base = self.ib_root / name
        uevent = self._uevent(base / "device")
        driver = self._driver(base / "device", uevent)
        hw_names = (
            tuple(self.hw_counter_names_for(name, driver))
            if self.hw_counter_names_for is not None
            else self.hw_counter_names
        )
        ports: dict[int, RdmaPort] = {}
        for port_name in self.listdir(base / "ports"):
            if not port_name.isdigit():
                continue
            port = int(port_name)
            ports[port] = self._read_port(
                name, port, base / "ports" / port_name, gid_indices, hw_names
            )
        hint = self.listdir(base / "device" / "net")
        return RdmaDevice(
            name=name,
            node_type=self.text(base / "node_type"),
            fw_ver=self.text(base / "fw_ver"),
            board_id=self.text(base / "board_id"),
            netdev_hint=hint[0] if hint else None,
            ports=ports,
            pci_address=uevent.get("PCI_SLOT_NAME") or None,
            # Each port binds to the netdev of its own dev_port, not to the first name here.
            pci_netdevs={n: self.integer(base / "device" / "net" / n / "dev_port") for n in hint},
            driver=driver,
            pci_id=uevent.get("PCI_ID") or None,
            pci_subsys_id=uevent.get("PCI_SUBSYS_ID") or None,
            pcie=self._pcie(base / "device", driver),
        )

    def _read_port(
        self,
        device: str,
        port: int,
        base: Path,
        gid_indices: Callable[[str, int, Path], Iterable[int]] | None,
        hw_names: tuple[str, ...],
    ) -> RdmaPort:
        gids_dir = base / "gids"
        indices = (
            gid_indices(device, port, gids_dir)
            if gid_indices is not None
            else self.all_gid_indices(gids_dir)
        )
        gids = tuple(g for g in (self.read_gid(base, i) for i in indices) if g is not None)
        link_layer = self.text(base / "link_layer")
        unavailable: dict[str, str] = {}
        # Each PortCounters file is a MAD to the HCA's PMA; only IB ports' are judged.
        counters = (
            self._counters(base / "counters", self.port_counter_names, unavailable)
            if link_layer == "InfiniBand"
            else {}
        )
        hw_counters = self._counters(base / "hw_counters", hw_names, unavailable)
        tos = None
        if self.rdma_cm_root is not None:
            tos = self.integer(
                self.rdma_cm_root / device / "ports" / str(port) / "default_roce_tos"
            )
        return RdmaPort(
            device=device,
            port=port,
            state=self.text(base / "state"),
            phys_state=self.text(base / "phys_state"),
            rate=self.text(base / "rate"),
            link_layer=link_layer,
            gids=gids,
            counters=counters,
            hw_counters=hw_counters,
            default_roce_tos=tos,
            unavailable=unavailable,
        )

    def all_gid_indices(self, gids_dir: Path) -> list[int]:
        return sorted(int(n) for n in self.listdir(gids_dir) if n.isdigit())

    def read_gid(self, port_dir: Path, index: int) -> Gid | None:
        """A populated GID slot; empty (all-zero) slots are None, like unreadable ones."""
        base = str(port_dir)
        gid = self.text(f"{base}/gids/{index}")
        if gid is None or gid == ZERO_GID:
            return None
        return Gid(
            index=index,
            gid=gid,
            type=self.text(f"{base}/gid_attrs/types/{index}"),
            ndev=self.text(f"{base}/gid_attrs/ndevs/{index}"),
        )

    def _counters(
        self, directory: Path, names: tuple[str, ...], unavailable: dict[str, str]
    ) -> dict[str, int]:
        out: dict[str, int] = {}
        base = str(directory)
        for name in names:
            path = f"{base}/{name}"
            text = self.text(path)
            if text is None:
                continue
            # ib_core answers "N/A (no PMA)" for PMA counters of a device without one: the
            # kernel's own "no value", not bad input, and worth naming in the skip.
            if text.startswith(NOT_AVAILABLE):
                unavailable[f"{directory.name}/{name}"] = text[:40]
                continue
            value = self._parse_int(path, text)
            if value is not None:
                out[name] = value
        return out
