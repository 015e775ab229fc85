"""Everything the operator knows, in memory: validations (state, spec, last written status),
Nodes (labels, what netval has on them) and reports that arrived before their validation.

Kopf handlers tell the store what exists (validations, their specs, Nodes and labels); MQTT
tells it what agents report. No I/O: the status writer and node gating read it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from netval.model.keys import LabelKey
from netval.model.loadtest import LoadRun
from netval.model.results import Report
from netval.model.spec import AdmissionMode, AdmissionPolicy, NetworkValidationSpec
from netval.model.status import ConditionType, NetworkValidationStatus
from netval.operator.consistency.ingest import configure_spec, fold_report
from netval.operator.gating.decisions import has_fabric_taint
from netval.operator.gating.facts import current_verdict
from netval.operator.gating.verdict import NodeDecision
from netval.operator.ingest.decode import BeatMessage, StateChange
from netval.operator.state import validation as vs
from netval.operator.state.beats import BeatOutcome, ingest_beat
from netval.operator.state.hearing import Deafness
from netval.operator.state.node_labels import kept_labels, referenced_keys
from netval.operator.state.validation import IngestResult, ValidationState

# Reports and states parked for validations not known yet (a restart's replay arrives before
# Kopf resumes the CRs): one entry per (validation, node), at most this many; beyond, new
# keys are dropped and counted (`dropped`), so a flood for made-up validation names cannot
# grow the operator without bound.
PENDING_LIMIT: Final = 100_000
OFFLINE_PENDING_LIMIT: Final = 100_000
# ... and at most this many bytes of parked reports (their JSON size): a report may be up to
# 1 MiB, so the count alone would allow 100 GB. A report dropped here is not lost for long:
# its agent publishes the next one every interval.
PENDING_BYTES: Final = 64 << 20
# Parked messages of a validation still unknown this long after they arrived, once every
# validation that existed at start is loaded, are of one deleted while no operator ran: they
# are forgotten and their retained topics cleared (else the broker replays them forever).
UNKNOWN_GRACE_SECONDS: Final = 600.0
# After a validation is deleted, messages for it are its agents' last words (a clean stop
# publishes a retained `offline`, a report may be in flight): for this long they are cleared
# from the broker instead of parked. A validation created again under the name ends it.
TOMBSTONE_SECONDS: Final = 600.0
MAX_TOMBSTONES: Final = 10_000


def utcnow() -> datetime:
    return datetime.now(UTC)


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@dataclass(frozen=True, slots=True)
class ValidationView:
    name: str
    healthy: bool  # the Healthy condition is True
    healthy_message: str
    admission: AdmissionMode
    # the node verdict of every targeted node (netval.operator.gating.verdict); empty for a
    # validation judged from its object (a standby replica)
    decisions: Mapping[str, NodeDecision]
    failures: tuple[tuple[str, str], ...]  # (node, check), worst first, at most 50
    policy: AdmissionPolicy  # what admission waits for (netval.operator.gating.capacity)
    usable: bool  # the Usable condition is True
    usable_message: str
    healthy_nodes: int  # fresh passing or warning nodes no exclusion holds (the verdict's)
    # targeted nodes whose exclusion (label unhealthy, taint) is decided, not written yet
    pending_exclusions: int = 0
    excluded: frozenset[str] = field(default_factory=frozenset)

    @property
    def unhealthy_nodes(self) -> list[str]:
        """The nodes admission excludes, sorted."""
        return sorted(self.excluded)


@dataclass(slots=True)
class _Pending:
    report: Report
    retained: bool
    received_at: datetime  # folded as if at this time, not at the takeover
    size: int = 0  # bytes, against PENDING_BYTES
    parked_at: datetime | None = None  # when it arrived here (the grace counts from it)


@dataclass(frozen=True, slots=True)
class ReplayGap:
    """Targeted nodes of a validation without a retained report after a (re)subscribe:
    the broker lost or dropped them, or the nodes never reported (a fresh install)."""

    validation: str
    replay: int  # which replay (Store.replays)
    targeted: int
    missing: tuple[str, ...]  # sorted
    # of those, nodes known to have reported (in memory from before the replay): the
    # broker must have retained their last report, so it lost or dropped it
    lost: tuple[str, ...]
    replayed: int  # targeted nodes whose report came back
    # the nodes the last written status counted as reporting (after an operator restart)
    expected: int | None

    @property
    def suspicious(self) -> bool:
        """The broker did not replay what it should hold (not just nodes that never
        reported)."""
        return bool(self.lost) or (self.expected is not None and self.replayed < self.expected)


class Store:
    def __init__(
        self,
        on_targets_changed: Callable[[], None] = lambda: None,
        *,
        label_keys: Iterable[str] = (),
        on_label_keys_added: Callable[[], None] = lambda: None,
        shards: int = 1,
    ) -> None:
        # called when a validation's spec or targeted nodes may have changed
        self.on_targets_changed = on_targets_changed
        # called when a validation references label keys not kept so far (`label_keys_missing`)
        self.on_label_keys_added = on_label_keys_added
        # the label keys kept of each Node (`state.node_labels`), and those a validation
        # referenced since the Nodes were last listed (filled by `fill_labels`)
        # (`label_keys`: kept from the start, as if a validation referenced them)
        self.label_keys: frozenset[str] = referenced_keys(()) | frozenset(label_keys)
        self.label_keys_missing: set[str] = set()
        self.states: dict[str, ValidationState] = {}
        self.selectors: dict[str, dict[str, str]] = {}
        self.specs: dict[str, NetworkValidationSpec] = {}
        # the object Events are about: {apiVersion, kind, metadata: {name, uid}}
        self.bodies: dict[str, Mapping[str, Any]] = {}
        self.previous: dict[str, NetworkValidationStatus] = {}  # the status last written
        # validation -> the newest finished NetworkLoadTest run on it ("<test>/<run id>", run),
        # for status.topology.domainPairs (`note_load_run`)
        self.load_runs: dict[str, tuple[str, LoadRun]] = {}
        self.node_labels: dict[str, dict[str, str]] = {}
        # what netval has on each node: (netval.io/fabric label, our taint present)
        self.node_fabric: dict[str, tuple[str | None, bool]] = {}
        # Validations that existed at start: gating waits until all are loaded, so that a
        # half-loaded operator never strips labels or taints that another validation owns.
        self.expected_validations: set[str] | None = None
        # Reports for validations the operator has not seen yet (retained messages can
        # arrive before Kopf resumes the CRs after a restart).
        self.pending: dict[tuple[str, str], _Pending] = {}
        self.offline_pending: dict[tuple[str, str], tuple[bool, datetime]] = {}
        # the newest beat per node of a validation not known yet: (beat, retained, received)
        self.beats_pending: dict[tuple[str, str], tuple[BeatMessage, bool, datetime]] = {}
        self.dropped: dict[str, int] = {"pending": 0, "offline_pending": 0, "beats_pending": 0}
        self.pending_bytes = 0
        # the (validation, node) keys of the last retained replay, and its number
        # (retained reports handled since, late ones included, join it)
        self.replayed: set[tuple[str, str]] = set()
        self.replays = 0
        self.replayed_at: datetime | None = None
        self.deleted: dict[str, datetime] = {}  # validation -> when it was deleted
        # when the operator's broker sessions came back, per shard (shared by every state)
        self.deafness = Deafness(shards)
        # the nodes whose exclusion is queued for a Node write, not written yet (the node
        # writer's queue sets it: `gating.write_queue.NodeWriteQueue.pending_exclusions`)
        self.exclusions_pending: Callable[[], Collection[str]] = frozenset

    # -- what MQTT tells us -----------------------------------------------------------------

    def ingest_report(self, report: Report, retained: bool) -> IngestResult | None:
        """None: kept pending until the validation is known."""
        if retained:
            # a retained report handled after the replay was declared over (its quiet
            # period ran out on a loaded machine) came back late, it was not lost
            self.replayed.add((report.validation, report.node))
        state = self.states.get(report.validation)
        if state is None:
            key = (report.validation, report.node)
            size = len(report.model_dump_json())  # only for unknown validations: rare
            old = self.pending.get(key)
            freed = old.size if old is not None else 0
            if (
                old is not None or len(self.pending) < PENDING_LIMIT
            ) and self.pending_bytes - freed + size <= PENDING_BYTES:
                now = utcnow()
                self.pending[key] = _Pending(report, retained, now, size, now)
                self.pending_bytes += size - freed
            else:
                self.dropped["pending"] += 1
            return None
        now = utcnow()
        result = vs.ingest_report(state, report, now, retained=retained)
        if result.stored:
            fold_report(state, report, self.specs.get(report.validation), self.node_labels, now)
        return result

    def ingest_beat(self, message: BeatMessage, retained: bool) -> BeatOutcome:
        """A beat (`netval.operator.state.beats`); parked like a report while its validation
        is unknown (a restart's replay comes before Kopf resumes the CRs)."""
        state = self.states.get(message.validation)
        key = (message.validation, message.node)
        if state is None:
            if key in self.beats_pending or len(self.beats_pending) < PENDING_LIMIT:
                self.beats_pending[key] = (message, retained, utcnow())
            else:
                self.dropped["beats_pending"] += 1
            return BeatOutcome.PARKED
        return ingest_beat(state, message.node, message.beat, utcnow(), retained=retained)

    def on_state(self, change: StateChange) -> None:
        state = self.states.get(change.validation)
        if state is None:
            key = (change.validation, change.node)
            if key in self.offline_pending or len(self.offline_pending) < OFFLINE_PENDING_LIMIT:
                self.offline_pending[key] = (change.online, utcnow())
            else:
                self.dropped["offline_pending"] += 1
            return
        if change.online:
            vs.node_online(state, change.node, utcnow())
        else:
            vs.node_offline(state, change.node, utcnow())

    # -- what Kopf tells us -----------------------------------------------------------------

    def upsert_validation(
        self,
        name: str,
        *,
        generation: int,
        spec: NetworkValidationSpec,
        body: Mapping[str, Any],
        status: Mapping[str, Any] | None,
    ) -> ValidationState:
        now = utcnow()
        state = self.states.get(name)
        if state is None:
            state = ValidationState(name=name, deafness=self.deafness)
            self.states[name] = state
            previous = NetworkValidationStatus.from_api(status)
            if previous is not None:
                self.previous[name] = previous
                vs.restore_since(state, previous)
        vs.set_spec(state, generation=generation, interval_seconds=spec.interval_seconds)
        self.selectors[name] = dict(spec.node_selector)
        self.specs[name] = spec
        self.bodies[name] = body
        self._note_label_keys()
        self._retarget(name, now)
        configure_spec(state, spec, now)
        # Parked reports count from when they arrived (a live one) or from their own end
        # time (a retained one, see `ingest_report`), never from now: a node silent since
        # before a failover must turn stale on time.
        for key in [k for k in self.pending if k[0] == name]:
            pending = self._unpark(key)
            result = vs.ingest_report(
                state, pending.report, pending.received_at, retained=pending.retained
            )
            if result.stored:
                fold_report(state, pending.report, spec, self.node_labels, now)
        for key in [k for k in self.offline_pending if k[0] == name]:
            online, at = self.offline_pending.pop(key)
            (vs.node_online if online else vs.node_offline)(state, key[1], at)
        for key in [k for k in self.beats_pending if k[0] == name]:
            message, retained, at = self.beats_pending.pop(key)
            ingest_beat(state, key[1], message.beat, at, retained=retained)
        self.on_targets_changed()
        return state

    def invalid_spec(
        self, name: str, *, generation: int, message: str, body: Mapping[str, Any]
    ) -> None:
        state = self.states.setdefault(name, ValidationState(name=name, deafness=self.deafness))
        interval = state.interval_seconds
        vs.set_spec(state, generation=generation, interval_seconds=interval, spec_error=message)
        self.bodies[name] = body

    def agents_applied(self, name: str) -> None:
        state = self.states.get(name)
        if state is not None:
            vs.set_agents_ready(state, True, utcnow())

    def note_load_run(self, validation: str, test: str, run: LoadRun) -> None:
        """A NetworkLoadTest run on `validation` finished: its figures go to the validation's
        status.topology.domainPairs (the newest finished run of any test wins). The hook for
        the NetworkLoadTest handlers, which call it when they write a finished `lastRun`."""
        if run.finished_at is None or run.east_west is None:
            return
        have = self.load_runs.get(validation)
        if have is None or have[1].finished_at is None or have[1].finished_at <= run.finished_at:
            self.load_runs[validation] = (f"{test}/{run.id}", run)

    def remove_validation(self, name: str) -> set[str]:
        """Forget the validation and everything parked for it; returns the nodes it knew
        (reported, targeted, offline or parked), whose retained topics may be cleared."""
        if self.expected_validations is not None:
            self.expected_validations.discard(name)
        state = self.states.get(name)
        nodes: set[str] = set()
        if state is not None:
            nodes |= set(state.nodes) | state.targeted | set(state.offline)
        for key in [k for k in self.pending if k[0] == name]:
            nodes.add(key[1])
            self._unpark(key)
        for key in [k for k in self.offline_pending if k[0] == name]:
            nodes.add(key[1])
            del self.offline_pending[key]
        for key in [k for k in self.beats_pending if k[0] == name]:
            nodes.add(key[1])
            del self.beats_pending[key]
        tables = (self.states, self.selectors, self.specs, self.bodies, self.previous)
        for table in (*tables, self.load_runs):
            table.pop(name, None)
        self.deleted[name] = utcnow()
        while len(self.deleted) > MAX_TOMBSTONES:
            del self.deleted[next(iter(self.deleted))]
        self.on_targets_changed()
        return nodes

    def _unpark(self, key: tuple[str, str]) -> _Pending:
        pending = self.pending.pop(key)
        self.pending_bytes -= pending.size
        return pending

    def take_unknown(self, now: datetime, grace: float | None = None) -> dict[str, set[str]]:
        """validation -> nodes whose parked messages have waited `grace` seconds (default
        UNKNOWN_GRACE_SECONDS) for a validation that did not come although every one that
        existed at start is loaded: forgotten here; the caller clears their retained topics."""
        grace = UNKNOWN_GRACE_SECONDS if grace is None else grace
        expected = self.expected_validations
        if expected is None or not expected <= set(self.states):
            return {}
        out: dict[str, set[str]] = {}
        for key, pending in list(self.pending.items()):
            at = pending.parked_at or pending.received_at
            if key[0] not in self.states and (now - at).total_seconds() >= grace:
                out.setdefault(key[0], set()).add(key[1])
                self._unpark(key)
        for key, (_, at) in list(self.offline_pending.items()):
            if key[0] not in self.states and (now - at).total_seconds() >= grace:
                out.setdefault(key[0], set()).add(key[1])
                del self.offline_pending[key]
        for key, (_, _, at) in list(self.beats_pending.items()):
            if key[0] not in self.states and (now - at).total_seconds() >= grace:
                out.setdefault(key[0], set()).add(key[1])
                del self.beats_pending[key]
        return out

    def is_deleted(self, name: str) -> bool:
        """Deleted within TOMBSTONE_SECONDS and not created again: its messages are to be
        cleared from the broker, not parked."""
        at = self.deleted.get(name)
        if at is None or name in self.states:
            return False
        if (utcnow() - at).total_seconds() > TOMBSTONE_SECONDS:
            del self.deleted[name]
            return False
        return True

    # -- what the retained replay says ------------------------------------------------------

    def note_deaf(self, reconnected_at: datetime, grace: timedelta, *, shard: int = 0) -> None:
        """The operator's session on broker `shard` came back at `reconnected_at` after it
        was down: that shard's agents not heard since get `grace` (their own reconnect
        backoff ceiling) to come back before their silence counts (`state.hearing`)."""
        self.deafness.note(shard, reconnected_at, reconnected_at + grace)

    def note_replay(self, keys: frozenset[tuple[str, str]]) -> None:
        """The retained reports the broker replayed after a (re)subscribe."""
        self.replayed = set(keys)
        self.replays += 1
        self.replayed_at = utcnow()

    def replay_gap(self, name: str) -> ReplayGap | None:
        """The targeted nodes of `name` that the last replay had no report of."""
        state = self.states.get(name)
        if state is None or not self.replays:
            return None
        missing = tuple(sorted(n for n in state.targeted if (name, n) not in self.replayed))
        # reports folded after the replay (live ones) say nothing about what the broker held
        before = self.replayed_at or utcnow()
        lost = tuple(
            n
            for n in missing
            if (rec := state.nodes.get(n)) is not None and rec.reported_at < before
        )
        previous = self.previous.get(name)
        # only a status describing the time before this replay (written by an earlier
        # operator, read back at start) says what the broker should hold; one this operator
        # wrote from live reports after the replay says nothing about it
        if previous is not None and (
            previous.last_report_time is None or previous.last_report_time >= before
        ):
            previous = None
        return ReplayGap(
            validation=name,
            replay=self.replays,
            targeted=len(state.targeted),
            missing=missing,
            lost=lost,
            replayed=len(state.targeted) - len(missing),
            expected=previous.nodes.reporting if previous is not None else None,
        )

    def on_node(
        self,
        name: str,
        labels: Mapping[str, str] | None,
        taints: list[dict[str, Any]] | None = None,
    ) -> None:
        now = utcnow()
        if labels is None:
            self.node_labels.pop(name, None)
            self.node_fabric.pop(name, None)
            for state in self.states.values():
                vs.forget_node(state, name)
                vs.set_node_targeted(state, name, False, now)
            return
        self.node_fabric[name] = (labels.get(LabelKey.FABRIC), has_fabric_taint(taints))
        # Our own label writes and kubelet status updates come back as Node events: only a
        # change of the kept labels can change what a selector matches.
        selectable = kept_labels(labels, self.label_keys)
        if self.node_labels.get(name) == selectable:
            return
        self.node_labels[name] = selectable
        for validation, selector in self.selectors.items():
            vs.set_node_targeted(
                self.states[validation], name, selector_matches(selector, selectable), now
            )
        self.on_targets_changed()

    def _note_label_keys(self) -> None:
        keys = referenced_keys(self.specs.values())
        added = keys - self.label_keys
        if added:
            # Nodes seen before know nothing of these keys: a listing fills them in.
            self.label_keys_missing |= added
            self.label_keys |= added
            self.on_label_keys_added()

    def fill_labels(self, listed: Mapping[str, Mapping[str, str]], keys: set[str]) -> None:
        """Fill in the `keys` that known Nodes lack from a listing of their labels (taken
        after the keys were added): a value a Node event brought since is newer and stays."""
        self.label_keys_missing -= keys
        changed = False
        for name, labels in self.node_labels.items():
            found = listed.get(name) or {}
            new = {k: found[k] for k in keys if k in found and k not in labels}
            if new:
                labels.update(new)
                changed = True
        if changed:
            now = utcnow()
            for validation in self.selectors:
                self._retarget(validation, now)
            self.on_targets_changed()

    def _retarget(self, name: str, now: datetime) -> None:
        selector = self.selectors.get(name)
        if selector is None:
            return
        targeted = {
            n for n, labels in self.node_labels.items() if selector_matches(selector, labels)
        }
        vs.set_targeted(self.states[name], targeted, now)

    # -- what admission and Kueue ask --------------------------------------------------------

    def validation_view(self, name: str) -> ValidationView | None:
        """The validation as admission decisions see it, or None if the operator knows no
        validation of that name."""
        state = self.states.get(name)
        spec = self.specs.get(name)
        if state is None or spec is None:
            return None
        status = self.previous.get(name)
        healthy = status.condition(ConditionType.HEALTHY) if status is not None else None
        usable = status.condition(ConditionType.USABLE) if status is not None else None
        verdict = current_verdict(name, state, spec, self.node_fabric, utcnow())
        pending = self.exclusions_pending()
        targeted = state.targeted
        waiting = (
            sum(1 for n in pending if n in targeted)
            if len(pending) < len(targeted)
            else sum(1 for n in targeted if n in pending)
        )
        return ValidationView(
            name=name,
            healthy=healthy is not None and healthy.status == "True",
            healthy_message=healthy.message if healthy is not None else "no status yet",
            admission=spec.gating.admission,
            decisions=verdict.nodes if verdict is not None else {},
            failures=tuple((f.node, f.check) for f in (status.failures if status else [])),
            policy=spec.gating.admission_policy,
            usable=usable is not None and usable.status == "True",
            usable_message=usable.message if usable is not None else "no status yet",
            healthy_nodes=verdict.admissible if verdict is not None else 0,
            pending_exclusions=waiting,
            excluded=verdict.excluded if verdict is not None else frozenset(),
        )
