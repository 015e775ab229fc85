"""The Node watch keeps only the label keys validations reference, through the real operator
(Kopf, the kmock API, a real broker): the other labels of each Node event are dropped at
once, and a validation referencing a key not kept yet gets it from one paged metadata-only
listing of the Nodes."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kube import KubeCluster, wait_for
from netval.operator.state.node_labels import kept_labels, referenced_keys
from netval.operator.term_runtime import OperatorRuntime
from operator_env import GPU, NODES, NV, validation, wait_status

NFD = {f"feature.node.kubernetes.io/cpu-cpuid.F{i:03d}": "true" for i in range(150)}
ZONE = "topology.kubernetes.io/zone"


def _targeted(cluster: KubeCluster, name: str) -> int:
    status = cluster.get(NV, "networkvalidations", name).get("status") or {}
    return int((status.get("nodes") or {}).get("targeted", -1))


def test_node_labels_kept_are_those_referenced(
    cluster: KubeCluster, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> None:
    runtime, _ = operator
    for node in NODES:
        cluster.patch("v1", "nodes", node, {"metadata": {"labels": NFD}})
    # labelled before any validation references the key: not kept by the watch
    for node in NODES[:2]:
        cluster.patch("v1", "nodes", node, {"metadata": {"labels": {"example.com/pool": "b"}}})
    cluster.create(validation())
    wait_status(cluster, lambda s: s.get("nodes", {}).get("targeted") == 4, "4 targeted")
    wait_for(
        lambda: all(
            "feature.node.kubernetes.io/cpu-cpuid.F000" not in runtime.store.node_labels.get(n, {})
            for n in NODES
        ),
        what="NFD labels dropped",
    )
    assert runtime.store.node_labels["gpu-a"] == {**GPU, ZONE: "rack-1"}

    # A new key: one paged listing of the Nodes' metadata fills it in.
    before = len(cluster.requests())
    cluster.create(validation("pool-b", nodeSelector={"example.com/pool": "b"}))
    wait_for(lambda: _targeted(cluster, "pool-b") == 2, timeout=30, what="pool-b targets 2")
    listings = [
        p for m, p in cluster.requests()[before:] if m == "GET" and p.startswith("/api/v1/nodes?")
    ]
    assert any("limit=500" in p and "watch" not in p for p in listings)
    assert runtime.store.node_labels["gpu-a"]["example.com/pool"] == "b"
    assert not runtime.store.label_keys_missing

    # From then on Node events carry it.
    cluster.patch("v1", "nodes", "gpu-c", {"metadata": {"labels": {"example.com/pool": "b"}}})
    wait_for(lambda: _targeted(cluster, "pool-b") == 3, timeout=30, what="pool-b targets 3")
    cluster.patch("v1", "nodes", "gpu-a", {"metadata": {"labels": {"example.com/pool": None}}})
    wait_for(lambda: _targeted(cluster, "pool-b") == 2, timeout=30, what="gpu-a left pool-b")


def test_kept_label_keys() -> None:
    from netval.model.spec import NetworkValidationSpec

    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": GPU, "checks": {"peers": {"enabled": True, "topologyKey": "x/rack"}}}
    )
    keys = referenced_keys([spec])
    assert keys == {"kubernetes.io/hostname", "x/rack", *GPU}
    labels = {**GPU, **NFD, "x/rack": "r1", "netval.io/fabric": "healthy",
              "cloud.example.com/topology-block": "b1", "other": "v"}  # fmt: skip
    assert kept_labels(labels, keys) == {**GPU, "x/rack": "r1",
                                         "cloud.example.com/topology-block": "b1"}  # fmt: skip


def test_a_cohort_label_is_kept() -> None:
    from netval.model.spec import NetworkValidationSpec

    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": GPU, "consistency": {"cohortLabel": "example.com/pool"}}
    )
    assert "example.com/pool" in referenced_keys([spec])
