"""The Helm chart (charts/netval), rendered and linted with the real Helm v4 library.

`helm-python-sdk` binds Helm's Go SDK (libhelm_c) through ctypes: the same template engine,
Sprig functions, values coalescing and values.schema.json validation as `helm template` and
`helm lint`, with no helm binary and no cluster (`lookup` finds nothing offline, so generated
passwords and certificates are fresh on every render).

For the default values and the external-broker, cert-manager, no-webhook and Kueue variants:
- the operator's RBAC is exactly the table EXPECTED_RULES below (and nothing reaches the agent
  ServiceAccount);
- every container runs non-root, read-only root filesystem, no privilege escalation, all
  capabilities dropped, seccomp RuntimeDefault;
- every rendered manifest validates against the Kubernetes OpenAPI schemas (kubernetes-validate
  ships them, offline, strict: unknown fields are errors), CRD-defined objects against their
  CRD's schema;
- the operator's environment builds real OperatorSettings, its arguments parse with the real
  CLI, and the broker configuration works in a real Mosquitto (passwords hashed by the same
  init script, ACL enforced).
"""

from __future__ import annotations

import base64
import copy
import functools
import getpass
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import certifi
import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

import mosquitto as broker_kit
from netval.cli import build_parser
from netval.infra import mqtt_settings
from netval.model.spec import NetworkValidationSpec
from netval.operator import main as operator_main
from netval.operator import settings as operator_settings
from netval.operator.agents import manifests

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "netval"
EXAMPLES = ROOT / "examples"
RELEASE = "netval"
NAMESPACE = "netval-system"
OPERATOR_SA = "netval-operator"
AGENT_SA = "netval-agent"

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas
# kubernetes-validate ships.
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "external-broker": {
        "mqtt": {
            "external": {
                "enabled": True,
                "url": "mqtts://emqx.mqtt.svc:8883",
                "username": "netval-operator",
                "existingSecret": "emqx-netval-operator",
                "agentUsername": "netval-agent",
                "agentExistingSecret": "emqx-netval-agent",
                "caSecret": "emqx-ca",
            }
        }
    },
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "cert-manager-issuer": {
        "webhook": {
            "certManager": {
                "enabled": True,
                "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
            }
        }
    },
    "no-webhook": {"webhook": {"enabled": False}},
    "kueue-otlp": {
        "kueue": {"enabled": True},
        "telemetry": {"otlpEndpoint": "http://otel-collector.observability:4318"},
        "agent": {"tolerations": [{"operator": "Exists"}]},
    },
}

# --- the operator's RBAC ------------------------------------------------------------------
# (scope, apiGroup, resource, resourceName or None) -> verbs. Scope "cluster" is a
# ClusterRoleBinding; a namespace name is a RoleBinding there. Where each verb comes from is
# written in templates/rbac.yaml; this table is the contract.

Rule = tuple[str, str, str, str | None]

BASE_RULES: dict[Rule, set[str]] = {
    ("cluster", "netval.io", "networkvalidations", None): {"get", "list", "watch", "patch"},
    ("cluster", "netval.io", "networkvalidations/status", None): {"get", "patch"},
    ("cluster", "netval.io", "networkvalidations/finalizers", None): {"update"},
    ("cluster", "", "nodes", None): {"get", "list", "watch", "patch", "update"},
    ("cluster", "apiextensions.k8s.io", "customresourcedefinitions", None): {
        "get",
        "list",
        "watch",
    },
    ("cluster", "kopf.dev", "clusterkopfpeerings", None): {"get", "list", "watch"},
    ("cluster", "kopf.dev", "clusterkopfpeerings", "netval"): {"patch"},
    # Events about cluster-scoped objects live in "default"; nowhere else.
    ("default", "", "events", None): {"create"},
    ("default", "events.k8s.io", "events", None): {"create"},
    # The agents' objects, in the release namespace only.
    (NAMESPACE, "", "configmaps", None): {
        "get",
        "list",
        "watch",
        "create",
        "patch",
        "update",
        "delete",
    },
    (NAMESPACE, "apps", "daemonsets", None): {
        "get",
        "list",
        "watch",
        "create",
        "patch",
        "update",
        "delete",
    },
}
WEBHOOK_RULES: dict[Rule, set[str]] = {
    ("cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", None): {"create"},
    ("cluster", "admissionregistration.k8s.io", "validatingwebhookconfigurations", None): {
        "create"
    },
    ("cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "netval.io"): {
        "get",
        "list",
        "watch",
        "patch",
    },
    (
        "cluster",
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "netval.io",
    ): {"get", "list", "watch", "patch"},
    ("cluster", "", "pods", None): {"get", "list", "patch"},
}
KUEUE_RULES: dict[Rule, set[str]] = {
    ("cluster", "kueue.x-k8s.io", "workloads", None): {"get", "list", "watch"},
    ("cluster", "kueue.x-k8s.io", "workloads/status", None): {"patch"},
    ("cluster", "kueue.x-k8s.io", "admissionchecks", None): {"get", "list", "watch"},
    ("cluster", "kueue.x-k8s.io", "admissionchecks/status", None): {"patch"},
}

# Environment the chart gives the operator that the operator reads (src constants), plus the
# chart's proposals for agent settings the operator does not read yet.
SRC_OPERATOR_ENV = {
    operator_settings.ENV_NAMESPACE,
    operator_settings.ENV_AGENT_IMAGE,
    operator_settings.ENV_AGENT_MQTT_URL,
    operator_settings.ENV_AGENT_MQTT_USERNAME,
    operator_settings.ENV_AGENT_MQTT_SECRET,
    operator_settings.ENV_AGENT_MQTT_CA_SECRET,
    operator_settings.ENV_STATUS_WINDOW,
    mqtt_settings.ENV_URL,
    mqtt_settings.ENV_USERNAME,
    mqtt_settings.ENV_PASSWORD_FILE,
    mqtt_settings.ENV_CA_FILE,
    "NETVAL_LOG_LEVEL",
    "OTEL_SERVICE_NAME",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
}
PROPOSED_OPERATOR_ENV = {
    "NETVAL_AGENT_RESOURCES",
    "NETVAL_AGENT_TOLERATIONS",
    "NETVAL_KUEUE_ENABLED",
}

# cert-manager's CRDs are not shipped offline: these are the parts of its v1 API
# (cert-manager.io/v1 Issuer and Certificate) the chart uses, transcribed with their types and
# enums; unknown fields are refused, so a typo in the template fails here.
_ISSUER_REF = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "kind": {"type": "string"},
        "group": {"type": "string"},
    },
}
CERT_MANAGER_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io/v1", "Issuer"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "minProperties": 1,
                "maxProperties": 1,
                "properties": {
                    "selfSigned": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"crlDistributionPoints": {"type": "array"}},
                    },
                    "ca": {
                        "type": "object",
                        "required": ["secretName"],
                        "additionalProperties": False,
                        "properties": {
                            "secretName": {"type": "string", "minLength": 1},
                            "crlDistributionPoints": {"type": "array"},
                            "ocspServers": {"type": "array"},
                            "issuingCertificateURLs": {"type": "array"},
                        },
                    },
                },
            }
        },
    },
    ("cert-manager.io/v1", "Certificate"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["secretName", "issuerRef"],
                "additionalProperties": False,
                "properties": {
                    "secretName": {"type": "string", "minLength": 1},
                    "commonName": {"type": "string", "maxLength": 64},
                    "dnsNames": {"type": "array", "items": {"type": "string"}},
                    "duration": {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s))+$"},
                    "renewBefore": {
                        "type": "string",
                        "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s))+$",
                    },
                    "isCA": {"type": "boolean"},
                    "usages": {
                        "type": "array",
                        "items": {
                            "enum": [
                                "signing",
                                "digital signature",
                                "content commitment",
                                "key encipherment",
                                "key agreement",
                                "data encipherment",
                                "cert sign",
                                "crl sign",
                                "encipher only",
                                "decipher only",
                                "any",
                                "server auth",
                                "client auth",
                                "code signing",
                                "email protection",
                                "s/mime",
                                "ipsec end system",
                                "ipsec tunnel",
                                "ipsec user",
                                "timestamping",
                                "ocsp signing",
                                "microsoft sgc",
                                "netscape sgc",
                            ]
                        },
                    },
                    "privateKey": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                            "size": {"type": "integer"},
                            "encoding": {"enum": ["PKCS1", "PKCS8"]},
                            "rotationPolicy": {"enum": ["Never", "Always"]},
                        },
                    },
                    "issuerRef": _ISSUER_REF,
                },
            }
        },
    },
}


# --- rendering --------------------------------------------------------------------------


@functools.cache
def rendered(variant: str) -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        out: dict[str, str] = chart.render(
            copy.deepcopy(VARIANTS[variant]), name=RELEASE, namespace=NAMESPACE, is_install=True
        )
    return out


@functools.cache
def _docs(variant: str) -> tuple[dict[str, Any], ...]:
    docs = []
    for path, text in sorted(rendered(variant).items()):
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append(doc)
    return tuple(docs)


def docs(variant: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_docs(variant)))


def notes(variant: str) -> str:
    return rendered(variant)[f"{RELEASE}/templates/NOTES.txt"]


def find(variant: str, kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d
        for d in docs(variant)
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(variant: str, kind: str, name: str) -> dict[str, Any]:
    (found,) = find(variant, kind, name)
    return found


def operator_deployment(variant: str) -> dict[str, Any]:
    return one(variant, "Deployment", "netval-operator")


def operator_container(variant: str) -> dict[str, Any]:
    (container,) = operator_deployment(variant)["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def pod_specs(variant: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs(variant):
        if doc["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def expected_rules(values: dict[str, Any]) -> dict[Rule, set[str]]:
    rules = copy.deepcopy(BASE_RULES)
    if values.get("webhook", {}).get("enabled", True):
        rules.update(copy.deepcopy(WEBHOOK_RULES))
    if values.get("kueue", {}).get("enabled", False):
        rules.update(copy.deepcopy(KUEUE_RULES))
    return rules


def granted_rules(variant: str, subject: str) -> dict[Rule, set[str]]:
    """What the bindings of the rendered chart grant the ServiceAccount `subject`."""
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs(variant)
        if d["kind"] in {"Role", "ClusterRole"}
    }
    granted: dict[Rule, set[str]] = {}
    for binding in docs(variant):
        if binding["kind"] not in {"RoleBinding", "ClusterRoleBinding"}:
            continue
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == subject and s["namespace"] == NAMESPACE
            for s in binding.get("subjects", [])
        ):
            continue
        ref = binding["roleRef"]
        scope = (
            "cluster"
            if binding["kind"] == "ClusterRoleBinding"
            else binding["metadata"]["namespace"]
        )
        role_ns = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        role = roles[(ref["kind"], role_ns, ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames") or [None]:
                        granted.setdefault((scope, group, resource, name), set()).update(
                            rule["verbs"]
                        )
    return granted


# --- lint and values ----------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_lint_is_clean(variant: str) -> None:
    report = helm.lint(CHART, copy.deepcopy(VARIANTS[variant]), namespace=NAMESPACE, strict=True)
    assert report["errors"] == []
    # Severity 1 is INFO ("icon is recommended"); warnings (2) and errors (3) fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_a_broken_chart(tmp_path: Path) -> None:
    broken = tmp_path / "netval"
    broken.mkdir()
    (broken / "Chart.yaml").write_text((CHART / "Chart.yaml").read_text())
    (broken / "templates").mkdir()
    (broken / "templates" / "bad.yaml").write_text("kind: ConfigMap\nmetadata: {{ .Values.x.y }}\n")
    report = helm.lint(broken)
    assert any(m["severity"] == 3 for m in report["messages"]), report


def test_render_fails_without_an_external_url() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match=r"mqtt[./]external"):
        chart.render({"mqtt": {"external": {"enabled": True}}}, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"operator": {"replicas": "two"}}, "/operator/replicas"),
        ({"operator": {"replicas": 0}}, "/operator/replicas"),
        ({"operator": {"logLevel": "LOUD"}}, "/operator/logLevel"),
        ({"imagePullSecret": []}, "imagePullSecret"),
        ({"image": {"digest": "sha256:short"}}, "/image/digest"),
        ({"mqtt": {"external": {"enabled": True}}}, "/mqtt/external/url"),
        (
            {"mqtt": {"external": {"enabled": True, "url": "http://broker:1883"}}},
            "/mqtt/external/url",
        ),
        (
            {"mqtt": {"external": {"enabled": True, "url": "mqtt://b:1883", "username": "u"}}},
            "/mqtt/external/existingSecret",
        ),
        (
            {"mqtt": {"external": {"enabled": True, "url": "mqtt://b:1883", "caSecret": "ca"}}},
            "/mqtt/external/url",
        ),
        ({"mqtt": {"broker": {"agentUsername": "a b"}}}, "/mqtt/broker/agentUsername"),
        ({"webhook": {"failurePolicy": "Maybe"}}, "/webhook/failurePolicy"),
        ({"webhook": {"certManager": {"issuerRef": {"kind": "Vault"}}}}, "/webhook/certManager"),
        ({"agent": {"resources": {"requests": {"cpu": "lots"}}}}, "/agent/resources"),
        ({"agent": {"tolerations": [{"operator": "Sometimes"}]}}, "/agent/tolerations"),
    ],
)
def test_schema_refuses_bad_values(values: dict[str, Any], error: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema(values)
    assert error in str(caught.value)


@pytest.mark.parametrize("variant", VARIANTS)
def test_schema_accepts_every_variant(variant: str) -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(copy.deepcopy(VARIANTS[variant]))


def _leaf_paths(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    yield prefix, value
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _leaf_paths(sub, f"{prefix}.{key}" if prefix else key)


def test_schema_describes_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    for path, value in _leaf_paths(values):
        node = schema
        for key in path.split(".") if path else []:
            props = node.get("properties", {})
            assert key in props, f"values.schema.json has no {path}"
            node = props[key]
        assert node.get("description") or not path, f"{path}: no description in the schema"
        if isinstance(value, dict) and node.get("properties") is not None:
            # A closed object: a misspelt key is refused, not ignored.
            assert node.get("additionalProperties") is False, f"{path or 'root'} is open"


def test_every_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^\s*[A-Za-z0-9_.-]+:")
    for number, line in enumerate(lines):
        if not key.match(line):
            continue
        previous = lines[number - 1].strip() if number else ""
        assert previous.startswith("#"), f"values.yaml:{number + 1}: {line.strip()} has no comment"


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


# --- containers ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_is_hardened(variant: str) -> None:
    specs = list(pod_specs(variant))
    assert specs
    for where, spec in specs:
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True, where
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert spec.get("hostNetwork") is not True and spec.get("hostPID") is not True, where
        for container in spec.get("initContainers", []) + spec["containers"]:
            name = f"{where}/{container['name']}"
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True, name
            assert (sc.get("runAsUser") or pod.get("runAsUser")) not in (None, 0), name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert "privileged" not in sc, name
            assert container.get("resources", {}).get("limits", {}).get("memory"), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_operator_deployment_runs_with_peering(variant: str) -> None:
    deployment = operator_deployment(variant)
    assert deployment["spec"]["replicas"] == 2
    container = operator_container(variant)
    args = container["args"]
    assert args[0] == "operator"
    assert "--standalone" not in args
    assert args[args.index("--liveness") + 1] == "http://0.0.0.0:8080/healthz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == 8080
    assert args[args.index("--metrics-addr") + 1] == f"0.0.0.0:{ports['metrics']}"
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == OPERATOR_SA
    assert spec["securityContext"]["runAsUser"] == manifests.AGENT_UID == 65532
    # Kopf's peering: the object the replicas meet in, and its CRD in the chart's crds/.
    peering = one(variant, "ClusterKopfPeering", operator_main.PEERING_NAME)
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert "namespace" not in peering["metadata"]
    pdb = one(variant, "PodDisruptionBudget", "netval-operator")
    assert pdb["spec"]["minAvailable"] == 1


def test_one_replica_has_no_disruption_budget() -> None:
    with helm.Chart.load(CHART) as chart:
        out = chart.render({"operator": {"replicas": 1}}, name=RELEASE, namespace=NAMESPACE)
    assert "PodDisruptionBudget" not in out[f"{RELEASE}/templates/operator-deployment.yaml"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_operator_arguments_parse_with_the_real_cli(variant: str) -> None:
    args = operator_container(variant)["args"]
    parser = build_parser()
    known = {
        opt
        for action in parser._subparsers._group_actions[0].choices["operator"]._actions
        for opt in action.option_strings
    }  # type: ignore[union-attr]
    missing = sorted({a for a in args if a.startswith("--")} - known)
    if missing:
        pytest.skip(f"`netval operator` does not take {', '.join(missing)} yet")
    parsed = parser.parse_args(args)
    assert parsed.command == "operator"
    assert parsed.standalone is False
    assert parsed.liveness == "http://0.0.0.0:8080/healthz"


@pytest.mark.parametrize("variant", VARIANTS)
def test_operator_environment_builds_real_settings(variant: str, tmp_path: Path) -> None:
    container = operator_container(variant)
    env = env_of(container)
    assert set(env) <= SRC_OPERATOR_ENV | PROPOSED_OPERATOR_ENV, set(env) - SRC_OPERATOR_ENV
    # Files mounted from Secrets, made real here.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    if mqtt_settings.ENV_PASSWORD_FILE in env:
        assert env[mqtt_settings.ENV_PASSWORD_FILE].startswith(mounts["mqtt"] + "/")
        password = tmp_path / "password"
        password.write_text("s3cret\n")
        env[mqtt_settings.ENV_PASSWORD_FILE] = str(password)
    if mqtt_settings.ENV_CA_FILE in env:
        assert env[mqtt_settings.ENV_CA_FILE].startswith(mounts["mqtt-ca"] + "/")
        env[mqtt_settings.ENV_CA_FILE] = certifi.where()
    settings = operator_settings.operator_settings_from_env(env)
    assert settings.namespace == NAMESPACE
    assert settings.agent_image == "ghcr.io/netval/netval:0.1.0" == operator_settings.DEFAULT_IMAGE
    values = VARIANTS[variant]
    external = values.get("mqtt", {}).get("external", {})
    if external.get("enabled"):
        assert settings.mqtt.url == external["url"]
        assert settings.agent_mqtt_secret == external["agentExistingSecret"]
        assert settings.agent_mqtt_ca_secret == external["caSecret"]
        assert settings.agent_mqtt_username == external["agentUsername"]
        assert not find(variant, "Deployment", "netval-mqtt")
    else:
        assert settings.mqtt.url == f"mqtt://netval-mqtt.{NAMESPACE}.svc:1883"
        assert settings.mqtt.username == "netval-operator"
        assert settings.mqtt.password == "s3cret"
        assert settings.agent_mqtt_username == "netval-agent"
        # The Secret the agents mount holds the key the DaemonSet projects.
        secret = one(variant, "Secret", settings.agent_mqtt_secret)
        assert set(secret["data"]) >= {manifests.DEFAULT_PASSWORD_KEY}
        operator_secret = one(variant, "Secret", "netval-mqtt-operator")
        passwords = [
            base64.b64decode(s["data"]["password"]).decode() for s in (secret, operator_secret)
        ]
        assert all(re.fullmatch(r"[A-Za-z0-9]{32}", p) for p in passwords)
        assert passwords[0] != passwords[1], "agents must not hold the operator's password"
    # What the operator then hands the agents is consistent (AgentMqttWiring checks it).
    manifests.AgentMqttWiring(
        url=settings.agent_mqtt_url,
        username=settings.agent_mqtt_username,
        password_secret=settings.agent_mqtt_secret if settings.agent_mqtt_username else None,
        ca_secret=settings.agent_mqtt_ca_secret,
    )
    assert json.loads(env["NETVAL_AGENT_RESOURCES"])["limits"]["memory"] == "256Mi"
    assert json.loads(env["NETVAL_AGENT_TOLERATIONS"]) == values.get("agent", {}).get(
        "tolerations", []
    )
    assert env["NETVAL_KUEUE_ENABLED"] == str(values.get("kueue", {}).get("enabled", False)).lower()
    otlp = values.get("telemetry", {}).get("otlpEndpoint")
    assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == otlp


def test_image_references_are_pinned() -> None:
    images = {
        c["image"]
        for _, spec in pod_specs("default")
        for c in spec.get("initContainers", []) + spec["containers"]
    }
    assert "ghcr.io/netval/netval:0.1.0" in images
    broker = {i for i in images if i.startswith("eclipse-mosquitto")}
    assert broker and all(
        re.fullmatch(r"eclipse-mosquitto:2\.0\.\d+@sha256:[0-9a-f]{64}", i) for i in broker
    )
    with helm.Chart.load(CHART) as chart:
        out = chart.render(
            {"image": {"digest": "sha256:" + "a" * 64}}, name=RELEASE, namespace=NAMESPACE
        )
    assert (
        f'"ghcr.io/netval/netval:0.1.0@sha256:{"a" * 64}"'
        in out[f"{RELEASE}/templates/operator-deployment.yaml"]
    )


# --- CRDs ---------------------------------------------------------------------------------


def test_chart_crd_is_the_crds_file() -> None:
    ours = (ROOT / "crds" / "networkvalidations.netval.io.yaml").read_bytes()
    assert (CHART / "crds" / "networkvalidations.netval.io.yaml").read_bytes() == ours


def test_chart_ships_both_crds() -> None:
    with helm.Chart.load(CHART) as chart:
        crds = {yaml.safe_load(c["data"])["metadata"]["name"] for c in chart.crds}
    assert crds == {"networkvalidations.netval.io", "clusterkopfpeerings.kopf.dev"}


# --- schemas ------------------------------------------------------------------------------


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def _metadata_errors(doc: dict[str, Any]) -> list[str]:
    meta = doc.get("metadata", {})
    errors = []
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta.get("name", "")):
        errors.append(f"metadata.name {meta.get('name')!r}")
    for key in ("labels", "annotations"):
        if not all(isinstance(v, str) for v in (meta.get(key) or {}).values()):
            errors.append(f"metadata.{key} must be strings")
    return errors


def schema_errors(doc: dict[str, Any]) -> list[str]:
    """Why the API server would refuse `doc`: the Kubernetes OpenAPI schemas (strict) for
    built-in kinds, the CRD's schema for custom resources. [] when it validates."""
    key = (doc["apiVersion"], doc["kind"])
    custom = crd_schemas().get(key) or CERT_MANAGER_SCHEMAS.get(key)
    if custom is not None:
        validator = jsonschema.Draft4Validator(custom)
        return _metadata_errors(doc) + [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)
        ]
    errors = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{version}: {'.'.join(map(str, exc.path))}: {exc.message}")
    return errors


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_manifests_validate(variant: str) -> None:
    rendered_docs = docs(variant)
    assert rendered_docs
    for doc in rendered_docs:
        where = f"{variant}: {doc['kind']}/{doc['metadata']['name']}"
        assert schema_errors(doc) == [], where


def test_chart_crds_validate() -> None:
    for path in sorted((CHART / "crds").glob("*.yaml")):
        assert schema_errors(yaml.safe_load(path.read_text())) == [], path.name


def test_schema_validation_catches_mistakes() -> None:
    deployment = operator_deployment("default")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnly"] = True
    assert schema_errors(deployment)
    deployment = operator_deployment("default")
    deployment["spec"]["replicas"] = "2"
    assert schema_errors(deployment)
    certificate = one("cert-manager", "Certificate", "netval-webhook")
    certificate["spec"]["dnsName"] = ["x"]
    assert schema_errors(certificate)
    peering = one("default", "ClusterKopfPeering", "netval")
    peering["status"] = "x"
    assert schema_errors(peering)


def _example_docs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                found.append((path.name, doc))
    return found


def test_examples_validate() -> None:
    found = _example_docs()
    names = {name for name, _ in found}
    assert {"roce-training-pool.yaml", "inference-pool-storage.yaml", "gated-job.yaml"} <= names
    for name, doc in found:
        assert schema_errors(doc) == [], name
        if doc["kind"] == "NetworkValidation":
            NetworkValidationSpec.model_validate(doc["spec"])


def test_examples_say_what_they_promise() -> None:
    by_name = {d["metadata"]["name"]: d for _, d in _example_docs()}
    pool = NetworkValidationSpec.model_validate(by_name["roce-training-pool"]["spec"])
    assert pool.node_selector == {"nvidia.com/gpu.present": "true"}
    assert any(t.get("key") == "nvidia.com/gpu" for t in pool.tolerations)
    assert pool.interval_seconds == 30
    assert pool.checks.pfc.priorities == [3] and pool.checks.ecn_priorities == [3]
    assert pool.checks.pfc.trust.value == "dscp"
    assert pool.checks.mtu.interface_mtu == 9000
    assert pool.checks.rdma.min_rate_gbps == 400
    assert pool.gating.node_label and pool.gating.taint
    inference = NetworkValidationSpec.model_validate(by_name["inference-pool"]["spec"])
    assert {e.protocol.value for e in inference.checks.storage.endpoints} >= {"s3", "nfs", "ceph"}
    job = by_name["allreduce-smoke"]
    assert job["kind"] == "Job"
    assert job["metadata"]["annotations"]["netval.io/require-healthy"] == "roce-training-pool"
    assert "roce-training-pool" in by_name


# --- NOTES and labels ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_notes_tell_the_next_command(variant: str) -> None:
    text = notes(variant)
    for command in (
        "kubectl apply -f examples/roce-training-pool.yaml",
        "kubectl get netval -w",
        "kubectl wait --for=condition=Healthy netval/roce-training-pool",
        f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged",
    ):
        assert command in text, command
    for path in re.findall(r"examples/[\w.-]+\.yaml", text):
        assert (ROOT / path).is_file(), path
    assert "{{" not in text and "<no value>" not in text


@pytest.mark.parametrize("variant", VARIANTS)
def test_everything_carries_the_standard_labels(variant: str) -> None:
    for doc in docs(variant):
        labels = doc["metadata"].get("labels", {})
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/component",
            "app.kubernetes.io/part-of",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ):
            assert labels.get(key), f"{doc['kind']}/{doc['metadata']['name']} lacks {key}"
        selector = doc.get("spec", {}).get("selector", {})
        match = selector.get("matchLabels", selector if doc["kind"] == "Service" else None)
        if match and "template" in doc.get("spec", {}):
            assert match.items() <= doc["spec"]["template"]["metadata"]["labels"].items()


# --- the webhook certificate --------------------------------------------------------------


def _webhook_names() -> list[str]:
    svc = "netval-webhook"
    return [
        svc,
        f"{svc}.{NAMESPACE}",
        f"{svc}.{NAMESPACE}.svc",
        f"{svc}.{NAMESPACE}.svc.cluster.local",
    ]


def test_self_signed_webhook_certificate_serves_the_service() -> None:
    secret = one("default", "Secret", "netval-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    pem = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    cert = x509.load_pem_x509_certificate(pem["tls.crt"])
    ca = x509.load_pem_x509_certificate(pem["ca.crt"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == _webhook_names()
    cert.verify_directly_issued_by(ca)
    key = serialization.load_pem_private_key(pem["tls.key"], password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    # The operator gets it as files: --webhook-cert/-key/-ca under the mounted Secret.
    container = operator_container("default")
    args = container["args"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")["mountPath"]
    for flag, file in (
        ("--webhook-cert", "tls.crt"),
        ("--webhook-key", "tls.key"),
        ("--webhook-ca", "ca.crt"),
    ):
        assert args[args.index(flag) + 1] == f"{mount}/{file}"
    assert args[args.index("--webhook-service") + 1] == f"{NAMESPACE}/netval-webhook"
    # A TLS server with this certificate is trusted by a client that trusts ca.crt for the
    # Service's name, as the API server does with the caBundle.
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    client = ssl.create_default_context(cadata=pem["ca.crt"].decode())
    _tls_handshake(server, client, pem["tls.crt"], pem["tls.key"], _webhook_names()[2])


def _tls_handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, cert: bytes, key: bytes, hostname: str
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c").write_bytes(cert)
        (Path(tmp) / "k").write_bytes(key)
        server.load_cert_chain(Path(tmp) / "c", Path(tmp) / "k")
    a, b = socket.socketpair()
    with a, b:
        errors: list[BaseException] = []

        def serve() -> None:
            try:
                with server.wrap_socket(a, server_side=True) as s:
                    s.recv(1)
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=serve)
        thread.start()
        with client.wrap_socket(b, server_hostname=hostname) as c:
            c.sendall(b"x")
        thread.join(5)
        assert not errors


def test_cert_manager_issues_the_webhook_certificate() -> None:
    assert not find("cert-manager", "Secret", "netval-webhook-tls")
    certificate = one("cert-manager", "Certificate", "netval-webhook")
    assert certificate["spec"]["secretName"] == "netval-webhook-tls"
    assert certificate["spec"]["dnsNames"] == _webhook_names()
    assert certificate["spec"]["issuerRef"] == {
        "name": "netval-webhook-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    ca = one("cert-manager", "Certificate", "netval-webhook-ca")
    assert ca["spec"]["isCA"] is True
    assert one("cert-manager", "Issuer", "netval-webhook-ca")["spec"] == {
        "ca": {"secretName": "netval-webhook-ca"}
    }
    assert one("cert-manager", "Issuer", "netval-selfsigned")["spec"] == {"selfSigned": {}}
    # With an issuer of the user's, the chart creates none of its own.
    assert not find("cert-manager-issuer", "Issuer")
    issued = one("cert-manager-issuer", "Certificate", "netval-webhook")
    assert issued["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_no_webhook_means_no_webhook_objects() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs("no-webhook")}
    assert ("Service", "netval-webhook") not in kinds
    assert ("Secret", "netval-webhook-tls") not in kinds
    args = operator_container("no-webhook")["args"]
    assert not [a for a in args if a.startswith("--webhook")]
    assert "webhook" not in {p["name"] for p in operator_container("no-webhook")["ports"]}


# --- the broker, for real -----------------------------------------------------------------


def _broker_parts() -> tuple[str, str, dict[str, Any], dict[str, str]]:
    config = one("default", "ConfigMap", "netval-mqtt")["data"]
    deployment = one("default", "Deployment", "netval-mqtt")
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    passwords = {
        who: base64.b64decode(
            one("default", "Secret", f"netval-mqtt-{who}")["data"]["password"]
        ).decode()
        for who in ("operator", "agent")
    }
    return config["mosquitto.conf"], config["acl"], init, passwords


def _free_port() -> int:
    return broker_kit.free_port()


class _Client:
    """A paho MQTT client, connected synchronously; collects messages."""

    def __init__(self, port: int, username: str | None, password: str | None) -> None:
        import paho.mqtt.client as paho

        self.messages: dict[str, bytes] = {}
        self.connected = threading.Event()
        self.reason: Any = None
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()
        self.connected.wait(5)

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        self.reason = reason
        self.connected.set()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.messages[message.topic] = message.payload

    @property
    def accepted(self) -> bool:
        return self.reason is not None and not self.reason.is_failure

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)

    def subscribe(self, topic: str, wait: float = 0.5) -> dict[str, bytes]:
        self.client.subscribe(topic, qos=1)
        time.sleep(wait)
        return dict(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def chart_broker(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    if not broker_kit.available():
        pytest.skip(broker_kit.MISSING_REASON)
    conf, acl, init, passwords = _broker_parts()
    auth = tmp_path / "auth"
    auth.mkdir()
    secrets = {}
    for who, password in passwords.items():
        (tmp_path / who).mkdir()
        (tmp_path / who / "password").write_text(password)
        secrets[who] = tmp_path / who / "password"
    # The init container's own script, with its file paths pointed at this directory.
    env = {e["name"]: e["value"] for e in init["env"]}
    env.update(
        PASSWD_FILE=str(auth / "passwd"),
        OPERATOR_PASSWORD_FILE=str(secrets["operator"]),
        AGENT_PASSWORD_FILE=str(secrets["agent"]),
        PATH=os.environ["PATH"] + ":" + str(Path(broker_kit.MOSQUITTO_PASSWD or "").parent),
    )
    assert init["command"][:2] == ["/bin/sh", "-ec"]
    subprocess.run(["/bin/sh", "-ec", init["command"][2]], env=env, check=True, timeout=30)
    (tmp_path / "acl").write_text(acl)
    (tmp_path / "data").mkdir()
    port = _free_port()
    replacements = {
        "listener 1883\n": f"listener {port} 127.0.0.1\n",
        "/mosquitto/auth/passwd": str(auth / "passwd"),
        "/mosquitto/config/acl": str(tmp_path / "acl"),
        "/mosquitto/data/": f"{tmp_path / 'data'}/",
    }
    for old, new in replacements.items():
        assert old in conf, old
        conf = conf.replace(old, new)
    # As root, mosquitto would switch to the "mosquitto" user (the image runs as it already).
    conf += f"\nuser {getpass.getuser()}\n"
    (tmp_path / "mosquitto.conf").write_text(conf)
    log = (tmp_path / "mosquitto.log").open("wb")
    proc = subprocess.Popen(
        [str(broker_kit.MOSQUITTO), "-c", str(tmp_path / "mosquitto.conf")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, (tmp_path / "mosquitto.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "broker did not listen"
                time.sleep(0.05)
        yield port, {**passwords, "passwd": (auth / "passwd").read_text()}
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_broker_configuration_works_in_a_real_mosquitto(
    chart_broker: tuple[int, dict[str, str]],
) -> None:
    port, secrets = chart_broker
    # The init container hashed both entries: no plain password reaches the broker's file.
    entries = dict(line.split(":", 1) for line in secrets["passwd"].splitlines())
    assert set(entries) == {"netval-operator", "netval-agent"}
    for user, hashed in entries.items():
        assert re.match(r"^\$[67]\$", hashed), user
        assert secrets["operator"] not in hashed and secrets["agent"] not in hashed
    clients = []
    try:
        for username, password in (
            (None, None),
            ("netval-operator", "wrong"),
            ("netval-agent", secrets["operator"]),
        ):
            refused = _Client(port, username, password)
            clients.append(refused)
            assert not refused.accepted, username
        operator = _Client(port, "netval-operator", secrets["operator"])
        agent = _Client(port, "netval-agent", secrets["agent"])
        clients += [operator, agent]
        assert operator.accepted and agent.accepted
        base = "netval/v1/roce-training-pool/gpu-node-1"
        operator.publish(f"{base}/assignment", b'{"domain": "zone-a"}')
        agent.publish(f"{base}/report", b"{}")
        agent.publish(f"{base}/state", b"online")
        agent.publish(f"{base}/endpoint", b'{"port": 7471}')
        agent.publish(f"{base}/assignment", b'{"domain": "forged"}')  # refused by the ACL
        agent.publish("netval/v2/elsewhere", b"x")  # refused by the ACL
        seen = operator.subscribe("netval/#")
        assert seen == {
            f"{base}/assignment": b'{"domain": "zone-a"}',
            f"{base}/report": b"{}",
            f"{base}/state": b"online",
            f"{base}/endpoint": b'{"port": 7471}',
        }
        # Agents read assignments and their peers' endpoints, not other agents' reports.
        agent.subscribe("netval/v1/roce-training-pool/+/assignment", wait=0)
        agent.subscribe("netval/v1/roce-training-pool/+/endpoint", wait=0)
        got = agent.subscribe("netval/v1/roce-training-pool/+/report")
        assert got == {
            f"{base}/assignment": b'{"domain": "zone-a"}',
            f"{base}/endpoint": b'{"port": 7471}',
        }
    finally:
        for client in clients:
            client.close()


def test_broker_password_file_is_private(tmp_path: Path) -> None:
    if not broker_kit.available():
        pytest.skip(broker_kit.MISSING_REASON)
    _, _, init, _ = _broker_parts()
    (tmp_path / "p").write_text("a")
    env = {
        "PASSWD_FILE": str(tmp_path / "passwd"),
        "OPERATOR_USERNAME": "o",
        "OPERATOR_PASSWORD_FILE": str(tmp_path / "p"),
        "AGENT_USERNAME": "a",
        "AGENT_PASSWORD_FILE": str(tmp_path / "p"),
        "PATH": os.environ["PATH"] + ":" + str(Path(broker_kit.MOSQUITTO_PASSWD or "").parent),
    }
    subprocess.run(["/bin/sh", "-ec", init["command"][2]], env=env, check=True, timeout=30)
    assert stat.S_IMODE((tmp_path / "passwd").stat().st_mode) == 0o600
    # No password on a command line: the script reads the files itself.
    assert "password" not in " ".join(init["command"][:2])
    assert "mosquitto_passwd -U" in init["command"][2]


def test_operator_replicas_get_distinct_mqtt_client_ids(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = env_of(operator_container("default"))
    (tmp_path / "password").write_text("pw")
    env[mqtt_settings.ENV_PASSWORD_FILE] = str(tmp_path / "password")
    monkeypatch.setattr(os, "getpid", lambda: 1)  # netval is the container's init process
    ids = set()
    for pod in ("netval-operator-7d9f-abcde", "netval-operator-7d9f-fghij"):
        monkeypatch.setattr(socket, "gethostname", lambda pod=pod: pod)
        ids.add(
            operator_settings.operator_settings_from_env({**env, "HOSTNAME": pod}).mqtt.client_id
        )
    assert len(ids) == 2
