"""A NetworkLoadTest through the real `netval operator` process (its env, a real broker, the
test API): test MQTT clients play the agents from their retained plans alone
(tests/loadtest_agents.py `answer_plans`), and the run lands in status and metrics."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from kube import KubeCluster, wait_for
from loadtest_agents import fake_agents
from mosquitto import MosquittoBroker
from operator_processes import OperatorProc
from test_loadtest_operator import FABRIC, POOL, _fleet, cond, loadtest, wait_netload


@pytest.fixture
def proc(cluster: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path):  # type: ignore[no-untyped-def]
    started = OperatorProc(cluster, mosquitto_broker, tmp_path, "op-load", standalone=True,
                           env={"NETVAL_LOADTEST_MAX_RATE_MBPS": "25000"}).start()  # fmt: skip
    yield started
    started.terminate()


def test_the_operator_process_runs_a_load_test(
    proc: OperatorProc, cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    _fleet(cluster, mosquitto_broker)
    with fake_agents(mosquitto_broker, POOL, FABRIC, expected=len(FABRIC.leaf_of)) as agents:
        cluster.create(loadtest("fabric-under-load"))
        done = wait_netload(cluster, "fabric-under-load",
                            lambda s: s.get("phase") in ("Succeeded", "Failed"),
                            f"the run finished\n{proc.log()[-3000:]}", timeout=90)  # fmt: skip
        assert done["phase"] == "Succeeded", done
        assert cond(done, "Passed")["reason"] == "ExpectationsMet"
        run = done["lastRun"]
        assert run["nodes"] == len(FABRIC.leaf_of)
        cells = {(c["a"], c["b"]): c for c in run["eastWest"]["cells"]}
        assert cells[("leaf-0", "leaf-1")]["oversubscription"] == pytest.approx(3.0, rel=0.02)
        assert cells[("leaf-1", "leaf-1")]["oversubscription"] == pytest.approx(1.0)
        # every plan carried the cluster's ceiling (the spec asked for no cap of its own)
        plans = [p for stage in agents.plans.values() for p in stage.values()]
        assert plans and {p.max_rate_mbps for p in plans} == {25_000.0}
        wait_for(lambda: agents.cleared >= set(FABRIC.leaf_of), timeout=30,
                 what="the plan topics cleared after the run")  # fmt: skip

    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'netval_loadtest_runs_total{phase="Succeeded"} 1.0' in text
    assert 'netval_loadtest_results_total{outcome="counted"}' in text
