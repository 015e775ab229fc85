"""A NetworkLoadTest is safe for its whole length (the operator in process on the kmock
API, a real Mosquitto, test MQTT clients as agents, as tests/test_loadtest_operator.py):

- plans and aborts carry the leadership term (the agents' side of the fence is
  tests/test_loadtest_agent.py);
- a participant that turns busy mid-run gets a LoadAbort on its plan topic (agents have no
  API access: the operator re-checks them every stage) and is in no later stage, named in
  skippedNodes with the stage;
- `reserveNodes` taints the participants NoSchedule while the run goes, and the taint goes
  at the run's end, at its abort, and by the next operator's sweep after a failover.
"""

from __future__ import annotations

from typing import Any

import kopf

from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from loadtest_agents import fake_agents
from mosquitto import MosquittoBroker
from netval.model.keys import TaintKey
from netval.operator.term_runtime import OperatorRuntime
from operator_env import NV, add_node, settings_for
from test_loadtest_operator import (
    FABRIC,
    LEAF,
    POOL,
    _plan_of,
    _pod,
    loadtest,
    lt_operator,  # noqa: F401 - the fixture
    wait_netload,
)

TAINT = TaintKey.LOAD_TEST.value


def _taints(cluster: KubeCluster) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in FABRIC.leaf_of:
        for t in (cluster.get("v1", "nodes", node).get("spec") or {}).get("taints") or []:
            if t.get("key") == TAINT:
                assert t.get("effect") == "NoSchedule"
                out[node] = t.get("value", "")
    return out


def test_a_node_that_turns_busy_mid_run_is_aborted_and_leaves_the_next_stage(
    lt_operator: OperatorRuntime,  # noqa: F811 - the fixture
    cluster: KubeCluster,
    mosquitto_broker: MosquittoBroker,
) -> None:
    term = lt_operator.loadtests.term
    assert term > 0
    with fake_agents(mosquitto_broker, POOL, FABRIC, run_plan=_plan_of(lt_operator)) as agents:
        cluster.create(loadtest("busy-midway"))
        running = wait_netload(cluster, "busy-midway", lambda s: s.get("phase") == "Running",
                               "Running")  # fmt: skip
        run_id = running["lastRun"]["id"]
        wait_for(lambda: len(agents.plans.get((run_id, 0), {})) == 6, timeout=30,
                 what="the first stage's plans")  # fmt: skip
        assert {p.term for p in agents.plans[(run_id, 0)].values()} == {term}
        # a training job lands on a participant while the intra stage runs
        cluster.create(_pod("training", "node-1-02", {"limits": {"nvidia.com/gpu": "8"}}))
        abort = wait_for(lambda: agents.aborts.get("node-1-02"), timeout=40,
                         what="a LoadAbort on the busy node's plan topic")  # fmt: skip
        assert (abort.run, abort.term) == (run_id, term)
        assert "Busy" in abort.reason
        done = wait_netload(cluster, "busy-midway",
                            lambda s: s.get("phase") in ("Succeeded", "Failed"), "finished")  # fmt: skip
        later = agents.plans.get((run_id, 1), {})
        assert later and "node-1-02" not in later  # the cross stage went on without it
        assert {n for n in agents.aborts if agents.aborts[n].run == run_id} == {"node-1-02"}
    skipped = {(s["node"], s["reason"], s.get("stage")) for s in done["lastRun"]["skippedNodes"]}
    assert ("node-1-02", "Busy", 1) in skipped


def test_reserved_nodes_are_tainted_for_the_run_and_released_at_its_end_and_abort(
    lt_operator: OperatorRuntime,  # noqa: F811 - the fixture
    cluster: KubeCluster,
    mosquitto_broker: MosquittoBroker,
) -> None:
    with fake_agents(mosquitto_broker, POOL, FABRIC, run_plan=_plan_of(lt_operator)):
        cluster.create(loadtest("reserved", reserveNodes=True))
        running = wait_netload(cluster, "reserved", lambda s: s.get("phase") == "Running",
                               "Running")  # fmt: skip
        run_id = running["lastRun"]["id"]
        wait_for(lambda: _taints(cluster) == dict.fromkeys(FABRIC.leaf_of, run_id), timeout=30,
                 what="every participant tainted NoSchedule")  # fmt: skip
        done = wait_netload(cluster, "reserved", lambda s: "finishedAt" in s.get("lastRun", {}),
                            "finished")  # fmt: skip
        assert done["lastRun"]["reservedNodes"] == 6
        wait_for(lambda: not _taints(cluster), timeout=30, what="every taint removed")
    # an aborted run releases its nodes too
    with fake_agents(mosquitto_broker, POOL, FABRIC, answering=False):
        cluster.create(loadtest("reserved-long", reserveNodes=True, duration="300s"))
        wait_for(lambda: len(_taints(cluster)) == 6, timeout=30, what="tainted again")
        cluster.delete(NV, "networkloadtests", "reserved-long")
        wait_for(lambda: not _taints(cluster), timeout=30, what="released after the abort")


def _set_taint(cluster: KubeCluster, node: str, value: str) -> None:
    cluster.patch("v1", "nodes", node, {"spec": {"taints": [
        {"key": "other.io/keep", "value": "x", "effect": "NoSchedule"},
        {"key": TAINT, "value": value, "effect": "NoSchedule"},
    ]}})  # fmt: skip


def test_the_next_operator_removes_the_taints_of_a_run_it_lost(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    """A failover (or restart) mid-run: the new term cannot resume the run; its first sweep
    removes the run's taints, and only those (another owner's taint stays)."""
    for leaf, nodes in FABRIC.leaves.items():
        for node in nodes:
            add_node(cluster, node, {"netval.test/pool": POOL, LEAF: leaf})
    # what a previous leader left behind when it died mid-run
    for node in ("node-0-00", "node-1-01"):
        _set_taint(cluster, node, "an-old-run-20260101-000000")
    assert len(_taints(cluster)) == 2
    memo = kopf.Memo(settings=settings_for(mosquitto_broker))
    with kopf_operator(cluster, modules=["netval.operator.handlers"], memo=memo):
        runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="operator runtime")
        wait_for(lambda: runtime.loadtests.reservations.swept, timeout=30, what="the sweep")
        wait_for(lambda: not _taints(cluster), timeout=30, what="the old run's taints removed")

        def other(node: str) -> list[Any]:
            return [t for t in cluster.get("v1", "nodes", node)["spec"]["taints"]
                    if t["key"] == "other.io/keep"]  # fmt: skip

        assert other("node-0-00") and other("node-1-01")
