"""The parts of the agent pod: its environment, volumes, mounts, ports, tolerations, and the
settings they come from (`AgentMqttWiring`, `AgentPodOptions`). Pure functions.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from netval.infra.mqtt_settings import (
    ENV_CA_FILE,
    ENV_PASSWORD_FILE,
    ENV_SHARDS,
    ENV_URL,
    ENV_URL_PATTERN,
    ENV_USERNAME,
    parse_mqtt_url,
)
from netval.model.keys import TAINT_EFFECT, TaintKey
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents.agent_configmap import AGENT_CONFIG_DIR, AGENT_CONFIG_PATH
from netval.operator.agents.agent_names import agent_object_name

AGENT_CONTAINER: Final = "agent"
AGENT_COMMAND: Final = ("netval", "agent")
# With spec.topology.lldp: the image's copy of the interpreter that holds the file capability
# cap_net_raw+ep (Dockerfile; docs/topology.md "Privileges").
NET_RAW_INTERPRETER: Final = "/opt/netval/bin/python-netraw"
AGENT_NET_RAW_COMMAND: Final = (NET_RAW_INTERPRETER, "-m", "netval", "agent")
AGENT_SERVICE_ACCOUNT: Final = "netval-agent"  # exists once per namespace; no RBAC bindings
AGENT_SERVICE_NAME: Final = "netval-agent"  # OTEL_SERVICE_NAME
AGENT_UID: Final = 65532  # the conventional "nonroot" uid/gid of distroless-style images

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

# RDMA load tests (docs/loadtest.md, "Privileges"): perftest opens the RDMA devices and
# registers (pins) memory. Its binaries in the image under RDMA_ENGINE_DIR hold the file
# capability cap_ipc_lock+ep (pinning beyond RLIMIT_MEMLOCK); the agent looks there first
# when ENV_ENGINE_PATH says so, which only the pods of validations with RDMA load tests do.
RDMA_ENGINE_DIR: Final = "/opt/netval/rdma-bin"
ENV_ENGINE_PATH: Final = "NETVAL_ENGINE_PATH"
ENGINE_PATH: Final = f"{RDMA_ENGINE_DIR}:/usr/local/bin:/usr/bin:/bin"
INFINIBAND_DEV: Final = "/dev/infiniband"

# Volume names.
VOLUME_CONFIG: Final = "config"
VOLUME_SYS: Final = "sys"
VOLUME_MQTT: Final = "mqtt"
VOLUME_TMP: Final = "tmp"
VOLUME_ENROLL: Final = "enroll"
VOLUME_INFINIBAND: Final = "infiniband"

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
    # sharded brokers (mqtt.shards > 1): the agent connects to its node's shard of these
    shards: int = 1
    url_pattern: str | None = None  # {shard}: the shard's index

    def __post_init__(self) -> None:
        _host, _port, tls = parse_mqtt_url(self.url)
        if self.password_secret and not self.username:
            raise ValueError("an MQTT password secret needs a username (NETVAL_MQTT_USERNAME)")
        if self.ca_secret and not tls:
            raise ValueError(f"an MQTT CA secret needs an mqtts:// url, got {self.url!r}")
        if self.shards > 1 and not self.url_pattern:
            raise ValueError(f"{self.shards} broker shards need a URL pattern")

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
    # RDMA load tests: the device plugin resource that gives the pod the RDMA devices
    # ("rdma/rdma_shared_device_a"); None: /dev/infiniband from the host (hostPath)
    rdma_resource: str | None = None
    traces_sampler: str | None = None
    traces_sampler_arg: str | None = None
    otel_headers_secret: str | None = None
    otel_headers_key: str = OTEL_HEADERS_KEY


NO_POD_OPTIONS: Final = AgentPodOptions()  # nothing cluster-specific


def pod_env(
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
    if mqtt.shards > 1 and mqtt.url_pattern:  # the agent picks its node's shard
        env += [
            {"name": ENV_SHARDS, "value": str(mqtt.shards)},
            {"name": ENV_URL_PATTERN, "value": mqtt.url_pattern},
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


def pod_volumes(
    validation: str, mqtt: AgentMqttWiring, *, rdma: bool = False, rdma_resource: str | None = None
) -> list[dict[str, Any]]:
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
    if rdma and rdma_resource is None:  # a device plugin brings the devices itself
        volumes.append(
            {"name": VOLUME_INFINIBAND,
             "hostPath": {"path": INFINIBAND_DEV, "type": "Directory"}}
        )  # fmt: skip
    return volumes


def container_mounts(
    mqtt: AgentMqttWiring, *, rdma: bool = False, rdma_resource: str | None = None
) -> list[dict[str, Any]]:
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
    if rdma and rdma_resource is None:
        # not read-only: perftest opens the verbs devices for writing (commands go to them)
        mounts.append({"name": VOLUME_INFINIBAND, "mountPath": INFINIBAND_DEV})
    return mounts


def container_ports(spec: NetworkValidationSpec, metrics_port: int) -> list[dict[str, Any]]:
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


def pod_tolerations(
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


def container_security(spec: NetworkValidationSpec, *, rdma: bool = False) -> dict[str, Any]:
    """Non-root, read-only, every capability dropped; with `topology.lldp`, NET_RAW in the
    bounding set and privilege escalation allowed: the capability interpreter's file
    capability is ignored under no_new_privs (what allowPrivilegeEscalation: false sets),
    and the bounding set caps what it can gain at NET_RAW. With an RDMA load test
    (`rdma`), IPC_LOCK likewise, for the perftest binaries that hold it as a file
    capability: memory registration pins buffers beyond RLIMIT_MEMLOCK."""
    lldp = spec.topology.lldp
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    added = [*(["NET_RAW"] if lldp else []), *(["IPC_LOCK"] if rdma else [])]
    if added:
        capabilities["add"] = added
    return {
        "runAsNonRoot": True,
        "runAsUser": AGENT_UID,
        "allowPrivilegeEscalation": lldp or rdma,
        "readOnlyRootFilesystem": True,
        "capabilities": capabilities,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def agent_command(spec: NetworkValidationSpec) -> list[str]:
    return list(AGENT_NET_RAW_COMMAND if spec.topology.lldp else AGENT_COMMAND)
