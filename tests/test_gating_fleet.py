"""Gating on a fleet: a 1,000-node validation with 1 %, 9 % and 30 % of its nodes failing.

On a fleet some node is always failing. Under the default admission policy (capacity) a few
failing nodes (within maxUnhealthyPercent, 10 %) no longer hold every annotated Pod or Kueue
Workload: the validation is Usable, the injected affinity keeps pods off the failing nodes.
A mass failure (30 %) trips the breaker: taints and `unhealthy` labels stop at the cap (the
rest are `suspect`, which the affinity does not exclude), Usable is False and admission waits.

First the pure decisions on a real `Store` fed 1,000 reports (labels, taints, conditions,
the webhook's reviewer, Kueue's decisions), then the operator end to end: kmock's Kubernetes
API with 1,000 Nodes, reports over a real Mosquitto broker, the webhook over HTTPS.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.keys import AnnotationKey, LabelKey, SchedulingGate, TaintKey
from netval.model.spec import AdmissionMode, AdmissionPolicy, NetworkValidationSpec
from netval.model.status import ConditionType
from netval.operator.admission.configurations import MUTATE_PODS, VALIDATE_PODS
from netval.operator.admission.options import WebhookOptions
from netval.operator.admission.reviewer import Reviewer
from netval.operator.gating import decisions as gating
from netval.operator.gating.capacity import min_healthy_nodes
from netval.operator.gating.conditions import GatingCondition, gating_condition
from netval.operator.gating.facts import verdict_of
from netval.operator.gating.verdict import ValidationVerdict, merge
from netval.operator.ingest.decode import StateChange
from netval.operator.kueue import decisions as kueue
from netval.operator.state.store import Store, ValidationView
from netval.operator.status.compute import validation_status
from operator_env import publish, report, report_msg, status_of, validation
from test_admission import (
    FABRIC,
    Webhook,
    admission_review,
    patched,
    pod,
    required_terms,
    serving,
)

N = 1000
FLEET = {"netval.example/fleet": "a"}
FLEET_NODES = [f"node-{i:04d}" for i in range(N)]
POOL = "pool-a"


def failing_nodes(percent: int) -> list[str]:
    """`percent` of the fleet, spread over it (every k-th node), sorted."""
    count = N * percent // 100
    return sorted(FLEET_NODES[i * N // count] for i in range(count))


def fleet_spec(**gating_fields: Any) -> NetworkValidationSpec:
    return NetworkValidationSpec.model_validate(
        {"nodeSelector": FLEET, "interval": "60s", "gating": {"taint": True, **gating_fields}}
    )


@dataclasses.dataclass
class Round:
    verdict: ValidationVerdict
    condition: GatingCondition
    changes: list[gating.NodeChange]


class Fleet:
    """A store with 1,000 targeted nodes that all reported, and what netval has on the
    Nodes (labels, taints) as the node writer would leave it."""

    def __init__(self, failing: list[str], spec: NetworkValidationSpec) -> None:
        self.spec = spec
        self.store = Store(label_keys=FLEET)
        for node in FLEET_NODES:
            self.store.on_node(node, FLEET)
        self.state = self.store.upsert_validation(
            POOL, generation=1, spec=spec, body={}, status=None
        )
        bad = set(failing)
        for node in FLEET_NODES:
            self.store.ingest_report(
                report(node, Status.FAIL if node in bad else Status.PASS), False
            )
        # before: a healthy fleet, every node labelled healthy, none tainted
        self.nodes: dict[str, tuple[str | None, bool]] = {
            n: ("healthy", False) for n in FLEET_NODES
        }

    def gating_round(self) -> Round:
        """One round of the node writer's decisions, applied to `nodes`."""
        v = verdict_of(POOL, self.state, self.spec, self.nodes, datetime.now(UTC))
        self.state.verdict = v
        merged = merge([v])
        changes = gating.plan_changes(self.nodes, merged.labels, merged.tainted)
        for change in changes:
            self.nodes[change.node] = (
                change.label.value if change.label is not None else None,
                change.taint,
            )
        return Round(v, gating_condition(v), changes)

    def status_and_view(self) -> ValidationView:
        status = validation_status(
            self.state, self.spec, node_labels={}, previous=None, now=datetime.now(UTC)
        )
        self.store.previous[POOL] = status
        view = self.store.validation_view(POOL)
        assert view is not None
        return view

    def label_counts(self) -> Counter[str | None]:
        return Counter(label for label, _ in self.nodes.values())

    def tainted(self) -> set[str]:
        return {n for n, (_, t) in self.nodes.items() if t}


def review(view: ValidationView, handler: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The webhook's answer, with `view` as the runtime hands it to the reviewer."""
    reviewer = Reviewer({})
    reviewer._views[view.name] = (math.inf, view)

    async def call() -> dict[str, Any]:
        answer = await reviewer(admission_review(obj), webhook=handler)
        response: dict[str, Any] = answer["response"]
        return response

    return asyncio.run(call())


PENDING: dict[str, Any] = {"name": "fabric", "state": "Pending"}


@pytest.mark.parametrize(
    ("percent", "action", "usable", "tainted", "unhealthy", "suspect"),
    [
        (1, "admit", True, 10, 10, 0),
        (9, "admit", True, 90, 90, 0),
        (30, "admit", True, 100, 100, 200),  # the default: a tripped breaker admits
        (30, "hold", False, 100, 100, 200),
    ],
)
def test_fleet_decisions(
    percent: int, action: str, usable: bool, tainted: int, unhealthy: int, suspect: int
) -> None:
    failing = failing_nodes(percent)
    fleet = Fleet(failing, fleet_spec(onBreakerTripped=action))

    # -- labels, taints, Gating --------------------------------------------------------------
    first = fleet.gating_round()
    assert first.verdict.cap == 100
    assert len(fleet.tainted()) == tainted and fleet.tainted() <= set(failing)
    counts = fleet.label_counts()
    want = Counter({"healthy": N - len(failing), "unhealthy": unhealthy, "suspect": suspect})
    assert +counts == +want  # (+: without zero counts)
    # every tainted node is labelled unhealthy: taint and label agree
    assert all(fleet.nodes[n][0] == "unhealthy" for n in fleet.tainted())
    ok, reason, message = first.condition
    if percent < 10:
        assert (ok, reason) == (True, "GatingActive")
        assert f"{tainted} node(s) tainted of 1000 targeted (cap 100)" == message
    else:
        assert (ok, reason) == (False, "BreakerTripped")
        assert "300 of 1000 targeted nodes failing" in message
        assert "not tainting 200 node(s)" in message
        assert "200 failing node(s) labelled suspect, not unhealthy" in message
        assert f"onBreakerTripped: {action}" in message
    # the next round changes nothing: the breaker's choice is stable
    assert fleet.gating_round().changes == []

    # -- conditions ------------------------------------------------------------------------------
    view = fleet.status_and_view()
    status = fleet.store.previous[POOL]
    healthy = status.condition(ConditionType.HEALTHY)
    use = status.condition(ConditionType.USABLE)
    gate = status.condition(ConditionType.GATING)
    assert healthy is not None and use is not None and gate is not None
    assert healthy.status == "False"  # some node is always failing on a fleet
    assert use.status == ("True" if usable else "False")
    reason = "CapacityAvailable" if percent < 10 else "AdmittingPastBreaker"
    assert use.reason == (reason if usable else "TooManyFailing")
    assert gate.status == ("True" if percent < 10 else "False")
    assert view.usable is usable and view.healthy_nodes == N - len(failing)
    assert status.nodes.admissible == N - len(failing) and status.nodes.excluded == unhealthy

    # -- the webhook (policy capacity, the default) -------------------------------------------
    mutated = review(view, MUTATE_PODS, pod("trainer"))
    admitted = patched(pod("trainer"), {"response": mutated})
    assert required_terms(admitted["spec"]) == [{"matchExpressions": [FABRIC]}]
    gated = admitted["spec"].get("schedulingGates") == [{"name": SchedulingGate.FABRIC}]
    assert gated is not usable
    denied = review(dataclasses.replace(view, admission=AdmissionMode.DENY), VALIDATE_PODS,
                    pod("trainer"))  # fmt: skip
    assert denied["allowed"] is usable
    if not usable:
        assert "is not Usable: 300 of 1000 targeted nodes failing" in denied["status"]["message"]
    # a pod that needs more healthy nodes than the fleet has waits
    big = pod("big")
    big["metadata"]["annotations"][AnnotationKey.MIN_HEALTHY_NODES] = str(N - len(failing) + 1)
    assert review(dataclasses.replace(view, admission=AdmissionMode.DENY), VALIDATE_PODS,
                  big)["allowed"] is False  # fmt: skip
    # strict: today's behaviour kept as an option: any failing node gates everything
    strict = dataclasses.replace(view, policy=AdmissionPolicy.STRICT)
    held = patched(pod("t"), {"response": review(strict, MUTATE_PODS, pod("t"))})
    assert held["spec"]["schedulingGates"] == [{"name": SchedulingGate.FABRIC}]

    # -- Kueue (assigned_nodes: what a TAS assignment names, topology.assigned_nodes) ---------
    good = [n for n in FLEET_NODES if n not in set(failing)][:8]
    ready = kueue.decide(PENDING, view, validation=POOL, admitted=False, assigned_nodes=good)
    assert ready is not None and ready.state == ("Ready" if usable else "Pending")
    on_bad = kueue.decide(PENDING, view, validation=POOL, admitted=False,
                          assigned_nodes=[*good[:7], failing[0]])  # fmt: skip
    assert on_bad is not None and on_bad.state == "Retry"  # placed again, away from it
    flavor = kueue.decide(PENDING, view, validation=POOL, admitted=False, pods=8)
    assert flavor is not None and flavor.state == ("Ready" if usable else "Pending")
    too_big = kueue.decide(PENDING, view, validation=POOL, admitted=False, pods=950)
    assert too_big is not None and too_big.state == ("Ready" if percent == 1 else "Pending")
    # a Ready check of a Workload not admitted yet stays Ready while the validation is Usable
    # (it flipped to Retry on every failing node before)
    again = kueue.decide({"name": "fabric", "state": "Ready"}, view, validation=POOL,
                         admitted=False, assigned_nodes=good)  # fmt: skip
    assert (again is None) is usable
    strict_wait = kueue.decide(PENDING, strict, validation=POOL, admitted=False, pods=8)
    assert strict_wait is not None and strict_wait.state == "Pending"


def test_fleet_going_stale_together_keeps_its_labels() -> None:
    """A broker outage or an agent rollout: 200 of 1,000 nodes lose their fresh report at
    once. Their labels hold (no 200 writes to `unknown` and 200 back), Gating says so, and
    the validation stays Usable on the nodes that still report."""
    failing = failing_nodes(1)
    fleet = Fleet(failing, fleet_spec())
    fleet.gating_round()
    before = dict(fleet.nodes)
    gone = [n for n in FLEET_NODES if n not in set(failing)][:190] + failing[:10]
    for node in gone:
        fleet.store.on_state(StateChange(POOL, node, False))
    held = fleet.gating_round()
    assert held.changes == [] and fleet.nodes == before
    assert len(held.verdict.held) == 190  # the 10 failing ones stay excluded, silent or not
    assert all(held.verdict.nodes[n].excluded for n in failing[:10])
    ok, reason, message = held.condition
    assert (ok, reason) == (False, "BreakerTripped")
    assert "190 of 1000 targeted nodes went stale at once" in message
    view = fleet.status_and_view()
    assert view.usable and view.healthy_nodes == 800
    # a few nodes going stale is no storm: they turn unknown; the failing ones that came
    # back passing stay out until recoveryReports (3) passing reports
    for node in gone[5:]:
        fleet.store.on_state(StateChange(POOL, node, True))
        fleet.store.ingest_report(report(node), False)
    after = fleet.gating_round()
    assert not after.verdict.held and fleet.label_counts()["unknown"] == 5
    assert fleet.label_counts()["unhealthy"] == 10 and len(fleet.tainted()) == 10


# -- end to end ----------------------------------------------------------------------------------


def fleet_labels(kube: KubeCluster) -> tuple[Counter[str | None], set[str]]:
    counts: Counter[str | None] = Counter()
    tainted: set[str] = set()
    for node in kube.list("v1", "nodes"):
        meta = node["metadata"]
        if (meta.get("labels") or {}).get("netval.example/fleet") != "a":
            continue
        counts[(meta.get("labels") or {}).get(LabelKey.FABRIC)] += 1
        if any(
            t["key"] == TaintKey.FABRIC_UNHEALTHY
            for t in (node.get("spec") or {}).get("taints") or []
        ):
            tainted.add(meta["name"])
    return counts, tainted


def conditions(kube: KubeCluster) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status_of(kube).get("conditions") or []}


# kmock stores a create in O(objects): 1,000 Nodes take a minute on a 2-core machine before
# the operator even starts, so the run through the real interfaces uses a 100-node fleet (the
# same shares: 30 % failing trips the breaker at 10 nodes, 9 % is within it).
E2E = 100
E2E_NODES = [f"node-{i:04d}" for i in range(E2E)]


@pytest.fixture
def fleet_webhook(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> Iterator[Webhook]:
    """The operator with its webhook, started on a cluster that has the fleet's Nodes."""
    for node in E2E_NODES:
        cluster.create({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": node, "labels": dict(FLEET)}})  # fmt: skip
    options = WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path / "certs")
    with serving(cluster, mosquitto_broker, options) as served:
        yield served


def test_fleet_end_to_end(fleet_webhook: Webhook, mosquitto_broker: MosquittoBroker) -> None:
    """The operator on a 100-node fleet with `onBreakerTripped: hold`: 30 % failing trips
    the breaker (10 taints, 10 unhealthy and 20 suspect labels, Usable False) and a new Pod
    is gated; down to 9 % the validation is Usable though still not Healthy, and the Pod is
    released. (The default, `admit`: tests/test_verdict_process.py.)"""
    webhook = fleet_webhook
    kube = webhook.kube
    kube.create(validation(POOL, nodeSelector=FLEET,
                           gating={"taint": True, "recoveryReports": 1,
                                   "onBreakerTripped": "hold"}))  # fmt: skip
    webhook.wait_known()
    wait_for(lambda: len(webhook.runtime.states[POOL].targeted) == E2E, timeout=60,
             what="the fleet targeted")  # fmt: skip
    bad = set(sorted(E2E_NODES[i * 10 // 3] for i in range(30)))
    assert len(bad) == 30
    publish(mosquitto_broker, [report_msg(report(n, Status.FAIL if n in bad else Status.PASS))
                               for n in E2E_NODES])  # fmt: skip

    def tripped() -> bool:
        c = conditions(kube)
        counts, tainted = fleet_labels(kube)
        return (
            c.get("Usable", {}).get("status") == "False"
            and c.get("Gating", {}).get("reason") == "BreakerTripped"
            and counts == Counter({"healthy": 70, "unhealthy": 10, "suspect": 20})
            and len(tainted) == 10
        )

    wait_for(tripped, timeout=60, interval=0.5, what="breaker tripped on 30 of 100 nodes")
    c = conditions(kube)
    assert c["Healthy"]["status"] == "False" and c["Usable"]["reason"] == "TooManyFailing"
    assert "20 failing node(s) labelled suspect" in c["Gating"]["message"]
    tainted = fleet_labels(kube)[1]
    assert tainted <= bad
    for name in tainted:  # tainted nodes are the ones labelled unhealthy
        assert kube.get("v1", "nodes", name)["metadata"]["labels"][LabelKey.FABRIC] == "unhealthy"
    wait_for(lambda: (v := webhook.runtime.validation_view(POOL)) is not None and not v.usable,
             timeout=30, what="the runtime's view: not Usable")  # fmt: skip
    response = webhook.review(MUTATE_PODS, pod("trainer", POOL))
    assert any("until it is Usable" in w for w in response["response"]["warnings"])
    gated = patched(pod("trainer", POOL), response)
    assert gated["spec"]["schedulingGates"] == [{"name": SchedulingGate.FABRIC}]
    kube.create(gated)

    # 21 nodes recover: 9 (9 %) still fail
    still = sorted(bad)[:9]
    publish(mosquitto_broker, [report_msg(report(n)) for n in sorted(bad - set(still))])

    def recovered() -> bool:
        c = conditions(kube)
        counts, tainted = fleet_labels(kube)
        return (
            c.get("Usable", {}).get("status") == "True"
            and c.get("Gating", {}).get("status") == "True"
            and counts == Counter({"healthy": 91, "unhealthy": 9})
            and tainted == set(still)
        )

    wait_for(recovered, timeout=60, interval=0.5, what="9 of 100 failing: Usable, 9 tainted")
    assert conditions(kube)["Healthy"]["status"] == "False"
    wait_for(
        lambda: not kube.get("v1", "pods", "trainer", "default")["spec"].get("schedulingGates"),
        timeout=30,
        what="trainer released while 9 nodes still fail",
    )
    response = webhook.review(MUTATE_PODS, pod("next", POOL))["response"]
    assert not response.get("warnings")
    assert "schedulingGates" not in patched(pod("next", POOL), {"response": response})["spec"]


# -- the annotation is untrusted input -----------------------------------------------------------


@given(st.one_of(st.text(max_size=20), st.integers(), st.none(), st.floats(), st.booleans()))
@settings(max_examples=300, deadline=None)
def test_min_healthy_nodes_takes_whole_numbers_only(raw: Any) -> None:
    annotations = {} if raw is None else {AnnotationKey.MIN_HEALTHY_NODES.value: raw}
    try:
        needed = min_healthy_nodes(annotations)
    except ValueError as exc:
        assert AnnotationKey.MIN_HEALTHY_NODES.value in str(exc) and len(str(exc)) < 200
        return
    if raw is None:
        assert needed is None
    else:
        assert needed is not None and 1 <= needed <= 1_000_000
        assert int(str(raw).strip()) == needed


def test_min_healthy_nodes_examples() -> None:
    assert min_healthy_nodes({AnnotationKey.MIN_HEALTHY_NODES.value: " 8 "}) == 8
    for bad in ("0", "-1", "8.5", "²", "1e3", "", "2000000"):
        with pytest.raises(ValueError, match="whole number"):
            min_healthy_nodes({AnnotationKey.MIN_HEALTHY_NODES.value: bad})
