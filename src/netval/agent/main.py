"""`netval agent`: wire settings, collector, publisher, link events, metrics and the loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
from collections.abc import Mapping

import aiomqtt
from opentelemetry.sdk.trace.export import SpanExporter

from netval.agent.collect.link_events import LinkWatcher
from netval.agent.collect.live import LiveCollector
from netval.agent.config import AgentConfig, AgentSettings
from netval.agent.config_watch import ConfigWatcher
from netval.agent.enroll import enroller_from_env
from netval.agent.loadtest.executor import LoadExecutor
from netval.agent.loadtest.rails import announced as announced_rails
from netval.agent.metrics import AgentMetrics, serve_agent_metrics
from netval.agent.peers.endpoints import interface_address
from netval.agent.peers.service import PeerService
from netval.agent.publish import ReportPublisher
from netval.agent.runner import ProbeRunner
from netval.agent.sampling import BoundedSampler
from netval.agent.storage.probe import StorageProber
from netval.agent.storage.slots import SlotReader
from netval.agent.topology.discovery import TopologyDiscovery
from netval.infra.telemetry import make_tracer_provider
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import TopicKind

log = logging.getLogger("netval.agent")


async def run_agent(
    settings: AgentSettings,
    *,
    env: Mapping[str, str] = os.environ,
    span_exporter: SpanExporter | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or `stop`); publish `offline` and exit cleanly."""
    spec = settings.config.spec
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    provider = make_tracer_provider(
        env,
        default_service="netval-agent",
        otlp_endpoint=spec.telemetry.otlp_endpoint,
        exporter=span_exporter,
        resource_attributes={"k8s.node.name": settings.node},
    )
    metrics = AgentMetrics(interval_seconds=spec.interval_seconds)
    server = None
    if settings.metrics_addr is not None:
        # Before enrolling: /healthz answers "enrolling" (alive) while the enrollment server
        # is busy or down, so the kubelet's liveness probe does not restart the agent into
        # the same queue.
        try:
            server = await serve_agent_metrics(*settings.metrics_addr, metrics)
            log.info("metrics on %s", [s.getsockname() for s in server.sockets])
        except OSError as exc:
            # Probing matters more than being scraped: run on without metrics.
            log.error("cannot serve metrics on %s: %s", settings.metrics_addr, exc)
    # per-node MQTT identity, if configured
    enroller = enroller_from_env(env, settings.node, settings.config.validation)
    if enroller is not None:
        metrics.attach_enroller(enroller)
        credential = await enroller.enroll_until(stop)
        if credential is None:
            if server is not None:
                server.close()
            return
        settings = dataclasses.replace(settings, mqtt=credential.apply(settings.mqtt))
    metrics.cycles_start()
    peers = (
        PeerService(validation=settings.config.validation, node=settings.node, spec=spec)
        if spec.checks.peers.enabled
        else None
    )
    # The operator's assignment carries this node's storage slot (and its peer domain).
    storage = StorageProber(SlotReader(settings.config.validation, settings.node))
    subscriptions = list(peers.subscriptions) if peers is not None else []
    if storage.slots.topic not in subscriptions:
        subscriptions.append(storage.slots.topic)
    load = _load_executor(settings.config.validation, settings.node, peers, spec)
    if load is not None:
        subscriptions.append(load.topic)
        metrics.attach_loadtest(load)
        storage.slots.paused = load.busy

    def on_message(message: aiomqtt.Message) -> None:
        storage.slots.on_message(message)
        if peers is not None:
            peers.on_message(message)
        if load is not None:
            load.on_message(message)

    publisher = ReportPublisher(
        settings.mqtt,
        settings.config.validation,
        settings.node,
        subscriptions=subscriptions,
        on_message=on_message,
        tracer=provider.get_tracer("netval.agent"),
        full_every=spec.report.full_every,
    )
    metrics.attach_publisher(publisher.stats)
    if load is not None:
        load.publish = lambda payload: publisher.publish_message(
            TopicKind.LOAD_RESULT.value, payload
        )
    collector = LiveCollector(interfaces=spec.checks.named_interfaces)
    sampler: BoundedSampler | None = None
    # opens its socket at the first cycle with spec.topology.lldp set (a reload may set it)
    topology = TopologyDiscovery(
        peer_addresses=(lambda: {n: e.address for n, e in peers.endpoints.items()})
        if peers is not None
        else None
    )
    tasks: list[asyncio.Task[None]] = []
    try:
        await publisher.start()
        if enroller is not None:
            tasks.append(asyncio.create_task(enroller.keep(publisher, stop), name="netval-enroll"))
        runner = ProbeRunner(
            config=settings.config,
            node=settings.node,
            collector=collector,
            sink=publisher,
            tracer_provider=provider,
            metrics=metrics,
            peers=peers,
            storage=storage,
            topology=topology,
        )
        sampler = runner.sampler
        if load is not None:
            runner.paused = load.busy
            load.spec = lambda: runner.config.spec  # a reload's endpoints count at once
            taken = sampler  # the newest sample (None before the first): rails, port rates
            load.sample = lambda: taken.latest
            if peers is not None:
                peers.announce_rails = lambda: announced_rails(
                    taken.latest, runner.config.spec.checks, interface_address
                )
        metrics.attach_sampler(sampler)
        # Before the baseline: the watcher learns the judged netdevs from it, so a carrier
        # change right after start is an event (not only after the first regular cycle).
        watcher = LinkWatcher(runner.on_link_change)
        runner.watcher = watcher
        await runner.take_baseline()
        if peers is not None:
            # The newest sample, never a read of its own: a blocked sysfs file must not
            # stall the loop the responder runs on.
            await peers.start(publisher.publish_retained, sampler.latest_source())
            tasks.append(asyncio.create_task(peers.run(stop), name="netval-peer-throughput"))
        tasks.append(
            asyncio.create_task(
                storage.slots.run(lambda: runner.config.spec, stop), name="netval-storage-slots"
            )
        )

        def apply_config(config: AgentConfig) -> None:
            runner.apply_config(config)
            publisher.full_every = config.spec.report.full_every

        config_watcher = ConfigWatcher(settings.config_path, settings.config, apply_config)
        metrics.attach_config(config_watcher)
        tasks += [
            asyncio.create_task(watcher.run(), name="netval-link-events"),
            asyncio.create_task(config_watcher.run(), name="netval-config-watch"),
        ]
        log.info(
            "agent for validation %s (generation %d) on node %s, interval %gs",
            settings.config.validation,
            settings.config.generation,
            settings.node,
            spec.interval_seconds,
        )
        await runner.run(stop)
    finally:
        for task in tasks:
            task.cancel()
        if load is not None:
            await load.close()
        if peers is not None:
            await peers.close()  # clears the retained endpoint before the publisher stops
        await publisher.stop()
        if server is not None:
            server.close()
        if sampler is not None:
            sampler.close()
        collector.close()
        topology.close()
        provider.shutdown()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _load_executor(
    validation: str, node: str, peers: PeerService | None, spec: NetworkValidationSpec
) -> LoadExecutor | None:
    """The load-test executor when this agent can run a plan's part: peers (flows, echoes)
    or storage endpoints (reads); None otherwise (nothing subscribes to its plans)."""
    if peers is None and not spec.checks.storage.endpoints:
        return None
    load = LoadExecutor(
        validation=validation,
        node=node,
        endpoints=(lambda: peers.endpoints) if peers is not None else dict,
        source=(lambda: peers.address) if peers is not None else lambda: None,
        spec=lambda: spec,
    )
    if peers is not None:
        peers.paused = load.busy
    return load
