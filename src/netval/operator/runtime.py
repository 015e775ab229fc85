"""The operator's in-memory state and its background work: MQTT ingest and status writes.

Kopf handlers tell the runtime what exists (validations, their specs, nodes and labels);
MQTT tells it what agents report. Status is written by one loop, one merge patch per
validation per window, and only after the retained reports were read back after a start, so
a restart does not flip conditions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from netval.infra.task_stop import cancel_and_wait
from netval.model.results import Report
from netval.model.spec import AdmissionMode, NetworkValidationSpec
from netval.model.status import Condition, ConditionType, NetworkValidationStatus, Reason
from netval.model.topics import TopicKind, topic
from netval.operator import aggregate, east_west, gating
from netval.operator.aggregate import ValidationState
from netval.operator.ingest import ReportIngest, StateChange
from netval.operator.kube_api import KubeApi
from netval.operator.manifests import (
    AGENT_APP_NAME,
    LABEL_NAME,
    LABEL_VALIDATION,
    validation_label_value,
)
from netval.operator.peer_ports import PeerListener, conflict_message, peer_port_conflicts
from netval.operator.settings import OperatorSettings

log = logging.getLogger("netval.operator")

# At most this many "node started/stopped failing" Events per validation per minute; the
# status carries the full picture, Events are for `kubectl describe` readers.
EVENTS_PER_MINUTE: Final = 10
MAX_LINKS_PER_WRITE: Final = 128  # trace links from a status write to the reports in it
# Node writes per gating round and in flight: a fresh deploy on 10,000 nodes must not hold
# one round (and the API server) for minutes.
MAX_GATING_WRITES_PER_ROUND: Final = 500
GATING_CONCURRENCY: Final = 16
_PENDING_LIMIT: Final = 100_000
# Seconds between reads of the agent DaemonSets' status: it only explains missing reports
# (Ready's message), so a read now and then is enough; a watch would need a cluster-wide
# permission or a second, namespaced Kopf operator.
AGENT_PODS_EVERY: Final = 10.0


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
    node_health: dict[str, aggregate.NodeHealth]  # targeted nodes only
    failures: tuple[tuple[str, str], ...]  # (node, check), worst first, at most 50

    @property
    def unhealthy_nodes(self) -> list[str]:
        return [n for n, h in self.node_health.items() if h == "unhealthy"]


@dataclass(slots=True)
class _Pending:
    report: Report
    retained: bool


class OperatorRuntime:
    def __init__(
        self, settings: OperatorSettings, kube: KubeApi, tracer_provider: TracerProvider
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.tracer_provider = tracer_provider
        self.tracer = tracer_provider.get_tracer("netval.operator")
        self.states: dict[str, ValidationState] = {}
        self.selectors: dict[str, dict[str, str]] = {}
        self.specs: dict[str, NetworkValidationSpec] = {}
        self.bodies: dict[str, dict[str, Any]] = {}
        self.previous: dict[str, NetworkValidationStatus] = {}
        self.node_labels: dict[str, dict[str, str]] = {}
        # what netval has on each node: (netval.io/fabric label, our taint present)
        self.node_fabric: dict[str, tuple[str | None, bool]] = {}
        self.gating_conditions: dict[str, tuple[bool, str, str]] = {}
        self.breaker_tripped: dict[str, bool] = {}
        # Validations that existed at start: gating waits until all are loaded, so that a
        # half-loaded operator never strips labels or taints that another validation owns.
        self.expected_validations: set[str] | None = None
        self.gating_writes = 0
        # Reports for validations the operator has not seen yet (retained messages can
        # arrive before Kopf resumes the CRs after a restart).
        self.pending: dict[tuple[str, str], _Pending] = {}
        self.offline_pending: dict[tuple[str, str], bool] = {}
        self.links: dict[str, list[Link]] = {}
        self.ingest = ReportIngest(settings.mqtt, on_report=self.on_report, on_state=self.on_state)
        self.status_writes = 0
        self.status_write_failures = 0
        self._event_times: dict[str, list[float]] = {}
        self._pending_events: list[tuple[str, str, str, str]] = []
        self.metrics_server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.agent_pods_every = AGENT_PODS_EVERY
        self.peer_port_conflicts: dict[tuple[str, str], list[str]] = {}
        self._agent_pods_due = 0.0
        self._targets_dirty = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.ingest.run(), name="netval-ingest"),
            asyncio.create_task(self.write_loop(), name="netval-status-writer"),
            asyncio.create_task(self.gating_loop(), name="netval-node-gating"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self.tracer_provider.shutdown()

    # -- MQTT -------------------------------------------------------------------------------

    def on_report(self, report: Report, retained: bool) -> None:
        parent = None
        if report.traceparent:
            parent = TraceContextTextMapPropagator().extract({"traceparent": report.traceparent})
        with self.tracer.start_as_current_span(
            "netval.ingest",
            context=parent,
            attributes={
                "netval.validation": report.validation,
                "netval.node": report.node,
                "netval.status": report.status.value,
                "netval.retained": retained,
            },
        ) as span:
            state = self.states.get(report.validation)
            if state is None:
                if len(self.pending) < _PENDING_LIMIT:
                    self.pending[(report.validation, report.node)] = _Pending(report, retained)
                span.set_attribute("netval.ingest_result", "pending")
                return
            result = aggregate.ingest_report(state, report, utcnow(), retained=retained)
            span.set_attribute("netval.ingest_result", result.value)
            if result is aggregate.IngestResult.ACCEPTED:
                links = self.links.setdefault(report.validation, [])
                if len(links) < MAX_LINKS_PER_WRITE:
                    links.append(Link(span.get_span_context()))

    def on_state(self, change: StateChange) -> None:
        state = self.states.get(change.validation)
        if state is None:
            self.offline_pending[(change.validation, change.node)] = change.online
            return
        if change.online:
            aggregate.node_online(state, change.node, utcnow())
        else:
            aggregate.node_offline(state, change.node, utcnow())

    # -- what Kopf tells us -----------------------------------------------------------------

    def upsert_validation(
        self,
        name: str,
        *,
        generation: int,
        spec: NetworkValidationSpec,
        body: dict[str, Any],
        status: Mapping[str, Any] | None,
    ) -> ValidationState:
        now = utcnow()
        state = self.states.get(name)
        if state is None:
            state = ValidationState(name=name)
            self.states[name] = state
            previous = NetworkValidationStatus.from_api(status)
            if previous is not None:
                self.previous[name] = previous
                aggregate.restore_since(state, previous)
        aggregate.set_spec(state, generation=generation, interval_seconds=spec.interval_seconds)
        self.selectors[name] = dict(spec.node_selector)
        self.specs[name] = spec
        self.bodies[name] = body
        self._retarget(name, now)
        for key in [k for k in self.pending if k[0] == name]:
            pending = self.pending.pop(key)
            aggregate.ingest_report(state, pending.report, now, retained=pending.retained)
        for key in [k for k in self.offline_pending if k[0] == name]:
            online = self.offline_pending.pop(key)
            (aggregate.node_online if online else aggregate.node_offline)(state, key[1], now)
        self._targets_changed()
        return state

    def invalid_spec(
        self, name: str, *, generation: int, message: str, body: dict[str, Any]
    ) -> NetworkValidationStatus:
        state = self.states.setdefault(name, ValidationState(name=name))
        interval = state.interval_seconds
        aggregate.set_spec(
            state, generation=generation, interval_seconds=interval, spec_error=message
        )
        self.bodies[name] = body
        return self.compute(name, utcnow())

    def agents_applied(self, name: str) -> None:
        state = self.states.get(name)
        if state is not None:
            aggregate.set_agents_ready(state, True, utcnow())

    def remove_validation(self, name: str) -> None:
        self.gating_conditions.pop(name, None)
        self.breaker_tripped.pop(name, None)
        if self.expected_validations is not None:
            self.expected_validations.discard(name)
        for table in (
            self.states,
            self.selectors,
            self.specs,
            self.bodies,
            self.previous,
            self.links,
        ):
            table.pop(name, None)
        self._targets_changed()

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
                aggregate.forget_node(state, name)
                aggregate.set_node_targeted(state, name, False, now)
            return
        self.node_fabric[name] = (labels.get(gating.FABRIC_LABEL), gating.has_fabric_taint(taints))
        # Our own label writes and kubelet status updates come back as Node events: only a
        # change of the other labels can change what a selector matches.
        selectable = {k: v for k, v in labels.items() if k != gating.FABRIC_LABEL}
        if self.node_labels.get(name) == selectable:
            return
        self.node_labels[name] = selectable
        for validation, selector in self.selectors.items():
            aggregate.set_node_targeted(
                self.states[validation], name, selector_matches(selector, selectable), now
            )
        self._targets_changed()

    def assignments(self) -> dict[str, bytes]:
        """The retained `assignment` of every targeted node of a peers-enabled validation:
        its topology domain, which agents cannot read from the API themselves."""
        out: dict[str, bytes] = {}
        for name, spec in self.specs.items():
            state = self.states.get(name)
            if state is None or not spec.checks.peers.enabled:
                continue
            key = spec.checks.peers.topology_key
            for node in state.targeted:
                domain = self.node_labels.get(node, {}).get(key)
                out[topic(name, node, TopicKind.ASSIGNMENT)] = json.dumps(
                    {"domain": domain}
                ).encode()
        return out

    def _targets_changed(self) -> None:
        """A validation's spec or targeted nodes may have changed: the assignments and the
        peers-port check are redone once in the next status window, not per Node event
        (a start-up delivers one event per node, each would redo all targeted nodes)."""
        self._targets_dirty = True

    def _refresh_targets(self) -> None:
        if not self._targets_dirty:
            return
        self._targets_dirty = False
        self.ingest.set_retained(self.assignments())
        self._check_peer_ports()

    def _check_peer_ports(self) -> None:
        """Queues a Warning Event on both validations when two start sharing a peers port on
        a node (again after the overlap went away and came back)."""
        listeners = {
            name: PeerListener(
                spec.checks.peers.port, spec.checks.peers.interface, frozenset(state.targeted)
            )
            for name, spec in self.specs.items()
            if spec.checks.peers.enabled and (state := self.states.get(name)) is not None
        }
        conflicts = peer_port_conflicts(listeners)
        for (a, b), nodes in conflicts.items():
            if (a, b) in self.peer_port_conflicts:
                continue
            port = listeners[a].port
            for name, other in ((a, b), (b, a)):
                message = conflict_message(other, port, nodes)
                self._pending_events.append((name, "Warning", "PeerPortConflict", message))
                log.warning("NetworkValidation %s: %s", name, message)
        self.peer_port_conflicts = conflicts

    def _retarget(self, name: str, now: datetime) -> None:
        selector = self.selectors.get(name)
        if selector is None:
            return
        targeted = {
            n for n, labels in self.node_labels.items() if selector_matches(selector, labels)
        }
        aggregate.set_targeted(self.states[name], targeted, now)

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
        now = utcnow()
        health = {node: aggregate.node_health(state, node, now) for node in sorted(state.targeted)}
        return ValidationView(
            name=name,
            healthy=healthy is not None and healthy.status == "True",
            healthy_message=healthy.message if healthy is not None else "no status yet",
            admission=spec.gating.admission,
            node_health=health,
            failures=tuple((f.node, f.check) for f in (status.failures if status else [])),
        )

    # -- status -----------------------------------------------------------------------------

    def compute(self, name: str, now: datetime) -> NetworkValidationStatus:
        previous = self.previous.get(name)
        state = self.states[name]
        status = aggregate.compute_status(state, now, previous=previous)
        spec = self.specs.get(name)
        if spec is not None and spec.checks.peers.enabled:
            key = spec.checks.peers.topology_key
            fresh = {
                n: rec.peer_results
                for n, rec in state.nodes.items()
                if n in state.targeted and aggregate.is_fresh(state, n, now)
            }
            # every targeted node's domain, so a silent node still counts in its domain
            domains = {n: self.node_labels.get(n, {}).get(key) for n in state.targeted}
            summary = east_west.east_west(
                fresh, domains, min_throughput_ratio=spec.checks.peers.min_throughput_ratio
            )
            status = status.model_copy(update={"east_west": summary})
        gate = self.gating_conditions.get(name)
        if gate is None:
            return status
        ok, reason, message = gate
        value: Literal["True", "False"] = "True" if ok else "False"
        before = previous.condition(ConditionType.GATING) if previous is not None else None
        condition = Condition(
            type=ConditionType.GATING,
            status=value,
            reason=reason,
            message=message,
            last_transition_time=before.last_transition_time
            if before is not None and before.status == value
            else now,
            observed_generation=self.states[name].generation,
        )
        others = [c for c in status.conditions if c.type != ConditionType.GATING]
        return status.model_copy(update={"conditions": [*others, condition]})

    async def write_loop(self) -> None:
        # Before the retained reports are read back, status would say "no reports".
        await self.ingest.synced.wait()
        while True:
            started = time.monotonic()
            if started >= self._agent_pods_due and self.states:
                self._agent_pods_due = started + self.agent_pods_every
                await self.refresh_agent_pods()
            try:
                await self.write_due(utcnow())
            except Exception:
                # one bad validation must not stop status for the others, nor the loop
                log.exception("status writer failed; retrying next window")
            await asyncio.sleep(
                max(0.0, self.settings.status_window - (time.monotonic() - started))
            )

    async def gating_loop(self) -> None:
        await self.ingest.synced.wait()
        while True:
            started = time.monotonic()
            try:
                await self.apply_gating(utcnow())
            except Exception:
                log.exception("node gating failed; retrying next window")
            await asyncio.sleep(
                max(0.0, self.settings.status_window - (time.monotonic() - started))
            )

    async def refresh_agent_pods(self) -> None:
        """What the agent DaemonSets' status says (e.g. "2 of 4 agent pods ready"), for the
        Ready message while nodes have not reported."""
        try:
            counts = await self.kube.agent_pod_counts(
                self.settings.namespace, f"{LABEL_NAME}={AGENT_APP_NAME}", LABEL_VALIDATION
            )
        except Exception as exc:
            log.warning("cannot read the agent DaemonSets' status: %s", exc)
            return
        for name, state in self.states.items():
            count = counts.get(validation_label_value(name))
            detail = (
                ""
                if count is None
                else aggregate.agent_pods_detail(
                    desired=count[0], ready=count[1], targeted=len(state.targeted)
                )
            )
            aggregate.set_agent_pods(state, detail)

    async def write_due(self, now: datetime) -> None:
        self._refresh_targets()
        for name, type_, reason, message in self._pending_events:
            await self._post(name, type_, reason, message)
        self._pending_events.clear()
        for name, state in list(self.states.items()):
            deadline = aggregate.next_deadline(state, now)
            if not state.dirty and (deadline is None or deadline > now):
                continue
            # Cleared before computing: a change made while the patch is in flight (ingest,
            # the gating task) marks it dirty again and is written next window.
            state.dirty = False
            status = self.compute(name, now)
            previous = self.previous.get(name)
            if previous is not None and status == previous:
                continue
            if not await self.write_status(name, status, previous):
                state.dirty = True

    # -- node gating --------------------------------------------------------------------------

    def gating_inputs(self, now: datetime) -> list[gating.GatingInput]:
        inputs: list[gating.GatingInput] = []
        for name, state in self.states.items():
            spec = self.specs.get(name)
            if spec is None:
                continue
            inputs.append(
                gating.GatingInput(
                    name=name,
                    targeted=frozenset(state.targeted),
                    node_label=spec.gating.node_label,
                    taint=spec.gating.taint,
                    max_unhealthy_percent=spec.gating.max_unhealthy_percent,
                    recovery_reports=spec.gating.recovery_reports,
                    health={
                        n: gating.FabricHealth(aggregate.node_health(state, n, now))
                        for n in state.targeted
                    },
                    ok_streak={n: rec.ok_streak for n, rec in state.nodes.items()},
                )
            )
        return inputs

    async def validations_loaded(self) -> bool:
        """Whether every validation that existed at start has been loaded: before that, a
        validation missing from memory may exist all the same."""
        if self.expected_validations is None:
            try:
                self.expected_validations = set(await self.kube.list_validation_names())
            except Exception as exc:
                log.warning("cannot list validations yet (%s); gating waits", exc)
                return False
        return self.expected_validations <= set(self.states)

    async def apply_gating(self, now: datetime) -> None:
        if not await self.validations_loaded():
            return
        inputs = self.gating_inputs(now)
        currently_tainted = [n for n, (_, tainted) in self.node_fabric.items() if tainted]
        decisions = [gating.decide_taints(v, currently_tainted) for v in inputs]
        for v, decision in zip(inputs, decisions, strict=True):
            self._record_gating(v, decision)
        labels = gating.desired_labels(inputs)
        taints = set().union(*(d.tainted for d in decisions)) if decisions else set()
        changes = gating.plan_changes(self.node_fabric, labels, taints)
        limit = asyncio.Semaphore(GATING_CONCURRENCY)

        async def write(change: gating.NodeChange) -> None:
            label = change.label.value if change.label is not None else None
            _, had_taint = self.node_fabric.get(change.node, (None, False))
            async with limit:
                try:
                    if change.taint == had_taint:
                        # label only: one merge patch, no read-modify-write needed
                        done = await self.kube.set_node_label(change.node, label)
                    else:
                        done = await self.kube.set_node_gating(change.node, label, change.taint)
                except Exception as exc:
                    log.warning("gating write to node %s failed: %s", change.node, exc)
                    return
            if done:
                self.gating_writes += 1
                # the watch will confirm; until then do not write the same change again
                self.node_fabric[change.node] = (label, change.taint)

        await asyncio.gather(*(write(c) for c in changes[:MAX_GATING_WRITES_PER_ROUND]))

    def _record_gating(self, v: gating.GatingInput, decision: gating.TaintDecision) -> None:
        if not v.taint:
            message = "node labels only (gating.taint is false)" if v.node_label else "off"
            new = (True, Reason.GATING_ACTIVE.value, message)
        elif decision.tripped:
            new = (
                False,
                Reason.BREAKER_TRIPPED.value,
                f"{decision.unhealthy} of {len(v.targeted)} targeted nodes failing, more than "
                f"maxUnhealthyPercent {v.max_unhealthy_percent:g}% allows ({decision.cap}); "
                f"not tainting {len(decision.withheld)} node(s) "
                f"({', '.join(decision.withheld[:5])}{', ...' if len(decision.withheld) > 5 else ''}): "
                "a mass failure is more likely a probe or config fault; labels still follow health",
            )
        else:
            new = (
                True,
                Reason.GATING_ACTIVE.value,
                f"{len(decision.tainted)} node(s) tainted of {len(v.targeted)} targeted "
                f"(cap {decision.cap})",
            )
        if self.gating_conditions.get(v.name) != new:
            self.gating_conditions[v.name] = new
            state = self.states.get(v.name)
            if state is not None:
                state.dirty = True
        was_tripped = self.breaker_tripped.get(v.name, False)
        self.breaker_tripped[v.name] = decision.tripped
        if decision.tripped and not was_tripped:
            self._pending_events.append((v.name, "Warning", "BreakerTripped", new[2]))

    async def write_status(
        self, name: str, status: NetworkValidationStatus, previous: NetworkValidationStatus | None
    ) -> bool:
        links = self.links.pop(name, [])
        with self.tracer.start_as_current_span(
            "netval.status_write", links=links, attributes={"netval.validation": name}
        ) as span:
            try:
                await self.kube.patch_status(name, status.to_patch())
            except Exception as exc:
                self.status_write_failures += 1
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR))
                log.warning("status write for %s failed: %s", name, exc)
                return False
        self.status_writes += 1
        self.previous[name] = status
        await self._post_transition_events(name, previous, status)
        return True

    async def _post_transition_events(
        self, name: str, before: NetworkValidationStatus | None, after: NetworkValidationStatus
    ) -> None:
        if name not in self.bodies:
            return
        old = {(f.node, f.check) for f in (before.failures if before else [])}
        new = {(f.node, f.check): f for f in after.failures}
        transitions = [(True, key) for key in sorted(set(new) - old)]
        transitions += [(False, key) for key in sorted(old - set(new))]
        now = time.monotonic()
        window = [t for t in self._event_times.get(name, []) if now - t < 60]
        for failing, (node, check) in transitions:
            if len(window) >= EVENTS_PER_MINUTE:
                break
            window.append(now)
            if failing:
                args = (
                    "Warning",
                    "CheckFailing",
                    f"node {node} fails {check}: {new[(node, check)].message}",
                )
            else:
                args = ("Normal", "CheckRecovered", f"node {node} passes {check} again")
            await self._post(name, *args)
        self._event_times[name] = window

    async def _post(self, name: str, type_: str, reason: str, message: str) -> None:
        ref = self.bodies.get(name)
        if ref is None:
            return
        involved = {
            "apiVersion": ref["apiVersion"],
            "kind": ref["kind"],
            "name": ref["metadata"]["name"],
            "uid": ref["metadata"].get("uid"),
        }
        try:
            await self.kube.post_event(involved, type=type_, reason=reason, message=message)
        except Exception as exc:
            log.warning("could not post event for %s: %s", name, exc)
