"""Render the agent objects of one NetworkValidation: its ConfigMap and its DaemonSet.

Pure functions: no I/O, no clock, no environment. `agents.rollout` applies what these return.

- The ConfigMap holds the agent config file (`{validation, generation, spec}`, see
  docs/architecture.md "Processes and environment") under `AGENT_CONFIG_KEY`, as YAML
  written by PyYAML, which the agent reads back with `yaml.safe_load` exactly (JSON text
  read as YAML is not always: `1e-05` would come back as a string).
- The DaemonSet runs `netval agent` on every node the spec selects, on the host network, as a
  non-root user with no capabilities and a read-only root filesystem; the agent never talks to
  the Kubernetes API, so its ServiceAccount has no token and no bindings.
- The pod template carries `netval.io/restart-hash`, the hash of what the agent reads only
  at start (`restart_document`), so a spec edit rolls the agents only when what the pod runs
  changes (that, or the image, env, mounts, ports, selector in the template itself); check
  thresholds, gating, the interval reach the running agents through the ConfigMap, which
  they reload live (`netval.agent.config_watch`). Status writes and node label changes
  never roll them (docs/architecture.md "MQTT": the domain travels in the assignment topic).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from netval.infra.mqtt_settings import (
    ENV_CA_FILE,
    ENV_PASSWORD_FILE,
    ENV_URL,
    ENV_USERNAME,
    parse_mqtt_url,
)
from netval.model.keys import (
    MANAGED_BY_OPERATOR,
    TAINT_EFFECT,
    AnnotationKey,
    LabelKey,
    TaintKey,
)
from netval.model.spec import NetworkValidationSpec

# --- names, labels, annotations -------------------------------------------------------------

# Label and annotation keys: `netval.model.keys` (LabelKey, AnnotationKey).
AGENT_APP_NAME: Final = "netval-agent"  # value of app.kubernetes.io/name

AGENT_OBJECT_PREFIX: Final = "netval-agent-"
MAX_NAME_LENGTH: Final = 63  # DNS label: DaemonSet names end up in pod names and labels
MAX_LABEL_VALUE_LENGTH: Final = 63
_HASH_SUFFIX_LENGTH: Final = 8

# --- the agent container --------------------------------------------------------------------

AGENT_CONTAINER: Final = "agent"
AGENT_COMMAND: Final = ("netval", "agent")
AGENT_SERVICE_ACCOUNT: Final = "netval-agent"  # exists once per namespace; no RBAC bindings
AGENT_SERVICE_NAME: Final = "netval-agent"  # OTEL_SERVICE_NAME
AGENT_UID: Final = 65532  # the conventional "nonroot" uid/gid of distroless-style images

# The agent config file, mounted from the ConfigMap.
AGENT_CONFIG_KEY: Final = "agent.yaml"
AGENT_CONFIG_DIR: Final = "/etc/netval/config"
AGENT_CONFIG_PATH: Final = f"{AGENT_CONFIG_DIR}/{AGENT_CONFIG_KEY}"

# MQTT credentials, projected from Secrets into one read-only directory.
MQTT_SECRET_DIR: Final = "/etc/netval/mqtt"
MQTT_PASSWORD_FILE: Final = "password"
MQTT_CA_FILE: Final = "ca.crt"
DEFAULT_PASSWORD_KEY: Final = "password"  # keys in the Secrets, unless told otherwise
DEFAULT_CA_KEY: Final = "ca.crt"

# Environment the agent reads (netval.agent.config, netval.infra.mqtt_settings; this package
# must not import the agent, tests check the names agree).
ENV_CONFIG: Final = "NETVAL_CONFIG"
ENV_NODE: Final = "NETVAL_NODE_NAME"
ENV_METRICS_ADDR: Final = "NETVAL_METRICS_ADDR"
ENV_HOST_IP: Final = "NETVAL_HOST_IP"
# Downward API: the pod's own name and namespace, for the agent's trace resource
# (k8s.pod.name, k8s.namespace.name; netval.infra.telemetry reads them).
ENV_POD_NAME: Final = "NETVAL_POD_NAME"
ENV_POD_NAMESPACE: Final = "NETVAL_POD_NAMESPACE"
OTEL_HEADERS_KEY: Final = "headers"  # key of the OTLP headers Secret (the chart's too)

METRICS_PORT: Final = 9477
METRICS_PORT_NAME: Final = "metrics"
PEER_PORT_NAME: Final = "peer"
HEALTH_PATH: Final = "/healthz"

CPU_REQUEST: Final = "20m"
MEMORY_REQUEST: Final = "64Mi"
MEMORY_LIMIT: Final = "256Mi"  # no CPU limit: throttling would skew latency probes
TMP_SIZE_LIMIT: Final = "16Mi"
MAX_UNAVAILABLE: Final = "10%"

# Volume names.
VOLUME_CONFIG: Final = "config"
VOLUME_SYS: Final = "sys"
VOLUME_MQTT: Final = "mqtt"
VOLUME_TMP: Final = "tmp"
VOLUME_ENROLL: Final = "enroll"

# Per-node MQTT identity (netval.agent.enroll): the pod's projected ServiceAccount token
# (audience netval, bound to the pod; the kubelet renews it) and the enrollment server's CA.
ENROLL_DIR: Final = "/var/run/secrets/netval.io/enroll"
ENROLL_AUDIENCE: Final = "netval"
ENROLL_TOKEN_SECONDS: Final = 3600
ENV_ENROLL_URL: Final = "NETVAL_ENROLL_URL"
ENV_ENROLL_TOKEN_FILE: Final = "NETVAL_ENROLL_TOKEN_FILE"
ENV_ENROLL_CA_FILE: Final = "NETVAL_ENROLL_CA_FILE"


@dataclass(frozen=True, slots=True)
class AgentMqttWiring:
    """How the agents reach the broker (from the operator's settings or the chart).

    The password and the CA bundle come from keys of Secrets in the agents' namespace; they
    are mounted as files, never put in the environment. A CA needs an `mqtts://` url and a
    password needs a username (the agent refuses to start otherwise, so this refuses first).
    """

    url: str
    username: str | None = None
    password_secret: str | None = None
    password_key: str = DEFAULT_PASSWORD_KEY
    ca_secret: str | None = None
    ca_key: str = DEFAULT_CA_KEY
    enroll_url: str | None = None  # per-node identity: agents enroll instead of a password
    enroll_ca_configmap: str | None = None  # key ca.crt: verifies enroll_url

    def __post_init__(self) -> None:
        _host, _port, tls = parse_mqtt_url(self.url)
        if self.password_secret and not self.username:
            raise ValueError("an MQTT password secret needs a username (NETVAL_MQTT_USERNAME)")
        if self.ca_secret and not tls:
            raise ValueError(f"an MQTT CA secret needs an mqtts:// url, got {self.url!r}")

    def secret_files(self) -> list[tuple[str, str, str]]:
        """(secret name, key, file name under MQTT_SECRET_DIR) for each mounted secret."""
        files = []
        if self.password_secret:
            files.append((self.password_secret, self.password_key, MQTT_PASSWORD_FILE))
        if self.ca_secret:
            files.append((self.ca_secret, self.ca_key, MQTT_CA_FILE))
        return files


@dataclass(frozen=True, slots=True)
class AgentPodOptions:
    """Cluster-specific parts of the agent pods, from the operator's settings (the chart).

    Pull secrets name Secrets in the agents' namespace. The sampler variables are the
    standard OTEL_TRACES_SAMPLER(_ARG), so a large fleet can sample (the agent starts each
    trace, the operator follows its decision); the OTLP headers (e.g. an authorization
    token) come from a Secret key, never from the pod spec's plain values.
    """

    image_pull_secrets: tuple[str, ...] = ()
    priority_class_name: str | None = None
    traces_sampler: str | None = None
    traces_sampler_arg: str | None = None
    otel_headers_secret: str | None = None
    otel_headers_key: str = OTEL_HEADERS_KEY


# --- names --------------------------------------------------------------------------------


def _shorten(text: str, limit: int) -> str:
    """`text` if it fits, else a prefix plus a hash of the whole (stable, still unique)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:_HASH_SUFFIX_LENGTH]
    head = text[: limit - _HASH_SUFFIX_LENGTH - 1].rstrip("-.")
    return f"{head}-{digest}"


def agent_object_name(validation: str) -> str:
    """Name of the ConfigMap and DaemonSet of `validation`: `netval-agent-<name>`, at most
    63 characters (a long name keeps a prefix and gets a hash of the full name)."""
    return _shorten(f"{AGENT_OBJECT_PREFIX}{validation}", MAX_NAME_LENGTH)


def validation_label_value(validation: str) -> str:
    """The `netval.io/validation` label value: the name, shortened like object names when it
    is longer than a label value may be (cluster-scoped names may have 253 characters)."""
    return _shorten(validation, MAX_LABEL_VALUE_LENGTH)


def selector_labels(validation: str) -> dict[str, str]:
    """The DaemonSet's selector (immutable once created: never add to it)."""
    return {
        LabelKey.NAME.value: AGENT_APP_NAME,
        LabelKey.VALIDATION.value: validation_label_value(validation),
    }


def agent_labels(validation: str) -> dict[str, str]:
    return {**selector_labels(validation), LabelKey.MANAGED_BY.value: MANAGED_BY_OPERATOR}


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference to the NetworkValidation `owner`: its object (Kopf's body,
    with `metadata.name/uid`) or a flat `{apiVersion, kind, name, uid}`.

    Cluster-scoped owners may own namespaced objects; deleting the validation garbage-collects
    its ConfigMap and DaemonSet. (blockOwnerDeletion needs `update` on
    networkvalidations/finalizers in the operator's RBAC.)
    """
    meta = owner.get("metadata") or {}
    ref = {
        "apiVersion": owner.get("apiVersion"),
        "kind": owner.get("kind"),
        "name": owner.get("name") or meta.get("name"),
        "uid": owner.get("uid") or meta.get("uid"),
    }
    missing = [k for k, v in ref.items() if not v]
    if missing:
        raise ValueError(f"owner lacks {', '.join(missing)} for an ownerReference")
    return {**ref, "controller": True, "blockOwnerDeletion": True}


# --- the config ---------------------------------------------------------------------------


def agent_config_document(
    name: str, generation: int, spec: NetworkValidationSpec
) -> dict[str, Any]:
    """The agent config file's content: `{validation, generation, spec}`."""
    return {
        "validation": name,
        "generation": generation,
        "spec": spec.model_dump(mode="json", by_alias=True),
    }


def config_hash(doc: Mapping[str, Any]) -> str:
    """First 16 hex digits of the SHA-256 of the canonical JSON of `doc`."""
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def restart_document(name: str, spec: NetworkValidationSpec) -> dict[str, Any]:
    """What a running agent cannot take from a reloaded config: its validation (its MQTT
    identity; `ConfigWatcher` refuses a new one) and the peer responder it starts once (it
    exists only with `peers.enabled` and binds `peers.port` on `peers.interface`'s address).
    Everything else in the spec applies live, so it stays out: a threshold edit must not
    restart 10,000 agents."""
    peers = spec.checks.peers
    return {
        "validation": name,
        "peers": {"enabled": peers.enabled, "port": peers.port, "interface": peers.interface},
    }


def restart_hash(name: str, spec: NetworkValidationSpec) -> str:
    """`config_hash` of `restart_document`: the pod template annotation that rolls agents."""
    return config_hash(restart_document(name, spec))


def _agent_object(
    api_version: str,
    kind: str,
    validation: str,
    namespace: str,
    owner: Mapping[str, Any],
    annotations: dict[str, str],
) -> dict[str, Any]:
    """apiVersion, kind and metadata of one of the agent objects of `validation`."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": agent_object_name(validation),
            "namespace": namespace,
            "labels": agent_labels(validation),
            "ownerReferences": [owner_reference(owner)],
            "annotations": annotations,
        },
    }


def render_configmap(
    name: str,
    generation: int,
    spec: NetworkValidationSpec,
    *,
    namespace: str,
    owner: Mapping[str, Any],
) -> dict[str, Any]:
    """The agent ConfigMap of validation `name` (annotated with the config hash too)."""
    doc = agent_config_document(name, generation, spec)
    annotations = {AnnotationKey.CONFIG_HASH.value: config_hash(doc)}
    return {
        **_agent_object("v1", "ConfigMap", name, namespace, owner, annotations),
        "data": {
            AGENT_CONFIG_KEY: yaml.safe_dump(
                doc, sort_keys=True, default_flow_style=False, allow_unicode=True
            )
        },
    }


# --- the DaemonSet ------------------------------------------------------------------------


def _env(
    name: str,
    spec: NetworkValidationSpec,
    mqtt: AgentMqttWiring,
    metrics_port: int,
    pod: AgentPodOptions,
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        # First: later values may refer to it as $(NETVAL_NODE_NAME).
        {"name": ENV_NODE, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": ENV_POD_NAMESPACE,
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": ENV_CONFIG, "value": AGENT_CONFIG_PATH},
        {"name": ENV_URL, "value": mqtt.url},
    ]
    if mqtt.username:
        env.append({"name": ENV_USERNAME, "value": mqtt.username})
    if mqtt.password_secret:
        env.append({"name": ENV_PASSWORD_FILE, "value": f"{MQTT_SECRET_DIR}/{MQTT_PASSWORD_FILE}"})
    if mqtt.ca_secret:
        env.append({"name": ENV_CA_FILE, "value": f"{MQTT_SECRET_DIR}/{MQTT_CA_FILE}"})
    if mqtt.enroll_url:
        env += [
            {"name": ENV_ENROLL_URL, "value": mqtt.enroll_url},
            {"name": ENV_ENROLL_TOKEN_FILE, "value": f"{ENROLL_DIR}/token"},
        ]
        if mqtt.enroll_ca_configmap:
            env.append({"name": ENV_ENROLL_CA_FILE, "value": f"{ENROLL_DIR}/ca.crt"})
    env += [
        # The node's address, not every interface of the host network (docs/operations.md
        # "Scraping the agents"); brackets make IPv6 host IPs unambiguous.
        {"name": ENV_HOST_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": ENV_METRICS_ADDR, "value": f"[$({ENV_HOST_IP})]:{metrics_port}"},
        {"name": "OTEL_SERVICE_NAME", "value": AGENT_SERVICE_NAME},
        {
            "name": "OTEL_RESOURCE_ATTRIBUTES",
            "value": f"k8s.node.name=$({ENV_NODE}),netval.validation={name}",
        },
    ]
    if spec.telemetry.otlp_endpoint:
        env.append({"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": spec.telemetry.otlp_endpoint})
    if pod.traces_sampler:
        env.append({"name": "OTEL_TRACES_SAMPLER", "value": pod.traces_sampler})
    if pod.traces_sampler_arg:
        env.append({"name": "OTEL_TRACES_SAMPLER_ARG", "value": pod.traces_sampler_arg})
    if pod.otel_headers_secret:
        secret = {"name": pod.otel_headers_secret, "key": pod.otel_headers_key}
        env.append({"name": "OTEL_EXPORTER_OTLP_HEADERS", "valueFrom": {"secretKeyRef": secret}})
    return env


def _volumes(validation: str, mqtt: AgentMqttWiring) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {
            "name": VOLUME_CONFIG,
            "configMap": {"name": agent_object_name(validation), "defaultMode": 0o444},
        },
        {"name": VOLUME_SYS, "hostPath": {"path": "/sys", "type": "Directory"}},
        {"name": VOLUME_TMP, "emptyDir": {"medium": "Memory", "sizeLimit": TMP_SIZE_LIMIT}},
    ]
    sources = [
        {"secret": {"name": secret, "items": [{"key": key, "path": path}]}}
        for secret, key, path in mqtt.secret_files()
    ]
    if sources:
        # 0440 with fsGroup: readable by the agent's group only.
        volumes.append(
            {"name": VOLUME_MQTT, "projected": {"sources": sources, "defaultMode": 0o440}}
        )
    if mqtt.enroll_url:
        enroll: list[dict[str, Any]] = [
            {"serviceAccountToken": {"audience": ENROLL_AUDIENCE, "path": "token",
                                     "expirationSeconds": ENROLL_TOKEN_SECONDS}},
        ]  # fmt: skip
        if mqtt.enroll_ca_configmap:
            enroll.append({"configMap": {"name": mqtt.enroll_ca_configmap,
                                         "items": [{"key": "ca.crt", "path": "ca.crt"}]}})  # fmt: skip
        volumes.append(
            {"name": VOLUME_ENROLL, "projected": {"sources": enroll, "defaultMode": 0o440}}
        )
    return volumes


def _mounts(mqtt: AgentMqttWiring) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": VOLUME_CONFIG, "mountPath": AGENT_CONFIG_DIR, "readOnly": True},
        # The host's /sys over the container's own, at the same path: the collector reads the
        # fixed paths /sys/class/net, /sys/class/infiniband and the rdma_cm configfs under
        # /sys/kernel/config. The container runtime's fresh sysfs mount already shows the
        # host's netdevs (with hostNetwork the pod is in the host netns, and sysfs shows the
        # netns of its mounter), but it has no submounts, so configfs (rdma_cm
        # default_roce_tos) would be missing; the hostPath bind is recursive and brings it.
        # The netns of this sysfs, of the ethtool ioctls and of DCB netlink is then one and
        # the same host netns, so every source describes the same netdevs; without
        # hostNetwork they would not (this mount would show the host, netlink the pod).
        # Read-only. Not `recursiveReadOnly`: Kubernetes 1.29, the oldest version netval
        # supports, has no such field (strict validation refuses the DaemonSet; 1.30 drops it
        # behind a feature gate). Submounts such as cgroupfs and configfs stay writable in
        # principle, but the agent runs non-root with every capability dropped and no
        # privilege escalation, so it cannot write them.
        {"name": VOLUME_SYS, "mountPath": "/sys", "readOnly": True},
        {"name": VOLUME_TMP, "mountPath": "/tmp"},
    ]
    if mqtt.secret_files():
        mounts.append({"name": VOLUME_MQTT, "mountPath": MQTT_SECRET_DIR, "readOnly": True})
    if mqtt.enroll_url:
        mounts.append({"name": VOLUME_ENROLL, "mountPath": ENROLL_DIR, "readOnly": True})
    return mounts


def _ports(spec: NetworkValidationSpec, metrics_port: int) -> list[dict[str, Any]]:
    # On the host network a container port is a host port (stated, as the API server would
    # default it): the scheduler then refuses a second pod that needs the same port on a node
    # instead of letting it crash on bind.
    ports = [
        {
            "name": METRICS_PORT_NAME,
            "containerPort": metrics_port,
            "hostPort": metrics_port,
            "protocol": "TCP",
        }
    ]
    peers = spec.checks.peers
    if peers.enabled:
        ports.append(
            {
                "name": PEER_PORT_NAME,
                "containerPort": peers.port,
                "hostPort": peers.port,
                "protocol": "TCP",
            }
        )
    return ports


def _tolerations(
    spec: NetworkValidationSpec, extra: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    # A JSON-mode copy: the rendered object shares nothing with the (frozen) spec.
    tolerations: list[dict[str, Any]] = spec.model_dump(mode="json", include={"tolerations"})[
        "tolerations"
    ]
    # netval's own taint (docs/gating.md, "Node taints and labels"). The agents must tolerate
    # it: a tainted node recovers only through its agent's passing reports, and a rolled
    # agent pod would otherwise not be scheduled back onto the very node it has to clear.
    own = {"key": TaintKey.FABRIC_UNHEALTHY.value, "operator": "Exists", "effect": TAINT_EFFECT}
    merged = [*tolerations, *(dict(t) for t in extra), own]
    return [t for i, t in enumerate(merged) if t not in merged[:i]]


def default_agent_resources() -> dict[str, Any]:
    return {
        "requests": {"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST},
        "limits": {"memory": MEMORY_LIMIT},
    }


METRICS_PORT_SPAN: Final = 500


def metrics_port_for(validation: str) -> int:
    """The agent metrics port of a validation: on the host network, two validations that
    select the same node need different ports. Derived from the name (stable across
    restarts and replicas); the pod template advertises it in `prometheus.io/port`."""
    return METRICS_PORT + zlib.crc32(validation.encode()) % METRICS_PORT_SPAN


def render_daemonset(
    name: str,
    generation: int,
    spec: NetworkValidationSpec,
    *,
    namespace: str,
    owner: Mapping[str, Any],
    image: str,
    mqtt: AgentMqttWiring,
    restart_hash: str,
    metrics_port: int = METRICS_PORT,
    resources: Mapping[str, Any] | None = None,
    extra_tolerations: Sequence[Mapping[str, Any]] = (),
    pod: AgentPodOptions = AgentPodOptions(),
) -> dict[str, Any]:
    """The agent DaemonSet of validation `name`.

    `restart_hash` is `restart_hash(name, spec)`; it goes on the pod template so that a
    change the agents cannot reload rolls them (and nothing else does). `metrics_port` is a
    host port (hostNetwork): two validations whose agents share a node need different ones.
    `generation` is annotated on the DaemonSet, not on its pods (a new generation alone must
    not roll them: the agents read it from the reloaded ConfigMap).
    """
    pod_spec: dict[str, Any] = {
        "serviceAccountName": AGENT_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,  # the agent never talks to the API
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",  # still resolve the in-cluster broker
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": AGENT_UID,
            "runAsGroup": AGENT_UID,
            "fsGroup": AGENT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "tolerations": _tolerations(spec, extra_tolerations),
        "containers": [
            {
                "name": AGENT_CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": list(AGENT_COMMAND),
                "env": _env(name, spec, mqtt, metrics_port, pod),
                "ports": _ports(spec, metrics_port),
                "volumeMounts": _mounts(mqtt),
                "resources": json.loads(json.dumps(resources))
                if resources is not None
                else default_agent_resources(),
                "livenessProbe": {
                    "httpGet": {"path": HEALTH_PATH, "port": METRICS_PORT_NAME},
                    "periodSeconds": 10,
                    "timeoutSeconds": 2,
                    "failureThreshold": 3,
                },
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": AGENT_UID,
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }
        ],
        "volumes": _volumes(name, mqtt),
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in pod.image_pull_secrets]
    if pod.priority_class_name:
        pod_spec["priorityClassName"] = pod.priority_class_name
    annotations = {AnnotationKey.GENERATION.value: str(generation)}
    return {
        **_agent_object("apps/v1", "DaemonSet", name, namespace, owner, annotations),
        "spec": {
            "selector": {"matchLabels": selector_labels(name)},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": MAX_UNAVAILABLE},
            },
            "template": {
                "metadata": {
                    "labels": agent_labels(name),
                    "annotations": {
                        AnnotationKey.RESTART_HASH.value: restart_hash,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(metrics_port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }
