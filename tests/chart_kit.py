"""Shared parts of the chart tests (tests/test_chart*.py): the chart rendered with the real
Helm v4 library, its documents, and schema validation of every manifest.

`helm-python-sdk` binds Helm's Go SDK (libhelm_c) through ctypes: the same template engine,
Sprig functions, values coalescing and values.schema.json validation as `helm template` and
`helm lint`, with no helm binary and no cluster (`lookup` finds nothing offline, so generated
passwords and certificates are fresh on every render).

Validation: built-in kinds against the Kubernetes OpenAPI schemas kubernetes-validate ships
(offline, strict: unknown fields are errors) for the oldest and the newest supported
versions; custom resources against their CRD's schema (the chart's own CRDs) or against the
parts of a third-party API the chart uses, transcribed here (cert-manager, Prometheus
Operator): unknown fields are refused, so a typo in a template fails.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "netval"
EXAMPLES = ROOT / "examples"
RELEASE = "netval"
NAMESPACE = "netval-system"
OPERATOR_SA = "netval-operator"
AGENT_SA = "netval-agent"
AGENT_NAMESPACE = "netval-agents"

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas
# kubernetes-validate ships.
# Kinds the chart renders only from a newer Kubernetes on: validated from that version on.
# ValidatingAdmissionPolicy v1 is GA in 1.30 (rbac.admissionPolicy refuses older clusters).
NEWER_KINDS = {
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): "1.30.0",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): "1.30.0",
}
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
    # an external broker that authenticates by the identity CA's client certificates
    "external-client-certificates": {
        "mqtt": {
            "external": {
                "enabled": True,
                "url": "mqtts://rabbitmq.mqtt.svc:8883",
                "caSecret": "rabbitmq-ca",
                "clientCertificates": True,
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
    # without the webhook there is no enrollment: the shared agent login (per-node identity
    # without the webhook does not render)
    "no-webhook": {
        "webhook": {"enabled": False},
        "mqtt": {"identity": {"enabled": False}},
    },
    # The bundled broker in plaintext (asked for), and its certificate from cert-manager or
    # from a Secret of the user's (agents elsewhere: their CA-only Secret named).
    "broker-plaintext": {"mqtt": {"tls": {"enabled": False}, "identity": {"enabled": False}}},
    # the shared agent login instead of per-node identity (no client certificates)
    "broker-shared-login": {"mqtt": {"identity": {"enabled": False}}},
    "broker-cert-manager": {"mqtt": {"tls": {"certManager": {"enabled": True}}}},
    "broker-tls-existing": {
        "agent": {"namespace": AGENT_NAMESPACE},
        "mqtt": {"tls": {"existingSecret": "corp-mqtt-tls", "agentCaSecret": "corp-mqtt-ca"}},
    },
    # Agents in their own namespace (created with the Pod Security labels), with their own
    # pull secrets and priority.
    "agents-namespace": {
        "agent": {
            "namespace": AGENT_NAMESPACE,
            "imagePullSecrets": [{"name": "gpu-registry"}],
            "priorityClassName": "system-node-critical",
        },
        "imagePullSecrets": [{"name": "registry"}],
    },
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
        }
    },
    "admission-policy": {"rbac": {"admissionPolicy": {"enabled": True}}},
    "no-network-policy": {"networkPolicy": {"broker": {"enabled": False}}},
    # Every opt-in at once.
    "all-on": {
        "agent": {"namespace": AGENT_NAMESPACE, "priorityClassName": "system-node-critical"},
        "kueue": {"enabled": True, "topologies": True},
        "deviceTaints": {
            "enabled": True,
            "drivers": [
                {
                    "driver": "dra.net",
                    "pciAddress": "dra.net/pciAddress",
                    "ifName": "dra.net/ifName",
                    "rdmaDevice": "dra.net/rdmaDevice",
                },
                {
                    "driver": "sriovnetwork.k8snetworkplumbingwg.io",
                    "pciAddress": "sriovnetwork.k8snetworkplumbingwg.io/pciAddress",
                    "parentPciAddress": "sriovnetwork.k8snetworkplumbingwg.io/pfPciAddress",
                },
            ],
        },
        "webhook": {"certManager": {"enabled": True}},
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
        },
        "rbac": {"admissionPolicy": {"enabled": True}},
        "networkPolicy": {
            "broker": {"podCidrs": ["10.244.0.0/16"]},
            "operator": {"enabled": True, "webhookSources": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
        },
        "telemetry": {
            "otlpEndpoint": "http://otel-collector.observability:4318",
            "tracesSampler": "parentbased_traceidratio",
            "tracesSamplerArg": "0.01",
            "headersSecret": "otlp-headers",
        },
        "mqtt": {
            "broker": {
                "operatorExistingSecret": "mqtt-operator",
                "agentExistingSecret": "mqtt-agent",
            }
        },
    },
    "gitops-secrets": {
        "mqtt": {
            "broker": {
                "operatorExistingSecret": "mqtt-operator",
                "agentExistingSecret": "mqtt-agent",
            },
            "tls": {"existingSecret": "netval-mqtt-cert"},
            "identity": {"existingSecret": "netval-identity-ca"},
        },
        "webhook": {"existingSecret": "netval-webhook-cert"},
    },
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


# The Prometheus Operator's CRDs are not shipped offline either: the parts of
# monitoring.coreos.com/v1 ServiceMonitor, PodMonitor and PrometheusRule the chart uses,
# transcribed from prometheus-operator's CRDs (v0.7x: example/prometheus-operator-crd), with
# their types and patterns; unknown fields are refused.
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}
_NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "any": {"type": "boolean"},
        "matchNames": {"type": "array", "items": {"type": "string"}},
    },
}
_RELABELING = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
        },
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "separator": {"type": "string"},
        "modulus": {"type": "integer"},
        "action": {
            "enum": [
                "replace",
                "Replace",
                "keep",
                "Keep",
                "drop",
                "Drop",
                "hashmod",
                "HashMod",
                "labelmap",
                "LabelMap",
                "labeldrop",
                "LabelDrop",
                "labelkeep",
                "LabelKeep",
                "lowercase",
                "Lowercase",
                "uppercase",
                "Uppercase",
                "keepequal",
                "KeepEqual",
                "dropequal",
                "DropEqual",
            ]
        },
    },
}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "scheme": {"enum": ["http", "https"]},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "honorLabels": {"type": "boolean"},
        "relabelings": {"type": "array", "items": _RELABELING},
        "metricRelabelings": {"type": "array", "items": _RELABELING},
    },
}
MONITORING_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["selector"],
                "additionalProperties": False,
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": _NAMESPACE_SELECTOR,
                    "endpoints": {"type": "array", "items": _ENDPOINT},
                    "jobLabel": {"type": "string"},
                    "targetLabels": {"type": "array", "items": {"type": "string"}},
                    "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                },
            }
        },
    },
    ("monitoring.coreos.com/v1", "PodMonitor"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["selector"],
                "additionalProperties": False,
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": _NAMESPACE_SELECTOR,
                    "podMetricsEndpoints": {"type": "array", "items": _ENDPOINT},
                    "jobLabel": {"type": "string"},
                    "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                },
            }
        },
    },
    ("monitoring.coreos.com/v1", "PrometheusRule"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "groups": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "interval": _DURATION,
                                "rules": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["expr"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "alert": {"type": "string"},
                                            "record": {"type": "string"},
                                            "expr": {"type": ["string", "integer"]},
                                            "for": _DURATION,
                                            "keep_firing_for": _DURATION,
                                            "labels": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                            "annotations": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    }
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


# --- schemas ------------------------------------------------------------------------------


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for path in sorted(
        [*(CHART / "crds").glob("*.yaml"), *(CHART / "files" / "crds").glob("*.yaml")]
    ):
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
    custom = crd_schemas().get(key) or CERT_MANAGER_SCHEMAS.get(key) or MONITORING_SCHEMAS.get(key)
    if custom is not None:
        validator = jsonschema.Draft4Validator(custom)
        return _metadata_errors(doc) + [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)
        ]
    errors = []
    versions = KUBE_VERSIONS
    if key in NEWER_KINDS:
        # Rendered only where the API exists (the template refuses older versions).
        versions = (NEWER_KINDS[key], KUBE_VERSIONS[1])
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{version}: {'.'.join(map(str, exc.path))}: {exc.message}")
    return errors


def render(values: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    """The chart rendered with `values` (not cached), as `helm install` would."""
    with helm.Chart.load(CHART) as chart:
        out: dict[str, str] = chart.render(
            copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE, is_install=True, **kwargs
        )
    return out
