"""The Node condition `NetworkFabricReady` (pure): what each node should carry, the changes
to write, and the conditions list a write carries.

The node verdict decides each node's status and reason and which validation speaks
(`verdict.merge`: the worst of the validations with `gating.nodeCondition`); this module
words the message from what that validation knows of the node -- the checks and subjects
failing, the NICs tainted -- and never from numbers that move every report, so an unchanged
verdict is an unchanged condition and nothing is written (no heartbeat: `lastHeartbeatTime`
is the time of the last write, `lastTransitionTime` of the last change of status). A node
that carries the condition and that no validation speaks for loses it.

The Node Readiness Controller, Cluster API MachineHealthChecks and Karpenter's node repair
read it (docs/gating.md, "The Node condition").
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from netval.model.keys import NodeConditionType
from netval.operator.gating.verdict import CONDITIONS, ConditionWish, Decisions, Why
from netval.operator.state.validation import NodeRecord, ValidationState

TYPE: Final = NodeConditionType.NETWORK_FABRIC_READY.value
NEVER_REPORTED: Final = CONDITIONS[Why.NEVER_REPORTED][1]
MAX_MESSAGE: Final = 1024
SHOWN: Final = 5

# what a Node carries of ours: (status, reason, message)
Carried = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class ConditionChange:
    """Set (`condition`) or remove (None) the node's NetworkFabricReady."""

    node: str
    condition: Carried | None

    @property
    def key(self) -> str:
        return f"condition\0{self.node}"

    @property
    def excludes(self) -> bool:
        return False  # a condition keeps no pod off by itself


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _failing(rec: NodeRecord | None) -> str:
    if rec is None or not rec.failures:
        return "failing"
    checks = sorted({f[2] for f in rec.failures})
    subjects = sorted({f[3] for f in rec.failures})
    return f"failing {_names(checks)} on {_names(subjects)}"


def _nics(rec: NodeRecord | None, nics: Sequence[str]) -> str:
    checks = dict(rec.nics.failing) if rec is not None and rec.nics is not None else {}
    parts = []
    for nic in nics[:SHOWN]:
        identity = rec.nics.identity(nic) if rec is not None and rec.nics is not None else None
        pci = f" {identity.pci_address}" if identity is not None and identity.pci_address else ""
        failed = f": {', '.join(checks[nic])}" if nic in checks else ""
        parts.append(f"{nic}{pci}{failed}")
    more = f" and {len(nics) - SHOWN} more" if len(nics) > SHOWN else ""
    return "; ".join(parts) + more


def message(wish: ConditionWish, rec: NodeRecord | None, nics: Sequence[str], recovery: int) -> str:
    """The condition's message: the validation, then what it sees, in words that do not move
    while the verdict holds."""
    v, why = wish.validation, wish.why
    if why is Why.PASSING:
        text = "fabric checks passing"
    elif why is Why.WARNING:
        warned = sorted(c for c, bucket in rec.check_buckets if bucket == 1) if rec else []
        text = f"warnings only ({_names(warned)})" if warned else "warnings only"
    elif why is Why.RETRIES_FROM_PEERS:
        text = "requester-side retries: its peers', not this node's fault"
    elif why in (Why.FAILING, Why.BLAMED):
        text = _failing(rec)
    elif why is Why.RECOVERING:
        text = f"passing again; excluded until {recovery} passing reports in a row"
    elif why is Why.SILENT_AFTER_FAILING:
        text = f"no fresh report after {_failing(rec)}; stays excluded"
    elif why is Why.DEVICES_FAILING:
        text = f"NIC(s) failing, their DRA devices tainted: {_nics(rec, nics)}"
    elif why is Why.DEVICES_RECOVERING:
        text = f"NIC(s) passing again, tainted until {recovery} passing reports: {_nics(rec, nics)}"
    elif why is Why.SILENT_AFTER_DEVICES:
        text = f"no fresh report; NIC(s) stay tainted: {_nics(rec, nics)}"
    elif why is Why.SUSPECT:
        text = (
            f"{_failing(rec)}, but more nodes fail than maxUnhealthyPercent allows: "
            "not excluded (suspect)"
        )
    else:
        text = f"no fresh report ({why.value})"
    return f"{v}: {text}"[:MAX_MESSAGE]


def wanted_conditions(
    decisions: Decisions, states: Mapping[str, ValidationState]
) -> dict[str, Carried]:
    """node -> the condition it should carry."""
    out: dict[str, Carried] = {}
    plain: dict[tuple[str, Why], Carried] = {}  # the words of verdicts without detail
    detailed = {
        Why.WARNING, Why.FAILING, Why.BLAMED, Why.SILENT_AFTER_FAILING, Why.SUSPECT,
        Why.DEVICES_FAILING, Why.DEVICES_RECOVERING, Why.SILENT_AFTER_DEVICES,
    }  # fmt: skip
    for node, wish in decisions.conditions.items():
        verdict = decisions.verdicts.get(wish.validation)
        recovery = verdict.policy.recovery_reports if verdict is not None else 0
        if wish.why not in detailed:
            key = (wish.validation, wish.why)
            found = plain.get(key)
            if found is None:
                found = plain[key] = (wish.status.value, wish.reason,
                                      message(wish, None, (), recovery))  # fmt: skip
            out[node] = found
            continue
        state = states.get(wish.validation)
        rec = state.nodes.get(node) if state is not None else None
        nics = verdict.devices.get(node, ()) if verdict is not None else ()
        out[node] = (wish.status.value, wish.reason, message(wish, rec, nics, recovery))
    return out


def plan_conditions(
    wanted: Mapping[str, Carried], carried: Mapping[str, Carried], known: set[str]
) -> list[ConditionChange]:
    """Changes for the nodes whose condition differs from what they carry (`carried`: the
    nodes carrying ours); `known`: the Nodes that exist. A node that carries none and was
    never heard from gets none yet: absent says as much as Unknown `NeverReported`, and a
    fresh install writes each node once, at its first verdict, not twice."""
    changes = [ConditionChange(n, c) for n, c in wanted.items()
               if n in known and carried.get(n) != c
               and not (n not in carried and c[1] == NEVER_REPORTED)]  # fmt: skip
    changes.extend(ConditionChange(n, None) for n in carried if n not in wanted and n in known)
    return changes


def carried_condition(conditions: Any) -> Carried | None:
    """Ours, of a Node's `status.conditions` as the API gives them (None: absent); the
    texts interned: 10,000 passing nodes hold one message, not 10,000 copies."""
    for c in conditions or ():
        if isinstance(c, dict) and c.get("type") == TYPE:
            return (sys.intern(str(c.get("status", ""))), sys.intern(str(c.get("reason", ""))),
                    sys.intern(str(c.get("message", ""))[:MAX_MESSAGE]))  # fmt: skip
    return None


def with_condition(
    conditions: list[dict[str, Any]] | None, wanted: Carried | None, now: datetime
) -> list[dict[str, Any]] | None:
    """The Node's conditions list with ours set (or removed: `wanted` None); None when it
    already is so. Other conditions are kept as they are; `lastTransitionTime` moves only
    when the status changes."""
    listed = list(conditions or [])
    mine = next((c for c in listed if c.get("type") == TYPE), None)
    if wanted is None:
        return [c for c in listed if c.get("type") != TYPE] if mine is not None else None
    status, reason, text = wanted
    if mine is not None and (mine.get("status"), mine.get("reason"), mine.get("message")) == wanted:
        return None
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    moved = mine is None or mine.get("status") != status
    entry = {
        "type": TYPE,
        "status": status,
        "reason": reason,
        "message": text,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp if moved else (mine or {}).get("lastTransitionTime", stamp),
    }
    if mine is None:
        return [*listed, entry]
    return [entry if c is mine else c for c in listed]


__all__ = [
    "TYPE",
    "Carried",
    "ConditionChange",
    "carried_condition",
    "message",
    "plan_conditions",
    "wanted_conditions",
    "with_condition",
]
