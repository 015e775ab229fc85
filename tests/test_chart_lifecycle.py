"""The chart's lifecycle: the pre-delete clean-up hook (its Job runs the real CLI, its RBAC is
exactly what netval.operator.uninstall calls, it exists only while the hook runs), Secrets
that stay stable for GitOps (existingSecret values render none), checksum annotations that
restart pods when a Secret the chart renders changes, and agents in their own namespace.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from chart_kit import (
    AGENT_NAMESPACE,
    NAMESPACE,
    VARIANTS,
    docs,
    find,
    one,
    operator_deployment,
)
from netval.cli import build_parser

HOOK = "netval-uninstall"
Rule = tuple[str, str, str, str | None]

# What `netval uninstall-cleanup` calls (src/netval/operator/uninstall.py), as RBAC.
CLEANUP_RULES: dict[Rule, set[str]] = {
    ("cluster", "", "nodes", None): {"get", "list", "patch"},
    ("cluster", "", "nodes/status", None): {"get", "patch"},  # the NetworkFabricReady condition
    ("cluster", "", "pods", None): {"get", "list", "patch"},
    ("cluster", "netval.io", "networkvalidations", None): {"get", "list", "patch"},
    ("cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "netval.io"): {
        "delete"
    },
    (
        "cluster",
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "netval.io",
    ): {"delete"},
    (NAMESPACE, "apps", "deployments", "netval-operator"): {"get", "patch"},
}


def cleanup_rules(agent_namespace: str) -> dict[Rule, set[str]]:
    return {
        **CLEANUP_RULES,
        (agent_namespace, "apps", "daemonsets", None): {"list", "delete"},
        (agent_namespace, "", "configmaps", None): {"list", "delete"},
    }


def _granted(variant: str, subject: str) -> dict[Rule, set[str]]:
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs(variant)
        if d["kind"] in {"Role", "ClusterRole"}
    }
    granted: dict[Rule, set[str]] = {}
    for binding in docs(variant):
        if binding["kind"] not in {"RoleBinding", "ClusterRoleBinding"}:
            continue
        if not any(s["name"] == subject for s in binding["subjects"]):
            continue
        cluster = binding["kind"] == "ClusterRoleBinding"
        scope = "cluster" if cluster else binding["metadata"]["namespace"]
        ref = binding["roleRef"]
        role = roles[(ref["kind"], None if cluster else scope, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames") or [None]:
                        granted.setdefault((scope, group, resource, name), set()).update(
                            rule["verbs"]
                        )
    return granted


def _hook_docs(variant: str) -> list[dict[str, Any]]:
    return [d for d in docs(variant) if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]


# --- the uninstall hook -------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "agents-namespace", "all-on"])
def test_cleanup_rbac_is_exactly_what_it_calls(variant: str) -> None:
    agent_ns = VARIANTS[variant].get("agent", {}).get("namespace") or NAMESPACE
    expected = cleanup_rules(agent_ns)
    if VARIANTS[variant].get("kueue", {}).get("topologies"):  # --kueue-topologies
        expected[("cluster", "kueue.x-k8s.io", "topologies", None)] = {"list", "delete"}
    if VARIANTS[variant].get("deviceTaints", {}).get("enabled"):  # --device-taint-rules
        expected[("cluster", "resource.k8s.io", "devicetaintrules", None)] = {"list", "delete"}
    assert _granted(variant, HOOK) == expected


def test_cleanup_exists_only_while_the_hook_runs() -> None:
    hooks = _hook_docs("default")
    assert {(d["kind"], d["metadata"]["name"]) for d in hooks} == {
        ("ServiceAccount", HOOK),
        ("ClusterRole", HOOK),
        ("ClusterRoleBinding", HOOK),
        ("Role", HOOK),
        ("RoleBinding", HOOK),
        ("Role", f"{HOOK}-workloads"),
        ("RoleBinding", f"{HOOK}-workloads"),
        ("Job", HOOK),
    }
    for doc in hooks:
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        # Its identity and rights first, then the Job.
        weight = int(annotations["helm.sh/hook-weight"])
        assert weight == (0 if doc["kind"] == "Job" else -10)
    # Nothing else is a hook, and nothing but the hook's Job uses its ServiceAccount.
    assert one("default", "ServiceAccount", HOOK)["automountServiceAccountToken"] is False
    for doc in docs("default"):
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        if spec.get("serviceAccountName") == HOOK:
            assert doc["kind"] == "Job"


def test_cleanup_job_runs_the_real_command() -> None:
    job = one("agents-namespace", "Job", HOOK)
    spec = job["spec"]
    assert spec["backoffLimit"] >= 1 and spec["activeDeadlineSeconds"] == 300
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == HOOK
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "uninstall-cleanup"
    assert args.operator_deployment == f"{NAMESPACE}/netval-operator"
    assert args.agent_namespace == AGENT_NAMESPACE
    assert args.operator_wait == 60
    # It scales the Deployment the chart renders.
    assert operator_deployment("agents-namespace")["metadata"]["name"] == "netval-operator"


def test_cleanup_can_be_turned_off() -> None:
    from chart_kit import render

    out = render({"uninstall": {"cleanup": False}})
    assert not out["netval/templates/uninstall-hook.yaml"].strip()


# --- Secrets: stable for GitOps, restarts when they change ---------------------------------


def _checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _annotations(variant: str, deployment: str) -> dict[str, str]:
    dep = one(variant, "Deployment", deployment)
    annotations: dict[str, str] = dep["spec"]["template"]["metadata"].get("annotations", {})
    return annotations


def test_checksums_follow_the_secrets_the_chart_renders() -> None:
    variant = "broker-shared-login"
    operator_pw = base64.b64decode(
        one(variant, "Secret", "netval-mqtt-operator")["data"]["password"]
    ).decode()
    agent_pw = base64.b64decode(
        one(variant, "Secret", "netval-mqtt-agent")["data"]["password"]
    ).decode()
    tls = one(variant, "Secret", "netval-webhook-tls")["data"]["tls.crt"]
    operator = _annotations(variant, "netval-operator")
    assert operator["checksum/mqtt-password"] == _checksum(operator_pw)
    assert operator["checksum/webhook-tls"] == _checksum(tls)
    broker = _annotations(variant, "netval-mqtt")
    assert broker["checksum/secrets"] == _checksum(f"{operator_pw}\n{agent_pw}")
    assert "checksum/config" in broker


def test_checksums_follow_the_identity_ca() -> None:
    """Per-node identity (the default): the broker reads the identity CA at start only and
    the operator the CA's key: a new CA restarts both; passwords are used by neither."""
    ca = one("default", "Secret", "netval-mqtt-identity-ca")["data"]["tls.crt"]
    operator = _annotations("default", "netval-operator")
    broker = _annotations("default", "netval-mqtt")
    assert operator["checksum/identity-ca"] == broker["checksum/identity-ca"] == _checksum(ca)
    assert "checksum/mqtt-password" not in operator
    assert "checksum/secrets" not in broker


def test_gitops_values_render_no_generated_secret() -> None:
    """`helm template` / Argo CD cannot look anything up: with existingSecret values (or
    cert-manager) the rendering holds no generated secret at all, so it is identical on
    every render."""
    assert not find("gitops-secrets", "Secret")
    container = operator_deployment("gitops-secrets")["spec"]["template"]["spec"]
    volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in container["volumes"]}
    assert "mqtt" not in volumes  # the operator shows a certificate it mints
    assert volumes["webhook-tls"] == "netval-webhook-cert"
    assert volumes["identity-ca"] == "netval-identity-ca"
    broker = one("gitops-secrets", "Deployment", "netval-mqtt")["spec"]["template"]["spec"]
    names = {v["name"]: v.get("secret", {}).get("secretName") for v in broker["volumes"]}
    # per-node identity (the default): the broker mounts the identity CA's certificate, no
    # password at all
    assert names["identity-ca"] == "netval-identity-ca"
    assert "operator-password" not in names and "agent-password" not in names
    assert "checksum/mqtt-password" not in _annotations("gitops-secrets", "netval-operator")
    # Nothing random left in the output: two renders are the same.
    from chart_kit import VARIANTS as variants
    from chart_kit import render

    first = render(variants["gitops-secrets"])
    second = render(variants["gitops-secrets"])
    assert first == second


def test_default_rendering_is_stable_within_one_render() -> None:
    """Generated passwords and certificates are computed once per render: every copy and
    every checksum sees the same ones (offline, where lookup finds nothing)."""
    agent = [s["data"]["password"] for s in find("agents-namespace", "Secret", "netval-mqtt-agent")]
    assert len(agent) == 2 and len(set(agent)) == 1


# --- agents in their own namespace ----------------------------------------------------------


def test_agents_namespace_is_the_only_privileged_one() -> None:
    ns = one("agents-namespace", "Namespace", AGENT_NAMESPACE)
    labels = ns["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "privileged"
    assert (
        one("agents-namespace", "ServiceAccount", "netval-agent")["metadata"]["namespace"]
        == AGENT_NAMESPACE
    )
    # The operator's rights on agent objects are in that namespace, none in its own.
    role = one("agents-namespace", "Role", "netval-operator")
    assert role["metadata"]["namespace"] == AGENT_NAMESPACE
    assert not find("default", "Namespace")
