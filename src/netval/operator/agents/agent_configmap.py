"""The agent ConfigMap of one NetworkValidation, and the hashes that decide what rolls agents.

Pure functions. The ConfigMap holds the agent config file (`{validation, generation, spec}`)
under `AGENT_CONFIG_KEY`, as YAML written by PyYAML, which the agent reads back with
`yaml.safe_load` exactly. `restart_hash` covers only what a running agent cannot reload.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

import yaml

from netval.model.keys import AnnotationKey
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents.agent_names import agent_object

# The agent config file, mounted from the ConfigMap.
AGENT_CONFIG_KEY: Final = "agent.yaml"
AGENT_CONFIG_DIR: Final = "/etc/netval/config"
AGENT_CONFIG_PATH: Final = f"{AGENT_CONFIG_DIR}/{AGENT_CONFIG_KEY}"


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
    exists only with `peers.enabled` and binds `peers.port` on `peers.interface`'s address,
    else the first of `peers.interfaces`).
    Everything else in the spec applies live, so it stays out: a threshold edit must not
    restart 10,000 agents."""
    peers = spec.checks.peers
    return {
        "validation": name,
        # the responder's interface: peers.interface, else the first of peers.interfaces
        "peers": {
            "enabled": peers.enabled,
            "port": peers.port,
            "interface": peers.primary_interface,
        },
    }


def restart_hash(name: str, spec: NetworkValidationSpec) -> str:
    """`config_hash` of `restart_document`: the pod template annotation that rolls agents."""
    return config_hash(restart_document(name, spec))


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
        **agent_object("v1", "ConfigMap", name, namespace, owner, annotations),
        "data": {
            AGENT_CONFIG_KEY: yaml.safe_dump(
                doc, sort_keys=True, default_flow_style=False, allow_unicode=True
            )
        },
    }
