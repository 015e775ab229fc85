"""`netval probe --output json` is exactly what agents publish: one report builder.

The CLI judges a bundled snapshot; the agent's runner judges the same two samples, handed to
it by a snapshot-backed collector on a clock that puts them the snapshot's interval apart,
and publishes over a real Mosquitto broker. Apart from the timing fields (startedAt,
durationMs, traceparent) the two JSON documents are the same: same keys, same results in the
same order, same messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import mosquitto
from netval.agent import report as report_builder
from netval.agent import runner as runner_module
from netval.agent.collect.snapshot_dir import load_snapshot
from netval.agent.config import AgentConfig
from netval.agent.publish import ReportPublisher
from netval.agent.runner import ProbeRunner
from netval.cli import main
from netval.infra.mqtt_client import make_client
from netval.infra.mqtt_settings import MqttSettings
from netval.infra.telemetry import make_tracer_provider
from netval.model.manifest import DEFAULT_VALIDATION_NAME
from netval.model.snapshot import NodeSnapshot, Sample
from netval.model.topics import topic_prefix

pytestmark = pytest.mark.timeout(60)

SNAPSHOTS = Path(__file__).resolve().parent.parent / "examples" / "snapshots"
TIMING = ("startedAt", "durationMs", "traceparent")


class SnapshotClock:
    """Stands in for the runner's `time` module: `monotonic()` is what the collector says."""

    perf_counter = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class SnapshotCollector:
    """The runner's Collector over a recorded snapshot: its samples in order, each one
    `interval_seconds` after the previous on `clock`."""

    def __init__(self, snapshot: NodeSnapshot, clock: SnapshotClock) -> None:
        self._samples = list(snapshot.samples)
        self._interval = snapshot.interval_seconds
        self._clock = clock
        self._taken = 0

    def sample(self) -> Sample:
        if self._taken:
            self._clock.now += self._interval
        sample = self._samples[self._taken]
        self._taken += 1
        return sample


def probe_json(snapshot_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(["probe", "--output", "json", "--from", str(snapshot_dir)])
    out = capsys.readouterr().out
    document: dict[str, Any] = json.loads(out)
    assert code == (1 if document["status"] in ("fail", "error") else 0)
    return document


async def published_json(
    broker: mosquitto.MosquittoBroker, snapshot: NodeSnapshot, clock: SnapshotClock
) -> dict[str, Any]:
    config = AgentConfig.model_validate(
        {"validation": DEFAULT_VALIDATION_NAME, "generation": 0, "spec": {"checks": {}}}
    )
    settings = MqttSettings(
        host=broker.host, port=broker.port, username=broker.username, password=broker.password
    )
    provider = make_tracer_provider({}, default_service="netval-agent")
    subscriber = make_client(settings, keepalive=60, timeout=5)
    prefix = topic_prefix(config.validation, snapshot.node)
    try:
        async with subscriber:
            await subscriber.subscribe(f"{prefix}/#", qos=1)
            messages = aiter(subscriber.messages)
            publisher = ReportPublisher(settings, config.validation, snapshot.node, timeout=3.0)
            async with publisher:
                # stop() sends the report only over a connection: wait for the agent's "online"
                online = await asyncio.wait_for(anext(messages), 5)
                assert str(online.topic) == f"{prefix}/state"
                runner = ProbeRunner(
                    config=config,
                    node=snapshot.node,
                    collector=SnapshotCollector(snapshot, clock),
                    sink=publisher,
                    tracer_provider=provider,
                )
                await runner.probe_once()
                message = await asyncio.wait_for(anext(messages), 5)
    finally:
        provider.shutdown()
    assert str(message.topic) == f"{prefix}/report"
    assert isinstance(message.payload, bytes)
    document: dict[str, Any] = json.loads(message.payload)
    return document


def test_the_runner_builds_its_report_with_the_shared_builder() -> None:
    assert runner_module.run_node_checks is report_builder.run_node_checks
    assert runner_module.make_report is report_builder.make_report


@pytest.mark.parametrize("name", ["healthy-roce", "fault-pause-storm"])
def test_probe_json_is_what_the_agent_publishes(
    name: str,
    mosquitto_broker: mosquitto.MosquittoBroker,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot_dir = SNAPSHOTS / name
    snapshot = load_snapshot(snapshot_dir)
    assert len(snapshot.samples) == 2  # the agent judges two samples: so must the snapshot

    probed = probe_json(snapshot_dir, capsys)
    clock = SnapshotClock()
    monkeypatch.setattr(runner_module, "time", clock)
    published = asyncio.run(published_json(mosquitto_broker, snapshot, clock))
    # the agent adds its own host's uname(2) release; a recorded snapshot has none of it
    assert published["facts"].pop("kernel_release") == os.uname().release

    assert list(published) == list(probed)  # same keys, in the same order
    assert [(r["check"], r["subject"]) for r in published["results"]] == [
        (r["check"], r["subject"]) for r in probed["results"]
    ]
    assert published["results"], "the snapshot yields results"
    assert {k: v for k, v in published.items() if k not in TIMING} == {
        k: v for k, v in probed.items() if k not in TIMING
    }
