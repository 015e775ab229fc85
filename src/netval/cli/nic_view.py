"""Per-NIC health in `netval status` (pure): the validation's NIC line, and per node its
named NICs and its `NetworkFabricReady` condition, from `status.nics` (at most 50 named
NICs: the status holds aggregates) and the Node objects."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from netval.model.keys import NodeConditionType
from netval.model.nic_status import DeviceTaints, NicEntry, NicState
from netval.model.status import NetworkValidationStatus


def nic_line(status: NetworkValidationStatus) -> str | None:
    """ "  nics     16 reported, 1 failing, 0 warning; device taints Active: 1 NIC tainted,
    1 node degraded" (None: no NIC reported and device taints off)."""
    nics = status.nics
    if nics is None:
        return None
    line = f"  nics     {nics.total} reported, {nics.failing} failing, {nics.warning} warning"
    if nics.device_taints is DeviceTaints.ACTIVE:
        line += (
            f"; device taints active: {nics.tainted} NIC(s) tainted, {nics.nodes_degraded} "
            "node(s) degraded"
        )
    elif nics.device_taints is DeviceTaints.UNAVAILABLE:
        line += f"; device taints unavailable: {nics.message}"
    return line


def _entry_text(e: NicEntry) -> str:
    where = f" {e.pci_address}" if e.pci_address else ""
    checks = f" ({', '.join(e.checks)})" if e.checks else ""
    taint = ", tainted" if e.tainted else ""
    return f"{e.device}{where} {e.state.value}{checks}{taint}"


def nics_by_node(status: NetworkValidationStatus | None) -> dict[str, list[NicEntry]]:
    out: dict[str, list[NicEntry]] = defaultdict(list)
    for entry in status.nics.entries if status is not None and status.nics is not None else []:
        out[entry.node].append(entry)
    return out


def node_nic_text(entries: list[NicEntry]) -> str:
    return "; ".join(_entry_text(e) for e in entries) or "-"


def failing_nics(entries: list[NicEntry]) -> bool:
    return any(e.state is NicState.FAILING for e in entries)


def node_condition(node: Mapping[str, Any]) -> str:
    """ "False DevicesFailing" of a Node's NetworkFabricReady, "-" without it."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == NodeConditionType.NETWORK_FABRIC_READY:
            return f"{c.get('status', '?')} {c.get('reason', '')}".strip()
    return "-"


__all__ = ["failing_nics", "nic_line", "nics_by_node", "node_condition", "node_nic_text"]
