"""The agent's probe loop: a drift-free, jittered schedule plus out-of-cycle event probes.

Each cycle takes one sample and judges it against the previous one, so counter checks see
true per-interval deltas. A link event (carrier or MTU change on a judged interface)
triggers an extra probe, rate-limited so a flapping port cannot flood the broker; event
probes skip the storage probes (reusing the last results) so they publish within a second.
The report comes from `netval.agent.report`, the builder `netval probe` uses too.

Nothing in a cycle may keep its report from going out: samples are taken off the event loop
with a deadline (`netval.agent.sampling`; a read that misses it gives `error` results for the
node checks, naming where it is blocked), each check is isolated (one that raises gives an
`error` result naming it), and so are the storage and peer probes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, StatusCode
from opentelemetry.util.types import AttributeValue

from netval.agent.checks import NODE_CHECKS, GroupRunner, check_raised, run_node_checks
from netval.agent.collect.link_events import LinkState, LinkWatcher
from netval.agent.config import AgentConfig
from netval.agent.facts import node_facts
from netval.agent.metrics import AgentMetrics
from netval.agent.nics import node_nics
from netval.agent.peers.service import PeerService
from netval.agent.report import make_report
from netval.agent.sampling import BoundedSampler, Collector, SampleMissing, default_deadline
from netval.agent.storage.probe import StorageProber
from netval.agent.storage.slots import SlotReader
from netval.agent.topology.discovery import TopologyDiscovery
from netval.infra.telemetry import traceparent_of
from netval.model.ids import CheckGroup, CheckId, Status
from netval.model.results import CheckResult, Report, node_status
from netval.model.snapshot import NodeSnapshot, Sample
from netval.model.topology import TopologyReport

_KERNEL_RELEASE: Final = os.uname().release  # uname(2): no read, no fork

log = logging.getLogger("netval.agent")

EVENT_MIN_SPACING: Final = 1.0  # seconds between two event-triggered probes
LINK_LOG_EVERY: Final = 5.0
REASON_INTERVAL: Final = "interval"
REASON_LINK_EVENT: Final = "link-event"


class ReportSink(Protocol):
    async def publish(self, report: Report) -> None: ...


@dataclass(slots=True)
class _Previous:
    sample: Sample
    at: float


class ProbeRunner:
    def __init__(
        self,
        *,
        config: AgentConfig,
        node: str,
        collector: Collector,
        sink: ReportSink,
        tracer_provider: TracerProvider,
        metrics: AgentMetrics | None = None,
        watcher: LinkWatcher | None = None,
        event_min_spacing: float = EVENT_MIN_SPACING,
        storage_timeout: float = 5.0,
        rng: random.Random | None = None,
        peers: PeerService | None = None,
        sample_deadline: float | None = None,
        storage: StorageProber | None = None,
        topology: TopologyDiscovery | None = None,
    ) -> None:
        self.config = config
        self.node = node
        self.collector = collector
        self.sampler = BoundedSampler(
            collector,
            deadline=sample_deadline or default_deadline(config.spec.interval_seconds),
        )
        self.sink = sink
        self.metrics = metrics
        self.watcher = watcher
        self.tracer = tracer_provider.get_tracer("netval.agent")
        self.interval = config.spec.interval_seconds
        self.event_min_spacing = event_min_spacing
        self.storage_timeout = storage_timeout
        self._rng = rng or random.Random()  # noqa: S311 - start jitter, not crypto
        self._rescheduled = False
        self._trigger = asyncio.Event()
        self._previous: _Previous | None = None
        self._cycle = 0
        self._last_event_probe = float("-inf")
        self._storage: list[CheckResult] = []
        # its slot reader takes the operator's assignment and reads on its own task (main)
        self.storage = storage or StorageProber(
            SlotReader(config.validation, node, phase_timeout=storage_timeout)
        )
        self.peers = peers
        self._peer_results: list[CheckResult] = []
        self.reports = 0
        self._last_link_log: dict[str, float] = {}
        self.topology = topology
        # True while a load-test plan runs: peer and storage probes keep their last results
        self.paused: Callable[[], bool] = lambda: False

    def apply_config(self, config: AgentConfig) -> None:
        """Take a reloaded config: new checks at the next cycle, a new interval from now."""
        self.config = config
        set_interfaces = getattr(self.collector, "set_interfaces", None)
        if set_interfaces is not None:
            set_interfaces(config.spec.checks.named_interfaces)
        if config.spec.interval_seconds != self.interval:
            self.interval = config.spec.interval_seconds
            self._rescheduled = True
            self._trigger.set()  # wake the wait so the new schedule starts now

    def on_link_change(self, name: str, now: LinkState, before: LinkState | None) -> None:
        # A flapping port changes state many times a second: log it at most every few
        # seconds per interface (the reports carry the facts).
        at = time.monotonic()
        if at - self._last_link_log.get(name, float("-inf")) >= LINK_LOG_EVERY:
            self._last_link_log[name] = at
            log.info("link event on %s: %s -> %s", name, before, now)
        self._trigger.set()

    async def take_baseline(self) -> None:
        """The first sample, so the first cycle already judges deltas since the start."""
        if self._previous is None:
            taken = await self._take_sample()
            if not isinstance(taken, SampleMissing):
                self._previous = _Previous(*taken)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        await self.take_baseline()
        # Jitter the start so a thousand agents started together do not probe together.
        start = loop.time() + self._rng.uniform(0, self.interval)
        slot = 0
        while not stop.is_set():
            if self._rescheduled:
                self._rescheduled = False
                self._trigger.clear()
                start, slot = loop.time() + self.interval, 0
            deadline = start + slot * self.interval
            reason = await self._wait(deadline, stop)
            if self._rescheduled:
                continue
            if reason is None:
                break
            if reason == REASON_INTERVAL:
                # Drift-free: slots are fixed; a cycle that overran skips missed slots.
                while start + slot * self.interval <= loop.time():
                    slot += 1
            try:
                await self.probe_once(reason)
            except Exception:
                log.exception("probe cycle failed")

    async def _wait(self, deadline: float, stop: asyncio.Event) -> str | None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if stop.is_set():
                return None
            if now >= deadline:
                self._trigger.clear()  # this cycle covers pending events too
                return REASON_INTERVAL
            if self._rescheduled:
                return REASON_INTERVAL
            if self._trigger.is_set():
                earliest = self._last_event_probe + self.event_min_spacing
                if time.monotonic() >= earliest:
                    self._trigger.clear()
                    return REASON_LINK_EVENT
                wait_for = min(deadline - now, earliest - time.monotonic())
                await _first_of(stop.wait(), asyncio.sleep(max(wait_for, 0.0)))
                continue
            await _first_of(stop.wait(), self._trigger.wait(), asyncio.sleep(deadline - now))

    async def _take_sample(self) -> tuple[Sample, float] | SampleMissing:
        sample = await self.sampler.sample()
        if isinstance(sample, SampleMissing):
            log.warning("no sample this cycle: %s", sample.reason)
            return sample
        at = time.monotonic()
        if self.watcher is not None:
            self.watcher.remember(sample.netdevs)
        return sample, at

    async def probe_once(self, reason: str = REASON_INTERVAL) -> Report:
        started_at = datetime.now(UTC)
        t0 = time.perf_counter()
        spec = self.config.spec
        attrs: dict[str, AttributeValue] = {
            "netval.node": self.node,
            "netval.validation": self.config.validation,
            "netval.generation": self.config.generation,
            "netval.reason": reason,
        }
        with self.tracer.start_as_current_span("netval.probe_cycle", attributes=attrs) as cycle:
            with self.tracer.start_as_current_span("netval.collect", attributes=attrs) as span:
                await self.take_baseline()
                taken = await self._take_sample()
                if isinstance(taken, SampleMissing):
                    span.set_status(StatusCode.ERROR, taken.reason)
            topology = None
            if isinstance(taken, SampleMissing):
                # The baseline stays: the next sample's deltas span the missed cycles.
                results = self._not_sampled(taken)
            else:
                results = self._node_results(taken, started_at, attrs)
                topology = await self._topology(taken[0])
            fresh = reason == REASON_INTERVAL and not self.paused()
            if spec.checks.storage.endpoints:
                self._storage = await self._network_group(
                    "storage",
                    CheckId.STORAGE_REACHABLE,
                    attrs,
                    self._storage,
                    self._probe_storage,
                    fresh=fresh,
                )
                results.extend(self._storage)
            if self.peers is not None and spec.checks.peers.enabled:
                peers, cycle_no = self.peers, self._cycle
                self._peer_results = await self._network_group(
                    "peer",
                    CheckId.PEER_LATENCY,
                    attrs,
                    self._peer_results,
                    lambda: peers.probe_cycle(cycle_no, spec),
                    fresh=fresh,
                )
                results.extend(self._peer_results)
            report = make_report(
                validation=self.config.validation,
                generation=self.config.generation,
                node=self.node,
                started_at=started_at,
                duration_ms=(time.perf_counter() - t0) * 1000,
                results=results,
                traceparent=traceparent_of(cycle),
                # re-derived every cycle (a firmware update shows within one interval); the
                # operator does work only when they change
                facts=None
                if isinstance(taken, SampleMissing)
                else node_facts(taken[0], kernel_release=_KERNEL_RELEASE),
                topology=topology,
                nics=None if isinstance(taken, SampleMissing) else node_nics(taken[0]),
            )
            cycle.set_attribute("netval.status", report.status.value)
        if reason == REASON_LINK_EVENT:
            self._last_event_probe = time.monotonic()
        else:
            self._cycle += 1
        await self.sink.publish(report)
        self.reports += 1
        if self.metrics is not None:
            self.metrics.observe(report, reason)
        return report

    def _node_results(
        self, taken: tuple[Sample, float], started_at: datetime, attrs: dict[str, AttributeValue]
    ) -> list[CheckResult]:
        sample, at = taken
        previous = self._previous or _Previous(sample, at)
        self._previous = _Previous(sample, at)
        snapshot = NodeSnapshot(
            node=self.node,
            captured_at=started_at.isoformat(),
            interval_seconds=max(at - previous.at, 1e-6),
            samples=(previous.sample, sample),
        )
        return run_node_checks(
            snapshot, self.config.spec.checks, self._group_runner(attrs), on_raise=_log_raised
        )

    async def _topology(self, sample: Sample) -> TopologyReport | None:
        """The section when spec.topology.lldp or .paths asks for it; a failure costs the section,
        never the report."""
        topology = self.config.spec.topology
        if self.topology is None or not (topology.lldp or topology.paths):
            return None
        try:
            return await self.topology.section(sample, self.config.spec.checks, topology)
        except Exception:
            log.exception("topology discovery failed")
            return None

    def _not_sampled(self, missing: SampleMissing) -> list[CheckResult]:
        """One `error` per node check: nothing of this node could be read in time."""
        message = f"not judged: {missing.reason}"[:1024]
        return [
            CheckResult(check=c, subject=self.node, status=Status.ERROR, message=message)
            for c in NODE_CHECKS
        ]

    @contextmanager
    def _group_span(self, group: str, attrs: dict[str, AttributeValue]) -> Iterator[Span]:
        with self.tracer.start_as_current_span(
            f"netval.checks.{group}", attributes={**attrs, "netval.check_group": group}
        ) as span:
            yield span

    def _group_runner(self, attrs: dict[str, AttributeValue]) -> GroupRunner:
        def run(group: str, judge: Callable[[], list[CheckResult]]) -> list[CheckResult]:
            with self._group_span(group, attrs) as span:
                results = judge()
                _annotate(span, results)
            return results

        return run

    async def _network_group(
        self,
        group: str,
        check: CheckId,
        attrs: dict[str, AttributeValue],
        last: list[CheckResult],
        probe: Callable[[], Awaitable[list[CheckResult]]],
        *,
        fresh: bool,
    ) -> list[CheckResult]:
        """Storage or peer results: probed afresh on interval cycles (and when there are none
        yet), reused on event probes so those publish within a second. A probe that raises
        gives one `error` result (as `check`) instead of ending the cycle."""
        with self._group_span(group, attrs) as span:
            try:
                results = await probe() if fresh or not last else last
            except Exception as exc:
                _log_raised(check, exc)
                results = [check_raised(check, self.node, exc)]
            _annotate(span, results)
        return results

    async def _probe_storage(self) -> list[CheckResult]:
        spec = self.config.spec
        return await self.storage.probe(
            spec.checks.storage,
            interval_seconds=spec.interval_seconds,
            timeout=self.storage_timeout,
        )


def _log_raised(check: CheckId, exc: Exception) -> None:
    log.error("check %s raised", check.value, exc_info=exc)


def _annotate(span: Span, results: list[CheckResult]) -> None:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
        span.add_event(
            "netval.result",
            {
                "netval.check": r.check.value,
                "netval.subject": r.subject,
                "netval.status": r.status.value,
            },
        )
    for status, n in counts.items():
        span.set_attribute(f"netval.results.{status}", n)
    span.set_attribute("netval.status", node_status(results).value)


async def _first_of(*aws: object) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


__all__ = ["REASON_INTERVAL", "REASON_LINK_EVENT", "CheckGroup", "ProbeRunner"]
