"""The agent's Prometheus metrics and health, served by netval.infra.metrics_server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from netval.agent.config_watch import ConfigWatcher
from netval.agent.publish import PublisherStats
from netval.agent.sampling import BoundedSampler
from netval.infra.metrics_server import serve_metrics
from netval.model.results import Report


class _PublisherCollector(Collector):
    def __init__(self, stats: Callable[[], PublisherStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._stats()
        for name, value, doc in (
            ("netval_reports_published", s.published, "Reports acknowledged by the broker"),
            ("netval_publish_failures", s.publish_failures, "Report publishes that failed"),
            ("netval_reports_replaced", s.replaced, "Unsent reports replaced by newer ones"),
            ("netval_mqtt_reconnects", s.reconnects, "MQTT reconnection attempts"),
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
        self.check_status = Gauge(
            "netval_check_status",
            "1 for the current status of each check and subject",
            ["check", "subject", "status"],
            registry=self.registry,
        )

    def attach_publisher(self, stats: Callable[[], PublisherStats]) -> None:
        self.registry.register(_PublisherCollector(stats))

    def attach_sampler(self, sampler: BoundedSampler) -> None:
        self.registry.register(_SamplerCollector(sampler))

    def attach_config(self, watcher: ConfigWatcher) -> None:
        self.registry.register(_ConfigCollector(watcher))

    def observe(self, report: Report, reason: str) -> None:
        self.last_cycle = time.monotonic()
        self.probe_duration.observe(report.duration_ms / 1000)
        self.cycles.labels(reason=reason).inc()
        # Replace the series: a subject that disappeared must not keep its last status.
        self.check_status.clear()
        for r in report.results:
            self.check_status.labels(
                check=r.check.value, subject=r.subject, status=r.status.value
            ).set(1)

    def healthy(self) -> bool:
        """Alive while cycles keep completing: within 3 intervals of the last (or of start)."""
        reference = self.last_cycle if self.last_cycle is not None else self.started
        return time.monotonic() - reference < 3 * self.interval_seconds + 5


async def serve_agent_metrics(host: str, port: int, metrics: AgentMetrics) -> asyncio.Server:
    def healthy() -> tuple[bool, str]:
        ok = metrics.healthy()
        return ok, "ok" if ok else "no probe cycle completed recently"

    return await serve_metrics(host, port, metrics.registry, healthy)
