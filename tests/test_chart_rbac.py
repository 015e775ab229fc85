"""The chart's RBAC: the operator's grants are exactly what it calls (the table below is the
contract; templates/rbac.yaml says where each verb comes from), nothing reaches the agents,
no wildcards or escalation anywhere.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from chart_kit import AGENT_SA, NAMESPACE, OPERATOR_SA, VARIANTS, Rule, find, granted_rules, one
from netval.operator import manifests

# --- the operator's RBAC ------------------------------------------------------------------
# (scope, apiGroup, resource, resourceName or None) -> verbs. Scope "cluster" is a
# ClusterRoleBinding; a namespace name is a RoleBinding there. Where each verb comes from is
# written in templates/rbac.yaml; this table is the contract.


BASE_RULES: dict[Rule, set[str]] = {
    ("cluster", "netval.io", "networkvalidations", None): {"get", "list", "watch", "patch"},
    ("cluster", "netval.io", "networkvalidations/status", None): {"patch"},
    ("cluster", "netval.io", "networkvalidations/finalizers", None): {"update"},
    # No update: nothing PUTs a Node (kube_api.set_node_gating patches with resourceVersion).
    ("cluster", "", "nodes", None): {"get", "list", "watch", "patch"},
    ("cluster", "apiextensions.k8s.io", "customresourcedefinitions", None): {"list", "watch"},
    ("cluster", "kopf.dev", "clusterkopfpeerings", None): {"list", "watch"},
    ("cluster", "kopf.dev", "clusterkopfpeerings", "netval"): {"patch"},
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
KUEUE_RULES: dict[Rule, set[str]] = {
    ("cluster", "kueue.x-k8s.io", "workloads", None): {"get", "list", "watch"},
    ("cluster", "kueue.x-k8s.io", "workloads/status", None): {"patch"},
    ("cluster", "kueue.x-k8s.io", "admissionchecks", None): {"list", "watch"},
    ("cluster", "kueue.x-k8s.io", "admissionchecks/status", None): {"patch"},
}


def expected_rules(values: dict[str, Any]) -> dict[Rule, set[str]]:
    rules = copy.deepcopy(BASE_RULES)
    rules.update(agent_rules(values.get("agent", {}).get("namespace") or NAMESPACE))
    if values.get("webhook", {}).get("enabled", True):
        rules.update(copy.deepcopy(WEBHOOK_RULES))
    if values.get("kueue", {}).get("enabled", False):
        rules.update(copy.deepcopy(KUEUE_RULES))
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
