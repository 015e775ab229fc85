"""Node gating: labels follow health, taints obey the breaker and hysteresis, foreign taints
survive. Pure decisions first, then end to end against the Kubernetes API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.keys import FabricHealth, LabelKey, TaintKey
from netval.operator.gating.decisions import (
    GatingInput,
    decide_labels,
    decide_taints,
    desired_labels,
    gating_condition,
    plan_changes,
    with_fabric_taint,
)
from operator_env import NV, condition, publish, report, report_msg, status_of, validation

H, D, U, K, S = (
    FabricHealth.HEALTHY,
    FabricHealth.DEGRADED,
    FabricHealth.UNHEALTHY,
    FabricHealth.UNKNOWN,
    FabricHealth.SUSPECT,
)


def gi(health: dict[str, FabricHealth], *, streak: dict[str, int] | None = None,
       pct: float = 50, recovery: int = 3, taint: bool = True, label: bool = True,
       name: str = "v") -> GatingInput:  # fmt: skip
    return GatingInput(
        name=name, targeted=frozenset(health), node_label=label, taint=taint,
        max_unhealthy_percent=pct, recovery_reports=recovery, health=health,
        ok_streak=streak or {},
    )  # fmt: skip


def test_taints_new_failures_within_the_cap() -> None:
    d = decide_taints(gi({"a": U, "b": H, "c": H, "d": H}), [])
    assert d.tainted == {"a"} and not d.tripped and d.cap == 2


def test_breaker_caps_new_taints_and_keeps_existing() -> None:
    health = {"a": U, "b": U, "c": U, "d": H}
    d = decide_taints(gi(health, pct=50), ["c"])
    assert d.cap == 2
    assert d.tainted == {"c", "a"}  # c kept, one new (sorted) within the cap
    assert d.withheld == ("b",) and d.tripped


def test_breaker_at_exactly_the_threshold_does_not_trip() -> None:
    d = decide_taints(gi({"a": U, "b": U, "c": H, "d": H}, pct=50), [])
    assert d.tainted == {"a", "b"} and not d.tripped


def test_hysteresis_keeps_taint_until_enough_passing_reports() -> None:
    health = {"a": H, "b": H}
    assert decide_taints(gi(health, streak={"a": 2}), ["a"]).tainted == {"a"}
    assert decide_taints(gi(health, streak={"a": 3}), ["a"]).tainted == frozenset()
    # a silent node keeps its taint: no evidence it recovered
    assert decide_taints(gi({"a": K, "b": H}), ["a"]).tainted == {"a"}


def test_taint_disabled_taints_nothing() -> None:
    assert decide_taints(gi({"a": U}, taint=False), ["a"]).tainted == frozenset()


def test_small_pool_taints_its_one_failing_node() -> None:
    nine = {f"n{i}": H for i in range(9)} | {"n0": U}
    v = gi(nine, pct=10)
    d = decide_taints(v, [])
    assert d.tainted == {"n0"} and not d.tripped and d.cap == 1
    labels = decide_labels(v, {}, d.tainted)
    assert labels.labels["n0"] is U and not labels.tripped
    assert gating_condition(v, d, labels)[:2] == (True, "GatingActive")


def test_label_breaker_holds_unhealthy_labels_beyond_the_cap() -> None:
    health = {"a": U, "b": U, "c": U, "d": H}
    v = gi(health, pct=25, taint=False)  # cap 1; labels only
    d = decide_labels(v, {"b": "unhealthy"})
    # b was labelled unhealthy before (within the cap): it stays; a and c are suspect
    assert d.labels == {"a": S, "b": U, "c": S, "d": H} and d.suspect == ("a", "c")
    ok, reason, message = gating_condition(v, decide_taints(v, []), d)
    assert (ok, reason) == (False, "BreakerTripped")
    assert "3 of 4 targeted nodes failing" in message
    assert "2 failing node(s) labelled suspect, not unhealthy (a, c)" in message
    # a tainted node is labelled unhealthy whatever the room, so label and taint agree
    assert decide_labels(v, {}, ["c"]).labels["c"] is U
    # recovered nodes follow at once (no hysteresis for labels)
    assert decide_labels(gi({"a": H, "b": H}, pct=25), {"a": "suspect"}).labels["a"] is H


def test_correlated_staleness_holds_labels() -> None:
    current = {f"n{i}": "healthy" for i in range(10)} | {"n9": "unhealthy"}
    # 3 of 10 stale at once, cap 1: they keep their last label (n9 too)
    stale = {f"n{i}": (K if i >= 7 else H) for i in range(10)}
    d = decide_labels(gi(stale, pct=10), current)
    assert d.held == ("n7", "n8", "n9")
    assert [d.labels[n] for n in d.held] == [H, H, U]
    message = gating_condition(gi(stale, pct=10), decide_taints(gi(stale, pct=10), []), d)[2]
    assert "3 of 10 targeted nodes went stale at once" in message
    assert "3 label(s) held" in message
    # one node going stale is not a storm: unknown, as before
    one = stale | {"n7": H, "n8": H}
    assert decide_labels(gi(one, pct=10), current).labels["n9"] is K
    # a node that never had a verdict is not held (nothing to hold)
    assert decide_labels(gi(stale, pct=10), {}).labels["n7"] is K


def test_label_is_the_worst_across_labelling_validations() -> None:
    labels = desired_labels(
        [gi({"a": H, "b": H}, name="x"), gi({"a": D, "c": K}, name="y"),
         gi({"a": U}, name="z", label=False)]
    )  # fmt: skip
    assert labels == {"a": D, "b": H, "c": K}


def test_plan_removes_what_nobody_wants_and_leaves_the_rest() -> None:
    current = {"a": ("healthy", False), "b": (None, False), "gone": ("unhealthy", True)}
    changes = plan_changes(current, {"a": U, "b": H}, ["a"])
    assert [(c.node, c.label, c.taint) for c in changes] == [
        ("a", U, True), ("b", H, False), ("gone", None, False)
    ]  # fmt: skip


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
    usable = condition(status_of(cluster), "Usable")
    assert usable is not None and usable["status"] == "False"
    assert usable["reason"] == "TooManyFailing"
    assert TaintKey.FABRIC_UNHEALTHY in node_state(cluster, "gpu-a")[1]  # existing taint kept
    events = wait_for(
        lambda: [e for e in cluster.list("v1", "events", "default")
                 if e.get("reason") == "BreakerTripped"], what="BreakerTripped event",
    )  # fmt: skip
    assert events

    # recovery with hysteresis: one passing report lifts the label at once, not the taint
    send("gpu-b", Status.PASS)
    send("gpu-a", Status.PASS)
    wait_node(cluster, "gpu-a", "healthy", True, foreign=True)
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


def test_no_gating_for_a_validation_without_labels() -> None:
    assert desired_labels([gi({"a": U}, label=False)]) == {}


# The cap is at least one node (it was floor(9 * 10%) = 0: a pool under 10 nodes never got a
# taint and said BreakerTripped for its first failing node), so also at 0 %.
@pytest.mark.parametrize(
    ("pct", "targeted", "cap"),
    [(10, 9, 1), (10, 10, 1), (10, 29, 2), (100, 3, 3), (0, 50, 1), (10, 0, 0)],
)
def test_cap(pct: float, targeted: int, cap: int) -> None:
    health = {f"n{i}": H for i in range(targeted)}
    assert decide_taints(gi(health, pct=pct), []).cap == cap
