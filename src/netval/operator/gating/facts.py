"""The node verdict's inputs, read off the operator's state at one instant (pure, no I/O).

Per validation: its `spec.gating` (`policy`) and, per targeted node, `NodeFacts`: how fresh
its last report is (`state.validation.heard`: 3 intervals, a beat, the agent's last will,
the operator's own reconnect grace), the report's effective status (its results with the
operator's verdicts folded in: fleet.consistency, topology.agreement, the east-west blame),
its recovery streak, whether it is an observer (its report warns only of failing paths, and
a suspect elsewhere explains all of them -- `ValidationState.observers` -- or it is the
first such report in a row: the next cycle's targeted re-probes carry the witnesses that
tell the culprit), and the decision of the round before. The decision before is the
validation's last verdict; for a node it has none of (the first round of an operator term,
a node newly targeted) it is what the Node carries: our taint or the label `unhealthy` mean
excluded, so a restart keeps a failing node out until it has passed `recoveryReports` times.

With device taints on and possible (`DeviceGate`: the validation asks for them, the operator
may write them and the cluster serves the API), a node whose NICs failed lately gets
`NicFacts`: its failing and recovering NICs, whether something tied to no NIC fails it, and
which of them have no DRA device to taint; its ok streak is then of reports with at most
`maxFailedDevicesPerNode` failing NICs (`state.nic_health.streak_within`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from netval.model.ids import Status
from netval.model.keys import FabricHealth
from netval.model.nics import Nic
from netval.model.spec import NetworkValidationSpec
from netval.operator.gating.verdict import (
    GatingPolicy,
    Heard,
    NicFacts,
    NodeFacts,
    ValidationVerdict,
    decide_validation,
)
from netval.operator.state import validation as vs
from netval.operator.state.nic_health import BEYOND, failing_count, nic_streaks, streak_within
from netval.operator.state.node_verdicts import BLAME, settle_fleet

# what netval has on a Node: (its netval.io/fabric label, our taint present)
NodeFabric = Mapping[str, tuple[str | None, bool]]
_LABELS: Final = {h.value: h for h in FabricHealth}
PATH_GRACE_REPORTS: Final = 2
_PASS: Final = Status.PASS
_SKIP: Final = Status.SKIP


@dataclass(frozen=True, slots=True)
class DeviceGate:
    """Device taints for one validation, possible now: whether a NIC of a node has a DRA
    device to taint (`devices.slices`), and the NICs of each node that carry our taint in
    the cluster (the decision before of an operator's first round: such a NIC recovers
    with `recoveryReports` passing reports as if it had failed before the restart)."""

    taintable: Callable[[str, Nic], bool]
    tainted: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def tainted_nodes(self) -> Collection[str]:
        return self.tainted.keys()


def policy(name: str, spec: NetworkValidationSpec, devices: bool = False) -> GatingPolicy:
    """`devices`: device taints are on and possible for the validation (else
    maxFailedDevicesPerNode does not apply: a failing NIC is the node's, as without it)."""
    g = spec.gating
    return GatingPolicy(
        name=name,
        node_label=g.node_label,
        taint=g.taint,
        max_unhealthy_percent=g.max_unhealthy_percent,
        recovery_reports=g.recovery_reports,
        on_breaker_tripped=g.on_breaker_tripped,
        node_condition=g.node_condition,
        max_failed_devices=g.max_failed_devices_per_node if devices else 0,
        max_device_taints=g.max_device_taints,
    )


def nic_facts(rec: vs.NodeRecord, node: str, gate: DeviceGate) -> NicFacts | None:
    """The node's NICs for device gating; None when none failed lately."""
    memory = rec.nic_failed
    in_cluster = gate.tainted.get(node, frozenset())
    if not memory and not in_cluster:
        return None
    health = rec.nics
    failing = tuple(nic for nic, _ in health.failing) if health is not None else ()
    recovering: list[tuple[str, int]] = []
    untaintable: set[str] = set()
    seen: set[str] = set()
    for nic, streak, identity in nic_streaks(rec):
        seen.add(nic)
        if nic not in failing:
            recovering.append((nic, streak))
        if not gate.taintable(node, identity):
            untaintable.add(nic)
    for nic in sorted(in_cluster - seen):  # tainted before this operator's memory began
        known = health.identity(nic) if health is not None else None
        if known is None or not gate.taintable(node, known):
            continue  # gone from the report or the slices: nothing to hold
        if nic not in failing:
            recovering.append((nic, rec.tally))
    return NicFacts(
        failing=failing if rec.status.is_bad else (),
        node_level=failing_count(rec) == BEYOND,
        recovering=tuple(recovering),
        untaintable=frozenset(untaintable),
    )


def node_facts(
    state: vs.ValidationState,
    node_fabric: NodeFabric,
    now: datetime,
    gate: DeviceGate | None = None,
    budget: int = 0,
) -> dict[str, NodeFacts]:
    """Every targeted node's facts at `now`; `gate` and `budget` (maxFailedDevicesPerNode):
    device taints on and possible."""
    vs.require_aware(now)
    devices = gate if budget >= 1 else None
    if state.fleet.dirty or state.fleet.expires_at is not None:
        settle_fleet(state, now)  # a pending cohort judgement changes report statuses
    before = state.verdict.nodes if state.verdict is not None else {}
    devices_before: Collection[str] = (
        state.verdict.devices
        if state.verdict is not None
        else (devices.tainted_nodes if devices is not None else ())
    )
    # the freshness rule of `state.validation.heard`, inlined: this runs for every targeted
    # node of every validation every status window
    offline, records, window = state.offline, state.nodes, state.stale_after
    heard_at = state.deafness.heard_at
    observers = state.observers
    fresh, silent = Heard.FRESH, Heard.SILENT
    out: dict[str, NodeFacts] = {}
    for node in state.targeted:
        rec = records.get(node)
        decided = before.get(node)
        was_label: FabricHealth | None
        if decided is not None:
            was_excluded, was_label = decided.excluded, decided.label
        else:
            label, tainted = node_fabric.get(node, (None, False))
            was_label = _LABELS.get(label or "")
            was_excluded = tainted or was_label is FabricHealth.UNHEALTHY
        if node in offline:
            heard = Heard.OFFLINE
        elif rec is None:
            out[node] = NodeFacts(Heard.NEVER, None, 0, False, False, was_excluded, was_label)
            continue
        elif rec.unconfirmed or now - heard_at(node, rec.reported_at) > window:
            heard = silent
        else:
            heard = fresh
        if rec is None:
            out[node] = NodeFacts(heard, None, 0, False, False, was_excluded, was_label)
            continue
        # a first report of failing paths is an observer's too: localization needs the
        # next cycle's witnesses (the targeted re-probes) to tell who the culprit is
        observer = (
            rec.path_warn
            and (node in observers or rec.path_warn_streak < PATH_GRACE_REPORTS)
            and all(st is None or st is _PASS or st is _SKIP for st, _ in rec.folded.values())
        )
        if devices is None:
            out[node] = NodeFacts(heard, rec.status, rec.ok_streak, BLAME in rec.folded,
                                  rec.retries is not None, was_excluded, was_label,
                                  observer=observer)  # fmt: skip
            continue
        out[node] = NodeFacts(heard, rec.status, streak_within(rec, budget),
                              BLAME in rec.folded, rec.retries is not None, was_excluded,
                              was_label, nic_facts(rec, node, devices),
                              node in devices_before, observer)  # fmt: skip
    return out


def verdict_of(
    name: str,
    state: vs.ValidationState,
    spec: NetworkValidationSpec,
    node_fabric: NodeFabric,
    now: datetime,
    gate: DeviceGate | None = None,
) -> ValidationVerdict:
    """The validation's verdict at `now` (not recorded: the gating round records it)."""
    gating = policy(name, spec, devices=gate is not None)
    facts = node_facts(state, node_fabric, now, gate, gating.max_failed_devices)
    return decide_validation(gating, facts)


def current_verdict(
    name: str,
    state: vs.ValidationState,
    spec: NetworkValidationSpec | None,
    node_fabric: NodeFabric,
    now: datetime,
    gate: DeviceGate | None = None,
) -> ValidationVerdict | None:
    """The last recorded verdict, else (before the first gating round) one decided now."""
    if state.verdict is not None or spec is None:
        return state.verdict
    return verdict_of(name, state, spec, node_fabric, now, gate)


__all__ = [
    "DeviceGate",
    "NodeFabric",
    "current_verdict",
    "nic_facts",
    "node_facts",
    "policy",
    "verdict_of",
]
