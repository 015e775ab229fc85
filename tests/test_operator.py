"""The operator end to end: real Kopf, a stateful Kubernetes API over HTTP, a real broker.

Agent reports are published as real MQTT messages; everything the operator does is observed
through the Kubernetes API, as `kubectl` would see it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import aiomqtt
import kopf
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.keys import AnnotationKey
from netval.operator.agents import manifests
from netval.operator.term_runtime import OperatorRuntime
from operator_env import (
    GPU,
    NODES,
    NS,
    NV,
    TRACE_ID,
    TRACEPARENT,
    add_node,
    condition,
    publish,
    report,
    report_msg,
    settings_for,
    state_msg,
    validation,
    wait_status,
)
from test_east_west import latency, loss, path_mtu, throughput


def test_create_renders_agents_exactly(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    runtime, _ = operator
    cluster.create(validation(tolerations=[{"operator": "Exists"}]))
    name = manifests.agent_object_name("pool-a")
    ds = wait_for(lambda: cluster.stored("apps/v1", "daemonsets", name, NS), what="DaemonSet")
    cm = cluster.get("v1", "configmaps", name, NS)
    nv = cluster.get(NV, "networkvalidations", "pool-a")
    from netval.model.spec import NetworkValidationSpec

    spec = NetworkValidationSpec.model_validate(nv["spec"])
    owner = {"apiVersion": NV, "kind": "NetworkValidation", "name": "pool-a",
             "uid": nv["metadata"]["uid"]}  # fmt: skip
    want_cm = manifests.render_configmap("pool-a", 1, spec, namespace=NS, owner=owner)
    assert cm["data"] == want_cm["data"]
    assert cm["metadata"]["ownerReferences"] == want_cm["metadata"]["ownerReferences"]
    s = runtime.settings
    want_ds = manifests.render_daemonset(
        "pool-a", 1, spec, namespace=NS, owner=owner, image=s.agent_image,
        mqtt=manifests.AgentMqttWiring(url=s.agent_mqtt_url, username=s.agent_mqtt_username,
                                       password_secret=s.agent_mqtt_secret, ca_secret=None),
        restart_hash=manifests.restart_hash("pool-a", spec),
        metrics_port=manifests.metrics_port_for("pool-a"),
    )  # fmt: skip
    assert ds["spec"] == want_ds["spec"]
    pod = ds["spec"]["template"]["spec"]
    # two validations on one node must not share the agents' host port
    port = pod["containers"][0]["ports"][0]["containerPort"]
    assert port == manifests.metrics_port_for("pool-a") != manifests.metrics_port_for("pool-b")
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert pod["nodeSelector"] == GPU
    assert pod["hostNetwork"] is True
    assert {"operator": "Exists"} in pod["tolerations"]


def test_status_follows_agent_reports(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, exporter = operator
    cluster.create(validation())
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 4, "4 targeted nodes")

    # 3 of 4 targeted nodes report
    publish(mosquitto_broker, [report_msg(report(n)) for n in NODES[:3]])
    status = wait_status(cluster, lambda s: s["nodes"]["reporting"] == 3, "3 reporting")
    assert status["nodes"] == {"targeted": 4, "reporting": 3, "passing": 3, "warning": 0,
                               "failing": 0, "stale": 1, "excluded": 0,
                               "admissible": 3}  # fmt: skip
    ready = condition(status, "Ready")
    assert ready is not None and ready["status"] == "False"
    assert "gpu-d" in ready["message"]
    assert ready["observedGeneration"] == 1
    assert condition(status, "Healthy")["status"] == "True"  # type: ignore[index]

    # one node starts failing; its trace is continued by the operator
    publish(mosquitto_broker, [report_msg(report("gpu-b", Status.FAIL, traceparent=TRACEPARENT))])
    status = wait_status(cluster, lambda s: s["nodes"]["failing"] == 1, "gpu-b failing")
    healthy = condition(status, "Healthy")
    assert healthy is not None
    assert (healthy["status"], healthy["reason"]) == ("False", "ChecksFailing")
    assert "gpu-b" in healthy["message"] and "mtu.interface" in healthy["message"]
    (failure,) = status["failures"]
    assert failure["node"] == "gpu-b" and failure["check"] == "mtu.interface"
    assert failure["subject"] == "ens1np0" and "MTU 1500" in failure["message"]
    assert status["checks"]["mtu.interface"] == {"pass": 2, "warn": 0, "fail": 1}
    ingest = [s for s in exporter.get_finished_spans() if s.name == "netval.ingest"]
    continued = [s for s in ingest if format(s.context.trace_id, "032x") == TRACE_ID]
    assert continued, "the ingest span continues the agent's trace"
    assert continued[0].parent is not None

    # an Event tells `kubectl describe` readers
    events = wait_for(
        lambda: [e for e in cluster.list("v1", "events", "default")
                 if e.get("reason") == "CheckFailing"],
        what="CheckFailing event",
    )  # fmt: skip
    assert "gpu-b" in events[0]["message"]
    assert events[0]["involvedObject"]["name"] == "pool-a"

    # the fourth node reports and the failing one recovers: Ready and Healthy
    publish(mosquitto_broker, [report_msg(report("gpu-d")), report_msg(report("gpu-b"))])
    status = wait_status(
        cluster,
        lambda s: (
            condition(s, "Ready")["status"] == "True"  # type: ignore[index]
            and condition(s, "Healthy")["status"] == "True"
        ),  # type: ignore[index]
        "Ready and Healthy",
    )
    assert condition(status, "Ready")["reason"] == "AgentsReporting"  # type: ignore[index]
    assert status["failures"] == []
    assert status["lastReportTime"]

    # offline (the last will): stale at once
    publish(mosquitto_broker, [state_msg("gpu-c", b"offline")])
    status = wait_status(cluster, lambda s: s["nodes"]["stale"] == 1, "gpu-c stale")
    assert "gpu-c" in condition(status, "Ready")["message"]  # type: ignore[index]
    del runtime


def test_bad_payloads_are_dropped_and_counted(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, _ = operator
    cluster.create(validation())
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 4, "targeted")
    impostor = report("gpu-a", Status.FAIL)  # claims gpu-a, published on gpu-b's topic
    publish(
        mosquitto_broker,
        [
            ("netval/v1/pool-a/gpu-c/report", b"{not json"),
            ("netval/v1/pool-a/gpu-c/report", b"\xff\xfe"),
            (
                "netval/v1/pool-a/gpu-c/report",
                json.dumps({"schema": "netval.io/report/v1"}).encode(),
            ),
            ("netval/v1/pool-a/gpu-b/report", impostor.to_json().encode()),
            ("netval/v1/pool-a/gpu-c/state", b"maybe"),
            ("netval/v1/pool-a/gpu-d/report", b"{" + b" " * (1 << 20) + b"}"),
            report_msg(report("gpu-a")),
        ],
    )
    status = wait_status(cluster, lambda s: s["nodes"]["reporting"] == 1, "the good report")
    assert status["nodes"]["failing"] == 0  # the impostor's failure did not land
    dropped = {reason.value: n for reason, n in runtime.ingest.stats.dropped.items()}
    assert dropped == {"invalid_report": 2, "not_utf8": 1, "node_mismatch": 1, "bad_state": 1,
                       "too_large": 1}  # fmt: skip
    # the counts are exported for alerting
    metrics = scrape(runtime)
    assert 'netval_operator_messages_dropped_total{reason="node_mismatch"} 1.0' in metrics
    assert 'netval_operator_messages_dropped_total{reason="too_large"} 1.0' in metrics
    assert 'netval_operator_nodes{state="reporting",validation="pool-a"} 1.0' in metrics


def scrape(runtime: OperatorRuntime) -> str:
    import urllib.request

    server = runtime_memo_server(runtime)
    host, port = server.sockets[0].getsockname()[:2]
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def runtime_memo_server(runtime: OperatorRuntime) -> Any:
    server = getattr(runtime, "metrics_server", None)
    assert server is not None, "the operator serves metrics"
    return server


def test_status_writes_are_coalesced(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, _ = operator
    cluster.create(validation())
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 4, "targeted")
    writes_before = runtime.status.writes
    base = datetime.now(UTC)
    burst = [
        report_msg(report(NODES[i % 4], started=base + timedelta(milliseconds=i)))
        for i in range(40)
    ]
    publish(mosquitto_broker, burst)
    wait_status(cluster, lambda s: s["nodes"]["reporting"] == 4, "all reporting")
    status_patches = [
        (m, p) for m, p in cluster.requests() if m == "PATCH" and p.endswith("pool-a/status")
    ]
    # 40 reports within a fraction of a second: a handful of windows, not 40 writes
    assert runtime.status.writes - writes_before <= 5
    assert len(status_patches) <= runtime.status.writes + 1


def _templates(cluster: KubeCluster, name: str) -> list[dict[str, Any]]:
    """Every pod template the DaemonSet has had, in order, without repeats."""
    out: list[dict[str, Any]] = []
    for version in cluster.history("apps/v1", "daemonsets", name, NS):
        if version is not None and (not out or version["spec"]["template"] != out[-1]):
            out.append(version["spec"]["template"])
    return out


@pytest.mark.handler_errors_expected
def test_spec_update_rolls_agents_only_when_the_pod_changes_and_invalid_spec_is_reported(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    cluster.create(validation())
    name = manifests.agent_object_name("pool-a")
    ds = wait_for(lambda: cluster.stored("apps/v1", "daemonsets", name, NS), what="DaemonSet")
    template = ds["spec"]["template"]
    hash1 = template["metadata"]["annotations"][AnnotationKey.RESTART_HASH]

    # The interval and a check threshold: the agents reload their ConfigMap, no roll.
    cluster.patch(
        NV,
        "networkvalidations",
        "pool-a",
        {"spec": {"interval": "10s", "checks": {"pfc": {"maxPausePercent": 25}}}},
    )
    wait_for(
        lambda: (
            (d := cluster.stored("apps/v1", "daemonsets", name, NS))
            and d["metadata"]["annotations"][AnnotationKey.GENERATION] == "2"
        ),
        what="DaemonSet of generation 2",
    )
    cm = cluster.get("v1", "configmaps", name, NS)
    assert "interval: 10s" in cm["data"][manifests.AGENT_CONFIG_KEY]
    assert "maxPausePercent: 25" in cm["data"][manifests.AGENT_CONFIG_KEY]
    assert _templates(cluster, name) == [template]
    wait_status(cluster, lambda s: s.get("observedGeneration") == 2, "observedGeneration 2")
    # once an agent reports generation 2, reports of generation 1 are ignored
    base = datetime.now(UTC)
    publish(mosquitto_broker, [report_msg(report("gpu-a", generation=2, started=base))])
    wait_status(cluster, lambda s: s["nodes"]["reporting"] == 1, "generation 2 report")
    late = report("gpu-b", Status.FAIL, generation=1, started=base + timedelta(seconds=1))
    publish(mosquitto_broker, [report_msg(late), report_msg(report("gpu-c", generation=2))])
    status = wait_status(cluster, lambda s: s["nodes"]["reporting"] == 2, "gpu-c reporting")
    assert status["nodes"]["failing"] == 0 and status["failures"] == []

    # kmock does not enforce the CRD schema, so the operator's own validation is what answers
    cluster.patch(
        NV, "networkvalidations", "pool-a", {"spec": {"checks": {"pfc": {"priorities": [9]}}}}
    )
    status = wait_status(
        cluster,
        lambda s: (c := condition(s, "Ready")) is not None and c["reason"] == "InvalidSpec",
        "InvalidSpec",
    )
    ready = condition(status, "Ready")
    assert ready is not None and "spec.checks.pfc.priorities.0" in ready["message"]
    assert ready["observedGeneration"] == 3
    # the agents keep the last good rendering
    assert _templates(cluster, name) == [template]

    # What the pod runs (the peer responder binds peers.interface at start): it rolls.
    cluster.patch(
        NV,
        "networkvalidations",
        "pool-a",
        {"spec": {"checks": {"pfc": {"priorities": [3]}, "peers": {"interface": "ib0"}}}},
    )
    rolled = wait_for(
        lambda: (
            (d := cluster.stored("apps/v1", "daemonsets", name, NS))
            and d["spec"]["template"]["metadata"]["annotations"][AnnotationKey.RESTART_HASH]
            != hash1
            and d
        ),
        what="DaemonSet rolled",
    )
    assert _templates(cluster, name) == [template, rolled["spec"]["template"]]


def test_node_labels_change_the_targeted_set(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    cluster.create(validation())
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 4, "4 targeted")
    cluster.patch(
        "v1", "nodes", "gpu-d", {"metadata": {"labels": {"nvidia.com/gpu.present": None}}}
    )
    wait_status(cluster, lambda s: s["nodes"]["targeted"] == 3, "3 targeted after relabel")
    add_node(cluster, "gpu-e", GPU)
    wait_status(cluster, lambda s: s["nodes"]["targeted"] == 4, "new node targeted")
    cluster.delete("v1", "nodes", "gpu-a")
    wait_status(cluster, lambda s: s["nodes"]["targeted"] == 3, "deleted node untargeted")


def test_ready_says_what_the_agent_daemonset_says_while_nodes_are_missing(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, _ = operator
    runtime.status.agent_pods_every = 0.2  # the DaemonSet's status is read every 10 s by default
    cluster.create(validation())
    name = manifests.agent_object_name("pool-a")
    wait_for(lambda: cluster.stored("apps/v1", "daemonsets", name, NS), what="DaemonSet")
    publish(mosquitto_broker, [report_msg(report(n)) for n in NODES[:2]])

    def ready_message(part: str) -> dict[str, Any]:
        return wait_status(
            cluster,
            lambda s: part in (((c := condition(s, "Ready")) and c["message"]) or ""),
            f"Ready message with {part!r}",
        )

    # playing the DaemonSet controller: pods on 3 of the 4 targeted nodes (one is tainted),
    # 2 ready
    status = {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
              "numberMisscheduled": 0}  # fmt: skip
    cluster.patch("apps/v1", "daemonsets", name, {"status": status}, NS, subresource="status")
    status_now = ready_message("runs on 3 of the 4 targeted nodes")
    ready = condition(status_now, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "AwaitingReports")
    assert ready["message"].startswith("2 of 4 targeted nodes reporting; awaiting a first report")
    assert "agent pods ready on 2 nodes" in ready["message"]
    assert "taints the agents do not tolerate?" in ready["message"]

    # all four scheduled, three ready
    status.update(desiredNumberScheduled=4, currentNumberScheduled=4, numberReady=3)
    cluster.patch("apps/v1", "daemonsets", name, {"status": status}, NS, subresource="status")
    ready_message("; 3 of 4 agent pods ready")

    # every pod ready and every node reporting: Ready, with nothing about pods
    status.update(numberReady=4)
    cluster.patch("apps/v1", "daemonsets", name, {"status": status}, NS, subresource="status")
    publish(mosquitto_broker, [report_msg(report(n)) for n in NODES[2:]])
    final = wait_status(
        cluster,
        lambda s: condition(s, "Ready")["status"] == "True",
        "Ready",  # type: ignore[index]
    )
    assert "agent pods" not in condition(final, "Ready")["message"]  # type: ignore[index]


def test_two_validations_sharing_a_peers_port_on_a_node_are_told(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    runtime, _ = operator
    peers = {"peers": {"enabled": True}}
    cluster.create(validation("train", checks=peers))
    cluster.create(validation("infer", checks=peers, nodeSelector={"pool": "infer"}))
    cluster.create(validation("apart", checks={"peers": {"enabled": True, "port": 7500}}))
    wait_for(lambda: {"train", "infer", "apart"} <= set(runtime.states), what="all loaded")
    assert not runtime.peer_ports.conflicts  # infer targets no node yet

    # gpu-c joins the infer pool too: both would listen on 7471 there
    cluster.patch("v1", "nodes", "gpu-c", {"metadata": {"labels": {"pool": "infer"}}})

    def conflict_events() -> list[dict[str, Any]]:
        return [e for e in cluster.list("v1", "events", "default")
                if e.get("reason") == "PeerPortConflict"]  # fmt: skip

    events = wait_for(lambda: len(conflict_events()) == 2 and conflict_events(), what="events")
    by_object = {e["involvedObject"]["name"]: e for e in events}
    assert set(by_object) == {"train", "infer"}
    assert all(e["type"] == "Warning" for e in events)
    assert "NetworkValidation 'infer' on 1 shared node(s) (gpu-c)" in by_object["train"]["message"]
    assert "NetworkValidation 'train'" in by_object["infer"]["message"]
    assert runtime.peer_ports.conflicts == {("infer", "train"): ["gpu-c"]}

    # the overlap ends: nothing more is said, and the conflict is forgotten
    cluster.patch("v1", "nodes", "gpu-c", {"metadata": {"labels": {"pool": None}}})
    wait_for(lambda: not runtime.peer_ports.conflicts, what="conflict gone")
    assert len(conflict_events()) == 2


def test_delete_removes_agents(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    runtime, _ = operator
    cluster.create(validation())
    name = manifests.agent_object_name("pool-a")
    wait_for(lambda: cluster.stored("apps/v1", "daemonsets", name, NS), what="DaemonSet")
    cluster.delete(NV, "networkvalidations", "pool-a")
    wait_for(
        lambda: cluster.stored(NV, "networkvalidations", "pool-a") is None,
        what="CR gone (finalizer released)",
    )
    assert cluster.stored("apps/v1", "daemonsets", name, NS) is None
    assert cluster.stored("v1", "configmaps", name, NS) is None
    assert "pool-a" not in runtime.states


def test_restart_rebuilds_state_before_writing(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    """After a restart the retained reports are read back first: conditions do not flip."""
    cluster.create(validation())
    publish(mosquitto_broker, [report_msg(report(n)) for n in NODES])

    def run_once() -> dict[str, Any]:
        memo = kopf.Memo(
            settings=settings_for(mosquitto_broker), span_exporter=InMemorySpanExporter()
        )
        # A second in-process Kopf run in one test retries its first requests (a closed
        # connector of the first run); Kopf recovers, so only the outcome is judged here.
        with kopf_operator(
            cluster, modules=["netval.operator.handlers"], memo=memo, fail_level=None
        ):
            return wait_status(
                cluster,
                lambda s: (c := condition(s, "Ready")) is not None and c["status"] == "True",
                "Ready",
            )

    first = run_once()
    history_before = len(cluster.history(NV, "networkvalidations", "pool-a"))
    second = run_once()
    assert condition(second, "Ready") == condition(first, "Ready")
    assert condition(second, "Healthy") == condition(first, "Healthy")
    # no status version in between said anything but Ready=True
    for version in cluster.history(NV, "networkvalidations", "pool-a")[history_before:]:
        if version is None:
            continue
        ready = condition(version.get("status") or {}, "Ready")
        assert ready is None or ready["status"] == "True", ready


def test_east_west_assignments_and_matrix(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    """The operator tells each agent its topology domain and its peer set (the endpoints the
    other agents announced, issue 24) and folds peer results into status.eastWest."""
    cluster.patch(
        "v1", "nodes", "gpu-c", {"metadata": {"labels": {"topology.kubernetes.io/zone": "rack-2"}}}
    )
    cluster.patch(
        "v1", "nodes", "gpu-d", {"metadata": {"labels": {"topology.kubernetes.io/zone": "rack-2"}}}
    )
    cluster.create(validation(checks={"peers": {"enabled": True, "minThroughputRatio": 0.5}}))

    async def assignments() -> dict[str, Any]:
        found: dict[str, Any] = {}
        async with aiomqtt.Client(
            mosquitto_broker.host, mosquitto_broker.port,
            username=mosquitto_broker.username, password=mosquitto_broker.password,
        ) as client:  # fmt: skip
            await client.subscribe("netval/v1/pool-a/+/assignment")
            # the retained assignments arrive at once; a short read, then the poll repeats
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1):
                    async for msg in client.messages:
                        node = msg.topic.value.split("/")[3]
                        found[node] = json.loads(bytes(msg.payload))  # type: ignore[arg-type]
                        if domains(found) == expected:
                            break
        return found

    def domains(found: dict[str, Any]) -> dict[str, Any]:
        return {node: {"domain": doc.get("domain")} for node, doc in found.items()}

    # the relabelled nodes may first be assigned their old domain: wait for the new ones
    expected = {"gpu-a": {"domain": "rack-1"}, "gpu-b": {"domain": "rack-1"},
                "gpu-c": {"domain": "rack-2"}, "gpu-d": {"domain": "rack-2"}}  # fmt: skip
    wait_for(lambda: domains(asyncio.run(assignments())) == expected, what=f"{expected}")
    # no agent announced itself: empty peer sets; then two do, and each gets the other
    assert all(doc["peers"] == {} for doc in asyncio.run(assignments()).values())
    # the endpoints count at the nodes' own addresses (ingest.endpoint_check)
    for node, address in (("gpu-b", "10.0.0.2"), ("gpu-c", "10.0.0.3")):
        cluster.patch("v1", "nodes", node,
                      {"status": {"addresses": [{"type": "InternalIP", "address": address}]}},
                      subresource="status")  # fmt: skip
    publish(mosquitto_broker, [
        ("netval/v1/pool-a/gpu-b/endpoint", b'{"address": "10.0.0.2", "port": 7471}'),
        ("netval/v1/pool-a/gpu-c/endpoint", b'{"address": "10.0.0.3", "port": 7471}'),
    ])  # fmt: skip
    want = {"gpu-a": {"rack-1": [["gpu-b", "10.0.0.2", 7471]], "rack-2": [["gpu-c", "10.0.0.3", 7471]]},
            "gpu-b": {"rack-2": [["gpu-c", "10.0.0.3", 7471]]},
            "gpu-c": {"rack-1": [["gpu-b", "10.0.0.2", 7471]]}}  # fmt: skip

    def peer_sets() -> dict[str, Any]:
        found = asyncio.run(assignments())
        return {n: d["peers"] for n, d in found.items() if n != "gpu-d"}

    wait_for(lambda: peer_sets() == want, what=f"peer sets {want}")

    # peer results: intra-rack at 400 Mbit/s, cross-rack at 100: a 4:1 capacity ratio
    def peer_report(node: str, peers: dict[str, float]) -> Any:
        r = report(node)
        extra = []
        for peer, mbps in peers.items():
            extra += [latency(peer), loss(peer), path_mtu(peer), throughput(peer, mbps)]
        return r.model_copy(update={"results": [*r.results, *extra]})

    publish(mosquitto_broker, [
        report_msg(peer_report("gpu-a", {"gpu-b": 400, "gpu-c": 100})),
        report_msg(peer_report("gpu-b", {"gpu-a": 400, "gpu-d": 100})),
        report_msg(peer_report("gpu-c", {"gpu-d": 400, "gpu-a": 100})),
        report_msg(peer_report("gpu-d", {"gpu-c": 400, "gpu-b": 100})),
    ])  # fmt: skip
    status = wait_status(cluster, lambda s: bool(s.get("eastWest", {}).get("flagged")), "eastWest")
    ew = status["eastWest"]
    assert ew["domains"] == 2 and ew["nodes"] == 4
    (pair,) = ew["flagged"]
    assert {pair["a"], pair["b"]} == {"rack-1", "rack-2"}
    assert pair["capacityRatio"] == pytest.approx(4.0, rel=0.01)
