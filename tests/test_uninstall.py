"""`netval uninstall-cleanup` (the chart's pre-delete hook) as a real process against the test
Kubernetes API (tests/kube.py): it removes exactly what netval wrote and nothing else, is
idempotent, and names what it could not clean (exit 1) while cleaning the rest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kmock
import kopf

from kube import KubeCluster
from netval.model.keys import AnnotationKey, LabelKey, SchedulingGate, TaintKey
from netval.model.topology import NetvalTopologyLabel
from netval.operator import uninstall
from netval.operator.admission import configurations as admission

ROOT = Path(__file__).resolve().parent.parent
ADMISSIONREG = "admissionregistration.k8s.io/v1"
NV = "netval.io/v1alpha1"
LEAF = NetvalTopologyLabel.LEAF.value
NS = "netval-system"
AGENTS = "netval-agents"
FOREIGN_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OUR_TAINT = {"key": TaintKey.FABRIC_UNHEALTHY.value, "effect": "NoSchedule"}
FOREIGN_GATE = {"name": "kueue.x-k8s.io/topology"}


def run_cleanup(kube: KubeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kube.kubeconfig_path),
        "PYTHONPATH": str(ROOT / "src"),
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)  # never the in-cluster configuration
    return subprocess.run(
        [sys.executable, "-m", "netval.cli", "uninstall-cleanup", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def node(name: str, labels: dict[str, str], taints: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
    }


def pod(name: str, gates: list[dict[str, str]], *, netval: bool) -> dict[str, Any]:
    labels = {"app": "trainer"}
    annotations = {"team": "ml"}
    if netval:
        labels[LabelKey.GATED_BY] = "roce-training-pool"
        annotations[AnnotationKey.REQUIRE_HEALTHY] = "roce-training-pool"
        annotations[AnnotationKey.GATE_MESSAGE] = "waiting for roce-training-pool"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "schedulingGates": gates,
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


def validation(name: str, finalizers: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": NV,
        "kind": "NetworkValidation",
        "metadata": {"name": name, "finalizers": finalizers},
        "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
    }


def webhook_configurations(kube: KubeCluster) -> None:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for name in ("netval.io", "someone-elses"):
            kube.create(
                {
                    "apiVersion": ADMISSIONREG,
                    "kind": kind,
                    "metadata": {"name": name},
                    "webhooks": [],
                }
            )


def agent_objects(kube: KubeCluster) -> None:
    kube.ensure_namespace(AGENTS)
    ours = {"app.kubernetes.io/managed-by": "netval-operator", "netval.io/validation": "pool"}
    for name, labels in (("netval-agent-pool", ours), ("unrelated", {"app": "x"})):
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": AGENTS, "labels": labels},
                "data": {"a": "b"},
            }
        )
        kube.create(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name, "namespace": AGENTS, "labels": labels},
                "spec": {
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                    },
                },
            }
        )


def operator_deployment(kube: KubeCluster) -> None:
    kube.ensure_namespace(NS)
    kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "netval-operator", "namespace": NS},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/component": "operator"}},
                    "spec": {"containers": [{"name": "operator", "image": "netval"}]},
                },
            },
        }
    )


def populate(kube: KubeCluster) -> None:
    kube.create(
        node(
            "gpu-1",
            {LabelKey.FABRIC: "unhealthy", "nvidia.com/gpu.present": "true"},
            [FOREIGN_TAINT, OUR_TAINT],
        )
    )
    kube.create(node("gpu-2", {LabelKey.FABRIC: "healthy", LEAF: "leaf-1"}, []))
    # a published topology label alone is netval's too (spec.topology.publishLabels)
    kube.create(node("gpu-3", {"zone": "a", LEAF: "leaf-2"}, [OUR_TAINT]))
    kube.create(node("cpu-1", {"zone": "b"}, [FOREIGN_TAINT]))
    kube.ensure_namespace("team-a")
    kube.create(pod("gated", [{"name": SchedulingGate.FABRIC.value}, FOREIGN_GATE], netval=True))
    kube.create(pod("gated-alone", [{"name": SchedulingGate.FABRIC.value}], netval=True))
    kube.create(pod("bystander", [FOREIGN_GATE], netval=False))
    kube.create(validation("pool", [uninstall.KOPF_FINALIZER, "example.com/keep"]))
    kube.create(validation("plain", []))
    webhook_configurations(kube)
    agent_objects(kube)
    operator_deployment(kube)


CLEANUP_ARGS = ("--operator-deployment", f"{NS}/netval-operator", "--agent-namespace", AGENTS)


def test_constants_match_the_operator() -> None:
    assert uninstall.WEBHOOK_CONFIGURATION == admission.CONFIGURATION_NAME
    assert kopf.OperatorSettings().persistence.finalizer == uninstall.KOPF_FINALIZER


def test_removes_exactly_what_netval_wrote(kube: KubeCluster) -> None:
    populate(kube)
    done = run_cleanup(kube, *CLEANUP_ARGS)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    # The operator went first, so that it could not put anything back.
    assert kube.get("apps/v1", "deployments", "netval-operator", NS)["spec"]["replicas"] == 0
    # Nodes: netval's label and taint gone, foreign ones kept.
    nodes = {n["metadata"]["name"]: n for n in kube.list("v1", "nodes")}
    assert nodes["gpu-1"]["metadata"]["labels"] == {"nvidia.com/gpu.present": "true"}
    assert nodes["gpu-1"]["spec"]["taints"] == [FOREIGN_TAINT]
    assert not nodes["gpu-2"]["metadata"].get("labels")
    assert not nodes["gpu-3"]["spec"].get("taints")
    assert nodes["gpu-3"]["metadata"]["labels"] == {"zone": "a"}
    assert nodes["cpu-1"]["spec"]["taints"] == [FOREIGN_TAINT]
    # Pods: netval's gate, label and note gone, the rest kept.
    gated = kube.get("v1", "pods", "gated", "team-a")
    assert gated["spec"]["schedulingGates"] == [FOREIGN_GATE]
    assert gated["metadata"]["labels"] == {"app": "trainer"}
    assert gated["metadata"]["annotations"] == {
        "team": "ml",
        AnnotationKey.REQUIRE_HEALTHY: "roce-training-pool",
    }
    assert not kube.get("v1", "pods", "gated-alone", "team-a")["spec"].get("schedulingGates")
    assert kube.get("v1", "pods", "bystander", "team-a")["spec"]["schedulingGates"] == [
        FOREIGN_GATE
    ]
    # Finalizers: only Kopf's.
    assert kube.get(NV, "networkvalidations", "pool")["metadata"]["finalizers"] == [
        "example.com/keep"
    ]
    # Webhook configurations: only netval's.
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        assert kube.stored(ADMISSIONREG, plural, "netval.io") is None
        assert kube.stored(ADMISSIONREG, plural, "someone-elses") is not None
    # Agent objects: only the operator's.
    for plural in ("configmaps", "daemonsets"):
        version = "v1" if plural == "configmaps" else "apps/v1"
        names = {o["metadata"]["name"] for o in kube.list(version, plural, AGENTS)}
        assert names == {"unrelated"}
    assert "released 2" in done.stdout
    assert "removed netval's label/taint from 3" in done.stdout
    assert "removed Kopf's finalizer from 1" in done.stdout

    # Idempotent: a second run finds nothing to do and writes nothing.
    writes_before = [r for r in kube.requests() if r[0] in {"PATCH", "PUT", "DELETE", "POST"}]
    again = run_cleanup(kube, *CLEANUP_ARGS)
    assert again.returncode == 0, again.stderr
    writes_after = [r for r in kube.requests() if r[0] in {"PATCH", "PUT", "DELETE", "POST"}]
    new_writes = writes_after[len(writes_before) :]
    # Only the (no-op) scale-down and the webhook deletes that answer 404.
    assert all("deployments" in path or "webhookconfigurations" in path for _, path in new_writes)
    assert "released 0" in again.stdout and "from 0" in again.stdout


def test_a_failure_is_named_and_the_rest_is_cleaned(kube: KubeCluster) -> None:
    populate(kube)

    async def break_one_node() -> None:
        kube.api[kmock.method.PATCH, kmock.resource("", "v1", "nodes"), kmock.name("gpu-3")] << 500

    kube.call(break_one_node)
    done = run_cleanup(kube, *CLEANUP_ARGS)
    assert done.returncode == 1
    assert "not cleaned: nodes: gpu-3: 500" in done.stderr
    assert "1 item(s) could not be cleaned" in done.stderr
    nodes = {n["metadata"]["name"]: n for n in kube.list("v1", "nodes")}
    assert nodes["gpu-1"]["spec"]["taints"] == [FOREIGN_TAINT]
    assert nodes["gpu-3"]["spec"]["taints"] == [OUR_TAINT]
    # Every later step still ran.
    assert kube.get("v1", "pods", "gated", "team-a")["spec"]["schedulingGates"] == [FOREIGN_GATE]
    assert kube.stored(ADMISSIONREG, "mutatingwebhookconfigurations", "netval.io") is None
    assert kube.get(NV, "networkvalidations", "pool")["metadata"]["finalizers"] == [
        "example.com/keep"
    ]


def test_a_conflicting_write_is_retried_on_fresh_data(kube: KubeCluster) -> None:
    populate(kube)

    async def conflict_once() -> None:
        (
            kube.api[kmock.method.PATCH, kmock.resource("", "v1", "nodes"), kmock.name("gpu-1")][:1]
            << 409
        )

    kube.call(conflict_once)
    done = run_cleanup(kube, *CLEANUP_ARGS)
    assert done.returncode == 0, done.stderr
    assert kube.get("v1", "nodes", "gpu-1")["spec"]["taints"] == [FOREIGN_TAINT]
    patches = [p for m, p in kube.requests() if m == "PATCH" and p.endswith("/nodes/gpu-1")]
    assert len(patches) == 2  # refused once, then written from a fresh read


def test_without_a_cluster_it_is_a_usage_error(tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "missing"), "PYTHONPATH": str(ROOT / "src")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    done = subprocess.run(
        [sys.executable, "-m", "netval.cli", "uninstall-cleanup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "no Kubernetes configuration" in done.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "netval.cli", "uninstall-cleanup", "--operator-deployment", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "NAMESPACE/NAME" in bad.stderr


def test_kueue_topologies_netval_wrote_are_deleted(kube: KubeCluster) -> None:
    from netval.operator.topology.kueue_topology import topology_object
    from test_kueue_topology_writer import topology_crd

    # Without Kueue: nothing to do, and no failure.
    done = run_cleanup(kube, "--kueue-topologies")
    assert done.returncode == 0, done.stderr
    assert "kueue topologies: no Kueue Topology API" in done.stdout

    kube.add_crd(topology_crd("v1beta2"))
    kube.create(topology_object("netval-pool", "pool", ["x/leaf"], "v1beta2"))
    foreign = topology_object("theirs", "pool", ["x/leaf"], "v1beta2")
    foreign["metadata"]["labels"] = {"team": "ml"}
    kube.create(foreign)
    skipped = run_cleanup(kube)  # the chart passes the flag only with kueue.topologies
    assert "kueue topologies: skipped" in skipped.stdout
    done = run_cleanup(kube, "--kueue-topologies")
    assert done.returncode == 0, done.stderr
    assert "deleted 1 Kueue Topologies" in done.stdout
    names = {t["metadata"]["name"] for t in kube.list("kueue.x-k8s.io/v1beta2", "topologies")}
    assert names == {"theirs"}
