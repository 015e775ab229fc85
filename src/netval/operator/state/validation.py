"""One NetworkValidation in memory (`ValidationState`) and how agent reports change it.

Pure and in memory: no I/O, no Kopf, no asyncio, no clock. Every function that depends on
time takes ``now`` (timezone-aware) explicitly, so the operator, tests and benchmarks drive
time themselves. The operator owns one `ValidationState` per NetworkValidation, feeds it
reports and online/offline state from MQTT and the targeted node set from its Node watch,
and calls `compute_status` (`netval.operator.state.aggregation`) once per write window.

Semantics (the contract the operator and the tests rely on):

- Freshness. A node is *fresh* when its latest accepted report was received within
  ``STALE_AFTER_INTERVALS`` (3) intervals (age <= 3 x interval) and its retained state is not
  ``offline``; ``offline`` makes it stale at once. A beat whose digest matches the stored
  report counts as that report received again (`netval.operator.state.beats`); one that does
  not match makes the stored report *unconfirmed*: stale until the node's next report. The time is the operator's receive time,
  not the agent's clock; for a *retained* message (replayed by the broker after the operator
  (re)subscribes, so its receive time says nothing) it is the report's own end time
  (startedAt + durationMs, capped at now), so a long-dead node does not look fresh after an
  operator restart.
- Ordering. A report older than the node's stored one (lower generation: STALE_GENERATION;
  same generation, earlier startedAt: OUT_OF_ORDER) is ignored while the stored one is still
  fresh; once the stored report is stale, any newer-received report replaces it (so an agent
  whose clock stepped back, or a CR deleted and recreated with generation 1, recovers within
  3 intervals). A report with the stored generation and startedAt is a DUPLICATE (QoS 1
  redelivery, retained replay on reconnect) and changes nothing, freshness included.
- Generations. Reports of a generation older than the CR's are accepted until some node
  reports the CR's generation (the agents roll out one by one), then ignored
  (STALE_GENERATION). Stored older-generation reports keep counting until their node
  reports the new generation or goes stale; the Ready message says how many nodes are still
  on an older generation. A report *newer* than the CR's generation (the operator has not
  seen the CR update yet, or a retained report of a deleted incarnation) is accepted.
- Targeting. A report of a node outside ``targeted`` is stored (NOT_TARGETED) but counted
  nowhere; it counts as soon as the node becomes targeted. A targeted node that never
  reported is *awaiting* for 3 intervals after it became targeted (or after the agents became
  ready, whichever is later), then stale. ``nodes.stale`` is ``targeted - reporting``
  (awaiting nodes included); the Ready condition tells awaiting and stale apart.
- Node status is the worst of the report's ``status`` and its results (a report that claims
  less than its results is not trusted). error counts as failing, skip-only as passing.
- ``checks`` counts *nodes* per check id: each fresh targeted node contributes once per
  check, at the worst status of that check's results (error as fail; skip-only checks are
  not counted). ``failures`` lists fail/error results of fresh targeted nodes, ordered by
  (since, node, check, subject) so the longest-standing failures come first and the order
  is stable, capped at 50; messages are truncated to keep the status small.
- ``since`` is the time the (node, check, subject) failure was first seen in an accepted
  report; kept while it keeps failing (fail <-> error included), dropped when it passes or
  disappears. `restore_since` seeds it from a previous status after an operator restart.
- Healthy is about fresh reports only: False/ChecksFailing when a fresh targeted node fails;
  Unknown when no targeted node has a fresh report (AwaitingReports if none ever reported,
  NodesStale if all are stale, NoTargetedNodes); True/AllChecksPassing otherwise, with stale
  nodes and warnings mentioned in the message (staleness is Ready's business).
- ``dirty`` is set by every mutation that can change the status; the status writer clears
  it after a successful patch. Time alone also changes the status (nodes turn stale):
  `next_deadline` says when to recompute next.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from netval.model.beat import report_digest
from netval.model.ids import CheckGroup, Status, worst
from netval.model.nics import Nic
from netval.model.results import CheckResult, Report
from netval.model.status import NetworkValidationStatus
from netval.operator.consistency.fingerprint import Fleet
from netval.operator.consistency.fingerprint import forget as fleet_forget
from netval.operator.consistency.fingerprint import touch as fleet_touch
from netval.operator.consistency.fold import NodeVerdict
from netval.operator.gating.verdict import Heard, ValidationVerdict
from netval.operator.state import nic_health
from netval.operator.state.hearing import Deafness
from netval.operator.state.nic_health import NicHealth
from netval.operator.state.node_verdicts import CHECK_BUCKET as _BUCKET
from netval.operator.state.node_verdicts import (
    apply_fleet_verdict,
    carry_blame,
    shared_buckets,
)
from netval.operator.state.node_verdicts import truncate_failure as _truncate
from netval.operator.state.retries import RetryNote, retry_note
from netval.operator.topology.agreement import NetdevView, netdev_views
from netval.operator.topology.routed import RouteView, route_view

if TYPE_CHECKING:
    from netval.operator.state.beats import BeatAhead

STALE_AFTER_INTERVALS: Final = 3

# (since, node, check, subject, message): sorts as the failures list is ordered.
FailureKey = tuple[datetime, str, str, str, str]


class IngestResult(StrEnum):
    ACCEPTED = "accepted"
    NOT_TARGETED = "not_targeted"  # stored (counts once the node is targeted), not counted now
    DUPLICATE = "duplicate"  # same generation and startedAt as the stored report
    STALE_GENERATION = "stale_generation"  # older than the node's or the rolled-out generation
    OUT_OF_ORDER = "out_of_order"  # same generation, older startedAt than the stored report
    WRONG_VALIDATION = "wrong_validation"  # report.validation is not this validation

    @property
    def stored(self) -> bool:
        return self in (IngestResult.ACCEPTED, IngestResult.NOT_TARGETED)


@dataclass(slots=True)
class NodeRecord:
    """A node's latest accepted report, pre-digested so `compute_status` is cheap."""

    # Only what later decisions read: holding the whole Report would cost ~60 KiB and ~150
    # GC-tracked objects per node (600 MiB and long collector pauses at 10,000 nodes).
    generation: int
    started_at: datetime
    reported_at: datetime
    peer_results: tuple[
        CheckResult, ...
    ]  # peer.* only, for the east-west matrix  # receive time (retained: the report's end time, capped at now)
    status: Status  # effective node status
    check_buckets: tuple[tuple[str, int], ...]  # (check id, 0 pass | 1 warn | 2 fail)
    failures: tuple[FailureKey, ...]  # sorted
    failing_checks: tuple[str, ...]  # sorted, unique
    failing_since: dict[tuple[str, str], datetime]  # (check, subject) -> first seen failing
    ok_streak: int  # consecutive accepted reports without fail/error (for taint recovery)
    # its report warns only because of failing path (peer.*) results: an observer when a
    # suspect elsewhere explains them (`ValidationState.observers`)
    path_warn: bool = False
    path_warn_streak: int = 0  # reports in a row with path_warn
    # the report's LLDP section (spec.topology.lldp) as plain tuples, judged against the
    # node labels at status time (netval.operator.topology)
    topology: tuple[NetdevView, ...] | None = None
    # its L3 path (next hops, spines on cross-leaf paths), for publication (topology.routed)
    routes: RouteView | None = None
    node_name: str = ""
    # topology.agreement as last judged: (netdev, status, message), carried to the next report
    topology_verdicts: tuple[tuple[str, Status, str], ...] = ()
    # Verdicts the operator judges across nodes (fleet.consistency, topology.agreement) are
    # folded in on top of the report's own values (`own`: status, buckets, failures, failing
    # checks), one entry per check id: (status or None, failures). `fold_verdict` recomputes
    # from both, so each check's fold is idempotent and never undoes another's.
    own: (
        tuple[Status, tuple[tuple[str, int], ...], tuple[FailureKey, ...], tuple[str, ...]] | None
    ) = None
    folded: dict[str, tuple[Status | None, tuple[FailureKey, ...]]] = field(default_factory=dict)
    # beats (issue 23): the report's material digest (netval.model.beat.report_digest), the
    # newest beat counted for it, and whether a beat contradicted it (then it is not fresh)
    digest: str = ""
    beat_seq: int = -1
    unconfirmed: bool = False
    # its rdma.errors warning of requester-side retries (netval.model.attribution), if any
    retries: RetryNote | None = None
    # per-NIC health (state.nic_health): the last report's NICs (None: no `nics` section),
    # reports and matching beats counted, the tally at which it last had more than j failing
    # NICs, and the NICs that failed lately: (tally then, identity)
    nics: NicHealth | None = None
    tally: int = 0
    over_at: tuple[int, ...] = ()
    nic_failed: dict[str, tuple[int, Nic]] | None = None


@dataclass(slots=True)
class ValidationState:
    """Everything the operator knows about one NetworkValidation, in memory."""

    name: str
    generation: int = 0  # the CR's metadata.generation
    interval_seconds: float = 30.0
    targeted: set[str] = field(default_factory=set)  # use set_targeted (records join times)
    agents_ready: bool = False  # use set_agents_ready
    agents_detail: str = ""  # e.g. "3/4 agent pods ready", shown while agents are pending
    agent_pods: str = ""  # use set_agent_pods: the DaemonSet's view when reports are missing
    spec_error: str | None = None  # set when the spec is invalid: Ready=False InvalidSpec
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    offline: dict[str, datetime] = field(default_factory=dict)  # node -> since
    targeted_since: dict[str, datetime] = field(default_factory=dict)
    agents_ready_since: datetime | None = None
    newest_generation: int = -1  # newest generation reported by any node
    since_hints: dict[str, dict[tuple[str, str], datetime]] = field(default_factory=dict)
    dirty: bool = True
    # fleet consistency (issue 22): fingerprints, cohorts, and each node's verdict
    fleet: Fleet = field(default_factory=Fleet)
    fleet_verdicts: dict[str, NodeVerdict] = field(default_factory=dict)
    # node -> its newest beat that matched no stored report (netval.operator.state.beats)
    beats_ahead: dict[str, BeatAhead] = field(default_factory=dict)

    # When the operator's own broker sessions came back (`state.hearing`; one object shared
    # by the store's validations): a node not heard since gets a grace.
    deafness: Deafness = field(default_factory=Deafness)
    # the node verdict of the last gating round (netval.operator.gating.verdict): what every
    # consumer reads, and the decision before of the next round
    verdict: ValidationVerdict | None = None
    # device taints (gating.deviceTaints): None off, "" in force, else why not (the status)
    devices_note: str | None = None
    # the nodes whose failing paths all point at a suspect elsewhere, as of the last status
    # computed (`state.east_west_matrix.analyse`): their path results make them no worse
    observers: frozenset[str] = frozenset()
    # failing node pairs a suspect explained (-> the suspect node, None for a link) and when
    # last, kept 2 intervals: a fault's last failing results outlive its suspect by a cycle
    explained: dict[tuple[str, str], tuple[str | None, datetime]] = field(default_factory=dict)
    # gating held (the broker ACL check found a violation): the Gating condition's message
    gating_hold: str | None = None

    @property
    def stale_after(self) -> timedelta:
        return timedelta(seconds=STALE_AFTER_INTERVALS * self.interval_seconds)

    def last_heard(self, node: str, reported_at: datetime) -> datetime:
        """What staleness is measured from: the last report, or, for a node not heard since
        the operator's session on its shard came back, that instant plus the agents'
        backoff ceiling (`state.hearing`)."""
        return self.deafness.heard_at(node, reported_at)


# -- mutations --------------------------------------------------------------------------


def set_spec(
    state: ValidationState,
    *,
    generation: int,
    interval_seconds: float,
    spec_error: str | None = None,
) -> None:
    """The CR was created, changed or resumed."""
    if (state.generation, state.interval_seconds, state.spec_error) != (
        generation,
        interval_seconds,
        spec_error,
    ):
        state.generation = generation
        state.interval_seconds = interval_seconds
        state.spec_error = spec_error
        state.dirty = True


def set_targeted(state: ValidationState, nodes: Iterable[str], now: datetime) -> None:
    """The nodes that match the nodeSelector (from the operator's Node watch)."""
    require_aware(now)
    new = set(nodes)
    if new == state.targeted:
        return
    for node in new - state.targeted:
        state.targeted_since[node] = now
        fleet_touch(state.fleet, node)
    for node in state.targeted - new:
        state.targeted_since.pop(node, None)
        fleet_touch(state.fleet, node)
    state.targeted = new
    state.dirty = True


def set_node_targeted(state: ValidationState, node: str, targeted: bool, now: datetime) -> None:
    """One node entered or left the selector (a Node event): O(1) instead of a full rescan."""
    require_aware(now)
    if targeted == (node in state.targeted):
        return
    fleet_touch(state.fleet, node)
    if targeted:
        state.targeted.add(node)
        state.targeted_since[node] = now
    else:
        state.targeted.discard(node)
        state.targeted_since.pop(node, None)
    state.dirty = True


def set_agents_ready(
    state: ValidationState, ready: bool, now: datetime, *, detail: str = ""
) -> None:
    """Whether the agent DaemonSet exists and has rolled out (detail: shown while pending)."""
    require_aware(now)
    if ready and not state.agents_ready:
        state.agents_ready_since = now
    if (ready, detail) != (state.agents_ready, state.agents_detail):
        state.agents_ready = ready
        state.agents_detail = detail
        state.dirty = True


def agent_pods_detail(*, desired: int, ready: int, targeted: int) -> str:
    """What the agent DaemonSet's status adds to "a node has not reported": "" when every
    targeted node has a ready agent pod, so nothing is to be learnt from it."""
    if desired < targeted:
        # DaemonSet pods skip nodes whose taints they do not tolerate: the usual cause.
        return (
            f"agent pods ready on {ready} nodes; the agent DaemonSet runs on {desired} of the"
            f" {targeted} targeted nodes (taints the agents do not tolerate?)"
        )
    if ready < desired:
        return f"{ready} of {desired} agent pods ready"
    return ""


def set_agent_pods(state: ValidationState, detail: str) -> None:
    if detail != state.agent_pods:
        state.agent_pods = detail
        state.dirty = True


def ingest_report(
    state: ValidationState, report: Report, now: datetime, *, retained: bool = False
) -> IngestResult:
    """Fold one validated report in. ``retained``: the MQTT message had the retain flag
    (a replay on subscribe, not a live publish); see the module docstring."""
    require_aware(now)
    if report.validation != state.name:
        return IngestResult.WRONG_VALIDATION
    node = report.node
    started = _aware(report.started_at)
    stored = state.nodes.get(node)
    if stored is not None:
        old_gen, old_started = stored.generation, stored.started_at
        if report.generation == old_gen and started == old_started:
            return IngestResult.DUPLICATE
        if now - stored.reported_at <= state.stale_after:
            if report.generation < old_gen:
                return IngestResult.STALE_GENERATION
            if report.generation == old_gen and started < old_started:
                return IngestResult.OUT_OF_ORDER
    if report.generation < state.generation <= state.newest_generation:
        return IngestResult.STALE_GENERATION

    if retained:
        reported_at = min(now, end_time(report))
    else:
        reported_at = now
        state.offline.pop(node, None)  # a live report: the agent is evidently running
    hints = state.since_hints.pop(node, None)
    rec = state.nodes[node] = _digest(report, reported_at, stored, hints)
    if state.beats_ahead:
        from netval.operator.state.beats import apply_beat_ahead  # it imports this module

        apply_beat_ahead(state, rec)
    verdict = state.fleet_verdicts.get(node)
    if verdict is not None:
        apply_fleet_verdict(rec, node, verdict, stored.failing_since if stored else {}, reported_at)
    state.newest_generation = max(state.newest_generation, report.generation)
    if node not in state.targeted:
        return IngestResult.NOT_TARGETED
    state.dirty = True
    return IngestResult.ACCEPTED


def end_time(report: Report) -> datetime:
    """startedAt + durationMs, timezone-aware. The model bounds both; past them (a model
    built without the decoder's clock) the latest representable time stands in, which
    `min(now, ...)` turns into now."""
    try:
        return _aware(report.started_at) + timedelta(milliseconds=report.duration_ms)
    except (OverflowError, ValueError):
        return datetime.max.replace(tzinfo=UTC)


def node_online(state: ValidationState, node: str, now: datetime) -> None:
    """Retained ``online`` state: the agent is connected (freshness still needs reports)."""
    require_aware(now)
    if state.offline.pop(node, None) is not None and node in state.targeted:
        state.dirty = True


def node_offline(state: ValidationState, node: str, now: datetime) -> None:
    """Retained ``offline`` state (the agent's last will): the node is stale at once."""
    require_aware(now)
    if node not in state.offline:
        state.offline[node] = now
        if node in state.targeted:
            state.dirty = True


def forget_node(state: ValidationState, node: str) -> None:
    """The Node was deleted: drop everything about it."""
    known = node in state.nodes or node in state.targeted or node in state.offline
    state.nodes.pop(node, None)
    state.offline.pop(node, None)
    state.targeted.discard(node)
    state.targeted_since.pop(node, None)
    state.since_hints.pop(node, None)
    state.beats_ahead.pop(node, None)
    fleet_forget(state.fleet, node)
    state.fleet_verdicts.pop(node, None)
    if known:
        state.dirty = True


def restore_since(state: ValidationState, previous: NetworkValidationStatus) -> None:
    """After an operator restart: keep the ``since`` of failures listed in the last written
    status (only those; the list is capped) when the node's first report still fails them."""
    for f in previous.failures:
        state.since_hints.setdefault(f.node, {})[(f.check, f.subject)] = _aware(f.since)


# -- queries ----------------------------------------------------------------------------


def heard(state: ValidationState, node: str, now: datetime) -> Heard:
    """How fresh the node's last report is: the one freshness rule every reader uses."""
    if node in state.offline:
        return Heard.OFFLINE
    rec = state.nodes.get(node)
    if rec is None:
        return Heard.NEVER
    if rec.unconfirmed or now - state.last_heard(node, rec.reported_at) > state.stale_after:
        return Heard.SILENT
    return Heard.FRESH


def is_fresh(state: ValidationState, node: str, now: datetime) -> bool:
    return heard(state, node, now) is Heard.FRESH


def next_deadline(state: ValidationState, now: datetime) -> datetime | None:
    """The earliest future time at which time alone changes the status (a fresh node turns
    stale, an awaiting node's grace ends); None when nothing is pending."""
    require_aware(now)
    window = state.stale_after
    best: datetime | None = None
    for node in state.targeted:
        if node in state.offline:
            continue
        rec = state.nodes.get(node)
        if rec is not None and rec.unconfirmed:
            continue  # stale already, until its next report
        start = (
            state.last_heard(node, rec.reported_at) if rec is not None else grace_start(state, node)
        )
        at = start + window
        if at >= now and (best is None or at < best):
            best = at
    expiry = state.fleet.expires_at  # a rollout's end turns its values into Outliers
    if expiry is not None and expiry >= now and (best is None or expiry < best):
        best = expiry
    return best + timedelta(microseconds=1) if best is not None else None


# -- internals --------------------------------------------------------------------------


def _digest(
    report: Report,
    reported_at: datetime,
    previous: NodeRecord | None,
    hints: dict[tuple[str, str], datetime] | None,
) -> NodeRecord:
    old_since = previous.failing_since if previous is not None else {}
    buckets: dict[str, int] = {}
    bad: dict[tuple[str, str], str] = {}
    for r in report.results:
        bucket = _BUCKET.get(r.status)
        if bucket is None:  # skip
            continue
        check = r.check.value
        if bucket > buckets.get(check, -1):
            buckets[check] = bucket
        if bucket == 2:
            bad.setdefault((check, r.subject), r.message)
    since: dict[tuple[str, str], datetime] = {}
    for key in bad:
        first = old_since.get(key)
        if first is None and hints is not None:
            hint = hints.get(key)
            first = hint if hint is not None and hint <= reported_at else None
        since[key] = first if first is not None else reported_at
    node = report.node
    failures = tuple(
        sorted(
            (since[key], node, key[0], key[1], _truncate(message)) for key, message in bad.items()
        )
    )
    # A failing peer.* result is about a path, and the prober is rarely the culprit: one lossy
    # node makes every node that probes it fail peer.loss. Path results can make a node
    # degraded, never unhealthy (no taint on a victim); status.eastWest names the suspect.
    local = worst(r.status for r in report.results if r.check.group is not CheckGroup.PEER)
    paths = worst(r.status for r in report.results if r.check.group is CheckGroup.PEER)
    status = worst((local, Status.WARN if paths.is_bad else paths))
    path_warn = paths.is_bad and not (local.is_bad or local is Status.WARN)
    ok = not status.is_bad
    rec = NodeRecord(
        generation=report.generation,
        started_at=_aware(report.started_at),
        peer_results=tuple(r for r in report.results if r.check.group is CheckGroup.PEER),
        reported_at=reported_at,
        status=status,
        check_buckets=shared_buckets(tuple(buckets.items())),
        failures=failures,
        failing_checks=tuple(sorted({check for check, _ in bad})),
        failing_since=since,
        ok_streak=(previous.ok_streak + 1 if previous is not None else 1) if ok else 0,
        path_warn=path_warn,
        path_warn_streak=(previous.path_warn_streak + 1 if previous is not None else 1)
        if path_warn
        else 0,
        topology=netdev_views(report.topology) if report.topology is not None else None,
        routes=route_view(report.topology) if report.topology is not None else None,
        node_name=node,
        digest=report_digest(report),
    )
    rec.retries = retry_note(report.results, previous.retries if previous else None, reported_at)
    from netval.operator.topology.nodes import carry_over  # it imports this module

    carry_over(rec, previous)
    carry_blame(rec, previous)
    nic_health.digest(rec, report, previous)
    return rec


def grace_start(state: ValidationState, node: str) -> datetime:
    start = state.targeted_since.get(node)
    ready = state.agents_ready_since
    if start is None:
        return ready if ready is not None else datetime.min.replace(tzinfo=UTC)
    return max(start, ready) if ready is not None else start


def require_aware(now: datetime) -> None:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
