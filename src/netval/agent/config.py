"""The agent's configuration: the file the operator renders into a ConfigMap, plus env.

`NETVAL_CONFIG` names a YAML or JSON file `{validation, generation, spec}` where spec is the
NetworkValidation spec. It is a trust boundary: validated with pydantic, errors name the
field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from netval.infra.metrics_server import parse_host_port
from netval.infra.mqtt_settings import MqttSettings, mqtt_env_for_node, mqtt_settings_from_env
from netval.infra.telemetry import TelemetryConfigError, sampler_from_env
from netval.infra.yaml_input import InputFileError, load_yaml_document
from netval.model.manifest import describe_validation_error
from netval.model.spec import NetworkValidationSpec

ENV_CONFIG: Final = "NETVAL_CONFIG"
ENV_NODE: Final = "NETVAL_NODE_NAME"
ENV_METRICS_ADDR: Final = "NETVAL_METRICS_ADDR"
# The node's own address (downward API status.hostIP): /metrics and /healthz bind to it by
# default, not to every interface of the host network (storage and GPU fabrics included).
ENV_HOST_IP: Final = "NETVAL_HOST_IP"
DEFAULT_METRICS_PORT: Final = 9477
MAX_CONFIG_BYTES: Final = 1 << 20


class AgentConfigError(ValueError):
    pass


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    validation: Annotated[
        str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    ]
    generation: Annotated[int, Field(ge=0)]
    spec: NetworkValidationSpec


def load_agent_config(path: Path) -> AgentConfig:
    try:
        doc = load_yaml_document(path, max_bytes=MAX_CONFIG_BYTES)
    except InputFileError as exc:
        raise AgentConfigError(str(exc)) from None
    try:
        return AgentConfig.model_validate(doc)
    except ValidationError as exc:
        raise AgentConfigError(f"{path}: {describe_validation_error(exc, '')}") from None


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything `netval agent` reads from its environment, built once at start."""

    node: str
    config_path: Path
    config: AgentConfig
    mqtt: MqttSettings
    metrics_addr: tuple[str, int] | None


def default_metrics_addr(env: Mapping[str, str]) -> str:
    """NETVAL_METRICS_ADDR, else the node's address (NETVAL_HOST_IP), else loopback only."""
    explicit = env.get(ENV_METRICS_ADDR, "").strip()
    if explicit:
        return explicit
    host = env.get(ENV_HOST_IP, "").strip() or "127.0.0.1"
    return f"[{host}]:{DEFAULT_METRICS_PORT}"


def agent_settings_from_env(env: Mapping[str, str] = os.environ) -> AgentSettings:
    node = env.get(ENV_NODE, "").strip()
    if not node:
        raise AgentConfigError(f"{ENV_NODE} is not set (the DaemonSet sets it from spec.nodeName)")
    config_path = env.get(ENV_CONFIG, "").strip()
    if not config_path:
        raise AgentConfigError(f"{ENV_CONFIG} is not set (path of the agent config file)")
    config = load_agent_config(Path(config_path))
    try:
        # sharded brokers: the node's own shard (netval.model.shards)
        mqtt = mqtt_settings_from_env(
            mqtt_env_for_node(env, node), client_id=f"netval-agent-{config.validation}-{node}"
        )
    except ValueError as exc:
        raise AgentConfigError(str(exc)) from None
    try:
        sampler_from_env(env)  # refused here, before anything starts
    except TelemetryConfigError as exc:
        raise AgentConfigError(str(exc)) from None
    try:
        metrics = parse_host_port(default_metrics_addr(env), variable=ENV_METRICS_ADDR)
    except ValueError as exc:
        raise AgentConfigError(str(exc)) from None
    return AgentSettings(node, Path(config_path), config, mqtt, metrics)
