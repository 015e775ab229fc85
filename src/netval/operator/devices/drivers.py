"""Which attributes of a DRA driver's devices name a NIC (pure).

A DeviceTaintRule selects a device by driver, pool and device name (CEL selectors were
removed in Kubernetes 1.35), so the operator finds the device a failing NIC is published as
by the attributes its driver publishes. Per driver, the attribute (fully qualified name) that
holds:

- `pciAddress`: the device's own PCI function ("0000:98:00.0");
- `parentPciAddress`: for a virtual function, its physical function's: a failing NIC's VFs
  are its devices too (SR-IOV drivers publish VFs, not the PF);
- `ifName`: its netdev; `rdmaDevice`: its RDMA device.

A device is the NIC's when its PCI address (or its parent's) is the NIC's; only a device
without a PCI address is matched by RDMA device or netdev name. Nothing else is ever
matched: a pool's other devices (GPUs share pool names with NICs) are never selected.

Defaults: dranet (kubernetes-sigs/dranet `pkg/apis/attributes.go`: driver `dra.net`,
`dra.net/pciAddress`, `dra.net/ifName`, `dra.net/rdmaDevice`). The SR-IOV DRA driver
(k8snetworkplumbingwg/dra-driver-sriov `pkg/consts/consts.go`: driver
`sriovnetwork.k8snetworkplumbingwg.io`, attributes `<driver>/pciAddress`,
`<driver>/pfPciAddress`, `<driver>/interfaceName`) and others are configured with
`NETVAL_DRA_DRIVERS` (chart `deviceTaints.drivers`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

# a DNS subdomain (ResourceSlice.spec.driver), and a qualified attribute name
# (<DNS subdomain>/<C identifier>, at most 63 characters after the slash)
_DRIVER: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ATTRIBUTE: Final = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]{0,62}$"
)
MAX_DRIVERS: Final = 8
_KEYS: Final = ("pciAddress", "parentPciAddress", "ifName", "rdmaDevice")


@dataclass(frozen=True, slots=True)
class DriverAttributes:
    driver: str
    pci_address: str | None = None
    parent_pci_address: str | None = None
    if_name: str | None = None
    rdma_device: str | None = None

    @property
    def attributes(self) -> tuple[str, ...]:
        """The attribute names read (what a slice's devices are trimmed to)."""
        found = (self.pci_address, self.parent_pci_address, self.if_name, self.rdma_device)
        return tuple(a for a in found if a)


DRANET: Final = DriverAttributes(
    driver="dra.net",
    pci_address="dra.net/pciAddress",
    if_name="dra.net/ifName",
    rdma_device="dra.net/rdmaDevice",
)
SRIOV: Final = DriverAttributes(
    driver="sriovnetwork.k8snetworkplumbingwg.io",
    pci_address="sriovnetwork.k8snetworkplumbingwg.io/pciAddress",
    parent_pci_address="sriovnetwork.k8snetworkplumbingwg.io/pfPciAddress",
    if_name="sriovnetwork.k8snetworkplumbingwg.io/interfaceName",
)
DEFAULT_DRIVERS: Final = (DRANET,)


def parse_drivers(text: str, variable: str = "NETVAL_DRA_DRIVERS") -> tuple[DriverAttributes, ...]:
    """The JSON list `[{driver, pciAddress?, parentPciAddress?, ifName?, rdmaDevice?}]`
    (attribute names); empty text: the defaults. ValueError names what is wrong."""
    if not text.strip():
        return DEFAULT_DRIVERS
    try:
        items: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{variable}: not valid JSON: {exc.msg}") from None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_DRIVERS:
        raise ValueError(f"{variable}: expected a JSON list of 1 to {MAX_DRIVERS} drivers")
    out: list[DriverAttributes] = []
    for item in items:
        if not isinstance(item, dict) or set(item) - {"driver", *_KEYS}:
            raise ValueError(f"{variable}: each driver is {{driver, {', '.join(_KEYS)}}}")
        driver = item.get("driver")
        if not isinstance(driver, str) or len(driver) > 253 or not _DRIVER.match(driver):
            raise ValueError(f"{variable}: driver must be a DNS subdomain, got {driver!r}")
        names = {key: item.get(key) for key in _KEYS}
        for key, name in names.items():
            if name is not None and (not isinstance(name, str) or not _ATTRIBUTE.match(name)):
                raise ValueError(f"{variable}: {driver} {key}: not an attribute name: {name!r}")
        if not any(names.values()):
            raise ValueError(f"{variable}: {driver} names no attribute")
        out.append(
            DriverAttributes(
                driver,
                names["pciAddress"],
                names["parentPciAddress"],
                names["ifName"],
                names["rdmaDevice"],
            )
        )
    if len({d.driver for d in out}) != len(out):
        raise ValueError(f"{variable}: a driver is listed twice")
    return tuple(out)


__all__ = ["DEFAULT_DRIVERS", "DRANET", "SRIOV", "DriverAttributes", "parse_drivers"]
