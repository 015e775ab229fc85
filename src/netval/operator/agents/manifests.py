"""Render the agent objects of one NetworkValidation: its ConfigMap and its DaemonSet.

This module renders the DaemonSet and is the one place the rest of netval imports from;
the parts live by object: `agent_names` (names, labels, owner), `agent_configmap` (the
ConfigMap, the config and restart hashes), `agent_pod` (env, volumes, mounts, ports,
tolerations, and the settings they come from).

Pure functions: no I/O, no clock, no environment. `agents.rollout` applies what these return.

- The ConfigMap holds the agent config file (`{validation, generation, spec}`, see
  docs/architecture.md "Processes and environment") under `AGENT_CONFIG_KEY`, as YAML
  written by PyYAML, which the agent reads back with `yaml.safe_load` exactly (JSON text
  read as YAML is not always: `1e-05` would come back as a string).
- The DaemonSet runs `netval agent` on every node the spec selects, on the host network, as a
  non-root user with no capabilities (NET_RAW through the image's capability interpreter with
  `spec.topology.lldp`) and a read-only root filesystem; the agent never talks to
  the Kubernetes API, so its ServiceAccount has no token and no bindings.
- The pod template carries `netval.io/restart-hash`, the hash of what the agent reads only
  at start (`restart_document`), so a spec edit rolls the agents only when what the pod runs
  changes (that, or the image, env, mounts, ports, selector in the template itself); check
  thresholds, gating, the interval reach the running agents through the ConfigMap, which
  they reload live (`netval.agent.config_watch`). Status writes and node label changes
  never roll them (docs/architecture.md "MQTT": the domain travels in the assignment topic).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from netval.model.keys import AnnotationKey
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents.agent_configmap import (
    AGENT_CONFIG_KEY,
    agent_config_document,
    config_hash,
    render_configmap,
    restart_hash,
)
from netval.operator.agents.agent_names import (
    AGENT_APP_NAME,
    agent_labels,
    agent_object,
    agent_object_name,
    selector_labels,
    validation_label_value,
)
from netval.operator.agents.agent_pod import (
    AGENT_CONTAINER,
    AGENT_SERVICE_ACCOUNT,
    AGENT_UID,
    DEFAULT_PASSWORD_KEY,
    ENGINE_PATH,
    ENROLL_DIR,
    ENV_CONFIG,
    ENV_ENGINE_PATH,
    ENV_HOST_IP,
    ENV_METRICS_ADDR,
    ENV_NODE,
    HEALTH_PATH,
    MAX_UNAVAILABLE,
    METRICS_PORT,
    METRICS_PORT_NAME,
    NO_POD_OPTIONS,
    VOLUME_ENROLL,
    AgentMqttWiring,
    AgentPodOptions,
    agent_command,
    container_mounts,
    container_ports,
    container_security,
    default_agent_resources,
    metrics_port_for,
    pod_env,
    pod_tolerations,
    pod_volumes,
)

__all__ = [  # what the rest of netval and the tests import from here
    "AGENT_APP_NAME",
    "AGENT_CONFIG_KEY",
    "AGENT_SERVICE_ACCOUNT",
    "AGENT_UID",
    "DEFAULT_PASSWORD_KEY",
    "ENROLL_DIR",
    "ENV_CONFIG",
    "ENV_HOST_IP",
    "ENV_METRICS_ADDR",
    "ENV_NODE",
    "METRICS_PORT",
    "METRICS_PORT_NAME",
    "VOLUME_ENROLL",
    "AgentMqttWiring",
    "AgentPodOptions",
    "agent_config_document",
    "agent_object_name",
    "config_hash",
    "metrics_port_for",
    "render_configmap",
    "render_daemonset",
    "restart_hash",
    "selector_labels",
    "validation_label_value",
]


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
    pod: AgentPodOptions = NO_POD_OPTIONS,
    rdma: bool = False,
) -> dict[str, Any]:
    """The agent DaemonSet of validation `name`.

    `rdma`: the validation has an RDMA load test (`netval.operator.loadtest.privileges`):
    its pods get the RDMA devices (a device plugin resource, else /dev/infiniband from the
    host), IPC_LOCK in the bounding set for perftest's file capability, and the engine path
    that finds those binaries first (`agent_pod`, docs/loadtest.md "Privileges").

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
        "tolerations": pod_tolerations(spec, extra_tolerations),
        "containers": [
            {
                "name": AGENT_CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": agent_command(spec),
                "env": [
                    *pod_env(name, spec, mqtt, metrics_port, pod),
                    *([{"name": ENV_ENGINE_PATH, "value": ENGINE_PATH}] if rdma else []),
                ],
                "ports": container_ports(spec, metrics_port),
                "volumeMounts": container_mounts(mqtt, rdma=rdma, rdma_resource=pod.rdma_resource),
                "resources": _resources(resources, pod.rdma_resource if rdma else None),
                "livenessProbe": {
                    "httpGet": {"path": HEALTH_PATH, "port": METRICS_PORT_NAME},
                    "periodSeconds": 10,
                    "timeoutSeconds": 2,
                    "failureThreshold": 3,
                },
                "securityContext": container_security(spec, rdma=rdma),
            }
        ],
        "volumes": pod_volumes(name, mqtt, rdma=rdma, rdma_resource=pod.rdma_resource),
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in pod.image_pull_secrets]
    if pod.priority_class_name:
        pod_spec["priorityClassName"] = pod.priority_class_name
    annotations = {AnnotationKey.GENERATION.value: str(generation)}
    return {
        **agent_object("apps/v1", "DaemonSet", name, namespace, owner, annotations),
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


def _resources(resources: Mapping[str, Any] | None, rdma_resource: str | None) -> dict[str, Any]:
    """The agent's resources (a JSON copy), with one unit of the RDMA device plugin's
    resource when it brings the devices."""
    out: dict[str, Any] = (
        json.loads(json.dumps(resources)) if resources is not None else default_agent_resources()
    )
    if rdma_resource:
        for kind in ("requests", "limits"):
            out.setdefault(kind, {})[rdma_resource] = "1"
    return out
