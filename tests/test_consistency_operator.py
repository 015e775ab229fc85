"""Fleet consistency end to end: the real operator (Kopf against the kmock API server), ten
nodes whose reports (with facts) go through the real Mosquitto broker. One node on another
firmware becomes an Outlier in status.consistency, and gating follows the configured
severity: warn -> the node is degraded; fail -> it is failing and labelled unhealthy."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model.keys import LabelKey
from netval.model.results import Report
from netval.operator.term_runtime import OperatorRuntime
from operator_env import (
    GPU,
    NODES,
    NV,
    add_node,
    publish,
    report,
    report_msg,
    validation,
    wait_status,
)

MORE = [f"gpu-{c}" for c in "efghij"]
FACTS = {
    "nic_model": "15B3:1021",
    "fw_ver": "28.40.1000",
    "link_rate_gbps": "400",
    "mtu": "9000",
    "pfc_enabled": "3",
    "trust": "dscp",
}


def with_facts(node: str, **facts: str) -> Report:
    base = report(node, started=datetime.now(UTC))
    return base.model_copy(update={"facts": {**FACTS, **facts}})


def fw_row(status: dict[str, Any]) -> dict[str, Any] | None:
    rows = (status.get("consistency") or {}).get("keys", [])
    return next((r for r in rows if r["key"] == "fw_ver"), None)


def fabric(cluster: KubeCluster, node: str) -> str | None:
    labels = cluster.get("v1", "nodes", node).get("metadata", {}).get("labels", {})
    value = labels.get(LabelKey.FABRIC)
    return str(value) if value is not None else None


def test_one_node_on_other_firmware_is_an_outlier_and_gating_follows_severity(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, Any],
    mosquitto_broker: MosquittoBroker,
) -> None:
    for node in MORE:
        add_node(cluster, node, {**GPU, "topology.kubernetes.io/zone": "rack-1"})
    nodes = [*NODES, *MORE]
    cluster.create(validation(gating={"recoveryReports": 1}))  # back after one report
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 10, "10 targeted")

    messages = [report_msg(with_facts(n)) for n in nodes if n != "gpu-c"]
    messages.append(report_msg(with_facts("gpu-c", fw_ver="28.39.1002")))
    publish(mosquitto_broker, messages)

    status = wait_status(
        cluster,
        lambda s: s["nodes"]["reporting"] == 10 and (fw_row(s) or {}).get("outliers"),
        "gpu-c an outlier",
    )
    row = fw_row(status)
    assert row is not None
    assert (row["majority"], row["share"], row["nodes"]) == ("28.40.1000", 0.9, 10)
    assert [(o["node"], o["value"]) for o in row["outliers"]] == [("gpu-c", "28.39.1002")]
    assert status["consistency"]["cohorts"] == 1
    # default severity warn: a degraded node, not a failing one
    assert (status["nodes"]["warning"], status["nodes"]["failing"]) == (1, 0)
    assert status["checks"]["fleet.consistency"] == {"pass": 9, "warn": 1, "fail": 0}
    wait_for(lambda: fabric(cluster, "gpu-c") == "degraded", what="gpu-c labelled degraded")
    assert fabric(cluster, "gpu-a") == "healthy"

    # outlierSeverity fail: the same fact now fails the node, and gating labels it unhealthy
    cluster.patch(
        NV,
        "networkvalidations",
        "pool-a",
        {"spec": {"consistency": {"outlierSeverity": "fail"}}},
    )
    status = wait_status(cluster, lambda s: s["nodes"]["failing"] == 1, "gpu-c failing")
    (failure,) = status["failures"]
    assert (failure["node"], failure["check"], failure["subject"]) == (
        "gpu-c",
        "fleet.consistency",
        "fw_ver",
    )
    assert "28.39.1002" in failure["message"]
    wait_for(lambda: fabric(cluster, "gpu-c") == "unhealthy", what="gpu-c labelled unhealthy")

    # gpu-c updated: consistent again, within one report; its label follows after
    # recoveryReports (1) reports judged passing: the report that clears the outlier arrived
    # while the fleet verdict still failed it, so the next one counts
    publish(mosquitto_broker, [report_msg(with_facts("gpu-c"))])
    status = wait_status(cluster, lambda s: s["nodes"]["failing"] == 0, "gpu-c consistent")
    assert fw_row(status)["outliers"] == []  # type: ignore[index]
    publish(mosquitto_broker, [report_msg(with_facts("gpu-c"))])
    wait_for(lambda: fabric(cluster, "gpu-c") == "healthy", what="gpu-c labelled healthy")
