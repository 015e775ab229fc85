"""A restarted operator against the bundled broker as the chart renders it (its mosquitto.conf
with the per-client limits, ACL and passwords of the shared-login variant: the limits are what
is measured, the same with per-node certificates; run in a real Mosquitto by
tests/test_chart_broker.py's `run_chart_broker`) holding 10,000 nodes' retained reports:
the operator's real ingest gets every one back, and every node's newest report is folded
(counted node by node). With Mosquitto's default limits most of them were lost.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import mosquitto
from netval.infra.mqtt_settings import MqttSettings
from netval.model.spec import NetworkValidationSpec
from netval.operator.ingest.subscriber import ReportIngest
from netval.operator.state.store import Store
from operator_env import GPU, report, report_msg
from test_chart_broker import (
    BROKER_HOST,
    LIMITS_VARIANT,
    _agent_publisher,
    _broker_parts,
    _publish_all,
    rendered_ca,
    run_chart_broker,
)
from test_ingest_faults import until

NODES = 10_000
POOL = "pool-a"


def node(i: int) -> str:
    return f"gpu-{i:05d}"


def test_the_chart_limits_used_by_the_ingest_tests_are_the_rendered_ones() -> None:
    """tests/mosquitto.py's CHART_LIMITS (the burst and restart tests) = the chart's values."""
    conf = _broker_parts()[0]
    for line in mosquitto.CHART_LIMITS:
        assert f"\n{line}\n" in conf, line


def test_a_restarted_operator_folds_every_node_of_10000_retained(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    older, newest = now - timedelta(seconds=20), now - timedelta(seconds=10)
    with run_chart_broker(tmp_path, variant=LIMITS_VARIANT) as (port, secrets):
        agents = _agent_publisher(port, secrets["operator"])
        try:
            # a tenth of the agents reported twice: the broker retains only the newest
            msgs = [report_msg(report(node(i), started=older)) for i in range(NODES // 10)]
            msgs += [report_msg(report(node(i), started=newest)) for i in range(NODES)]
            _publish_all(agents, msgs, retain=True)
        finally:
            agents.disconnect()
            agents.loop_stop()

        store = Store(label_keys=GPU)
        for i in range(NODES):
            store.on_node(node(i), GPU)
        ca_file = tmp_path / "ca.crt"
        ca_file.write_text(rendered_ca())
        settings = MqttSettings(  # as the chart configures the operator: TLS, name verified
            host=BROKER_HOST,
            port=port,
            tls=True,
            username="netval-operator",
            password=secrets["operator"],
            ca_file=ca_file,
            client_id="netval-operator",
        )
        ingest = ReportIngest(
            settings,
            on_report=store.ingest_report,
            on_state=store.on_state,
            on_replayed=store.note_replay,
        )
        replay: dict[str, Any] = {}

        async def main() -> None:
            task = asyncio.create_task(ingest.run())
            started = time.monotonic()
            try:
                # a restart: the replay arrives before Kopf resumes the validation (parked)
                await until(ingest.synced.is_set, "the replay", limit=60)
                replay["seconds"] = time.monotonic() - started
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        asyncio.run(main())

    print(f"10,000 retained reports replayed and parked in {replay['seconds']:.2f} s")
    assert ingest.stats.reports == NODES and not ingest.stats.dropped
    assert len(store.pending) == NODES and not any(store.dropped.values())
    spec = NetworkValidationSpec.model_validate({"nodeSelector": GPU, "interval": "60s"})
    state = store.upsert_validation(POOL, generation=1, spec=spec, body={}, status=None)
    folded = [n for n, rec in state.nodes.items() if rec.started_at == newest]
    assert len(folded) == NODES and len(state.targeted) == NODES
    gap = store.replay_gap(POOL)
    assert gap is not None and not gap.missing
