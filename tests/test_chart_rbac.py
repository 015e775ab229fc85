"""The chart's RBAC: the operator's grants are exactly what it calls (the table below is the
contract; templates/rbac.yaml says where each verb comes from), nothing reaches the agents,
no wildcards or escalation anywhere.
"""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import pytest

from chart_kit import (
    AGENT_SA,
    CHART,
    NAMESPACE,
    OPERATOR_SA,
    VARIANTS,
    Rule,
    find,
    granted_rules,
    one,
)
from netval.operator.agents import manifests

# --- the operator's RBAC ------------------------------------------------------------------
# (scope, apiGroup, resource, resourceName or None) -> verbs. Scope "cluster" is a
# ClusterRoleBinding; a namespace name is a RoleBinding there. Where each verb comes from is
# written in templates/rbac.yaml; this table is the contract.


BASE_RULES: dict[Rule, set[str]] = {
    ("cluster", "netval.io", "networkvalidations", None): {"get", "list", "watch", "patch"},
    ("cluster", "netval.io", "networkvalidations/status", None): {"patch"},
    ("cluster", "netval.io", "networkvalidations/finalizers", None): {"update"},
    # NetworkLoadTest (handlers/loadtests.py, loadtest/runner.py): Kopf's watch and
    # annotations (no finalizer); the coordinator's status patches.
    ("cluster", "netval.io", "networkloadtests", None): {"get", "list", "watch", "patch"},
    ("cluster", "netval.io", "networkloadtests/status", None): {"patch"},
    # skipBusyNodes: nodes running pods that request GPUs (KubeApi.gpu_pod_nodes)
    ("cluster", "", "pods", None): {"list"},
    # No update: nothing PUTs a Node (kube_api.set_node_gating patches with resourceVersion).
    ("cluster", "", "nodes", None): {"get", "list", "watch", "patch"},
    # The NetworkFabricReady condition (kube/node_status.py: read through nodes get).
    ("cluster", "", "nodes/status", None): {"patch"},
    ("cluster", "apiextensions.k8s.io", "customresourcedefinitions", None): {"list", "watch"},
    # Leader election (operator.leadership.lease): the Lease in the release namespace.
    (NAMESPACE, "coordination.k8s.io", "leases", None): {"create"},
    (NAMESPACE, "coordination.k8s.io", "leases", "netval-operator"): {"get", "update"},
    # Events about cluster-scoped objects live in "default"; nowhere else.
    ("default", "", "events", None): {"create"},
}


def agent_rules(namespace: str) -> dict[Rule, set[str]]:
    """The agents' objects, in their namespace only (kube_api.KubeApi)."""
    return {
        (namespace, "", "configmaps", None): {"get", "create", "patch", "delete"},
        (namespace, "apps", "daemonsets", None): {"get", "list", "create", "update", "delete"},
    }


WEBHOOK_RULES: dict[Rule, set[str]] = {
    ("cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", None): {"create"},
    ("cluster", "admissionregistration.k8s.io", "validatingwebhookconfigurations", None): {
        "create"
    },
    ("cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "netval.io"): {
        "get",
        "patch",
    },
    (
        "cluster",
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "netval.io",
    ): {"get", "patch"},
    ("cluster", "", "pods", None): {"get", "list", "patch"},
}
# Per-node MQTT identity (client certificates from the operator's enrollment, webhook on): who an
# enrolling agent's token belongs to (operator/identity/review.py; the Pod read is the
# webhook's pods get).
IDENTITY_RULES: dict[Rule, set[str]] = {
    ("cluster", "authentication.k8s.io", "tokenreviews", None): {"create"},
}
KUEUE_RULES: dict[Rule, set[str]] = {
    ("cluster", "kueue.x-k8s.io", "workloads", None): {"get", "list", "watch"},
    ("cluster", "kueue.x-k8s.io", "workloads/status", None): {"patch"},
    ("cluster", "kueue.x-k8s.io", "admissionchecks", None): {"list", "watch"},
    ("cluster", "kueue.x-k8s.io", "admissionchecks/status", None): {"patch"},
}
# spec.topology.publishKueueTopology (operator/topology/kueue_writer.py): its own objects by
# label, and delete + create (levels are immutable).
KUEUE_TOPOLOGY_RULES: dict[Rule, set[str]] = {
    ("cluster", "kueue.x-k8s.io", "topologies", None): {"list", "create", "delete"},
}


# spec.gating.deviceTaints (operator/devices): the configured drivers' ResourceSlices (list,
# watch), its own DeviceTaintRules by label, create and delete (a rule's target never changes).
DEVICE_TAINT_RULES: dict[Rule, set[str]] = {
    ("cluster", "resource.k8s.io", "resourceslices", None): {"list", "watch"},
    ("cluster", "resource.k8s.io", "devicetaintrules", None): {"list", "create", "delete"},
}


def expected_rules(values: dict[str, Any]) -> dict[Rule, set[str]]:
    rules = copy.deepcopy(BASE_RULES)
    rules.update(agent_rules(values.get("agent", {}).get("namespace") or NAMESPACE))
    if values.get("webhook", {}).get("enabled", True):
        rules.update(copy.deepcopy(WEBHOOK_RULES))
    if values.get("kueue", {}).get("enabled", False):
        rules.update(copy.deepcopy(KUEUE_RULES))
    if values.get("kueue", {}).get("topologies", False):
        rules.update(copy.deepcopy(KUEUE_TOPOLOGY_RULES))
    if values.get("deviceTaints", {}).get("enabled", False):
        rules.update(copy.deepcopy(DEVICE_TAINT_RULES))
    mqtt = values.get("mqtt", {})
    external = mqtt.get("external", {})
    if (
        (not external.get("enabled", False) or external.get("clientCertificates", False))
        and mqtt.get("identity", {}).get("enabled", True)
        and values.get("webhook", {}).get("enabled", True)
    ):
        rules.update(copy.deepcopy(IDENTITY_RULES))
    return rules


# --- RBAC ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_operator_rbac_is_exactly_what_it_uses(variant: str) -> None:
    assert granted_rules(variant, OPERATOR_SA) == expected_rules(VARIANTS[variant])


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_wildcards_and_no_escalation(variant: str) -> None:
    for role in find(variant, "ClusterRole") + find(variant, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (role["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert not {
                "secrets",
                "roles",
                "clusterroles",
                "rolebindings",
                "clusterrolebindings",
            } & set(rule["resources"]), "the operator reads no Secrets and grants no roles"


@pytest.mark.parametrize("variant", VARIANTS)
def test_agent_service_account_has_no_api_access(variant: str) -> None:
    # The operator renders agent DaemonSets that name this ServiceAccount.
    assert manifests.AGENT_SERVICE_ACCOUNT == AGENT_SA
    account = one(variant, "ServiceAccount", AGENT_SA)
    assert account["automountServiceAccountToken"] is False
    assert granted_rules(variant, AGENT_SA) == {}
    for binding in find(variant, "RoleBinding") + find(variant, "ClusterRoleBinding"):
        for subject in binding.get("subjects", []):
            assert subject["name"] != AGENT_SA, binding["metadata"]["name"]
            assert subject["kind"] == "ServiceAccount"
    for role in find(variant, "Role") + find(variant, "ClusterRole"):
        assert "agent" not in role["metadata"]["name"]


def test_rbac_check_notices_a_missing_verb() -> None:
    granted = granted_rules("default", OPERATOR_SA)
    granted[("cluster", "", "nodes", None)].discard("patch")
    assert granted != expected_rules({})


# --- the opt-in ValidatingAdmissionPolicy -----------------------------------------------------


def _policy(variant: str = "admission-policy") -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        one(variant, "ValidatingAdmissionPolicy", "netval-operator-writes"),
        one(variant, "ValidatingAdmissionPolicyBinding", "netval-operator-writes"),
    )


def test_admission_policy_is_opt_in() -> None:
    assert not find("default", "ValidatingAdmissionPolicy")
    assert not find("default", "ValidatingAdmissionPolicyBinding")


def test_admission_policy_binds_the_operator_only() -> None:
    policy, binding = _policy()
    assert binding["spec"] == {
        "policyName": "netval-operator-writes",
        "validationActions": ["Deny"],
    }
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"] and set(rule["resources"]) == {"nodes", "pods"}
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}'"
    )


def test_admission_policy_needs_kubernetes_1_30(capfd: pytest.CaptureFixture[str]) -> None:
    values = {"rbac": {"admissionPolicy": {"enabled": True}}}
    new = helm.lint(CHART, values, namespace=NAMESPACE, kube_version="v1.30.0", strict=True)
    assert new["errors"] == []
    assert [m for m in new["messages"] if m["severity"] >= 2] == []
    # Helm's lint reports a template's `fail` only in its log, on stderr.
    capfd.readouterr()
    helm.lint(CHART, values, namespace=NAMESPACE, kube_version="v1.29.0")
    assert "needs Kubernetes >= 1.30" in capfd.readouterr().err


def _cel_checks(old: dict[str, Any], new: dict[str, Any], resource: str) -> list[bool]:
    celpy = pytest.importorskip("celpy", reason="cel-python evaluates the policy's CEL")
    policy, _ = _policy()
    env = celpy.Environment()

    def evaluate(expression: str, variables: dict[str, Any]) -> Any:
        activation = {
            "object": celpy.json_to_cel(new),
            "oldObject": celpy.json_to_cel(old),
            "request": celpy.json_to_cel({"resource": {"resource": resource}}),
            "variables": celpy.celtypes.MapType(
                {celpy.celtypes.StringType(k): v for k, v in variables.items()}
            ),
        }
        return env.program(env.compile(expression)).evaluate(activation)

    variables: dict[str, Any] = {}
    for variable in policy["spec"]["variables"]:
        variables[variable["name"]] = evaluate(variable["expression"], variables)
    return [bool(evaluate(v["expression"], variables)) for v in policy["spec"]["validations"]]


NODE = {
    "metadata": {"labels": {"zone": "a"}},
    "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
}
POD = {
    "metadata": {
        "labels": {"netval.io/gated-by": "pool", "app": "trainer"},
        "annotations": {"netval.io/gate-message": "waiting"},
    },
    "spec": {
        "schedulingGates": [{"name": "netval.io/fabric"}, {"name": "kueue"}],
        "containers": [{"name": "main", "image": "trainer:1"}],
    },
}


def _changed(obj: dict[str, Any], change: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    change(new)
    return new


@pytest.mark.parametrize(
    ("resource", "old", "change", "allowed"),
    [
        (
            "nodes",
            NODE,
            lambda n: (
                n["metadata"]["labels"].update({"netval.io/fabric": "unhealthy"}),
                n["spec"]["taints"].append({"key": "netval.io/fabric-unhealthy"}),
            ),
            True,
        ),
        ("nodes", {"metadata": {}, "spec": {}}, lambda n: n["metadata"].update(labels={}), True),
        (
            "nodes",
            NODE,
            lambda n: n["metadata"]["labels"].update({"topology.netval.io/leaf": "leaf-1"}),
            True,
        ),
        (
            "nodes",
            {"metadata": {"labels": {"topology.netval.io/leaf": "leaf-1"}}, "spec": {}},
            lambda n: n["metadata"]["labels"].clear(),
            True,
        ),
        (
            "nodes",
            NODE,
            lambda n: n["metadata"]["labels"].update({"topology.kubernetes.io/zone": "z"}),
            False,
        ),
        ("nodes", NODE, lambda n: n["metadata"]["labels"].update(zone="b"), False),
        ("nodes", NODE, lambda n: n["spec"].update(taints=[]), False),
        ("nodes", NODE, lambda n: n["spec"].update(unschedulable=True), False),
        ("nodes", NODE, lambda n: n["metadata"].update(annotations={"x": "y"}), False),
        (
            "pods",
            POD,
            lambda p: (
                p["metadata"]["labels"].pop("netval.io/gated-by"),
                p["metadata"]["annotations"].clear(),
                p["spec"].update(schedulingGates=[{"name": "kueue"}]),
            ),
            True,
        ),
        ("pods", POD, lambda p: p["spec"].update(schedulingGates=[]), False),
        ("pods", POD, lambda p: p["spec"]["containers"][0].update(image="evil"), False),
        ("pods", POD, lambda p: p["spec"].update(tolerations=[{"operator": "Exists"}]), False),
        ("pods", POD, lambda p: p["metadata"]["labels"].pop("app"), False),
    ],
)
def test_admission_policy_allows_exactly_netvals_changes(
    resource: str, old: dict[str, Any], change: Any, allowed: bool
) -> None:
    assert all(_cel_checks(old, _changed(old, change), resource)) is allowed
