"""The agent's Prometheus metrics and health, served by netval.infra.metrics_server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from netval.agent.config_watch import ConfigWatcher
from netval.agent.enroll import Enroller
from netval.agent.loadtest.executor import LoadExecutor
from netval.agent.publish import PublisherStats
from netval.agent.sampling import BoundedSampler
from netval.infra.metrics_server import serve_metrics
from netval.model.ids import CheckGroup, Status
from netval.model.results import CheckResult, Report


class _PublisherCollector(Collector):
    def __init__(self, stats: Callable[[], PublisherStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._stats()
        for name, value, doc in (
            ("netval_reports_published", s.published, "Reports acknowledged by the broker"),
            (
                "netval_beats_published",
                s.beats,
                "Beats published instead of an unchanged report (spec.report.fullEvery)",
            ),
            ("netval_publish_failures", s.publish_failures, "Report publishes that failed"),
            ("netval_reports_replaced", s.replaced, "Unsent reports replaced by newer ones"),
            ("netval_mqtt_reconnects", s.reconnects, "MQTT reconnection attempts"),
            (
                "netval_mqtt_credential_refusals",
                s.credential_refusals,
                "Connects the broker refused for the credential (bad user name or password, not"
                " authorized), and publishes refused so for 5 min",
            ),
            (
                "netval_publish_refusals",
                s.publish_refusals,
                "Publishes the broker answered with a failure reason code (not taken)",
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily(
            "netval_mqtt_connected", "1 while connected to the broker", value=int(s.connected)
        )


class _ConfigCollector(Collector):
    def __init__(self, watcher: ConfigWatcher) -> None:
        self._watcher = watcher

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        w = self._watcher
        yield CounterMetricFamily(
            "netval_config_reloads", "Config updates applied", value=w.reloads
        )
        yield CounterMetricFamily(
            "netval_config_reload_failures",
            "Config updates rejected (the last good config stays in force)",
            value=w.failures,
        )
        yield GaugeMetricFamily(
            "netval_config_generation",
            "Generation of the config in force",
            value=w.current.generation,
        )
        yield GaugeMetricFamily(
            "netval_config_valid",
            "0 while the newest config file is rejected",
            value=int(w.last_error is None),
        )


class _SamplerCollector(Collector):
    def __init__(self, sampler: BoundedSampler) -> None:
        self._sampler = sampler

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._sampler
        yield CounterMetricFamily(
            "netval_collector_timeouts",
            "Cycles without a sample: a read missed its deadline or was still blocked",
            value=s.timeouts,
        )
        yield CounterMetricFamily(
            "netval_collector_errors", "Collector reads that raised", value=s.errors
        )
        yield GaugeMetricFamily(
            "netval_collector_blocked",
            "1 while a collector read is blocked past its deadline",
            value=int(s.blocked),
        )


class _EnrollCollector(Collector):
    def __init__(self, enroller: Enroller) -> None:
        self._enroller = enroller

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        e = self._enroller
        yield GaugeMetricFamily(
            "netval_enrolled",
            "1 while the agent holds a per-node MQTT credential that has not expired and that"
            " the broker did not refuse",
            value=int(e.enrolled()),
        )
        yield GaugeMetricFamily(
            "netval_enrolling", "1 while an enrollment (or its retries) is under way",
            value=int(e.enrolling),
        )  # fmt: skip
        yield CounterMetricFamily(
            "netval_enrollments", "Credentials obtained from the enrollment server",
            value=e.enrollments,
        )  # fmt: skip
        yield CounterMetricFamily(
            "netval_enrollment_failures", "Enrollment requests that gave no credential",
            value=e.failures,
        )  # fmt: skip


class _LoadCollector(Collector):
    def __init__(self, executor: LoadExecutor) -> None:
        self._executor = executor

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        e = self._executor
        s = e.stats
        for name, value, doc in (
            ("netval_agent_loadtest_plans_run", s.plans_run, "Load-test plans started"),
            ("netval_agent_loadtest_plans_aborted", s.plans_aborted,
             "Load-test plans stopped by an abort (or a cleared plan) before their end"),
            ("netval_agent_loadtest_engine_runs", s.engine_runs,
             "Engine processes started for load-test plans (flows, servers, latency probes)"),
            ("netval_agent_loadtest_engines_unavailable", s.engines_unavailable,
             "Load-test plans that needed an engine this node lacks (EngineUnavailable)"),
            ("netval_agent_loadtest_results_published", s.results_published,
             "Load-test results queued for the operator (one per plan)"),
        ):  # fmt: skip
            yield CounterMetricFamily(name, doc, value=value)
        refused = CounterMetricFamily(
            "netval_agent_loadtest_plans_refused",
            "Load-plan messages not run, by reason (invalid, not_mine, expired, repeated, old_term)",
            labels=["reason"],
        )
        for reason, n in sorted(e.intake.refused.items()):
            refused.add_metric([reason.value], n)
        yield refused
        yield GaugeMetricFamily(
            "netval_agent_loadtest_running", "1 while a load-test plan runs", value=int(e.busy())
        )


UNASSIGNED_DOMAIN: Final = "unassigned"  # peer_domain of peers whose domain is not known
_STATUSES: Final = tuple(Status)


def _state_set(
    name: str, doc: str, labels: list[str], current: Mapping[tuple[str, ...], Status]
) -> GaugeMetricFamily:
    """kube-state-metrics style: one series per possible status, 1 for the current one, so
    a status change moves a value instead of ending one series and starting another."""
    family = GaugeMetricFamily(name, doc, labels=[*labels, "status"])
    for key, status in current.items():
        for candidate in _STATUSES:
            family.add_metric([*key, candidate.value], int(candidate is status))
    return family


class _CheckStatusCollector(Collector):
    """The last report's statuses. Node and storage results by subject (netdevs, RDMA
    ports, endpoints: a handful, stable); peer results by peer domain, the worst per check
    and domain, and a count per status: peer subjects are node names that change every
    cycle, ~3,000 short-lived series per agent at 1,000 nodes."""

    def __init__(self) -> None:
        self.checks: dict[tuple[str, ...], Status] = {}
        self.peers: dict[tuple[str, ...], Status] = {}
        self.peer_counts: dict[tuple[str, ...], int] = {}

    def observe(self, results: Iterable[CheckResult]) -> None:
        checks: dict[tuple[str, ...], Status] = {}
        peers: dict[tuple[str, ...], Status] = {}
        counts: dict[tuple[str, ...], int] = {}
        for r in results:
            if r.check.group is CheckGroup.PEER:
                domain = r.observed.get("domain")
                key = (r.check.value, domain if isinstance(domain, str) and domain else
                       UNASSIGNED_DOMAIN)  # fmt: skip
                worst = peers.get(key)
                if worst is None or r.status.severity > worst.severity:
                    peers[key] = r.status
                counts[(*key, r.status.value)] = counts.get((*key, r.status.value), 0) + 1
            else:
                key = (r.check.value, r.subject)
                worst = checks.get(key)
                if worst is None or r.status.severity > worst.severity:
                    checks[key] = r.status
        # Replaced whole: a subject that disappeared must not keep its last status.
        self.checks, self.peers, self.peer_counts = checks, peers, counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield _state_set(
            "netval_check_status",
            "1 for the current status of each node or storage check and subject, 0 for the"
            " other statuses",
            ["check", "subject"],
            self.checks,
        )
        yield _state_set(
            "netval_peer_check_status",
            "1 for the worst status of each peer check over the peers of a domain, 0 for the"
            " other statuses",
            ["check", "peer_domain"],
            self.peers,
        )
        family = GaugeMetricFamily(
            "netval_peer_results",
            "Peers of a domain probed in the last cycle, by check and status",
            labels=["check", "peer_domain", "status"],
        )
        for key in self.peers:  # every status, 0 included: a fixed series set here too
            for candidate in _STATUSES:
                family.add_metric([*key, candidate.value], self.peer_counts.get(
                    (*key, candidate.value), 0))  # fmt: skip
        yield family


class AgentMetrics:
    def __init__(self, *, interval_seconds: float) -> None:
        self.registry = CollectorRegistry()
        self.interval_seconds = interval_seconds
        self.started = time.monotonic()
        self.last_cycle: float | None = None
        self.probe_duration = Histogram(
            "netval_probe_duration_seconds",
            "Duration of a probe cycle (collect, check, storage probes)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=self.registry,
        )
        self.cycles = Counter(
            "netval_probe_cycles", "Probe cycles by trigger", ["reason"], registry=self.registry
        )
        self.check_status = _CheckStatusCollector()
        self.registry.register(self.check_status)
        self.enroller: Enroller | None = None

    def attach_publisher(self, stats: Callable[[], PublisherStats]) -> None:
        self.registry.register(_PublisherCollector(stats))

    def attach_sampler(self, sampler: BoundedSampler) -> None:
        self.registry.register(_SamplerCollector(sampler))

    def attach_enroller(self, enroller: Enroller) -> None:
        self.enroller = enroller
        self.registry.register(_EnrollCollector(enroller))

    def attach_loadtest(self, executor: LoadExecutor) -> None:
        self.registry.register(_LoadCollector(executor))

    def cycles_start(self) -> None:
        """Probing starts now (after enrollment): the liveness clock starts with it."""
        self.started = time.monotonic()

    def attach_config(self, watcher: ConfigWatcher) -> None:
        self.registry.register(_ConfigCollector(watcher))

    def observe(self, report: Report, reason: str) -> None:
        self.last_cycle = time.monotonic()
        self.probe_duration.observe(report.duration_ms / 1000)
        self.cycles.labels(reason=reason).inc()
        self.check_status.observe(report.results)

    def enrolling(self) -> bool:
        """The first enrollment is under way: no cycle can run yet, and an enrollment server
        under load may take minutes to answer (Retry-After); that is alive, not stuck."""
        return self.enroller is not None and self.enroller.credential is None

    def healthy(self) -> bool:
        """Alive while enrolling for the first time, then while cycles keep completing:
        within 3 intervals of the last (or of the start of probing)."""
        if self.enrolling():
            return True
        reference = self.last_cycle if self.last_cycle is not None else self.started
        return time.monotonic() - reference < 3 * self.interval_seconds + 5


async def serve_agent_metrics(host: str, port: int, metrics: AgentMetrics) -> asyncio.Server:
    def healthy() -> tuple[bool, str]:
        ok = metrics.healthy()
        if metrics.enrolling():
            return ok, "enrolling"
        return ok, "ok" if ok else "no probe cycle completed recently"

    return await serve_metrics(host, port, metrics.registry, healthy)
