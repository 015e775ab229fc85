"""`status.nics` from a validation's state and its node verdict (pure).

Counts: every NIC listed by the fresh targeted nodes' reports, those failing and those that
only warn, the NICs the verdict taints and the nodes it labels degraded for their NICs.
Entries: at most MAX_NIC_ENTRIES, failing NICs first (by node, device), then the ones
recovering (tainted, passing again), then warning ones. None when no targeted node reports a
`nics` section and device taints are off: the status stays as it was without them.
"""

from __future__ import annotations

from datetime import datetime

from netval.model.nic_status import (
    MAX_NIC_CHECKS,
    MAX_NIC_ENTRIES,
    DeviceTaints,
    NicEntry,
    NicState,
    NicStatus,
)
from netval.model.nics import Nic
from netval.operator.gating.verdict import DEVICE_WHYS, Heard, ValidationVerdict
from netval.operator.state.validation import ValidationState, heard

_ORDER = {NicState.FAILING: 0, NicState.RECOVERING: 1, NicState.WARNING: 2}


def _entry(
    node: str,
    nic: str,
    identity: Nic | None,
    state: NicState,
    checks: tuple[str, ...],
    tainted: bool,
) -> NicEntry:
    return NicEntry(
        node=node,
        device=nic,
        state=state,
        pci_address=identity.pci_address if identity is not None else None,
        netdevs=list(identity.netdevs) if identity is not None else [],
        checks=list(checks[:MAX_NIC_CHECKS]),
        tainted=tainted,
    )


def nic_status(
    state: ValidationState, verdict: ValidationVerdict | None, now: datetime
) -> NicStatus | None:
    total = failing = warning = 0
    reported = False
    entries: list[tuple[int, str, str, NicEntry]] = []
    devices = verdict.devices if verdict is not None else {}
    for node in state.targeted:
        rec = state.nodes.get(node)
        if rec is None or rec.nics is None or heard(state, node, now) is not Heard.FRESH:
            continue
        health = rec.nics
        reported = True
        total += health.count
        failing += len(health.failing)
        warning += len(health.warning)
        tainted = set(devices.get(node, ()))
        named = {nic for nic, _ in health.failing}
        for nic, checks in health.failing:
            entry = _entry(node, nic, health.identity(nic), NicState.FAILING, checks,
                           nic in tainted)  # fmt: skip
            entries.append((0, node, nic, entry))
        for nic in sorted(tainted - named):
            seen = (rec.nic_failed or {}).get(nic)
            entry = _entry(node, nic, seen[1] if seen else None, NicState.RECOVERING, (), True)
            entries.append((1, node, nic, entry))
        for nic, checks in health.warning:
            entry = _entry(node, nic, health.identity(nic), NicState.WARNING, checks,
                           nic in tainted)  # fmt: skip
            entries.append((2, node, nic, entry))
    note = state.devices_note
    if not reported and note is None:
        return None
    entries.sort(key=lambda e: e[:3])
    degraded = (
        sum(1 for d in verdict.nodes.values() if d.why in DEVICE_WHYS) if verdict is not None else 0
    )
    return NicStatus(
        total=total,
        failing=failing,
        warning=warning,
        tainted=verdict.tainted_devices if verdict is not None else 0,
        nodes_degraded=degraded,
        device_taints=_taints(note),
        message=(note or "")[:1024],
        entries=[e for *_, e in entries[:MAX_NIC_ENTRIES]],
    )


def _taints(note: str | None) -> DeviceTaints | None:
    if note is None:
        return None
    return DeviceTaints.ACTIVE if note == "" else DeviceTaints.UNAVAILABLE


__all__ = ["nic_status"]
