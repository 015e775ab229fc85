"""Kueue Topology-Aware Scheduling by count: an assignment whose levels stop above nodes (a
rack) is Ready when the rack has as many admissible nodes (the node verdict's) as its pods
take, pods divided by the pods the Workload packs on a node where its pod set says so.
The decisions on a real Store fed reports; the assignments in Kueue's own schema."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from netval.model import Status
from netval.model.spec import NetworkValidationSpec
from netval.operator.gating.facts import verdict_of
from netval.operator.kueue import decisions as kueue
from netval.operator.kueue import topology
from netval.operator.kueue.workloads import _trim
from netval.operator.state.store import Store, ValidationView
from operator_env import report
from test_kueue import individual, tas_admission, validate_status

RACK = "example.com/topology-rack"
HOSTNAME = "kubernetes.io/hostname"
POOL = "pool-a"
PENDING: dict[str, Any] = {"name": "fabric", "state": "Pending"}


def rack_store(failing: set[str], size: int = 20) -> tuple[Store, list[str]]:
    """Rack r1 with `size` GPU nodes (and a CPU node in it that no validation targets), r2
    with 4; every GPU node reported; `failing` fail."""
    store = Store(label_keys={"gpu": "1", RACK: "", HOSTNAME: ""})
    nodes = [f"r1-{i:02d}" for i in range(size)]
    for node in nodes:
        store.on_node(node, {"gpu": "1", RACK: "r1", HOSTNAME: node})
    for i in range(4):
        store.on_node(f"r2-{i}", {"gpu": "1", RACK: "r2", HOSTNAME: f"r2-{i}"})
    store.on_node("r1-cpu", {RACK: "r1", HOSTNAME: "r1-cpu"})
    spec = NetworkValidationSpec.model_validate({"nodeSelector": {"gpu": "1"}, "interval": "60s"})
    state = store.upsert_validation(POOL, generation=1, spec=spec, body={}, status=None)
    for node in sorted(state.targeted):
        store.ingest_report(report(node, Status.FAIL if node in failing else Status.PASS), False)
    state.verdict = verdict_of(POOL, state, spec, store.node_fabric, datetime.now(UTC))
    return store, nodes


def usable_view(store: Store) -> ValidationView:
    view = store.validation_view(POOL)
    assert view is not None
    # as the status writer would have written it (Usable: 1 of 24 failing, within the cap)
    from dataclasses import replace

    return replace(view, usable=True, usable_message="CapacityAvailable")


def rack_assignment(count: int, rack: str = "r1") -> dict[str, Any]:
    admission = tas_admission(
        {
            "levels": [RACK],
            "slices": [
                {
                    "domainCount": 1,
                    "valuesPerLevel": [{"universal": rack}],
                    "podCounts": {"universal": count},
                }
            ],
        }
    )
    validate_status({"admission": admission})
    return admission


def decide(store: Store, admission: dict[str, Any], workload: dict[str, Any] | None = None
           ) -> kueue.Verdict:  # fmt: skip
    placed = topology.placement(
        admission, store.node_labels, topology.pods_per_node(_trim(workload or {}))
    )
    verdict = kueue.decide(
        PENDING, usable_view(store), validation=POOL, admitted=False,
        assigned_nodes=placed.named, domains=placed.domains, pods=8,
    )  # fmt: skip
    assert verdict is not None
    return verdict


def test_rack_assignment_is_judged_by_count() -> None:
    store, _nodes = rack_store({"r1-03"})
    view = usable_view(store)
    assert view.excluded == {"r1-03"} and view.healthy_nodes == 23
    ready = decide(store, rack_assignment(8))
    assert ready.state == "Ready", ready.message
    assert f"enough healthy nodes in {RACK}=r1 (8)" in ready.message
    retry = decide(store, rack_assignment(20))
    assert retry.state == "Retry", retry.message
    assert f"domain {RACK}=r1 has 19 healthy node(s), the assignment needs 20" in retry.message
    # 19 of 20 is enough for 19 pods; the untargeted CPU node in the rack never counts
    assert decide(store, rack_assignment(19)).state == "Ready"


def test_pods_per_node_from_the_pod_set() -> None:
    """A pod set whose slices are required on one node packs `podSetSliceSize` pods a node
    (Kueue's topologyRequest, or the template annotations it comes from)."""
    store, _ = rack_store({"r1-03", "r1-04", "r1-05", "r1-06", "r1-07"})  # 15 left in r1
    admission = rack_assignment(40)
    assert decide(store, admission).state == "Retry"  # one pod a node: 40 nodes
    packed = {"spec": {"podSets": [{"name": "ps-0", "count": 40, "topologyRequest": {
        "required": RACK, "podSetSliceRequiredTopology": HOSTNAME, "podSetSliceSize": 4}}]}}  # fmt: skip
    assert decide(store, admission, packed).state == "Ready"  # 10 nodes of 15
    annotated = {"spec": {"podSets": [{"name": "ps-0", "count": 40, "template": {"metadata": {
        "annotations": {topology.SLICE_TOPOLOGY: HOSTNAME, topology.SLICE_SIZE: "2"}}}}]}}  # fmt: skip
    verdict = decide(store, admission, annotated)  # 20 nodes of 15
    assert verdict.state == "Retry" and "has 15 healthy node(s), the assignment needs 20" in (
        verdict.message
    )
    # a slice at the rack level says nothing about nodes: one pod a node
    racked = {"spec": {"podSets": [{"name": "ps-0", "count": 40, "topologyRequest": {
        "podSetSliceRequiredTopology": RACK, "podSetSliceSize": 20}}]}}  # fmt: skip
    assert topology.pods_per_node(_trim(racked)) == {}


def test_two_pod_sets_in_one_rack_add_up_and_hostnames_still_name_nodes() -> None:
    store, _ = rack_store({"r1-03"})
    both = tas_admission(
        {"levels": [RACK], "slices": [{"domainCount": 1, "valuesPerLevel": [{"universal": "r1"}],
                                       "podCounts": {"universal": 10}}]},
        {"levels": [RACK], "slices": [{"domainCount": 2, "valuesPerLevel": [
            individual(["1", "2"], prefix="r")], "podCounts": {"individual": [10, 2]}}]},
    )  # fmt: skip
    validate_status({"admission": both})
    placed = topology.placement(both, store.node_labels)
    assert [(d.describe(), d.needed, len(d.nodes)) for d in placed.domains] == [
        (f"{RACK}=r1", 20, 21),  # the CPU node matches the labels; it is not admissible
        (f"{RACK}=r2", 2, 4),
    ]
    assert decide(store, both).state == "Retry"
    on_host = tas_admission({"levels": [RACK, HOSTNAME], "slices": [{"domainCount": 1,
        "valuesPerLevel": [{"universal": "r1"}, {"universal": "r1-03"}],
        "podCounts": {"universal": 1}}]})  # fmt: skip
    validate_status({"admission": on_host})
    retry = decide(store, on_host)
    assert retry.state == "Retry" and "unhealthy fabric: r1-03" in retry.message
