"""The Kueue Topology reconciler (spec.topology.publishKueueTopology) through the real
operator (Kopf, the kmock API): the version the cluster serves, created once and left alone,
replaced when the levels change, deleted when switched off or the validation goes; a cluster
without Kueue gets one Event and no discovery per round."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kube import KubeCluster, wait_for
from netval.operator.term_runtime import OperatorRuntime
from netval.operator.topology.kueue_topology import (
    serves_topologies,
    topology_name,
    topology_object,
)
from operator_env import NV, validation

KUEUE = "kueue.x-k8s.io"
DATA = Path(__file__).parent / "data" / "kueue"
LEVELS = ["example.com/block", "example.com/leaf"]
HOST = "kubernetes.io/hostname"


def topology_crd(*versions: str) -> dict[str, Any]:
    """Kueue's Topology CRD, reduced to what the emulator needs: the served versions."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"topologies.{KUEUE}"},
        "spec": {
            "group": KUEUE,
            "scope": "Cluster",
            "names": {"plural": "topologies", "kind": "Topology", "singular": "topology"},
            "versions": [
                {"name": v, "served": True, "storage": v == versions[0]} for v in versions
            ],
        },
    }


def publishing(name: str = "pool-a", **topology: Any) -> dict[str, Any]:
    return validation(
        name,
        topology={"levels": LEVELS, "publishKueueTopology": {"enabled": True}, **topology},
        gating={"nodeLabel": False},
    )


def topologies(cluster: KubeCluster, version: str) -> dict[str, dict[str, Any]]:
    return {t["metadata"]["name"]: t for t in cluster.list(f"{KUEUE}/{version}", "topologies")}


def calls(cluster: KubeCluster, method: str, version: str) -> int:
    prefix = f"/apis/{KUEUE}/{version}/topologies"
    return sum(1 for m, p in cluster.requests() if m == method and p.startswith(prefix))


def settle(runtime: OperatorRuntime, rounds: int = 3) -> None:
    writer = runtime.kueue_topologies
    start = writer.rounds
    wait_for(lambda: writer.rounds >= start + rounds, what=f"{rounds} more rounds")


def levels(obj: dict[str, Any]) -> list[str]:
    return [level["nodeLabel"] for level in obj["spec"]["levels"]]


def test_pure_pieces() -> None:
    assert serves_topologies(["workloads", "topologies"])
    assert not serves_topologies(["workloads", "resourceflavors"])
    assert topology_name("pool", None) == "netval-pool"
    assert topology_name("pool", "tas") == "tas"
    assert len(topology_name("x" * 253, None)) == 253
    owner = {"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": "p", "uid": "u"}}
    (ref,) = topology_object("t", "p", LEVELS, "v1beta2", owner)["metadata"]["ownerReferences"]
    assert ref == {"apiVersion": NV, "kind": "NetworkValidation", "name": "p", "uid": "u"}


def test_created_once_replaced_on_a_level_change_deleted_when_switched_off(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    runtime, _ = operator
    cluster.add_crd(topology_crd("v1beta2", "v1beta1"))
    cluster.create(publishing())
    made = wait_for(
        lambda: topologies(cluster, "v1beta2").get("netval-pool-a"), timeout=30, what="created"
    )
    assert levels(made) == [*LEVELS, HOST]
    schema = json.loads((DATA / "topology-spec.v1beta2.schema.json").read_text())
    jsonschema.Draft4Validator(schema).validate(made["spec"])
    owner = cluster.get(NV, "networkvalidations", "pool-a")["metadata"]["uid"]
    assert made["metadata"]["ownerReferences"][0]["uid"] == owner
    assert topologies(cluster, "v1beta1") == {}  # the newest served version only

    # Steady state: no write, no list, round after round.
    settle(runtime)
    lists, posts = calls(cluster, "GET", "v1beta2"), calls(cluster, "POST", "v1beta2")
    settle(runtime, 5)
    assert (calls(cluster, "GET", "v1beta2"), calls(cluster, "POST", "v1beta2")) == (lists, posts)
    assert posts == 1 and runtime.kueue_topologies.writes == 1

    # Levels are immutable: a change replaces the object (one DELETE, one POST).
    cluster.patch(
        NV, "networkvalidations", "pool-a", {"spec": {"topology": {"levels": ["example.com/leaf"]}}}
    )
    wait_for(
        lambda: (
            levels(topologies(cluster, "v1beta2").get("netval-pool-a") or made)
            == ["example.com/leaf", HOST]
        ),
        timeout=30,
        what="replaced",
    )
    settle(runtime)
    assert calls(cluster, "DELETE", "v1beta2") == 1 and calls(cluster, "POST", "v1beta2") == 2

    # Switched off: deleted.
    cluster.patch(
        NV,
        "networkvalidations",
        "pool-a",
        {"spec": {"topology": {"publishKueueTopology": {"enabled": False}}}},
    )
    wait_for(lambda: topologies(cluster, "v1beta2") == {}, timeout=30, what="deleted")


def test_v1beta1_when_that_is_what_is_served_and_gone_with_the_validation(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    cluster.add_crd(topology_crd("v1beta1"))
    cluster.create(publishing(publishKueueTopology={"enabled": True, "name": "tas"}))
    made = wait_for(lambda: topologies(cluster, "v1beta1").get("tas"), timeout=30, what="created")
    schema = json.loads((DATA / "topology-spec.v1beta1.schema.json").read_text())
    jsonschema.Draft4Validator(schema).validate(made["spec"])
    assert made["apiVersion"] == f"{KUEUE}/v1beta1"
    # The emulator has no garbage collector: the operator deletes it itself.
    cluster.delete(NV, "networkvalidations", "pool-a")
    wait_for(lambda: topologies(cluster, "v1beta1") == {}, timeout=30, what="deleted")


def test_without_kueue_one_event_and_a_slow_retry(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    runtime, _ = operator
    writer = runtime.kueue_topologies
    cluster.create(publishing())

    def failed() -> list[dict[str, Any]]:
        return [
            e
            for e in cluster.list("v1", "events", "default")
            if e.get("reason") == "KueueTopologyFailed"
        ]

    (event,) = wait_for(failed, timeout=30, what="the Event")
    assert "serves no Kueue Topology API" in event["message"]
    discoveries = writer.discoveries
    settle(runtime, 5)
    assert writer.discoveries == discoveries and len(failed()) == 1

    # Kueue installed later: picked up at the next retry (made due here, not waited for).
    cluster.add_crd(topology_crd("v1beta2"))
    writer.hold_until = 0.0
    wait_for(lambda: topologies(cluster, "v1beta2"), timeout=30, what="created after install")


def test_a_foreign_topology_of_that_name_is_left_alone(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    runtime, _ = operator
    cluster.add_crd(topology_crd("v1beta2"))
    foreign = {
        "apiVersion": f"{KUEUE}/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "netval-pool-a"},
        "spec": {"levels": [{"nodeLabel": HOST}]},
    }
    cluster.create(foreign)
    cluster.create(publishing())
    wait_for(
        lambda: any(
            e.get("reason") == "KueueTopologyFailed" and "not netval's" in e["message"]
            for e in cluster.list("v1", "events", "default")
        ),
        timeout=30,
        what="the Event",
    )
    settle(runtime)
    assert levels(topologies(cluster, "v1beta2")["netval-pool-a"]) == [HOST]
    assert calls(cluster, "DELETE", "v1beta2") == 0


def test_two_validations_naming_one_topology_the_second_is_told_once(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    runtime, _ = operator
    cluster.add_crd(topology_crd("v1beta2"))
    shared = {"enabled": True, "name": "tas"}
    cluster.create(publishing("pool-a", publishKueueTopology=shared))
    cluster.create(publishing("pool-b", publishKueueTopology=shared))
    made = wait_for(lambda: topologies(cluster, "v1beta2").get("tas"), timeout=30, what="made")
    assert made["metadata"]["labels"]["netval.io/validation"] == "pool-a"

    def told() -> list[dict[str, Any]]:
        return [
            e
            for e in cluster.list("v1", "events", "default")
            if e.get("reason") == "KueueTopologyFailed"
        ]

    (event,) = wait_for(told, timeout=30, what="the Event")
    assert event["involvedObject"]["name"] == "pool-b" and "pool-a's already" in event["message"]
    settle(runtime, 5)
    assert len(told()) == 1
