"""The operator's parts for one leadership term, wired in one place (start-up and stop:
`netval.operator.term_startup`; a new term builds a new runtime from fresh state).

- `store` (`state.store.Store`): what Kopf handlers and MQTT tell the operator.
- `ingest` (`ingest.subscriber.ReportIngest`): the MQTT subscription; reports go to the store
  (`ingest.shards.ShardedIngest`, one session per broker shard, with mqtt.shards > 1).
- `status` (`status.writer.StatusWriter`): one status patch per validation per window.
- `gating` (`gating.node_writer.NodeGating`): node labels and taints, the Gating condition.
- `topology_labels` (`topology.label_writer.TopologyLabels`): `topology.netval.io/*` labels.
- `kueue_topologies` (`topology.kueue_writer.KueueTopologies`): the Kueue Topology objects.
- `events` (`status.events.Events`): the Events all of them post.
- `loadtests` (`loadtest.runner.LoadTests`): NetworkLoadTest runs (plans out, results in,
  their status), on the same MQTT connection as the ingest.
- targets: when a spec, the targeted nodes, an agent's endpoint or the peers' epoch
  changed, the agent assignments and the peers-port check are redone once in the next
  status window, not per Node or MQTT event (a start-up delivers one event per node, each
  would redo all targeted nodes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from netval.infra.mqtt_client import ReconnectPolicy
from netval.infra.supervised import supervised_task
from netval.infra.task_stop import cancel_and_wait
from netval.model.results import Report
from netval.model.spec import NetworkValidationSpec
from netval.model.status import EventReason
from netval.operator.agents.rollout import apply_agents
from netval.operator.gating.node_writer import NodeGating
from netval.operator.ingest.assignments import assignments, leftover_topics
from netval.operator.ingest.decode import EndpointAnnounce
from netval.operator.ingest.endpoint_check import (
    EndpointCheck,
    VerifiedEndpoints,
    fabric_networks,
)
from netval.operator.ingest.peer_sets import EndpointTable, epoch_of
from netval.operator.ingest.shards import ShardedIngest
from netval.operator.ingest.subscriber import ReportIngest
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.loadtest.privileges import RdmaLoadTests
from netval.operator.loadtest.runner import LoadTests
from netval.operator.settings import OperatorSettings
from netval.operator.state.peer_ports import PeerPortCheck
from netval.operator.state.store import Store, ValidationView, utcnow
from netval.operator.state.validation import IngestResult, ValidationState
from netval.operator.status.events import Events
from netval.operator.status.writer import StatusWriter
from netval.operator.topology.kueue_writer import KueueTopologies
from netval.operator.topology.label_writer import TopologyLabels

__all__ = ["OperatorRuntime", "ValidationView"]

log = logging.getLogger("netval.operator")

LABEL_LISTING_BACKOFF: Final = 30.0  # seconds before another Node label listing after a failure


class OperatorRuntime:
    def __init__(
        self, settings: OperatorSettings, kube: KubeApi, tracer_provider: TracerProvider
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.tracer_provider = tracer_provider
        self.tracer = tracer_provider.get_tracer("netval.operator")
        self.store = Store(
            on_targets_changed=self.targets_changed,
            on_label_keys_added=self._list_missing_labels,
            shards=settings.shard_count,
        )
        self.events = Events(kube, self.store)
        self.gating = NodeGating(settings, kube, self.store, self.events)
        self.store.exclusions_pending = self.gating.queue.pending_exclusions
        self.topology_labels = TopologyLabels(
            settings,
            kube,
            self.store,
            ready=self.gating.validations_loaded,
            bucket=self.gating.bucket,
        )
        self.kueue_topologies = KueueTopologies(
            settings, kube, self.store, self.events, ready=self.gating.validations_loaded
        )
        self.status = StatusWriter(
            settings,
            kube,
            self.store,
            self.events,
            self.tracer,
            before_round=self.before_round,
        )
        self.loadtests = LoadTests(
            kube,
            self.store,
            lambda group, desired: self.ingest.set_retained(desired, group=group),
            max_rate_ceiling_mbps=settings.loadtest_max_rate_mbps,
            # announcements count only at the node's own addresses (ingest.endpoint_check)
            endpoints=lambda validation: self.verified_endpoints.of(validation),
            rails=lambda validation: self.verified_endpoints.rails_of(validation),
            # the term's fencing token for load plans: this leader's clock (ms) at its start
            term=time.time_ns() // 1_000_000,
        )
        # one session per broker shard when mqtt.shards > 1 (ingest.shards)
        ingest_kwargs: dict[str, Any] = {
            "on_load_result": self.loadtests.on_result,
            "on_report": self.on_report,
            "on_state": self.store.on_state,
            "on_beat": self.store.ingest_beat,
            "on_endpoint": self.on_endpoint,
            "on_replayed": self.store.note_replay,
            # after the operator's own connection to a shard was down, that shard's agents
            # get their reconnect backoff's ceiling (the default policy's, which the agent
            # publisher uses) to come back before their silence counts
            "on_reconnected": lambda shard: self.store.note_deaf(
                utcnow(), timedelta(seconds=ReconnectPolicy().cap), shard=shard
            ),
            "deleted": self.store.is_deleted,
            "tracer": self.tracer,
        }
        self.ingest: ReportIngest | ShardedIngest = (
            ShardedIngest(settings.mqtt_shards, **ingest_kwargs)
            if settings.mqtt_shards
            else ReportIngest(settings.mqtt, **ingest_kwargs)
        )
        self.peer_ports = PeerPortCheck()
        self.endpoints = EndpointTable()
        # announced endpoints count only at the node's own address (ingest.endpoint_check)
        self.endpoint_check = EndpointCheck()
        self.verified_endpoints = VerifiedEndpoints(
            self.endpoints, self.endpoint_check, self._fabric_networks
        )
        self.rdma_tests = RdmaLoadTests()
        self._rdma_listed = False
        self._peer_epochs: dict[str, int] = {}
        self.metrics_server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._targets_dirty = False
        self._label_listing: asyncio.Task[None] | None = None
        self._label_listing_after = 0.0  # monotonic: no listing before (after a failure)
        self._started = False
        self._stopped = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Idempotent: a second call starts nothing (one MQTT session per runtime, ever)."""
        if self._started:
            return
        self._started = True
        synced = self.ingest.synced
        self._tasks = [
            supervised_task("netval-ingest", self.ingest.run),
            supervised_task("netval-status-writer", lambda: self.status.loop(synced)),
            supervised_task("netval-node-gating", lambda: self.gating.loop(synced)),
            supervised_task("netval-topology-labels", lambda: self.topology_labels.loop(synced)),
            supervised_task("netval-loadtests", self.loadtests.run),
            supervised_task("netval-kueue-topologies", self.kueue_topologies.loop),
        ]

    async def stop(self) -> None:
        """Idempotent; after it returns nothing of this runtime runs (a retry of start-up or
        the next leadership term builds a new one)."""
        listing = [self._label_listing] if self._label_listing is not None else []
        await cancel_and_wait([*self._tasks, *listing])
        if not self._stopped:
            self._stopped = True
            # Each term builds its own client: its thread pools go with it (a hung call in
            # one of them must not outlive the term that made it).
            self.kube.close()
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
            result = self.store.ingest_report(report, retained)
            span.set_attribute(
                "netval.ingest_result", "pending" if result is None else result.value
            )
            if result is IngestResult.ACCEPTED:
                self.status.link(report.validation, span)

    def on_endpoint(self, announce: EndpointAnnounce) -> None:
        """An agent's endpoint changed: the peer sets that name it, in the next window."""
        if self.endpoints.update(announce.validation, announce.node, announce.payload):
            self.targets_changed()

    def on_node_addresses(self, node: str, addresses: frozenset[str] | None) -> None:
        """A Node's status.addresses (None: deleted): endpoints are judged against them."""
        if self.endpoint_check.note_node(node, addresses):
            self.targets_changed()

    def _fabric_networks(self, validation: str) -> tuple[Any, ...]:
        spec = self.store.specs.get(validation)
        return fabric_networks(spec.checks.peers.fabric_cidrs) if spec is not None else ()

    # -- what Kopf tells us -----------------------------------------------------------------

    async def invalid_spec(
        self, name: str, *, generation: int, message: str, body: Mapping[str, Any]
    ) -> None:
        """Ready=False InvalidSpec, written at once."""
        self.store.invalid_spec(name, generation=generation, message=message, body=body)
        status = self.status.compute(name, utcnow())
        await self.status.write(name, status, self.store.previous.get(name))

    def remove_validation(self, name: str) -> None:
        self.loadtests.validation_deleted(name)  # before its plan topics are cleared
        self.gating.forget(name)
        self.status.forget(name)
        nodes = self.store.remove_validation(name)
        self.endpoints.forget(name)
        self.endpoint_check.forget(name)
        self.ingest.clear_retained(leftover_topics(name, nodes))

    # -- targets ----------------------------------------------------------------------------

    def targets_changed(self) -> None:
        self._targets_dirty = True

    def before_round(self) -> None:
        self.refresh_targets()
        self.clear_unknown()

    def clear_unknown(self) -> None:
        """Retained messages of validations that never came (deleted while no operator
        ran): cleared after a grace, so the broker stops replaying them to every term."""
        for name, nodes in self.store.take_unknown(utcnow()).items():
            self.ingest.clear_retained(leftover_topics(name, nodes))

    def refresh_targets(self) -> None:
        """Agent assignments and the peers-port check, if targets or a spec changed; a
        listing of the Nodes' labels if a validation references keys not kept yet."""
        self._list_missing_labels()
        now = time.time()
        epochs = {
            name: epoch_of(spec, now)
            for name, spec in self.store.specs.items()
            if spec.checks.peers.enabled
        }
        if epochs != self._peer_epochs:  # a new epoch: the next peer sets
            self._peer_epochs = epochs
            self._targets_dirty = True
        if not self._targets_dirty:
            return
        self._targets_dirty = False
        self.ingest.set_retained(assignments(self.store, self.verified_endpoints, now))
        for validation, node, (address, port) in self.endpoint_check.news():
            what, effect = (
                (f"the east-west endpoint {address}:{port}", "its peers do not probe it")
                if port
                else (f"the load-test rail address {address}", "no load test uses its rails")
            )
            self.events.queue(
                validation, "Warning", EventReason.ENDPOINT_REFUSED,
                f"node {node} announced {what}, which is neither one of its Node's addresses "
                f"nor in spec.checks.peers.fabricCidrs: refused ({effect})",
            )  # fmt: skip
        for name, message in self.peer_ports.update(self.store):
            self.events.queue(name, "Warning", EventReason.PEER_PORT_CONFLICT, message)

    def _list_missing_labels(self) -> None:
        """Started as soon as a validation references a new key (from Kopf's handlers, on
        the loop), or by the next status round (a failed listing's retry)."""
        if not self.store.label_keys_missing or self._label_listing is not None:
            return
        if time.monotonic() < self._label_listing_after:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on the loop: the next status round starts it
        keys = set(self.store.label_keys_missing)
        self._label_listing = loop.create_task(self._fill_labels(keys))

    async def _fill_labels(self, keys: set[str]) -> None:
        try:
            listed = await self.kube.list_node_labels(frozenset(keys))
        except Exception as exc:
            self._label_listing_after = time.monotonic() + LABEL_LISTING_BACKOFF
            log.warning("cannot list the Nodes' labels %s: %s", sorted(keys), error_text(exc))
        else:
            self.store.fill_labels(listed, keys)
            log.info("Node labels %s filled in for %d nodes", sorted(keys), len(listed))
        finally:
            self._label_listing = None
        self._list_missing_labels()  # keys a validation added while this listing ran

    # -- what admission and Kueue ask (through the runtime in Kopf's memo) ------------------

    @property
    def states(self) -> dict[str, ValidationState]:
        return self.store.states

    @property
    def specs(self) -> dict[str, NetworkValidationSpec]:
        return self.store.specs

    @property
    def node_labels(self) -> dict[str, dict[str, str]]:
        return self.store.node_labels

    def validation_view(self, name: str) -> ValidationView | None:
        return self.store.validation_view(name)

    async def validations_loaded(self) -> bool:
        return await self.gating.validations_loaded()

    # -- RDMA load tests: which agents get perftest's privileges ----------------------------

    async def rdma_load(self, validation: str) -> bool:
        """Whether `validation` has an RDMA load test (its agents get perftest's
        privileges). The tests are listed once per term before the first answer, so a
        validation rendered at start-up, before the load tests' handlers ran, keeps what its
        tests ask (no roll there and back); ApiException if that list fails."""
        if not self._rdma_listed:
            for name, spec in (await self.kube.list_loadtest_specs()).items():
                self.rdma_tests.note(name, spec)
            self._rdma_listed = True
        return validation in self.rdma_tests.validations(self.store.specs)

    async def loadtest_seen(self, name: str, spec: Mapping[str, Any] | None) -> None:
        """A load test changed or went (None): the agents of a validation that gains or
        loses its last RDMA load test are rendered again."""
        before = self.rdma_tests.validations(self.store.specs)
        if spec is None:
            self.rdma_tests.forget(name)
        else:
            self.rdma_tests.note(name, spec)
        if not self._rdma_listed:
            return  # the first validation rendered lists them all
        after = self.rdma_tests.validations(self.store.specs)
        for validation in sorted(before ^ after):
            body = self.store.bodies.get(validation)
            spec_of = self.store.specs.get(validation)
            if body is None or spec_of is None:
                continue
            generation = int((body.get("metadata") or {}).get("generation") or 1)
            log.info("agents of %s %s perftest's privileges (RDMA load tests)", validation,
                     "get" if validation in after else "lose")  # fmt: skip
            await apply_agents(self.kube, self.settings, body, generation, spec_of,
                               rdma=validation in after)  # fmt: skip
