"""Which driver's counter names apply to an RDMA device or a netdev, and how that was found.

An RDMA device's own PCI device is asked first (its uevent DRIVER=, recorded in the
snapshot; live, the `device/driver` link when the uevent has none), so udev-renamed devices
(`rocep129s0f1`, `ibp152s0f0`) are recognised and an irdma device on an IPU (`idpf`) is not
taken for an E810 (`ice`). Then the netdev carrying its traffic; a RoCE LAG's netdev is a
bond without a device, so then the bond's slaves (or lower_* links), which all sit on the
same NIC. The RDMA name prefix (`mlx5_`, `bnxt_re`, ...) is the last resort, used only when
no driver was read at all (a 1.0 snapshot): a driver that was read and has no map is never
second-guessed from a name. The `source` says which of these answered: checks put it in
`observed`, so a wrong counter set can be traced to its cause.
"""

from __future__ import annotations

from dataclasses import dataclass

from netval.agent.checks.drivers import (
    DriverCounters,
    counters_for_driver,
    counters_for_rdma_prefix,
    known_drivers,
)
from netval.model.snapshot import Sample


@dataclass(frozen=True, slots=True)
class FoundDriver:
    counters: DriverCounters | None
    driver: str | None  # the driver name that selected `counters` (or the unknown one seen)
    source: str  # how it was found, or everything that was looked at when nothing was

    @property
    def observed(self) -> dict[str, str | None]:
        return {"driver": self.driver, "driverFrom": self.source}

    def unknown_reason(self, subject: str) -> str:
        if self.driver:
            return (
                f"driver {self.driver} of {subject} ({self.source}) has no counter map: "
                f"its counter names are not known (mapped: {', '.join(known_drivers())})"
            )
        return f"driver of {subject} not found: {self.source}"


def rdma_device_driver(sample: Sample, device_name: str, netdev_name: str | None) -> FoundDriver:
    device = sample.rdma.get(device_name)
    seen: list[str] = []
    unknown: tuple[str, str] | None = None
    if device is not None and device.driver:
        found = counters_for_driver(device.driver)
        if found is not None:
            return FoundDriver(found, device.driver, f"{device_name} device/uevent")
        unknown = (device.driver, f"{device_name} device/uevent")
    else:
        seen.append(f"{device_name} has no device/uevent DRIVER=")
    if netdev_name is not None:
        netdev = sample.netdevs.get(netdev_name)
        if netdev is None:
            seen.append(f"netdev {netdev_name} not read")
        else:
            if netdev.driver:
                found = counters_for_driver(netdev.driver)
                if found is not None:
                    return FoundDriver(found, netdev.driver, f"netdev {netdev_name} device/uevent")
                unknown = unknown or (netdev.driver, f"netdev {netdev_name} device/uevent")
            else:
                seen.append(f"netdev {netdev_name} has no device")
            below = netdev.ports_below
            for slave in below:
                slave_dev = sample.netdevs.get(slave)
                if slave_dev is not None and slave_dev.driver:
                    found = counters_for_driver(slave_dev.driver)
                    if found is not None:
                        return FoundDriver(
                            found,
                            slave_dev.driver,
                            f"{slave} device/uevent (slave of {netdev_name})",
                        )
                    unknown = unknown or (
                        slave_dev.driver,
                        f"{slave} device/uevent (slave of {netdev_name})",
                    )
            if below:
                seen.append(f"slaves {', '.join(below)} name no known driver")
            elif not netdev.driver:
                seen.append(f"{netdev_name} lists no bond slaves or lower_* links")
    else:
        seen.append("no netdev is bound to it")
    if unknown is not None:
        return FoundDriver(None, unknown[0], unknown[1])
    found = counters_for_rdma_prefix(device_name)
    if found is not None:
        # No driver was read: the counter names are the prefix's, the driver stays unknown.
        return FoundDriver(
            found,
            None,
            f"RDMA device name prefix of {device_name} ({found.name} names; no driver recorded)",
        )
    return FoundDriver(None, None, "; ".join(seen))


def netdev_driver(sample: Sample, name: str) -> FoundDriver:
    netdev = sample.netdevs.get(name)
    if netdev is None or not netdev.driver:
        return FoundDriver(None, None, f"{name} has no device/uevent DRIVER=")
    return FoundDriver(
        counters_for_driver(netdev.driver), netdev.driver, f"netdev {name} device/uevent"
    )
