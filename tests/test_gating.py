"""Node gating: labels and taints follow the node verdict (its table: tests/test_verdict.py),
within the breaker and with hysteresis; foreign taints survive. The Node writes planned from
the verdict, then end to end against the Kubernetes API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.keys import FabricHealth, LabelKey, TaintKey
from netval.operator.gating.decisions import NodeChange, plan_changes, with_fabric_taint
from operator_env import NV, condition, publish, report, report_msg, status_of, validation

U, H = FabricHealth.UNHEALTHY, FabricHealth.HEALTHY


def test_plan_removes_what_nobody_wants_and_leaves_the_rest() -> None:
    current = {"a": ("healthy", False), "b": (None, False), "gone": ("unhealthy", True)}
    changes = plan_changes(current, {"a": U, "b": H}, ["a"])
    assert [(c.node, c.label, c.taint) for c in changes] == [
        ("a", U, True), ("b", H, False), ("gone", None, False)
    ]  # fmt: skip


def test_a_write_that_excludes_is_told_apart() -> None:
    assert NodeChange("a", U, False).excludes and NodeChange("a", None, True).excludes
    assert not NodeChange("a", H, False).excludes
    assert not NodeChange("a", FabricHealth.SUSPECT, False).excludes
    assert not NodeChange("a", None, False).excludes


def test_foreign_taints_survive() -> None:
    foreign = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    added = with_fabric_taint(foreign, True)
    assert added[0] == foreign[0] and added[1]["key"] == TaintKey.FABRIC_UNHEALTHY
    assert with_fabric_taint(added, False) == foreign


# -- end to end -----------------------------------------------------------------------------


def node_state(kube: KubeCluster, name: str) -> tuple[str | None, list[str]]:
    node = kube.get("v1", "nodes", name)
    taints = [t["key"] for t in node.get("spec", {}).get("taints") or []]
    return node["metadata"].get("labels", {}).get(LabelKey.FABRIC), taints


def wait_node(kube: KubeCluster, name: str, label: str | None, tainted: bool,
              foreign: bool = False) -> None:  # fmt: skip
    def ok() -> bool:
        have_label, taints = node_state(kube, name)
        return (
            have_label == label
            and (TaintKey.FABRIC_UNHEALTHY in taints) == tainted
            and ("example.com/maintenance" in taints if foreign else True)
        )

    wait_for(ok, timeout=30, what=f"{name}: label {label}, tainted {tainted}")


def test_labels_and_taints_follow_health(
    cluster: KubeCluster, operator: Any, mosquitto_broker: MosquittoBroker
) -> None:
    # a foreign taint another controller owns must survive every write
    cluster.patch("v1", "nodes", "gpu-a", {"spec": {"taints": [
        {"key": "example.com/maintenance", "value": "soon", "effect": "PreferNoSchedule"}]}})  # fmt: skip
    cluster.create(validation(gating={"taint": True, "maxUnhealthyPercent": 25,
                                      "recoveryReports": 2}))  # fmt: skip
    base = datetime.now(UTC)
    seq = iter(range(1000))

    def send(node: str, status: Status) -> None:
        started = base + timedelta(milliseconds=next(seq))
        publish(mosquitto_broker, [report_msg(report(node, status, started=started))])

    for node in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
        send(node, Status.PASS)
    for node in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
        wait_node(cluster, node, "healthy", False, foreign=node == "gpu-a")
    assert node_state(cluster, "cpu-1") == (None, [])  # not targeted: untouched

    send("gpu-a", Status.FAIL)
    wait_node(cluster, "gpu-a", "unhealthy", True, foreign=True)

    # a second failure: the cap is 25% of 4 = 1 node: the breaker trips, gpu-b is neither
    # tainted nor labelled unhealthy (the breaker covers labels too: `suspect`, which the
    # webhook's affinity does not exclude), and the Gating condition says so
    send("gpu-b", Status.FAIL)
    wait_node(cluster, "gpu-b", "suspect", False)
    gate = wait_for(
        lambda: (c := condition(status_of(cluster), "Gating")) and c["reason"] == "BreakerTripped" and c,
        timeout=30, what="Gating=False BreakerTripped",
    )  # fmt: skip
    assert gate["status"] == "False" and "gpu-b" in gate["message"]
    assert "not tainting 1 node(s) (gpu-b)" in gate["message"]
    assert "1 failing node(s) labelled suspect" in gate["message"]
    assert node_state(cluster, "gpu-a")[0] == "unhealthy"  # within the cap: still unhealthy
    # onBreakerTripped: admit (the default): admission goes on, the exclusions that fit the
    # cap still hold
    usable = condition(status_of(cluster), "Usable")
    assert usable is not None and usable["status"] == "True"
    assert usable["reason"] == "AdmittingPastBreaker"
    assert "admission goes on (onBreakerTripped: admit)" in gate["message"]
    assert TaintKey.FABRIC_UNHEALTHY in node_state(cluster, "gpu-a")[1]  # existing taint kept
    events = wait_for(
        lambda: [e for e in cluster.list("v1", "events", "default")
                 if e.get("reason") == "BreakerTripped"], what="BreakerTripped event",
    )  # fmt: skip
    assert events

    # recovery with hysteresis, label and taint together: a suspect node was never excluded
    # (healthy at its first passing report), an excluded one needs recoveryReports (2)
    send("gpu-b", Status.PASS)
    send("gpu-a", Status.PASS)
    wait_node(cluster, "gpu-b", "healthy", False)
    assert node_state(cluster, "gpu-a")[0] == "unhealthy"
    send("gpu-a", Status.PASS)
    wait_node(cluster, "gpu-a", "healthy", False, foreign=True)
    wait_for(
        lambda: (c := condition(status_of(cluster), "Gating")) and c["status"] == "True",
        timeout=30, what="Gating=True again",
    )  # fmt: skip


def test_delete_removes_labels_and_taints(
    cluster: KubeCluster, operator: Any, mosquitto_broker: MosquittoBroker
) -> None:
    cluster.create(validation(gating={"taint": True, "maxUnhealthyPercent": 50}))
    publish(mosquitto_broker, [report_msg(report("gpu-a", Status.FAIL))])
    wait_node(cluster, "gpu-a", "unhealthy", True)
    wait_node(cluster, "gpu-b", "unknown", False)
    cluster.delete(NV, "networkvalidations", "pool-a")
    for node in ("gpu-a", "gpu-b"):
        wait_node(cluster, node, None, False)
