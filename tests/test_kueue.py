"""The Kueue AdmissionCheck controller end to end: AdmissionCheck and Workload objects in
Kueue's shapes (v1beta2, and v1beta1 where only that is served) in the Kubernetes API; the
test plays Kueue's part (reserving quota, admitting); health comes from MQTT reports."""

from __future__ import annotations

import dataclasses
import time
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

import kopf
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.operator.kueue import decisions, topology
from netval.operator.kueue.admission_checks import CONTROLLER_NAME
from netval.operator.kueue.controller import KueueController
from netval.operator.runtime import OperatorRuntime, ValidationView
from operator_env import NODES, publish, report, report_msg, settings_for, validation

MODULES = [
    "netval.operator.handlers",
    "netval.operator.admission.handlers",
    "netval.operator.kueue.handlers",
]
KUEUE_KINDS = ("workloads", "localqueues", "clusterqueues", "admissionchecks", "resourceflavors")
FOREIGN = "kueue.x-k8s.io/provisioning-request"


def kueue_version(version: str) -> str:
    return f"kueue.x-k8s.io/{version}"


def admission_check(
    name: str,
    validation_name: str = "pool-a",
    *,
    version: str = "v1beta2",
    controller: str = CONTROLLER_NAME,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    params = parameters or {
        "apiGroup": "netval.io",
        "kind": "NetworkValidation",
        "name": validation_name,
    }
    return {
        "apiVersion": kueue_version(version),
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "spec": {"controllerName": controller, "parameters": params},
    }


def workload(name: str, *, version: str = "v1beta2") -> dict[str, Any]:
    return {
        "apiVersion": kueue_version(version),
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "queueName": "team-a",
            "podSets": [
                {
                    "name": "main",
                    "count": 2,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "busybox"}],
                        }
                    },
                }
            ],
        },
    }


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kueue_condition(kind: str, reason: str) -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": reason,
            "lastTransitionTime": now()}  # fmt: skip


def pending(name: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": "Pending", "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip


class Kueue:
    """Plays Kueue: creates objects, reserves quota, admits; reads the results back."""

    def __init__(self, kube: KubeCluster, version: str) -> None:
        self.kube = kube
        self.version = version
        self.api = kueue_version(version)

    def ac(self, name: str) -> dict[str, Any]:
        return self.kube.get(self.api, "admissionchecks", name)

    def active(self, name: str) -> dict[str, Any] | None:
        conditions = (self.ac(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Active"), None)

    def wl(self, name: str) -> dict[str, Any]:
        return self.kube.get(self.api, "workloads", name, "default")

    def checks(self, name: str) -> dict[str, dict[str, Any]]:
        status = self.wl(name).get("status") or {}
        return {c["name"]: c for c in status.get("admissionChecks") or []}

    def queue(self, name: str, checks: list[str], admission: dict[str, Any] | None = None) -> None:
        """A Workload Kueue has seen: its checks Pending, no quota yet."""
        self.kube.create(workload(name, version=self.version))
        status: dict[str, Any] = {"admissionChecks": [pending(c, "queued") for c in checks]}
        if admission is not None:
            status["admission"] = admission
        self.kube.patch(self.api, "workloads", name, {"status": status}, "default",
                        subresource="status")  # fmt: skip

    def reserve(self, name: str, *, admitted: bool = False) -> None:
        conditions = [kueue_condition("QuotaReserved", "QuotaReserved")]
        if admitted:
            conditions.append(kueue_condition("Admitted", "Admitted"))
        status = self.wl(name)["status"]
        status["conditions"] = conditions
        status.setdefault("admission", {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "flavors": {"nvidia.com/gpu": "h100"}, "count": 2}]})  # fmt: skip
        self.kube.patch(self.api, "workloads", name, {"status": status}, "default",
                        subresource="status")  # fmt: skip

    def wait_state(self, wl: str, check: str, state: str, timeout: float = 10) -> dict[str, Any]:
        return wait_for(
            lambda: (c := self.checks(wl).get(check)) is not None and c["state"] == state and c,
            timeout=timeout,
            what=f"{wl}: {check} {state}",
        )


def operator_for(
    kube: KubeCluster, broker: MosquittoBroker
) -> tuple[kopf.Memo, AbstractContextManager[Any]]:
    settings = dataclasses.replace(settings_for(broker), kueue_enabled=True)
    memo = kopf.Memo(settings=settings, span_exporter=InMemorySpanExporter())
    return memo, kopf_operator(kube, modules=MODULES, memo=memo)


def started(memo: kopf.Memo) -> tuple[OperatorRuntime, KueueController]:
    runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="operator runtime")
    wait_for(lambda: runtime.ingest.synced.is_set(), timeout=30, what="MQTT ingest synced")
    controller = wait_for(lambda: memo.get("kueue"), timeout=30, what="Kueue controller")
    assert isinstance(runtime, OperatorRuntime) and isinstance(controller, KueueController)
    return runtime, controller


def healthy(broker: MosquittoBroker) -> None:
    publish(broker, [report_msg(report(n)) for n in NODES])


def failing(broker: MosquittoBroker, node: str = "gpu-b") -> None:
    publish(broker, [report_msg(report(node, Status.FAIL))])


def wait_view(runtime: OperatorRuntime, pred: Any, what: str) -> ValidationView:
    return wait_for(
        lambda: (v := runtime.validation_view("pool-a")) is not None and pred(v) and v,
        timeout=30,
        what=what,
    )


# -- v1beta2 (the preferred version where Kueue serves it) ---------------------------------------


def test_active_condition_and_check_states(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    k = Kueue(cluster, "v1beta2")
    cluster.create(validation())
    for ac in (
        admission_check("fabric"),
        admission_check("prov", controller=FOREIGN,
                        parameters={"apiGroup": "kueue.x-k8s.io",
                                    "kind": "ProvisioningRequestConfig", "name": "p"}),
        admission_check("bad", parameters={"apiGroup": "", "kind": "ConfigMap", "name": "x"}),
        admission_check("ghost", "nope"),
    ):  # fmt: skip
        cluster.create(ac)
    # wl-1: not yet reserved; wl-2: will be admitted (running) before the fabric turns bad
    k.queue("wl-1", ["fabric", "prov"])
    k.queue("wl-2", ["fabric"])

    memo, operator = operator_for(cluster, mosquitto_broker)
    with operator:
        runtime, controller = started(memo)

        active = wait_for(lambda: k.active("fabric"), timeout=30, what="fabric Active")
        assert (active["status"], active["reason"]) == ("True", "Active")
        assert active["observedGeneration"] == k.ac("fabric")["metadata"]["generation"]
        bad = wait_for(lambda: k.active("bad"), timeout=30, what="bad Active")
        assert (bad["status"], bad["reason"]) == ("False", "BadParameters")
        assert "NetworkValidation" in bad["message"]
        ghost = wait_for(lambda: k.active("ghost"), timeout=30, what="ghost Active")
        assert (ghost["status"], ghost["reason"]) == ("False", "ValidationNotFound")
        assert "'nope'" in ghost["message"]
        assert not (k.ac("prov").get("status") or {}).get("conditions")  # not ours

        # before quota reservation: nothing is touched
        wl1_rv = k.wl("wl-1")["metadata"]["resourceVersion"]
        time.sleep(2.5 * controller.interval)
        assert k.wl("wl-1")["metadata"]["resourceVersion"] == wl1_rv
        assert k.checks("wl-1")["fabric"]["message"] == "queued"

        # quota reserved, no report yet (Healthy Unknown): Pending, saying what it waits for
        k.reserve("wl-1")
        fabric = wait_for(
            lambda: "waiting for" in (c := k.checks("wl-1")["fabric"])["message"] and c,
            timeout=30,
            what="wl-1 fabric Pending with a message",
        )
        assert fabric["state"] == "Pending" and "pool-a" in fabric["message"]
        prov_before = k.checks("wl-1")["prov"]

        # healthy: Ready; the foreign check is left exactly as it was
        healthy(mosquitto_broker)
        ready = k.wait_state("wl-1", "fabric", "Ready")
        assert "is Healthy" in ready["message"]
        assert ready["lastTransitionTime"] != "2026-01-01T00:00:00Z"
        assert k.checks("wl-1")["prov"] == prov_before
        k.reserve("wl-2", admitted=True)
        k.wait_state("wl-2", "fabric", "Ready")

        # unhealthy after Ready: Retry for the waiting workload, the admitted one runs on
        failing(mosquitto_broker)
        retry = k.wait_state("wl-1", "fabric", "Retry")
        assert "no longer Healthy" in retry["message"] and "gpu-b" in retry["message"]
        assert k.checks("wl-1")["prov"] == prov_before
        time.sleep(2.5 * controller.interval)
        assert k.checks("wl-2")["fabric"]["state"] == "Ready"
        assert k.checks("wl-1")["fabric"]["state"] == "Retry"  # Kueue resets it, not us

        # the missing validation appears: its AdmissionCheck turns Active
        cluster.create(validation("nope"))
        wait_for(
            lambda: (c := k.active("ghost")) is not None and c["status"] == "True",
            timeout=30,
            what="ghost Active once its validation exists",
        )
        assert controller.patches > 0
        del runtime


def test_assigned_unhealthy_node_asks_for_retry(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    """Topology-Aware Scheduling names the nodes: an assignment on a failing node is sent
    back to Kueue (Retry) at once; one on good nodes waits for the validation."""
    k = Kueue(cluster, "v1beta2")
    cluster.create(validation())
    cluster.create(admission_check("fabric"))

    def on_hosts(*hosts: str) -> dict[str, Any]:
        ta = {
            "levels": ["kubernetes.io/hostname"],
            "slices": [
                {
                    "domainCount": len(hosts),
                    "valuesPerLevel": [
                        {"prefix": "gpu-", "roots": [h.removeprefix("gpu-") for h in hosts]}
                    ],
                    "universalPodCount": 1,
                }
            ],
        }
        return {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "count": len(hosts), "topologyAssignment": ta}]}  # fmt: skip

    k.queue("on-b", ["fabric"], admission=on_hosts("gpu-a", "gpu-b"))
    k.queue("on-cd", ["fabric"], admission=on_hosts("gpu-c", "gpu-d"))
    memo, operator = operator_for(cluster, mosquitto_broker)
    with operator:
        runtime, _ = started(memo)
        publish(mosquitto_broker, [report_msg(report(n, Status.FAIL if n == "gpu-b"
                                                     else Status.PASS)) for n in NODES])  # fmt: skip
        wait_view(runtime, lambda v: v.unhealthy_nodes == ["gpu-b"], "gpu-b unhealthy")
        k.reserve("on-b")
        k.reserve("on-cd")
        retry = k.wait_state("on-b", "fabric", "Retry")
        assert "gpu-b" in retry["message"] and "other nodes" in retry["message"]
        wait_for(lambda: "waiting for" in k.checks("on-cd")["fabric"]["message"],
                 timeout=30, what="on-cd Pending")  # fmt: skip
        assert k.checks("on-cd")["fabric"]["state"] == "Pending"
        healthy(mosquitto_broker)
        ready = k.wait_state("on-cd", "fabric", "Ready")
        assert "gpu-c, gpu-d" in ready["message"]


# -- v1beta1 only (an older Kueue) ----------------------------------------------------------------


def test_v1beta1_when_v1beta2_is_not_served(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    async def serve_v1beta1_only() -> None:
        for plural in KUEUE_KINDS:
            del cluster.api.resources[f"kueue.x-k8s.io/v1beta2/{plural}"]

    cluster.call(serve_v1beta1_only)
    group = cluster.request("GET", "/apis/kueue.x-k8s.io").body
    assert group["preferredVersion"]["version"] == "v1beta1"

    k = Kueue(cluster, "v1beta1")
    cluster.create(validation())
    cluster.create(admission_check("fabric", version="v1beta1"))
    k.queue("wl", ["fabric"])
    memo, operator = operator_for(cluster, mosquitto_broker)
    with operator:
        started(memo)
        active = wait_for(lambda: k.active("fabric"), timeout=30, what="Active (v1beta1)")
        assert active["status"] == "True"
        k.reserve("wl")
        healthy(mosquitto_broker)
        k.wait_state("wl", "fabric", "Ready")
    writes = [p for m, p in cluster.requests() if m == "PATCH" and "kueue.x-k8s.io" in p]
    assert writes and all("/v1beta1/" in p for p in writes)


# -- pure parts ----------------------------------------------------------------------------------


def test_topology_assignment_forms() -> None:
    v1beta1 = {
        "topologyAssignment": {
            "levels": ["rack", "kubernetes.io/hostname"],
            "domains": [{"values": ["r1", "n1"], "count": 2}, {"values": ["r1", "n2"], "count": 1}],
        }
    }
    v1beta2 = {"topologyAssignment": {"levels": ["rack"], "slices": [
        {"domainCount": 2, "valuesPerLevel": [{"prefix": "rack-", "roots": ["1", "2"]}],
         "podCounts": [4, 2]},
        {"domainCount": 1, "valuesPerLevel": [{"universalValue": "rack-9"}],
         "universalPodCount": 1}]}}  # fmt: skip
    assert topology.topology_domains(v1beta1) == (
        ["rack", "kubernetes.io/hostname"],
        [["r1", "n1"], ["r1", "n2"]],
    )
    assert topology.topology_domains(v1beta2) == (["rack"], [["rack-1"], ["rack-2"], ["rack-9"]])
    labels = {
        "node-1": {"rack": "rack-1", "kubernetes.io/hostname": "n1"},
        "node-2": {"rack": "rack-2", "kubernetes.io/hostname": "n2"},
        "node-3": {"rack": "rack-3"},
    }
    assert topology.assigned_nodes({"podSetAssignments": [v1beta1]}, labels) == ["node-1", "node-2"]
    assert topology.assigned_nodes({"podSetAssignments": [v1beta2]}, labels) == ["node-1", "node-2"]
    flavors_only = {"podSetAssignments": [{"name": "main", "flavors": {"cpu": "default"}}]}
    assert topology.assigned_nodes(flavors_only, labels) == []


def test_only_our_entries_change() -> None:
    checks = [pending("fabric"), {"name": "prov", "state": "Ready", "message": "booked",
                                  "lastTransitionTime": "2026-01-01T00:00:00Z"}]  # fmt: skip
    verdict = decisions.Verdict("Ready", "ok")
    at = datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC)
    out = decisions.updated_checks(checks, {"fabric": verdict}, at)
    assert out is not None
    assert out[0] == {"name": "fabric", "state": "Ready", "message": "ok",
                      "lastTransitionTime": "2026-02-03T04:05:06Z"}  # fmt: skip
    assert out[1] == checks[1]
    assert decisions.updated_checks(out, {"fabric": verdict}, at) is None


def test_parameters() -> None:
    assert decisions.check_parameters({"parameters": {"apiGroup": "netval.io",
                                   "kind": "NetworkValidation", "name": "a"}}) == ("a", None)  # fmt: skip
    name, error = decisions.check_parameters({})
    assert name is None and error is not None and "spec.parameters" in error
