"""The Events the operator posts about failure transitions, end to end: real Kopf, the
kmock Kubernetes API, a real Mosquitto broker; agents are MQTT clients publishing reports
(and, for one, holding the agent's last will); what is asserted is the Events POSTed."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from identity_kit import Mqtt
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.status import MAX_FAILURES
from netval.operator.term_runtime import OperatorRuntime
from operator_env import GPU, add_node, publish, report, report_msg, validation, wait_status
from test_operator import scrape

Operator = tuple[OperatorRuntime, InMemorySpanExporter]
# Node label writes are not what these tests are about, and 500 of them load the test API
NO_LABELS = {"nodeLabel": False}
SUMMARY = re.compile(
    r"^(\d+) more transitions not posted as events \(at most 10 per 3600 s\): (.*); the status"
)


def events(cluster: KubeCluster, reason: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.list("v1", "events", "default")
        if reason is None or e.get("reason") == reason
    ]


def about(cluster: KubeCluster, reason: str, node: str) -> list[dict[str, Any]]:
    return [e for e in events(cluster, reason) if e["message"].startswith(f"node {node} ")]


def test_a_failing_node_that_goes_offline_or_silent_is_node_stale_not_recovered(
    cluster: KubeCluster, operator: Operator, mosquitto_broker: MosquittoBroker
) -> None:
    b = mosquitto_broker
    # 5 s, the shortest interval: stale by time 15 s after a node's last report
    cluster.create(validation(interval="5s"))
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 4, "4 targeted")
    # gpu-b's agent holds its last will on its state topic, as the agent does
    agent = Mqtt(
        b.port,
        b.username,
        b.password,
        client_id="netval-gpu-b",
        will=("netval/v1/pool-a/gpu-b/state", b"offline"),
    )
    assert agent.connect().is_failure is False
    agent.publish("netval/v1/pool-a/gpu-b/state", b"online")
    topic, payload = report_msg(report("gpu-b", Status.FAIL))
    agent.publish(topic, payload)
    publish(b, [report_msg(report("gpu-a", Status.FAIL))])
    for node in ("gpu-a", "gpu-b"):
        wait_for(lambda n=node: about(cluster, "CheckFailing", n), what=f"{node} CheckFailing")

    # the agent dies (no DISCONNECT): the broker publishes its will
    agent.drop()
    (stale,) = wait_for(lambda: about(cluster, "NodeStale", "gpu-b"), what="gpu-b NodeStale")
    assert stale["type"] == "Warning" and stale["involvedObject"]["name"] == "pool-a"
    assert stale["message"] == (
        "node gpu-b is stale (offline) while failing mtu.interface: not judged until it"
        " reports again"
    )
    # gpu-a just stops reporting: stale by time
    (silent,) = wait_for(
        lambda: about(cluster, "NodeStale", "gpu-a"), timeout=60, what="gpu-a NodeStale"
    )
    age = re.match(r"node gpu-a is stale \(no report for (\d+)s\) while failing", silent["message"])
    assert age is not None and int(age.group(1)) >= 15, silent["message"]
    assert not events(cluster, "CheckRecovered")

    # gpu-b's agent is back and passes: now it has recovered
    publish(b, [report_msg(report("gpu-b"))])
    (recovered,) = wait_for(
        lambda: about(cluster, "CheckRecovered", "gpu-b"), what="gpu-b CheckRecovered"
    )
    assert recovered["type"] == "Normal"
    assert recovered["message"] == "node gpu-b passes mtu.interface again"
    assert not about(cluster, "CheckRecovered", "gpu-a")
    assert len(events(cluster, "NodeStale")) == 2
    agent.close()


def test_failures_past_the_status_cap_still_get_events(
    cluster: KubeCluster, operator: Operator, mosquitto_broker: MosquittoBroker
) -> None:
    runtime, _ = operator
    runtime.events.per_window = 1000  # the rate cap is not what this test is about
    extra = [f"gpu-x{i:03d}" for i in range(MAX_FAILURES + 10 - 4)]
    for node in extra:
        add_node(cluster, node, GPU)
    nodes = ["gpu-a", "gpu-b", "gpu-c", "gpu-d", *extra]
    cluster.create(validation(gating=NO_LABELS))
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == len(nodes), "targeted")

    publish(mosquitto_broker, [report_msg(report(n, Status.FAIL)) for n in nodes])
    status = wait_status(cluster, lambda s: s["nodes"]["failing"] == len(nodes), "all failing")
    assert len(status["failures"]) == MAX_FAILURES  # the status lists 50 of 60
    failing = wait_for(
        lambda: len(e := events(cluster, "CheckFailing")) == len(nodes) and e,
        what=f"{len(nodes)} CheckFailing events",
    )
    assert {e["message"].split()[1] for e in failing} == set(nodes)

    # and all 60 recover, each told
    publish(mosquitto_broker, [report_msg(report(n)) for n in nodes])
    recovered = wait_for(
        lambda: len(e := events(cluster, "CheckRecovered")) == len(nodes) and e,
        what=f"{len(nodes)} CheckRecovered events",
    )
    assert {e["message"].split()[1] for e in recovered} == set(nodes)
    assert not events(cluster, "EventsSuppressed")


def test_five_hundred_nodes_failing_at_once_give_ten_events_and_one_summary(
    cluster: KubeCluster, operator: Operator, mosquitto_broker: MosquittoBroker
) -> None:
    runtime, _ = operator
    # one window for the whole test (a loaded machine may take minutes), ended by the clock
    runtime.events.window = 3600.0
    skew = [0.0]
    clock = runtime.events.clock
    runtime.events.clock = lambda: clock() + skew[0]
    nodes = [f"gpu-y{i:03d}" for i in range(500)]
    for node in nodes:
        add_node(cluster, node, {"fleet": "y"})
    cluster.create(validation(nodeSelector={"fleet": "y"}, gating=NO_LABELS))
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 500, "500 targeted")

    publish(mosquitto_broker, [report_msg(report(n, Status.FAIL)) for n in nodes])
    wait_status(cluster, lambda s: s["nodes"]["failing"] == 500, "500 failing", timeout=60)
    metric = 'netval_operator_events_suppressed_total{reason="CheckFailing"} 490.0'
    wait_for(lambda: metric in scrape(runtime), what=metric)
    (summary,) = wait_for(lambda: events(cluster, "EventsSuppressed"), what="the summary")
    assert summary["type"] == "Warning" and summary["involvedObject"]["name"] == "pool-a"
    said = SUMMARY.match(summary["message"])
    assert said is not None, summary["message"]
    assert said.group(2) == f"{said.group(1)} CheckFailing"
    first = int(said.group(1))  # the overflow of the first status write that had failures
    wait_for(lambda: len(events(cluster, "CheckFailing")) == 10, what="10 CheckFailing")

    # a broker outage as the agents see it: every one's last will, all stale at once
    publish(mosquitto_broker, [(f"netval/v1/pool-a/{n}/state", b"offline") for n in nodes])
    wait_status(cluster, lambda s: s["nodes"]["stale"] == 500, "500 stale", timeout=60)
    metric = 'netval_operator_events_suppressed_total{reason="NodeStale"} 500.0'
    wait_for(lambda: metric in scrape(runtime), what=metric)
    # (500 failing trip the breaker, labels or not: it caps exclusions from admission too)
    assert Counter(e["reason"] for e in events(cluster)) == {
        "CheckFailing": 10,
        "EventsSuppressed": 1,
        "BreakerTripped": 1,
    }

    # the window ends: one more summary says what waited, without a new transition
    skew[0] = 3600.0
    late = wait_for(lambda: len(e := events(cluster, "EventsSuppressed")) == 2 and e, what="late")
    (message,) = [e["message"] for e in late if e["message"] != summary["message"]]
    said = SUMMARY.match(message)
    assert said is not None, message
    waited = [f"{490 - first} CheckFailing"] if first < 490 else []
    assert said.group(2) == ", ".join([*waited, "500 NodeStale"])
    assert int(said.group(1)) == 490 - first + 500
    assert len(events(cluster)) == 13


def test_a_deprecated_per_interval_field_gets_a_warning_event(
    cluster: KubeCluster, operator: Operator
) -> None:
    body = validation(interval="30s")
    body["spec"]["checks"] = {"rdma": {"maxErrorsPerInterval": 3}}
    cluster.create(body)
    (event,) = wait_for(lambda: events(cluster, "DeprecatedField"), what="DeprecatedField")
    assert event["type"] == "Warning"
    assert event["message"] == (
        "spec.checks.rdma.maxErrorsPerInterval is deprecated: read as maxRetryErrorsPerSecond "
        "0.1 (per interval 30s); set maxRetryErrorsPerSecond instead"
    )
