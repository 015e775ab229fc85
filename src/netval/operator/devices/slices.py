"""The node-local devices of the configured DRA drivers' ResourceSlices, trimmed to what
matching a NIC needs (pure).

A ResourceSlice is semi-trusted input (a DRA driver's kubelet plugin wrote it through the
API server's validation): every value read is type-checked and bounded again here, and a
slice that does not parse is skipped (counted), never an error of the round. Of each slice
only the driver, pool (name, generation), node and, per device, its name and the few
attributes `drivers` names are kept: a GPU node's slices hold dozens of attributes per
device, and a GPU driver's slices are never watched at all (the watch selects
`spec.driver`). Only the slices of a pool's newest generation count (a driver rewriting its
pool leaves older slices behind for a moment), and only node-local devices: those of a
slice with `nodeName`, or with `perDeviceNodeSelection` and the device's own `nodeName`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from netval.model.nics import Nic
from netval.model.sharing import Shared
from netval.operator.devices.drivers import DriverAttributes

MAX_DEVICES_PER_SLICE: Final = 128  # the API's own bound (ResourceSliceMaxDevices)
MAX_DEVICES_PER_NIC: Final = 64  # a NIC matching more (VFs) is not tainted device by device
MAX_VALUE: Final = 64  # DeviceAttributeMaxValueLength
# A fleet's nodes publish the same rails (the same PCI addresses, names and devices): one
# shared tuple per distinct device list instead of one per node (bounded).
MAX_SHARED: Final = 65_536
_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a device name
_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # node, slice
_POOL: Final = re.compile(r"^[a-z0-9]([-a-z0-9./]{0,251}[a-z0-9])?$")


class SliceDevice(NamedTuple):
    device: str
    pci: str | None
    parent: str | None
    if_name: str | None
    rdma: str | None


class DeviceRef(NamedTuple):
    """What a DeviceTaintRule's selector names."""

    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class SliceEntry:
    node: str
    driver: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_VALUE else None


def _attribute(attrs: Mapping[str, Any], name: str | None, driver: str) -> str | None:
    """A string attribute; an unqualified name in the slice is in the driver's domain."""
    if not name:
        return None
    found = attrs.get(name)
    if found is None and name.startswith(driver + "/"):
        found = attrs.get(name[len(driver) + 1 :])
    return _text(found.get("string")) if isinstance(found, dict) else None


def _pci(value: str | None) -> str | None:
    return value.lower() if value is not None else None


_SHARED: Final = Shared[tuple[SliceDevice, ...]](MAX_SHARED)


def _interned(value: str | None) -> str | None:
    return sys.intern(value) if value is not None else None


def parse_slice(
    obj: Mapping[str, Any], drivers: Mapping[str, DriverAttributes]
) -> tuple[str, list[SliceEntry]] | None:
    """(the slice's name, its node-local entries: one per node), or None when it is not a
    slice of a configured driver or does not parse."""
    meta = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    name = meta.get("name")
    driver = spec.get("driver")
    pool = spec.get("pool")
    if not isinstance(name, str) or len(name) > 253 or not isinstance(driver, str):
        return None
    mapping = drivers.get(driver)
    if mapping is None or not isinstance(pool, dict):
        return None
    pool_name, generation = pool.get("name"), pool.get("generation", 0)
    if not isinstance(pool_name, str) or not _POOL.match(pool_name):
        return None
    if type(generation) is not int or not 0 <= generation < 2**63:
        return None
    node = spec.get("nodeName")
    per_device = spec.get("perDeviceNodeSelection") is True
    if not per_device and not (isinstance(node, str) and _NAME.match(node)):
        return None  # not node-local (allNodes, nodeSelector): no node's NIC
    devices = spec.get("devices")
    if not isinstance(devices, list):
        devices = []
    by_node: dict[str, list[SliceDevice]] = {}
    for item in devices[:MAX_DEVICES_PER_SLICE]:
        if not isinstance(item, dict):
            continue
        device = item.get("name")
        if not isinstance(device, str) or not _LABEL.match(device):
            continue
        basic = item.get("basic")  # resource.k8s.io/v1beta1 nests the device's fields
        body = basic if isinstance(basic, dict) else item
        where = body.get("nodeName") if per_device else node
        if not isinstance(where, str) or not _NAME.match(where):
            continue
        attrs = body.get("attributes")
        attrs = attrs if isinstance(attrs, dict) else {}
        found = SliceDevice(
            sys.intern(device),
            _interned(_pci(_attribute(attrs, mapping.pci_address, driver))),
            _interned(_pci(_attribute(attrs, mapping.parent_pci_address, driver))),
            _interned(_attribute(attrs, mapping.if_name, driver)),
            _interned(_attribute(attrs, mapping.rdma_device, driver)),
        )
        if found[1:] != (None, None, None, None):  # a device that names no NIC is not kept
            by_node.setdefault(sys.intern(where), []).append(found)
    driver, pool_name = sys.intern(driver), sys.intern(pool_name)
    entries = [
        SliceEntry(n, driver, pool_name, generation, _SHARED(tuple(d))) for n, d in by_node.items()
    ]
    return name, entries


def matches(device: SliceDevice, nic: Nic) -> bool:
    """Whether `device` is (a function of) `nic`: by PCI address when both have one, else by
    RDMA device, else by netdev name."""
    if nic.pci_address is not None and (device.pci is not None or device.parent is not None):
        return nic.pci_address in (device.pci, device.parent)
    if device.rdma is not None:
        return device.rdma == nic.rdma_device
    return device.if_name is not None and device.if_name in nic.netdevs


@dataclass(slots=True)
class SliceIndex:
    """The configured drivers' node-local devices, by slice and by node."""

    drivers: Mapping[str, DriverAttributes]
    slices: dict[str, list[SliceEntry]] = field(default_factory=dict)
    by_node: dict[str, set[str]] = field(default_factory=dict)
    skipped: int = 0  # slices of a configured driver that did not parse

    def upsert(self, obj: Mapping[str, Any]) -> None:
        parsed = parse_slice(obj, self.drivers)
        if parsed is None:
            meta, spec = obj.get("metadata"), obj.get("spec")
            name = meta.get("name") if isinstance(meta, dict) else None
            if isinstance(spec, dict) and spec.get("driver") in self.drivers:
                self.skipped += 1
            if isinstance(name, str):
                self.delete(name)  # it no longer parses: what it said does not hold
            return
        name, entries = parsed
        self.delete(name)
        if entries:
            self.slices[name] = entries
            for entry in entries:
                self.by_node.setdefault(entry.node, set()).add(name)

    def delete(self, name: str) -> None:
        for entry in self.slices.pop(name, ()):
            names = self.by_node.get(entry.node)
            if names is not None:
                names.discard(name)
                if not names:
                    del self.by_node[entry.node]

    def replace_all(self, objs: Iterable[Mapping[str, Any]], driver: str) -> None:
        """A fresh listing of `driver`'s slices replaces what was known of it."""
        for name in [n for n, es in self.slices.items() if es and es[0].driver == driver]:
            self.delete(name)
        for obj in objs:
            self.upsert(obj)

    def _current(self, node: str) -> list[SliceEntry]:
        """The node's entries of each pool's newest generation."""
        entries = [e for name in self.by_node.get(node, ()) for e in self.slices[name]
                   if e.node == node]  # fmt: skip
        newest: dict[tuple[str, str], int] = {}
        for e in entries:
            key = (e.driver, e.pool)
            newest[key] = max(newest.get(key, e.generation), e.generation)
        return [e for e in entries if e.generation == newest[(e.driver, e.pool)]]

    def devices_of(self, node: str, nic: Nic) -> tuple[DeviceRef, ...] | None:
        """The devices `nic` of `node` is published as (sorted; empty: none), or None when
        it matches more than MAX_DEVICES_PER_NIC (not tainted device by device)."""
        found = {
            DeviceRef(e.driver, e.pool, d.device)
            for e in self._current(node)
            for d in e.devices
            if matches(d, nic)
        }
        if len(found) > MAX_DEVICES_PER_NIC:
            return None
        return tuple(sorted(found))

    def taintable(self, node: str, nic: Nic) -> bool:
        return bool(self.devices_of(node, nic))

    @property
    def devices(self) -> int:
        return sum(len(e.devices) for entries in self.slices.values() for e in entries)


__all__ = [
    "MAX_DEVICES_PER_NIC",
    "DeviceRef",
    "SliceDevice",
    "SliceEntry",
    "SliceIndex",
    "matches",
    "parse_slice",
]
