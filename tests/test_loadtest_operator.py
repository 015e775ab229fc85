"""NetworkLoadTest through the operator (Kopf in-process, the kmock test API, a real
Mosquitto broker): test MQTT clients play the agents (tests/loadtest_agents.py) and answer
their retained plans with the results of a synthetic 3:1 fabric (tests/loadtest_fabric.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import aiomqtt
import kopf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from loadtest_agents import fake_agents
from loadtest_fabric import leaf_spine
from mosquitto import MosquittoBroker
from netval.model.loadplan import FlowResult, LoadResult, encode
from netval.operator.term_runtime import OperatorRuntime
from operator_env import NV, add_node, publish, report, report_msg, settings_for

POOL = "fabric"
LEAF = "netval.test/leaf"
CEILING = 10_000.0  # loadTests.maxRateMbps of these operators
FABRIC = leaf_spine(2, 3)  # 3 nodes per leaf, ports = uplink: 3:1 across leaves


def _validation(**checks: Any) -> dict[str, Any]:
    return {
        "apiVersion": NV,
        "kind": "NetworkValidation",
        "metadata": {"name": POOL},
        "spec": {
            "nodeSelector": {"netval.test/pool": POOL},
            "interval": "60s",
            "checks": {"peers": {"enabled": True, "topologyKey": LEAF}, **checks},
        },
    }


def loadtest(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": NV,
        "kind": "NetworkLoadTest",
        "metadata": {"name": name},
        "spec": {"validation": POOL, "duration": "5s", "phases": ["eastWest"], **spec},
    }


def netload(kube: KubeCluster, name: str) -> dict[str, Any]:
    return dict(kube.get(NV, "networkloadtests", name).get("status") or {})


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def wait_netload(
    kube: KubeCluster, name: str, pred: Any, what: str, timeout: float = 60
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = netload(kube, name)
        return status if status and pred(status) else None

    return wait_for(check, timeout=timeout, what=what)


def _fleet(kube: KubeCluster, broker: MosquittoBroker) -> None:
    """The fabric's nodes, targeted by the validation, each with a fresh report."""
    for leaf, nodes in FABRIC.leaves.items():
        for node in nodes:
            add_node(kube, node, {"netval.test/pool": POOL, LEAF: leaf})
    kube.create(_validation())
    publish(broker, [report_msg(report(n, validation_name=POOL)) for n in FABRIC.leaf_of])


@pytest.fixture
def lt_operator(
    request: pytest.FixtureRequest, cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> Iterator[OperatorRuntime]:
    base = settings_for(mosquitto_broker)
    memo = kopf.Memo(settings=dataclasses.replace(base, loadtest_max_rate_mbps=CEILING))
    expected = request.node.get_closest_marker("handler_errors_expected") is not None
    with kopf_operator(
        cluster,
        modules=["netval.operator.handlers"],
        memo=memo,
        fail_level=logging.CRITICAL if expected else logging.ERROR,
    ):
        runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="operator runtime")
        assert isinstance(runtime, OperatorRuntime)
        wait_for(lambda: runtime.ingest.synced.is_set(), timeout=30, what="MQTT ingest synced")
        _fleet(cluster, mosquitto_broker)
        wait_for(
            lambda: len(runtime.store.states.get(POOL, _Empty).nodes) == len(FABRIC.leaf_of),
            timeout=30,
            what="every node's report folded",
        )
        yield runtime


class _Empty:
    nodes: dict[str, Any] = {}


def _plan_of(runtime: OperatorRuntime) -> Any:
    def find(run_id: str) -> Any:
        run = runtime.loadtests.runs.get(POOL)
        return run.plan if run is not None and run.plan.run_id == run_id else None

    return find


def test_a_run_measures_oversubscription_and_one_run_per_validation_at_a_time(
    lt_operator: OperatorRuntime, cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    with fake_agents(mosquitto_broker, POOL, FABRIC, run_plan=_plan_of(lt_operator)) as agents:
        cluster.create(loadtest("first", expect={"maxOversubscription": 1.5}))
        wait_netload(cluster, "first", lambda s: s.get("phase") == "Running", "first Running")
        plan = lt_operator.loadtests.runs[POOL].plan
        assert plan.settings.max_rate_mbps == CEILING  # spec 0: the cluster's ceiling
        cluster.create(loadtest("second"))
        second = wait_netload(cluster, "second", lambda s: cond(s, "Complete").get("reason") == "Waiting",
                              "second Waiting")  # fmt: skip
        assert second["phase"] == "Pending"
        assert "first" in cond(second, "Complete")["message"]

        done = wait_netload(cluster, "first", lambda s: s.get("phase") == "Failed", "first Failed")
        run = done["lastRun"]
        assert cond(done, "Passed")["reason"] == "ExpectationsBreached"
        assert cond(done, "Complete") | {"status": "True"} == cond(done, "Complete")
        assert run["nodes"] == 6 and run["refusedFlows"] == 0 and not run["skippedNodes"]
        cells = {(c["a"], c["b"]): c for c in run["eastWest"]["cells"]}
        cross = cells[("leaf-0", "leaf-1")]
        assert cross["oversubscription"] == pytest.approx(3.0, rel=0.02)
        assert cells[("leaf-0", "leaf-0")]["oversubscription"] == pytest.approx(1.0)
        assert cross["loadedLatencyP99Ms"] > cross["idleLatencyP99Ms"]
        assert run["maxOversubscription"] == pytest.approx(3.0, rel=0.02)
        assert run["breaches"][0]["expectation"] == "maxOversubscription"
        # the first run's plan topics are cleared; then the second test runs
        wait_for(lambda: agents.cleared >= set(FABRIC.leaf_of), timeout=30, what="plans cleared")
        wait_netload(cluster, "second", lambda s: s.get("phase") == "Running", "second Running")

        # deleting a test aborts its run: every participant's plan becomes a LoadAbort
        run_id = netload(cluster, "second")["lastRun"]["id"]
        agents.answering = False
        cluster.delete(NV, "networkloadtests", "second")
        wait_for(lambda: {n for n, a in agents.aborts.items() if a.run == run_id} >= set(FABRIC.leaf_of),
                 timeout=30, what="LoadAbort on every plan topic")  # fmt: skip
        assert not lt_operator.loadtests.runs
        # no finalizer: the test is gone at once, with or without an operator
        assert not cluster.stored(NV, "networkloadtests", "second")

    text = _metrics(lt_operator)
    assert 'netval_loadtest_max_oversubscription{test="first"}' in text
    assert 'netval_loadtest_runs_total{phase="Failed"}' in text


def _metrics(runtime: OperatorRuntime) -> str:
    from prometheus_client import generate_latest

    from netval.operator.metrics import operator_registry

    return generate_latest(operator_registry(runtime)).decode()


@pytest.mark.handler_errors_expected
def test_bad_specs_fail_naming_the_field(
    lt_operator: OperatorRuntime, cluster: KubeCluster
) -> None:
    cluster.create(loadtest("nowhere", validation="no-such-pool"))
    cluster.create(loadtest("no-endpoint", phases=["storage"], storage={"endpoints": ["nope"]}))
    cluster.create(loadtest("too-fast", maxRateMbps=50_000))
    cases = {
        "nowhere": ("ValidationNotFound", "spec.validation:"),
        "no-endpoint": ("InvalidSpec", "spec.storage.endpoints:"),
        "too-fast": ("InvalidSpec", "spec.maxRateMbps:"),
    }
    for name, (reason, field) in cases.items():
        status = wait_netload(cluster, name, lambda s: s.get("phase") == "Failed", f"{name} Failed")
        complete = cond(status, "Complete")
        assert complete["status"] == "True" and complete["reason"] == reason, status
        assert complete["message"].startswith(field), complete["message"]
        assert cond(status, "Passed")["status"] == "False"
        assert complete["observedGeneration"] == 1
    assert not lt_operator.loadtests.runs


_TIME = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_NAME = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
_HOSTILE = st.builds(
    lambda **kw: LoadResult(**kw),  # only these fields (builds would infer the aliases too)
    run=_NAME,
    stage=st.integers(0, 100_000),
    validation=st.just(POOL) | _NAME,
    node=st.sampled_from(sorted(FABRIC.leaf_of)) | _NAME,
    sent_at=_TIME,
    flows=st.lists(
        st.builds(
            lambda **kw: FlowResult(**kw),
            window=st.sampled_from(["r0:intra", "r1:cross", "r0:idle", "x"]),
            peer=st.sampled_from(sorted(FABRIC.leaf_of)),
            bytes=st.integers(0, 2**62),
            start=st.just(datetime(2030, 1, 1, tzinfo=UTC)),
            end=st.just(datetime(2030, 1, 1, 0, 0, 5, tzinfo=UTC)),
        ),
        max_size=4,
    ),
)
_GARBAGE = st.one_of(
    st.binary(max_size=300),
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    ).map(lambda v: json.dumps(v).encode()),
)


def test_garbage_and_hostile_results_are_counted_never_fatal(
    lt_operator: OperatorRuntime, cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    # a long run that nobody answers: every message is decoded and judged against it
    cluster.create(loadtest("soak", duration="300s"))
    wait_netload(cluster, "soak", lambda s: s.get("phase") == "Running", "soak Running")
    run_id = lt_operator.loadtests.runs[POOL].plan.run_id
    lt = lt_operator.loadtests
    sent = 0

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        garbage=st.lists(_GARBAGE, max_size=4),
        hostile=st.lists(_HOSTILE, max_size=3),
        node=st.sampled_from(sorted(FABRIC.leaf_of)),
        own_run=st.booleans(),
    )
    def publish_some(
        garbage: list[bytes], hostile: list[LoadResult], node: str, own_run: bool
    ) -> None:
        nonlocal sent
        messages = [(f"netval/v1/{POOL}/{node}/loadresult", p) for p in garbage]
        for r in hostile:
            if own_run:
                r = r.model_copy(update={"run": run_id, "stage": 0})
            messages.append((f"netval/v1/{POOL}/{node}/loadresult", encode(r)))
        _send(mosquitto_broker, messages)
        sent += len(messages)

    publish_some()
    wait_for(lambda: sum(lt.results.values()) >= sent, timeout=30,
             what=f"{sent} loadresult messages counted: {dict(lt.results)}")  # fmt: skip
    assert lt.results["invalid"] > 0
    assert lt_operator.loadtests.runs[POOL].plan.run_id == run_id  # the run goes on
    assert lt_operator.ingest.stats.connected
    cluster.delete(NV, "networkloadtests", "soak")
    wait_for(lambda: not lt.runs, timeout=30, what="the soak run aborted")


def _send(broker: MosquittoBroker, messages: list[tuple[str, bytes]]) -> None:
    async def main() -> None:
        async with aiomqtt.Client(
            broker.host, broker.port, username=broker.username, password=broker.password
        ) as client:
            for name, payload in messages:
                await client.publish(name, payload, qos=1)

    asyncio.run(main())


def test_deleting_the_validation_aborts_its_run(
    lt_operator: OperatorRuntime, cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    with fake_agents(mosquitto_broker, POOL, FABRIC, answering=False) as agents:
        cluster.create(loadtest("long", duration="300s"))
        running = wait_netload(cluster, "long", lambda s: s.get("phase") == "Running", "Running")
        run_id = running["lastRun"]["id"]
        wait_for(lambda: len(agents.plans.get((run_id, 0), {})) == len(FABRIC.leaf_of),
                 timeout=30, what="every node's plan of the first stage")  # fmt: skip
        cluster.delete(NV, "networkvalidations", POOL)
        aborted = wait_netload(cluster, "long", lambda s: s.get("phase") == "Failed", "Aborted")
        assert cond(aborted, "Complete")["reason"] == "Aborted"
        assert f"NetworkValidation {POOL!r} deleted" in cond(aborted, "Complete")["message"]
        assert aborted["lastRun"]["finishedAt"]
        # the retained plans were replaced (not just cleared): an agent that reconnects
        # reads the abort
        wait_for(lambda: {n for n, a in agents.aborts.items() if a.run == run_id}
                 >= set(FABRIC.leaf_of), timeout=30, what="LoadAbort on every plan topic")  # fmt: skip
    assert not lt_operator.loadtests.runs


def test_a_run_lost_to_an_operator_restart_is_aborted_by_the_next_one(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    memo = kopf.Memo(settings=settings_for(mosquitto_broker))
    with fake_agents(mosquitto_broker, POOL, FABRIC, answering=False) as agents:
        with kopf_operator(cluster, modules=["netval.operator.handlers"], memo=memo):
            runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="operator runtime")
            wait_for(lambda: runtime.ingest.synced.is_set(), timeout=30, what="synced")
            _fleet(cluster, mosquitto_broker)
            wait_for(lambda: len(runtime.store.states.get(POOL, _Empty).nodes) == 6,
                     timeout=30, what="reports folded")  # fmt: skip
            cluster.create(loadtest("across-restart", duration="300s"))
            running = wait_netload(cluster, "across-restart",
                                   lambda s: s.get("phase") == "Running", "Running")  # fmt: skip
            run_id = running["lastRun"]["id"]
            wait_for(lambda: len(agents.plans.get((run_id, 0), {})) == 6, timeout=30,
                     what="the first stage's plans")  # fmt: skip
        # the next term (a restart, a failover) finds the test Running: nobody folds it now
        memo = kopf.Memo(settings=settings_for(mosquitto_broker))
        with kopf_operator(cluster, modules=["netval.operator.handlers"], memo=memo):
            status = wait_netload(cluster, "across-restart",
                                  lambda s: s.get("phase") == "Failed", "Aborted")  # fmt: skip
            assert cond(status, "Complete")["reason"] == "Aborted"
            assert "restarted" in cond(status, "Complete")["message"]
            assert status["lastRun"]["id"] == run_id and status["lastRun"]["finishedAt"]
            wait_for(lambda: {n for n, a in agents.aborts.items() if a.run == run_id}
                     >= set(FABRIC.leaf_of), timeout=30, what="LoadAbort to every node")  # fmt: skip
            runtime = memo["runtime"]
            assert not runtime.loadtests.runs  # a one-shot test: no new run


def _pod(name: str, node: str, resources: dict[str, Any]) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", "resources": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [container]},
    }


def test_busy_nodes_are_skipped_and_a_scheduled_test_says_when_it_runs(
    lt_operator: OperatorRuntime, cluster: KubeCluster
) -> None:
    gpu = {"limits": {"nvidia.com/gpu": "8"}}
    cluster.create(_pod("training", "node-0-00", gpu))
    cluster.create(_pod("finished", "node-1-00", gpu))
    # the API ignores status on create: the pod finishes through its status subresource
    cluster.patch("v1", "pods", "finished", {"status": {"phase": "Succeeded"}}, "default",
                  subresource="status")  # fmt: skip
    cluster.create(_pod("cpu-only", "node-1-01", {"requests": {"cpu": "2"}}))
    cluster.create(loadtest("now"))
    running = wait_netload(cluster, "now", lambda s: s.get("phase") == "Running", "Running")
    assert running["lastRun"]["skippedCount"] == 1
    plan = lt_operator.loadtests.runs[POOL].plan
    assert [(n, r.value) for n, r in plan.skipped] == [("node-0-00", "Busy")]
    assert "node-1-00" in plan.domain_of and "node-1-01" in plan.domain_of
    cluster.delete(NV, "networkloadtests", "now")
    wait_for(lambda: not lt_operator.loadtests.runs, timeout=30, what="the run aborted")

    cluster.create(loadtest("yearly", schedule="0 0 1 1 *"))
    status = wait_netload(cluster, "yearly", lambda s: s.get("nextRunAt"), "nextRunAt")
    assert status["phase"] == "Pending"
    assert cond(status, "Complete")["reason"] == "Waiting"
    assert status["nextRunAt"].startswith(f"{datetime.now(UTC).year + 1}-01-01T00:00:00")
