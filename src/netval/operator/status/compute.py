"""The status one write would carry (pure): the aggregated conditions and counts, the
east-west summary of peers-enabled validations (whose suspects blame the nodes that warn of
requester-side retries, `state.node_verdicts.apply_blame`, and whose observers -- nodes
whose failing paths a suspect elsewhere explains -- the verdict does not degrade), what the node verdict makes of
the nodes (`gating.verdict`: the excluded and admissible counts, the Usable and Gating
conditions, `gating.conditions`) and the likely culprit of retries on many nodes
(`status.retries`); within the status size budget (`status.size_budget`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Final, Literal

from netval.model.loadtest import LoadRun
from netval.model.spec import NetworkValidationSpec
from netval.model.status import Condition, ConditionType, NetworkValidationStatus, Reason
from netval.operator.consistency.ingest import apply_changes
from netval.operator.consistency.status import consistency_status
from netval.operator.gating.conditions import gating_condition, usable_condition
from netval.operator.gating.facts import DeviceGate, NodeFabric, verdict_of
from netval.operator.gating.verdict import ValidationVerdict
from netval.operator.state import validation as vs
from netval.operator.state.aggregation import compute_status
from netval.operator.state.east_west_matrix import analyse
from netval.operator.state.node_verdicts import apply_blame
from netval.operator.state.validation import ValidationState
from netval.operator.status.nics import nic_status
from netval.operator.status.retries import retries_summary, with_retries
from netval.operator.status.size_budget import fit_status
from netval.operator.topology.agreement import peer_topology_key
from netval.operator.topology.nodes import fold_into_nodes
from netval.operator.topology.pairs import domain_pairs

EXPLAINED_INTERVALS: Final = 2  # how long a failing pair a suspect explained stays explained


def validation_status(
    state: ValidationState,
    spec: NetworkValidationSpec | None,
    *,
    node_labels: Mapping[str, Mapping[str, str]],
    previous: NetworkValidationStatus | None,
    now: datetime,
    load_run: tuple[str, LoadRun] | None = None,
    verdict: ValidationVerdict | None = None,
    node_fabric: NodeFabric | None = None,
    gate: DeviceGate | None = None,
) -> NetworkValidationStatus:
    """`load_run`: the newest finished NetworkLoadTest run on the validation ("<test>/<run
    id>", run), whose figures join status.topology.domainPairs. `verdict`: the node verdict
    (default: decided now from the state and `node_fabric`, what netval has on the Nodes)."""
    apply_changes(state, now)  # a rollout's `until` passed: its values are Outliers now
    # topology.agreement is judged across nodes and folded into their records first, so it
    # counts in the status like any check
    topology = fold_into_nodes(state, spec, node_labels, now) if spec is not None else None
    summary = None
    state.observers = frozenset()
    if spec is not None and spec.checks.peers.enabled:
        key = peer_topology_key(spec, (node_labels.get(n, {}) for n in state.targeted))
        fresh = {
            n: rec.peer_results
            for n, rec in state.nodes.items()
            if n in state.targeted and vs.is_fresh(state, n, now)
        }
        # every targeted node's domain, so a silent node still counts in its domain
        domains = {n: node_labels.get(n, {}).get(key) for n in state.targeted}
        keep = timedelta(seconds=EXPLAINED_INTERVALS * state.interval_seconds)
        recent = {p: c for p, (c, at) in state.explained.items() if now - at <= keep}
        summary, state.observers, explained = analyse(
            fresh, domains, min_throughput_ratio=spec.checks.peers.min_throughput_ratio,
            recent=recent,
        )  # fmt: skip
        state.explained = {p: state.explained[p] for p in recent}
        state.explained.update((p, (c, now)) for p, c in explained.items())
    else:
        state.explained = {}
    # the east-west suspects that warn of requester-side retries fail rdma.errors (folded
    # before the counts, so they count as failing like any check)
    blamed = {
        s.node: f"{s.failing_peers} of {s.peers} peers fail paths to it ({', '.join(s.checks)})"
        for s in (summary.suspects if summary is not None else ())
    }
    apply_blame(state, blamed, now)
    status = compute_status(state, now, previous=previous)
    if spec is not None:
        fleet = consistency_status(state.fleet, max_named=spec.consistency.max_outliers_per_key)
        status = status.model_copy(update={"consistency": fleet})
    if topology is not None:
        status = status.model_copy(update={"topology": topology})
    if summary is not None:
        status = status.model_copy(update={"east_west": summary})
    if topology is not None and spec is not None:
        load = load_run[1].east_west if load_run is not None else None
        pairs, omitted = domain_pairs(status.east_west, load.cells if load is not None else ())
        key = peer_topology_key(spec, (node_labels.get(n, {}) for n in state.targeted))
        figures = {
            "pairs_key": key if pairs else None,
            "domain_pairs": pairs,
            "omitted_pairs": omitted,
            "load_test": load_run[0] if load_run is not None and load is not None else None,
        }
        status = status.model_copy(update={"topology": topology.model_copy(update=figures)})
    if verdict is None and spec is not None:
        # decided at this `now` from this state, the last recorded verdict as the decision
        # before: what the next gating round records (deciding is idempotent), so the status
        # never lags the reports it counts
        verdict = verdict_of(state.name, state, spec, node_fabric or {}, now, gate)
    if verdict is not None:
        counts = {"excluded": len(verdict.excluded), "admissible": verdict.admissible}
        status = status.model_copy(update={"nodes": status.nodes.model_copy(update=counts)})
    status = with_retries(status, retries_summary(state, now))
    status = status.model_copy(update={"nics": nic_status(state, verdict, now)})
    if spec is not None:
        usable = usable_condition(status.nodes, status.condition(ConditionType.HEALTHY), verdict)
    else:
        usable = ("Unknown", Reason.INVALID_SPEC.value, "no valid spec")
    status = _with_condition(status, ConditionType.USABLE, *usable, state, previous, now)
    if verdict is not None and spec is not None:
        ok, reason, message = gating_condition(verdict)
        if state.gating_hold is not None:  # operator.broker_check: nothing is written
            ok, reason, message = False, Reason.BROKER_ACL_VIOLATED.value, state.gating_hold
        status = _with_condition(
            status, ConditionType.GATING, "True" if ok else "False", reason, message, state,
            previous, now,
        )  # fmt: skip
    return fit_status(status)  # under 64 KiB at any fleet size


def _with_condition(
    status: NetworkValidationStatus,
    kind: ConditionType,
    value: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    state: ValidationState,
    previous: NetworkValidationStatus | None,
    now: datetime,
) -> NetworkValidationStatus:
    """`status` with condition `kind` set (lastTransitionTime kept while its status holds)."""
    before = previous.condition(kind) if previous is not None else None
    condition = Condition(
        type=kind,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=before.last_transition_time
        if before is not None and before.status == value
        else now,
        observed_generation=state.generation,
    )
    others = [c for c in status.conditions if c.type != kind]
    return status.model_copy(update={"conditions": [*others, condition]})
