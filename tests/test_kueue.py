"""The Kueue AdmissionCheck controller end to end: AdmissionCheck and Workload objects in
Kueue's shapes (v1beta2, and v1beta1 where only that is served) in the Kubernetes API; the
test plays Kueue's part (reserving quota, admitting); health comes from MQTT reports."""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import pytest
from jsonschema import Draft4Validator, ValidationError
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.operator.kueue import decisions, topology
from netval.operator.kueue.admission_checks import CONTROLLER_NAME
from netval.operator.kueue.controller import KueueController
from netval.operator.term_runtime import OperatorRuntime, ValidationView
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


# -- Kueue's own Workload schema (tests/data/kueue, vendored from the Kueue CRD) -----------------

SCHEMAS = Path(__file__).resolve().parent / "data" / "kueue"
HOSTNAME = "kubernetes.io/hostname"

# The CEL rules (x-kubernetes-validations) under topologyAssignment in Kueue's schema, each with
# its Python equivalent, applied to the object at the rule's place. A rule not listed here fails
# `validate_status`: someone has to read it first.
Rule = Callable[[dict[str, Any]], bool]
_EXACTLY_ONE: Rule = lambda o: ("universal" in o) != ("individual" in o)  # noqa: E731
CEL_RULES: dict[str, Rule] = {
    "self.slices.all(x, size(x.valuesPerLevel) == size(self.levels))": lambda ta: all(
        len(s["valuesPerLevel"]) == len(ta["levels"]) for s in ta["slices"]
    ),
    "!has(self.podCounts.individual) || size(self.podCounts.individual) == self.domainCount": (
        lambda s: (
            "individual" not in s["podCounts"]
            or len(s["podCounts"]["individual"]) == s["domainCount"]
        )
    ),
    "self.valuesPerLevel.all(x, !has(x.individual) || size(x.individual.roots) == "
    "self.domainCount)": lambda s: all(
        "individual" not in v or len(v["individual"]["roots"]) == s["domainCount"]
        for v in s["valuesPerLevel"]
    ),
    "has(self.universal) != has(self.individual)": _EXACTLY_ONE,
    "[has(self.universal),has(self.individual)].filter(x,x==true).size() == 1": _EXACTLY_ONE,
}


@functools.cache
def status_schema(version: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(
        (SCHEMAS / f"workload-status.{version}.schema.json").read_text()
    )
    return schema


def _schema_errors(schema: dict[str, Any], value: Any, path: str, *, cel: bool) -> Iterator[str]:
    """What the API server adds to the JSON schema: unknown fields (a structural schema prunes
    them: a fixture carrying one is not what Kueue stores) and, where `cel`, the CEL rules."""
    if cel:
        for validation in schema.get("x-kubernetes-validations") or []:
            rule = CEL_RULES.get(validation["rule"])
            if rule is None:
                yield f"{path}: CEL rule without a Python equivalent: {validation['rule']!r}"
            elif not rule(value):
                yield f"{path}: {validation['message']}"
    if isinstance(value, dict) and "properties" in schema:
        known = schema["properties"]
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            yield from (f"{path}.{k}: unknown field" for k in value if k not in known)
        for key, sub in value.items():
            if key in known:
                inner = cel or key == "topologyAssignment"
                yield from _schema_errors(known[key], sub, f"{path}.{key}", cel=inner)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _schema_errors(schema["items"], item, f"{path}[{i}]", cel=cel)


def validate_status(status: dict[str, Any], version: str = "v1beta2") -> dict[str, Any]:
    """`status` as Kueue's Workload CRD of `version` would take it, or AssertionError."""
    schema = status_schema(version)
    try:
        Draft4Validator(schema).validate(status)
    except ValidationError as exc:
        raise AssertionError(
            f"Workload status ({version}): {exc.message} at {exc.json_path}"
        ) from None
    errors = list(_schema_errors(schema, status, "status", cel=False))
    assert not errors, f"Workload status ({version}): {errors}"
    return status


def tas_admission(*assignments: dict[str, Any]) -> dict[str, Any]:
    """status.admission with one podSetAssignment per topologyAssignment."""
    return {"clusterQueue": "cq", "podSetAssignments": [
        {"name": f"ps-{i}", "flavors": {"nvidia.com/gpu": "h100"}, "count": 1,
         "topologyAssignment": ta} for i, ta in enumerate(assignments)]}  # fmt: skip


def individual(roots: list[str], prefix: str | None = None, suffix: str | None = None
               ) -> dict[str, Any]:  # fmt: skip
    values: dict[str, Any] = {"roots": roots}
    if prefix is not None:
        values["prefix"] = prefix
    if suffix is not None:
        values["suffix"] = suffix
    return {"individual": values}


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
        status = validate_status(self.wl(name).get("status") or {}, self.version)
        return {c["name"]: c for c in status.get("admissionChecks") or []}

    def queue(self, name: str, checks: list[str], admission: dict[str, Any] | None = None) -> None:
        """A Workload Kueue has seen: its checks Pending, no quota yet."""
        self.kube.create(workload(name, version=self.version))
        status: dict[str, Any] = {"admissionChecks": [pending(c, "queued") for c in checks]}
        if admission is not None:
            status["admission"] = admission
        validate_status(status, self.version)
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
        validate_status(status, self.version)
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
    # strict: any failing node turns a Ready check back to Retry (capacity, the default,
    # is in test_capacity_policy_keeps_ready_with_one_failing_node)
    cluster.create(validation(gating={"admissionPolicy": "strict"}))
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
            lambda: (
                "waiting until it is Healthy" in (c := k.checks("wl-1")["fabric"])["message"] and c
            ),
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
        assert "no longer admitted" in retry["message"] and "is not Healthy" in retry["message"]
        assert "gpu-b" in retry["message"]
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


def test_a_conflicting_check_patch_is_decided_again_on_fresh_data(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    """A Workload status patch that meets another writer (409) re-reads the Workload and
    decides on it again (kube.read_modify_write), instead of waiting for the next round."""
    k = Kueue(cluster, "v1beta2")
    cluster.create(validation())
    cluster.create(admission_check("fabric"))
    k.queue("wl-1", ["fabric"])
    k.reserve("wl-1")  # before the fault: this patch is Kueue's, not the controller's
    before = len(cluster.requests())
    conflict = cluster.inject("PATCH", r"/workloads/wl-1/status$", status=409, times=1)
    memo, operator = operator_for(cluster, mosquitto_broker)
    with operator:
        _, controller = started(memo)
        healthy(mosquitto_broker)
        k.wait_state("wl-1", "fabric", "Ready")
        assert conflict.hits == 1
        reads = [p for m, p in cluster.requests()[before:] if m == "GET"]
        assert f"/apis/{k.api}/namespaces/default/workloads/wl-1" in reads
        assert controller.patches > 0


def test_assigned_unhealthy_node_asks_for_retry(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    """Topology-Aware Scheduling names the nodes: an assignment on a failing node is sent
    back to Kueue (Retry) at once; one on good nodes is Ready at once under the default
    policy (capacity: one failing node of four is within the breaker's cap), while under
    strict it waits for the validation to be Healthy."""
    k = Kueue(cluster, "v1beta2")
    cluster.create(validation())
    cluster.create(admission_check("fabric"))
    for node in NODES:  # hostnames other than the node names: found by the label
        cluster.patch("v1", "nodes", node, {"metadata": {"labels": {HOSTNAME: f"{node}.dc1"}}})
    levels = ["topology.kubernetes.io/zone", HOSTNAME]
    rack = {"universal": "rack-1"}
    # gpu-a and gpu-b, in two slices (universal values, an individual one with prefix+suffix)
    on_b = {"levels": levels, "slices": [
        {"domainCount": 1, "valuesPerLevel": [rack, {"universal": "gpu-a.dc1"}],
         "podCounts": {"universal": 1}},
        {"domainCount": 1, "valuesPerLevel": [rack, individual(["b"], "gpu-", ".dc1")],
         "podCounts": {"individual": [2]}}]}  # fmt: skip
    on_cd = {"levels": levels, "slices": [
        {"domainCount": 2, "valuesPerLevel": [rack, individual(["c", "d"], "gpu-", ".dc1")],
         "podCounts": {"universal": 1}}]}  # fmt: skip
    k.queue("on-b", ["fabric"], admission=tas_admission(on_b))
    k.queue("on-cd", ["fabric"], admission=tas_admission(on_cd))
    cluster.create(validation("strict-pool", gating={"admissionPolicy": "strict"}))
    cluster.create(admission_check("strict", "strict-pool"))
    k.queue("strict-cd", ["strict"], admission=tas_admission(on_cd))
    memo, operator = operator_for(cluster, mosquitto_broker)
    with operator:
        runtime, _ = started(memo)
        publish(mosquitto_broker, [report_msg(report(n, Status.FAIL if n == "gpu-b"
                                                     else Status.PASS, validation_name=v))
                                   for n in NODES for v in ("pool-a", "strict-pool")])  # fmt: skip
        wait_view(runtime, lambda v: v.unhealthy_nodes == ["gpu-b"] and v.usable, "gpu-b failing")
        wait_for(lambda: (v := runtime.validation_view("strict-pool")) and v.failures,
                 timeout=30, what="strict-pool failing")  # fmt: skip
        for name in ("on-b", "on-cd", "strict-cd"):
            k.reserve(name)
        retry = k.wait_state("on-b", "fabric", "Retry")
        assert "unhealthy fabric: gpu-b (" in retry["message"]  # the node, by its hostname
        assert "other nodes" in retry["message"]
        ready = k.wait_state("on-cd", "fabric", "Ready")
        assert "assigned nodes (gpu-c, gpu-d)" in ready["message"]
        assert "is Usable" in ready["message"]
        wait_for(lambda: "waiting until it is Healthy" in k.checks("strict-cd")["strict"]["message"],
                 timeout=30, what="strict-cd Pending")  # fmt: skip
        assert k.checks("strict-cd")["strict"]["state"] == "Pending"
        publish(mosquitto_broker, [report_msg(report(n, validation_name="strict-pool"))
                                   for n in NODES])  # fmt: skip
        ready = k.wait_state("strict-cd", "strict", "Ready")
        assert "is Healthy" in ready["message"]
        assert "assigned nodes (gpu-c, gpu-d)" in ready["message"]


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
    # v1beta1's topology shape: one domain per node (nodes without a hostname label: by name)
    on_b = {"levels": ["topology.kubernetes.io/zone", HOSTNAME], "domains": [
        {"values": ["rack-1", "gpu-a"], "count": 1},
        {"values": ["rack-1", "gpu-b"], "count": 2}]}  # fmt: skip
    k.queue("on-b", ["fabric"], admission=tas_admission(on_b))
    memo, operator = operator_for(cluster, mosquitto_broker)
    with operator:
        runtime, _ = started(memo)
        active = wait_for(lambda: k.active("fabric"), timeout=30, what="Active (v1beta1)")
        assert active["status"] == "True"
        k.reserve("wl")
        healthy(mosquitto_broker)
        k.wait_state("wl", "fabric", "Ready")
        failing(mosquitto_broker)
        wait_view(runtime, lambda v: v.unhealthy_nodes == ["gpu-b"], "gpu-b unhealthy")
        k.reserve("on-b")
        retry = k.wait_state("on-b", "fabric", "Retry")
        assert "unhealthy fabric: gpu-b (" in retry["message"]
    writes = [p for m, p in cluster.requests() if m == "PATCH" and "kueue.x-k8s.io" in p]
    assert writes and all("/v1beta1/" in p for p in writes)


# -- pure parts ----------------------------------------------------------------------------------


BLOCK, RACK = "cloud.example.com/block", "cloud.example.com/rack"
# One placement in Kueue's two shapes: v1beta2 slices (universal values, individual ones with
# prefix, suffix or both, universal and individual pod counts) and v1beta1 domains.
V1BETA2_TA: dict[str, Any] = {"levels": [BLOCK, RACK, HOSTNAME], "slices": [
    {"domainCount": 2,
     "valuesPerLevel": [{"universal": "block-1"}, {"universal": "rack-1"},
                        individual(["a", "b"], prefix="gpu-", suffix=".dc1")],
     "podCounts": {"individual": [4, 2]}},
    {"domainCount": 1,
     "valuesPerLevel": [{"universal": "block-1"}, individual(["rack-2"]),
                        individual(["c"], prefix="gpu-")],
     "podCounts": {"universal": 1}},
    {"domainCount": 2,
     "valuesPerLevel": [{"universal": "block-2"}, {"universal": "rack-9"},
                        individual(["n1", "n2"], suffix="-x")],
     "podCounts": {"universal": 3}}]}  # fmt: skip
V1BETA1_TA: dict[str, Any] = {"levels": [BLOCK, RACK, HOSTNAME], "domains": [
    {"values": ["block-1", "rack-1", "gpu-a.dc1"], "count": 4},
    {"values": ["block-1", "rack-1", "gpu-b.dc1"], "count": 2},
    {"values": ["block-1", "rack-2", "gpu-c"], "count": 1},
    {"values": ["block-2", "rack-9", "n1-x"], "count": 3},
    {"values": ["block-2", "rack-9", "n2-x"], "count": 3}]}  # fmt: skip
NODE_LABELS = {
    "node-a": {BLOCK: "block-1", RACK: "rack-1", HOSTNAME: "gpu-a.dc1"},
    "node-b": {BLOCK: "block-1", RACK: "rack-1", HOSTNAME: "gpu-b.dc1"},
    "gpu-c": {BLOCK: "block-1", RACK: "rack-2"},  # no hostname label: the node of that name
    "node-d": {BLOCK: "block-1", RACK: "rack-2", HOSTNAME: "gpu-d"},
    "node-e": {BLOCK: "block-2", RACK: "rack-9", HOSTNAME: "n1-x"},
}


def test_topology_assignment_both_shapes() -> None:
    for ta, version in ((V1BETA2_TA, "v1beta2"), (V1BETA1_TA, "v1beta1")):
        validate_status({"admission": tas_admission(ta)}, version)
        levels, domains = topology.topology_domains({"topologyAssignment": ta})
        assert levels == [BLOCK, RACK, HOSTNAME]
        assert [(d.values, d.count) for d in domains] == [
            (("block-1", "rack-1", "gpu-a.dc1"), 4),
            (("block-1", "rack-1", "gpu-b.dc1"), 2),
            (("block-1", "rack-2", "gpu-c"), 1),
            (("block-2", "rack-9", "n1-x"), 3),
            (("block-2", "rack-9", "n2-x"), 3),
        ], version
        # by hostname label, else the node of that name (n2-x: not known, named as Kueue does)
        nodes = topology.assigned_nodes(tas_admission(ta), NODE_LABELS)
        assert nodes == ["gpu-c", "n2-x", "node-a", "node-b", "node-e"], version


def test_topology_assignment_above_nodes_and_flavors_only() -> None:
    """A lowest level above nodes (a rack) names every node of the domain by its labels."""
    racks = {"levels": [BLOCK, RACK], "slices": [
        {"domainCount": 2, "valuesPerLevel": [{"universal": "block-1"},
                                              individual(["1", "2"], prefix="rack-")],
         "podCounts": {"individual": [2, 1]}}]}  # fmt: skip
    two_psas = tas_admission(racks, {"levels": [HOSTNAME], "slices": [
        {"domainCount": 1, "valuesPerLevel": [{"universal": "n1-x"}],
         "podCounts": {"universal": 1}}]})  # fmt: skip
    validate_status({"admission": two_psas})
    assert topology.assigned_nodes(two_psas, NODE_LABELS) == [
        "gpu-c",
        "node-a",
        "node-b",
        "node-d",
        "node-e",
    ]
    flavors_only = {"clusterQueue": "cq", "podSetAssignments": [
        {"name": "main", "flavors": {"cpu": "default"}, "count": 1}]}  # fmt: skip
    validate_status({"admission": flavors_only})
    assert topology.assigned_nodes(flavors_only, NODE_LABELS) == []


@pytest.mark.parametrize(
    ("slice_", "why"),
    [
        # a shape no Kueue release writes (values and counts outside universal/individual)
        ({"domainCount": 1, "valuesPerLevel": [{"universalValue": "rack-9"}],
          "universalPodCount": 1}, "'podCounts' is a required property"),
        ({"domainCount": 2, "valuesPerLevel": [{"prefix": "rack-", "roots": ["1", "2"]}],
          "podCounts": {"universal": 1}}, "unknown field"),
        ({"domainCount": 1, "valuesPerLevel": [{"universal": "r", **individual(["r"])}],
          "podCounts": {"universal": 1}}, "exactly one of"),
        ({"domainCount": 2, "valuesPerLevel": [individual(["1"])],
          "podCounts": {"universal": 1}}, "roots of length"),
        ({"domainCount": 2, "valuesPerLevel": [{"universal": "r"}],
          "podCounts": {"individual": [1]}}, "podCounts.individual must have length"),
        ({"domainCount": 1, "valuesPerLevel": [{"universal": "r"}, {"universal": "h"}],
          "podCounts": {"universal": 1}}, "same length as the number of levels"),
        ({"domainCount": 1, "valuesPerLevel": [{"universal": "r"}], "podCounts": {}},
         "exactly one of"),
    ],
)  # fmt: skip
def test_kueue_schema_refuses_other_shapes(slice_: dict[str, Any], why: str) -> None:
    """The schema checks have teeth: what Kueue's API server would refuse (or prune)."""
    admission = tas_admission({"levels": [RACK], "slices": [slice_]})
    with pytest.raises(AssertionError, match=why):
        validate_status({"admission": admission})


def test_every_topology_cel_rule_has_an_equivalent() -> None:
    for version in ("v1beta2", "v1beta1"):
        schema = status_schema(version)["properties"]["admission"]["properties"]
        ta = schema["podSetAssignments"]["items"]["properties"]["topologyAssignment"]

        def rules(node: Any) -> Iterator[str]:
            if isinstance(node, dict):
                yield from (v["rule"] for v in node.get("x-kubernetes-validations") or [])
                for value in node.values():
                    yield from rules(value)

        found = set(rules(ta))
        assert found <= set(CEL_RULES), found - set(CEL_RULES)
        assert found or version == "v1beta1"  # v1beta1's shape has no CEL rules


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
