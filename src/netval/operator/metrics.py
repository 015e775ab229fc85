"""The operator's Prometheus metrics: MQTT ingest (accepted, dropped by reason, retained
replay gaps, parked messages dropped), status and gating writes, Kubernetes API retries,
validations and nodes by health, NetworkLoadTest runs and their last figures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from netval.model.loadtest import RunPhase
from netval.model.topics import DropReason
from netval.operator.ingest.decode import INGEST_DROP_REASONS
from netval.operator.ingest.endpoint_check import Refusal
from netval.operator.ingest.shards import ShardedIngest
from netval.operator.loadtest.runner import RESULT_OUTCOMES
from netval.operator.state.beats import BeatOutcome
from netval.operator.status.event_budget import SUMMARISED_REASONS

if TYPE_CHECKING:
    from netval.operator.term_runtime import OperatorRuntime


class _RuntimeCollector(Collector):
    def __init__(self, runtime: OperatorRuntime) -> None:
        self._runtime = runtime

    def collect(
        self,
    ) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        rt = self._runtime
        stats = rt.ingest.stats
        yield CounterMetricFamily(
            "netval_operator_reports_received", "Valid reports received", value=stats.reports
        )
        dropped = CounterMetricFamily(
            "netval_operator_messages_dropped",
            "MQTT messages dropped as invalid, by reason",
            labels=["reason"],
        )
        for reason in INGEST_DROP_REASONS:
            dropped.add_metric([reason.value], stats.dropped.get(reason, 0))
        yield dropped
        beats = CounterMetricFamily(
            "netval_operator_beats",
            "Beats received, by what they did: matched (the report holds: freshness"
            " refreshed), mismatched (the report is unconfirmed until the next), no_report,"
            " out_of_order, parked (validation not known yet), invalid (not decoded)",
            labels=["outcome"],
        )
        for outcome in BeatOutcome:
            beats.add_metric([outcome.value], stats.beats.get(outcome.value, 0))
        beats.add_metric(["invalid"], stats.dropped.get(DropReason.INVALID_BEAT, 0))
        yield beats
        writes = CounterMetricFamily(
            "netval_operator_api_writes",
            "Kubernetes API writes by kind: node_patch (fabric label, taint, topology labels),"
            " node_status_patch (NetworkFabricReady), device_taint_rule (creates, deletes),"
            " status_patch, event; steady state writes no Node and one status per resync",
            labels=["kind"],
        )
        writes.add_metric(["node_patch"], rt.gating.writes + rt.topology_labels.writes)
        writes.add_metric(["node_status_patch"], rt.gating.condition_writes)
        writes.add_metric(["device_taint_rule"], rt.gating.devices.writes)
        writes.add_metric(["status_patch"], rt.status.writes)
        writes.add_metric(["event"], rt.events.posted)
        yield writes
        yield GaugeMetricFamily(
            "netval_operator_mqtt_connected", "1 while subscribed", value=int(stats.connected)
        )
        yield CounterMetricFamily(
            "netval_operator_mqtt_reconnects", "MQTT reconnections", value=stats.reconnects
        )
        if isinstance(rt.ingest, ShardedIngest):  # mqtt.shards > 1: which shard is down
            shard_up = GaugeMetricFamily(
                "netval_operator_mqtt_shard_connected",
                "1 while subscribed to this broker shard",
                labels=["shard"],
            )
            for i, session in enumerate(rt.ingest.sessions):
                shard_up.add_metric([str(i)], int(session.stats.connected))
            yield shard_up
        yield CounterMetricFamily(
            "netval_operator_status_writes", "Status patches written", value=rt.status.writes
        )
        yield CounterMetricFamily(
            "netval_operator_status_write_failures",
            "Status patches that failed",
            value=rt.status.write_failures,
        )
        yield CounterMetricFamily(
            "netval_operator_gating_writes", "Node label/taint writes", value=rt.gating.writes
        )
        yield from _breaker_metrics(rt)
        yield from _node_write_metrics(rt)
        yield from _device_metrics(rt)
        yield CounterMetricFamily(
            "netval_operator_topology_label_writes",
            "Node topology.netval.io/* label patches (spec.topology.publishLabels)",
            value=rt.topology_labels.writes,
        )
        yield CounterMetricFamily(
            "netval_operator_retained_publish_failures",
            "Failed publishes of the operator's retained messages (retried)",
            value=stats.retained_failures,
        )
        parked = CounterMetricFamily(
            "netval_operator_parked_dropped",
            "Reports (pending), states (offline_pending) and beats (beats_pending) for unknown"
            " validations dropped because the table was full (reports: 100,000 entries or"
            " 64 MiB)",
            labels=["table"],
        )
        for table, count in sorted(rt.store.dropped.items()):
            parked.add_metric([table], count)
        yield parked
        yield GaugeMetricFamily(
            "netval_operator_parked",
            "Reports and states held for validations not known yet",
            value=len(rt.store.pending)
            + len(rt.store.offline_pending)
            + len(rt.store.beats_pending),
        )
        yield GaugeMetricFamily(
            "netval_operator_parked_bytes",
            "Bytes of the reports held for validations not known yet (budget 64 MiB)",
            value=rt.store.pending_bytes,
        )
        yield CounterMetricFamily(
            "netval_operator_replay_gaps",
            "Retained replays after which targeted nodes had no retained report",
            value=rt.status.gap_events,
        )
        gap = GaugeMetricFamily(
            "netval_operator_replay_missing_nodes",
            "Targeted nodes without a retained report in the last replay, per validation",
            labels=["validation"],
        )
        for name, found in sorted(rt.status.gaps.items()):
            gap.add_metric([name], len(found.missing))
        yield gap
        yield CounterMetricFamily(
            "netval_operator_api_retries",
            "Kubernetes API calls retried after a 5xx, 429, 409 or transport error",
            value=rt.kube.retries,
        )
        yield CounterMetricFamily(
            "netval_operator_events_dropped",
            "Events dropped because the queue for the next window was full",
            value=rt.events.dropped,
        )
        suppressed = CounterMetricFamily(
            "netval_operator_events_suppressed",
            "Node transitions past the Events rate cap, counted in an EventsSuppressed"
            " summary instead of posted, by the reason they would have had",
            labels=["reason"],
        )
        for event_reason in SUMMARISED_REASONS:
            suppressed.add_metric([event_reason.value], rt.events.suppressed[event_reason])
        yield suppressed
        nodes = GaugeMetricFamily(
            "netval_operator_nodes",
            "Targeted nodes per validation and state",
            labels=["validation", "state"],
        )
        for name, status in rt.store.previous.items():
            counts = status.nodes
            for state in ("targeted", "reporting", "passing", "warning", "failing", "stale"):
                nodes.add_metric([name, state], getattr(counts, state))
        yield nodes
        refused = CounterMetricFamily(
            "netval_operator_endpoints_refused",
            "Announced east-west endpoints refused (not the node's address nor in a declared "
            "fabric network: a node claiming another's), counted once per node and address",
            labels=["reason"],
        )
        for refusal in Refusal:
            refused.add_metric([refusal.value], rt.endpoint_check.refusals[refusal])
        yield refused
        yield from _loadtest_metrics(rt)


def _device_metrics(rt: OperatorRuntime) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """Per-NIC gating (docs/gating.md, "Gate the NIC, not the node")."""
    tainted = GaugeMetricFamily(
        "netval_operator_devices_tainted",
        "NICs the node verdict taints as DRA devices (DeviceTaintRules), per validation",
        labels=["validation"],
    )
    for name, state in sorted(rt.store.states.items()):
        if state.verdict is not None and state.devices_note is not None:
            tainted.add_metric([name], state.verdict.tainted_devices)
    yield tainted
    yield CounterMetricFamily(
        "netval_operator_device_taint_rule_writes",
        "DeviceTaintRules created and deleted",
        value=rt.gating.devices.writes,
    )
    yield CounterMetricFamily(
        "netval_operator_node_condition_writes",
        "NetworkFabricReady condition writes (nodes/status), on transitions only",
        value=rt.gating.condition_writes,
    )


def _breaker_metrics(rt: OperatorRuntime) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """The node verdict's circuit breaker, per validation (docs/gating.md "The breaker")."""
    tripped = GaugeMetricFamily(
        "netval_operator_breaker_tripped",
        "1 while more nodes want exclusion than maxUnhealthyPercent allows, per validation;"
        " action: what admission does then (gating.onBreakerTripped: admit or hold)",
        labels=["validation", "action"],
    )
    for name, state in sorted(rt.store.states.items()):
        verdict = state.verdict
        if verdict is not None:
            action = verdict.policy.on_breaker_tripped.value
            tripped.add_metric([name, action], int(verdict.tripped))
    yield tripped
    trips = CounterMetricFamily(
        "netval_operator_breaker_trips",
        "Times a validation's breaker tripped, by what admission did (admit, hold)",
        labels=["action"],
    )
    for action, count in sorted(rt.gating.breaker_trips.items()):
        trips.add_metric([action], count)
    yield trips
    excluded = GaugeMetricFamily(
        "netval_operator_nodes_excluded",
        "Targeted nodes the node verdict excludes from admission (labelled unhealthy), per"
        " validation",
        labels=["validation"],
    )
    pending = GaugeMetricFamily(
        "netval_operator_exclusions_pending",
        "Nodes whose exclusion (label unhealthy, taint) is decided and not written yet",
        value=len(rt.gating.queue.pending_exclusions()),
    )
    for name, state in sorted(rt.store.states.items()):
        if state.verdict is not None:
            excluded.add_metric([name], len(state.verdict.excluded))
    yield excluded
    yield pending


def _node_write_metrics(
    rt: OperatorRuntime,
) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
    """The paced Node write queue (`gating.write_queue`)."""
    queue = rt.gating.queue
    yield GaugeMetricFamily(
        "netval_operator_node_write_queue_depth",
        "Nodes waiting for a fabric label/taint write (one entry per node, the latest wish)",
        value=len(queue),
    )
    yield CounterMetricFamily(
        "netval_operator_node_writes_coalesced",
        "Queued Node wishes replaced by a newer one before they were written",
        value=queue.coalesced,
    )
    yield CounterMetricFamily(
        "netval_operator_node_writes_retried",
        "Node writes that failed and went back to the queue",
        value=queue.retried,
    )
    latency = queue.latency
    yield HistogramMetricFamily(
        "netval_operator_node_write_latency_seconds",
        "From a node's wish first queued to its write accepted",
        buckets=latency.buckets(),
        sum_value=latency.total,
    )


def _loadtest_metrics(rt: OperatorRuntime) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """NetworkLoadTest figures; labels are bounded: per test (objects the users made),
    per endpoint of a test (at most 64), phases and outcomes are fixed sets."""
    lt = rt.loadtests
    runs = CounterMetricFamily(
        "netval_loadtest_runs", "Load-test runs ended (this term), by phase", labels=["phase"]
    )
    for phase in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.INCONCLUSIVE):
        runs.add_metric([phase.value], lt.runs_finished.get(phase.value, 0))
    yield runs
    yield GaugeMetricFamily(
        "netval_loadtest_running", "Load-test runs under way", value=len(lt.runs)
    )
    results = CounterMetricFamily(
        "netval_loadtest_results",
        "loadresult messages by outcome (invalid, mismatch, no_run, not_counted: not counted)",
        labels=["outcome"],
    )
    for outcome in RESULT_OUTCOMES:
        results.add_metric([outcome], lt.results.get(outcome, 0))
    yield results
    yield CounterMetricFamily(
        "netval_loadtest_status_write_failures",
        "NetworkLoadTest status patches that failed (retried)",
        value=lt.writer.failures,
    )
    over = GaugeMetricFamily(
        "netval_loadtest_max_oversubscription",
        "The last run's worst cross-domain oversubscription, per test",
        labels=["test"],
    )
    refused = GaugeMetricFamily(
        "netval_loadtest_refused_flows", "Flows the last run refused, per test", labels=["test"]
    )
    breaches = GaugeMetricFamily(
        "netval_loadtest_breaches", "Expectations the last run breached, per test", labels=["test"]
    )
    coverage = GaugeMetricFamily(
        "netval_loadtest_coverage_percent",
        "The last run's counted share of its planned flows and reads, per test",
        labels=["test"],
    )
    storage = GaugeMetricFamily(
        "netval_loadtest_storage_per_node_mbytes_per_second",
        "The last run's per-node storage read rate under concurrent load (10^6 B/s), per test"
        " and endpoint: the slowest node (min) and the median",
        labels=["test", "endpoint", "stat"],
    )
    for test, run in sorted(lt.last_runs.items()):
        if run.max_oversubscription is not None:
            over.add_metric([test], run.max_oversubscription)
        refused.add_metric([test], run.refused_flows)
        breaches.add_metric([test], len(run.breaches))
        if run.coverage_percent is not None:
            coverage.add_metric([test], run.coverage_percent)
        for s in run.storage:
            if s.per_node_m_bps_min is not None:
                storage.add_metric([test, s.endpoint, "min"], s.per_node_m_bps_min)
            if s.per_node_m_bps_median is not None:
                storage.add_metric([test, s.endpoint, "median"], s.per_node_m_bps_median)
    yield from (over, refused, breaches, coverage, storage)


def operator_registry(runtime: OperatorRuntime) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_RuntimeCollector(runtime))
    return registry
