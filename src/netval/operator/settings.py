"""`netval operator` settings, built once from the environment."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from netval.infra.mqtt_settings import (
    ENV_URL,
    ENV_URL_PATTERN,
    MqttSettings,
    mqtt_settings_from_env,
    parse_mqtt_url,
    read_password_file,
    shard_urls,
)
from netval.infra.telemetry import TelemetryConfigError, sampler_from_env
from netval.model.identity import OPERATOR_IDENTITY
from netval.model.loadplan import MAX_MBPS
from netval.model.shards import shard_url
from netval.operator.devices.drivers import DEFAULT_DRIVERS, DriverAttributes, parse_drivers
from netval.operator.identity.authority import (
    DEFAULT_LIFETIME,
    AuthorityError,
    IdentityAuthority,
    MintedIdentity,
)

ENV_NAMESPACE: Final = "NETVAL_NAMESPACE"
ENV_AGENT_IMAGE: Final = "NETVAL_AGENT_IMAGE"
ENV_AGENT_MQTT_URL: Final = "NETVAL_AGENT_MQTT_URL"
# sharded brokers: the agents' URL pattern ({shard}); default the operator's own
ENV_AGENT_MQTT_URL_PATTERN: Final = "NETVAL_AGENT_MQTT_URL_PATTERN"
ENV_AGENT_MQTT_USERNAME: Final = "NETVAL_AGENT_MQTT_USERNAME"
ENV_AGENT_MQTT_SECRET: Final = "NETVAL_AGENT_MQTT_SECRET"
ENV_AGENT_MQTT_CA_SECRET: Final = "NETVAL_AGENT_MQTT_CA_SECRET"
ENV_STATUS_WINDOW: Final = "NETVAL_STATUS_WINDOW_SECONDS"
ENV_NODE_WRITES_PER_SECOND: Final = "NETVAL_NODE_WRITES_PER_SECOND"  # operator.nodeWritesPerSecond
ENV_NODE_WRITE_BURST: Final = "NETVAL_NODE_WRITE_BURST"  # operator.nodeWriteBurst
ENV_AGENT_RESOURCES: Final = "NETVAL_AGENT_RESOURCES"
ENV_AGENT_TOLERATIONS: Final = "NETVAL_AGENT_TOLERATIONS"
ENV_KUEUE_ENABLED: Final = "NETVAL_KUEUE_ENABLED"
ENV_DEVICE_TAINTS: Final = "NETVAL_DEVICE_TAINTS"  # chart deviceTaints.enabled
ENV_DRA_DRIVERS: Final = "NETVAL_DRA_DRIVERS"  # chart deviceTaints.drivers
ENV_LOADTEST_MAX_RATE: Final = "NETVAL_LOADTEST_MAX_RATE_MBPS"  # chart: loadTests.maxRateMbps
ENV_AGENT_RDMA_RESOURCE: Final = "NETVAL_AGENT_RDMA_RESOURCE"  # chart: loadTests.rdmaResource
ENV_AGENT_NAMESPACE: Final = "NETVAL_AGENT_NAMESPACE"
ENV_AGENT_IMAGE_PULL_SECRETS: Final = "NETVAL_AGENT_IMAGE_PULL_SECRETS"
ENV_AGENT_PRIORITY_CLASS_NAME: Final = "NETVAL_AGENT_PRIORITY_CLASS_NAME"
ENV_AGENT_TRACES_SAMPLER: Final = "NETVAL_AGENT_OTEL_TRACES_SAMPLER"
ENV_AGENT_TRACES_SAMPLER_ARG: Final = "NETVAL_AGENT_OTEL_TRACES_SAMPLER_ARG"
ENV_AGENT_OTEL_HEADERS_SECRET: Final = "NETVAL_AGENT_OTEL_HEADERS_SECRET"
ENV_AGENT_ENROLL_URL: Final = "NETVAL_AGENT_ENROLL_URL"
ENV_AGENT_ENROLL_CA_CONFIGMAP: Final = "NETVAL_AGENT_ENROLL_CA_CONFIGMAP"
# The credential the broker ACL start check probes with when there is no per-node identity
# (an external broker): the agents' login, or a node's (operator/broker_check.py).
ENV_ACL_PROBE_USERNAME: Final = "NETVAL_ACL_PROBE_USERNAME"
ENV_ACL_PROBE_PASSWORD_FILE: Final = "NETVAL_ACL_PROBE_PASSWORD_FILE"
# While the broker ACL check finds a violation: hold gating (default) or proceed.
ENV_GATING_ON_ACL_VIOLATION: Final = "NETVAL_GATING_ON_ACL_VIOLATION"
# The identity CA (docs/architecture.md "Broker identity"): signs the agents' and the
# operator's own MQTT client certificates.
ENV_IDENTITY_CA_FILE: Final = "NETVAL_IDENTITY_CA_FILE"
ENV_IDENTITY_CA_KEY_FILE: Final = "NETVAL_IDENTITY_CA_KEY_FILE"
ENV_CREDENTIAL_LIFETIME: Final = "NETVAL_CREDENTIAL_LIFETIME_SECONDS"
MIN_LIFETIME: Final = 60.0

DEFAULT_NAMESPACE: Final = "netval-system"
DEFAULT_IMAGE: Final = "ghcr.io/netval/netval:0.1.0"
DEFAULT_AGENT_SECRET: Final = "netval-mqtt-agent"
DEFAULT_STATUS_WINDOW: Final = 2.0
# Node writes: a 1 %-of-100k burst (1,000 nodes) costs under a minute at 20/s, a small share
# of the API server's default max-mutating-requests-inflight (200) and priority seats.
DEFAULT_NODE_WRITES_PER_SECOND: Final = 20.0
DEFAULT_NODE_WRITE_BURST: Final = 40


class OperatorConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    namespace: str  # where agent DaemonSets and ConfigMaps live
    agent_image: str
    mqtt: MqttSettings  # the operator's own broker connection
    agent_mqtt_url: str  # what agents connect to (in-cluster Service name)
    agent_mqtt_username: str | None
    agent_mqtt_secret: str  # Secret with key `password` for the agents
    agent_mqtt_ca_secret: str | None  # Secret with key `ca.crt` when the broker uses TLS
    status_window: float  # seconds: one status patch per validation per window
    agent_resources: dict[str, Any] | None = None  # container resources (None: defaults)
    agent_tolerations: tuple[dict[str, Any], ...] = ()  # added to every agent DaemonSet
    kueue_enabled: bool = False  # answer Kueue AdmissionChecks (needs the Kueue RBAC)
    agents_namespace: str | None = None  # None: `namespace`, see `agent_namespace`
    agent_image_pull_secrets: tuple[str, ...] = ()  # Secret names in the agents' namespace
    agent_priority_class_name: str | None = None
    agent_traces_sampler: str | None = None  # the agents' OTEL_TRACES_SAMPLER
    agent_traces_sampler_arg: str | None = None  # ... and OTEL_TRACES_SAMPLER_ARG
    agent_otel_headers_secret: str | None = None  # Secret (key `headers`): OTLP headers

    @property
    def agent_namespace(self) -> str:
        """Where the agent DaemonSets and ConfigMaps live (the operator's own by default)."""
        return self.agents_namespace or self.namespace

    # Per-node MQTT identity (operator/identity): the enrollment URL the agents get and the
    # ConfigMap (key ca.crt, agents' namespace) that verifies it; None: shared credentials.
    agent_enroll_url: str | None = None
    agent_enroll_ca_configmap: str | None = None
    # The broker ACL start check's credential without per-node identity (None: no check).
    acl_probe: MqttSettings | None = None
    # gating held while that check finds a violation (False: proceed regardless)
    hold_gating_on_acl_violation: bool = True
    # The identity CA: agents' certificates at enrollment, the operator's own session's.
    identity_ca: IdentityAuthority | None = None
    # NetworkLoadTest: the cluster's per-flow ceiling, Mbit/s (0: none). A spec above it is
    # refused (InvalidSpec, spec.maxRateMbps); a spec without a cap of its own gets it.
    loadtest_max_rate_mbps: float = 0.0
    # RDMA load tests: the device plugin resource that gives agents the RDMA devices (None:
    # /dev/infiniband from the host; docs/loadtest.md "Privileges")
    agent_rdma_resource: str | None = None
    # Sharded brokers (mqtt.shards > 1): the operator's connection to each shard, by index
    # (empty: one broker, `mqtt`), and the agents' URL pattern ({shard}); `mqtt` is shard 0's.
    mqtt_shards: tuple[MqttSettings, ...] = ()
    agent_mqtt_url_pattern: str | None = None
    # Node writes (fabric label, taint, topology labels): a token bucket, per node the latest
    # wish queued, exclusions first (`gating.write_queue`).
    node_writes_per_second: float = DEFAULT_NODE_WRITES_PER_SECOND
    node_write_burst: int = DEFAULT_NODE_WRITE_BURST
    # DRA device taints (spec.gating.deviceTaints): allowed (the chart grants the RBAC with
    # it), and which attributes name a NIC in each DRA driver's devices (devices.drivers)
    device_taints: bool = False
    dra_drivers: tuple[DriverAttributes, ...] = DEFAULT_DRIVERS

    @property
    def shard_count(self) -> int:
        return max(1, len(self.mqtt_shards))


def operator_settings_from_env(env: Mapping[str, str] = os.environ) -> OperatorSettings:
    try:
        # Each replica needs its own client id (the broker disconnects a duplicate): in a pod
        # the hostname is the pod name, unique; the pid alone is 1 in every container.
        urls = shard_urls(env)
        if len(urls) > 1:  # shard 0 stands for "the broker" where one URL is wanted
            env = {**env, ENV_URL: urls[0]}
        mqtt = mqtt_settings_from_env(
            env, client_id=f"netval-operator-{socket.gethostname()}-{os.getpid()}"
        )
    except ValueError as exc:
        raise OperatorConfigError(str(exc)) from None
    authority = _identity_ca(env)
    if authority is not None and mqtt.cert_file is None:
        if not mqtt.tls:
            raise OperatorConfigError(
                f"{ENV_IDENTITY_CA_FILE}: client certificates need mqtts:// ({ENV_URL})"
            )
        # its own session's certificate, minted in memory (CN netval-operator)
        mqtt = dataclasses.replace(mqtt, identity=MintedIdentity(authority, OPERATOR_IDENTITY))
    shards, agent_pattern = _shards(env, urls, mqtt)
    window_text = env.get(ENV_STATUS_WINDOW, str(DEFAULT_STATUS_WINDOW))
    try:
        window = float(window_text)
    except ValueError:
        raise OperatorConfigError(f"{ENV_STATUS_WINDOW}: not a number: {window_text!r}") from None
    if not 0.05 <= window <= 60:
        raise OperatorConfigError(f"{ENV_STATUS_WINDOW}: must be between 0.05 and 60, got {window}")
    try:
        sampler_from_env(env)  # the operator's own sampler, refused before anything starts
    except TelemetryConfigError as exc:
        raise OperatorConfigError(str(exc)) from None
    agent_sampler = {
        "OTEL_TRACES_SAMPLER": env.get(ENV_AGENT_TRACES_SAMPLER, ""),
        "OTEL_TRACES_SAMPLER_ARG": env.get(ENV_AGENT_TRACES_SAMPLER_ARG, ""),
    }
    try:
        sampler_from_env(agent_sampler)  # an agent would refuse to start with it
    except TelemetryConfigError as exc:
        raise OperatorConfigError(f"{ENV_AGENT_TRACES_SAMPLER}(_ARG): {exc}") from None
    resources = _json_env(env, ENV_AGENT_RESOURCES, dict)
    tolerations = _json_env(env, ENV_AGENT_TOLERATIONS, list) or []
    if not all(isinstance(t, dict) for t in tolerations):
        raise OperatorConfigError(f"{ENV_AGENT_TOLERATIONS}: expected a JSON list of objects")
    kueue = _bool_env(env, ENV_KUEUE_ENABLED)
    try:
        drivers = parse_drivers(env.get(ENV_DRA_DRIVERS, ""), ENV_DRA_DRIVERS)
    except ValueError as exc:
        raise OperatorConfigError(str(exc)) from None
    pull_secrets = _pull_secret_names(_json_env(env, ENV_AGENT_IMAGE_PULL_SECRETS, list) or [])
    return OperatorSettings(
        namespace=env.get(ENV_NAMESPACE) or DEFAULT_NAMESPACE,
        agent_image=env.get(ENV_AGENT_IMAGE) or DEFAULT_IMAGE,
        mqtt=mqtt,
        agent_mqtt_url=env.get(ENV_AGENT_MQTT_URL) or mqtt.url,
        agent_mqtt_username=env.get(ENV_AGENT_MQTT_USERNAME) or mqtt.username,
        agent_mqtt_secret=env.get(ENV_AGENT_MQTT_SECRET) or DEFAULT_AGENT_SECRET,
        agent_mqtt_ca_secret=env.get(ENV_AGENT_MQTT_CA_SECRET) or None,
        status_window=window,
        agent_resources=resources or None,
        agent_tolerations=tuple(tolerations),
        kueue_enabled=kueue,
        agents_namespace=_name_env(env, ENV_AGENT_NAMESPACE, limit=63),  # a DNS label
        agent_image_pull_secrets=pull_secrets,
        agent_priority_class_name=_name_env(env, ENV_AGENT_PRIORITY_CLASS_NAME),
        agent_traces_sampler=env.get(ENV_AGENT_TRACES_SAMPLER, "").strip() or None,
        agent_traces_sampler_arg=env.get(ENV_AGENT_TRACES_SAMPLER_ARG, "").strip() or None,
        agent_otel_headers_secret=_name_env(env, ENV_AGENT_OTEL_HEADERS_SECRET),
        agent_enroll_url=_enroll_url(env),
        agent_enroll_ca_configmap=env.get(ENV_AGENT_ENROLL_CA_CONFIGMAP, "").strip() or None,
        acl_probe=_acl_probe(env, mqtt),
        hold_gating_on_acl_violation=_on_acl_violation(env),
        identity_ca=authority,
        loadtest_max_rate_mbps=_number_env(env, ENV_LOADTEST_MAX_RATE, 0, 0, MAX_MBPS),
        agent_rdma_resource=env.get(ENV_AGENT_RDMA_RESOURCE, "").strip() or None,
        mqtt_shards=shards,
        agent_mqtt_url_pattern=agent_pattern,
        node_writes_per_second=_number_env(
            env, ENV_NODE_WRITES_PER_SECOND, DEFAULT_NODE_WRITES_PER_SECOND, 0.1, 1000
        ),
        node_write_burst=_node_write_burst(env),
        device_taints=_bool_env(env, ENV_DEVICE_TAINTS),
        dra_drivers=drivers,
    )


def _bool_env(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "false").strip().lower()
    if text not in ("true", "false", ""):
        raise OperatorConfigError(f"{name}: expected true or false, got {text!r}")
    return text == "true"


def _shards(
    env: Mapping[str, str], urls: list[str], mqtt: MqttSettings
) -> tuple[tuple[MqttSettings, ...], str | None]:
    """One connection per shard (same credentials and CA), and the agents' URL pattern."""
    if len(urls) < 2:
        return (), None
    shards = []
    for url in urls:
        host, port, tls = parse_mqtt_url(url, variable=ENV_URL_PATTERN)
        try:
            shards.append(dataclasses.replace(mqtt, host=host, port=port, tls=tls))
        except ValueError as exc:  # e.g. a CA file with one mqtt:// shard
            raise OperatorConfigError(f"{ENV_URL_PATTERN}: {exc}") from None
    pattern = env.get(ENV_AGENT_MQTT_URL_PATTERN, "").strip() or env[ENV_URL_PATTERN].strip()
    try:
        for i in range(len(urls)):
            parse_mqtt_url(shard_url(pattern, i), variable=ENV_AGENT_MQTT_URL_PATTERN)
    except ValueError as exc:
        raise OperatorConfigError(f"{ENV_AGENT_MQTT_URL_PATTERN}: {exc}") from None
    return tuple(shards), pattern


def _number_env(
    env: Mapping[str, str], name: str, default: float, low: float, high: float
) -> float:
    """A float setting within [low, high]; unset or empty: `default`."""
    text = env.get(name, "").strip() or str(default)
    try:
        value = float(text)
    except ValueError:
        raise OperatorConfigError(f"{name}: not a number: {text!r}") from None
    if not low <= value <= high:
        raise OperatorConfigError(f"{name}: must be {low:g}..{high:g}, got {text}")
    return value


def _node_write_burst(env: Mapping[str, str]) -> int:
    text = env.get(ENV_NODE_WRITE_BURST, "").strip() or str(DEFAULT_NODE_WRITE_BURST)
    if not text.isdigit() or not 1 <= int(text) <= 10000:
        raise OperatorConfigError(
            f"{ENV_NODE_WRITE_BURST}: must be an integer 1..10000, got {text!r}"
        )
    return int(text)


# A DNS subdomain (RFC 1123): what names of namespaces, Secrets and PriorityClasses must be.
_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def _name_env(env: Mapping[str, str], name: str, *, limit: int = 253) -> str | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if len(value) > limit or not _DNS_SUBDOMAIN.match(value) or (limit == 63 and "." in value):
        raise OperatorConfigError(f"{name}: not a valid Kubernetes name: {value!r}")
    return value


def _pull_secret_names(items: list[Any]) -> tuple[str, ...]:
    """Helm's `[{name: SECRET}]` (as in a pod spec), or plain names."""
    names = []
    for item in items:
        value = item.get("name") if isinstance(item, dict) else item
        if not isinstance(value, str) or not _DNS_SUBDOMAIN.match(value) or len(value) > 253:
            raise OperatorConfigError(
                f"{ENV_AGENT_IMAGE_PULL_SECRETS}: expected a JSON list of {{name: SECRET}},"
                f" got {item!r}"
            )
        names.append(value)
    return tuple(dict.fromkeys(names))


def _json_env(env: Mapping[str, str], name: str, kind: type) -> Any:
    text = env.get(name, "").strip()
    if not text or text == "null":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OperatorConfigError(f"{name}: not valid JSON: {exc.msg}") from None
    if not isinstance(value, kind):
        raise OperatorConfigError(f"{name}: expected a JSON {kind.__name__}")
    return value


def _enroll_url(env: Mapping[str, str]) -> str | None:
    url = env.get(ENV_AGENT_ENROLL_URL, "").strip()
    if url and not url.startswith("https://"):
        raise OperatorConfigError(f"{ENV_AGENT_ENROLL_URL}={url!r}: must be an https:// URL")
    return url or None


def _acl_probe(env: Mapping[str, str], mqtt: MqttSettings) -> MqttSettings | None:
    """The operator's broker connection with the probe's login (and its own client id)."""
    username = env.get(ENV_ACL_PROBE_USERNAME, "").strip()
    path = env.get(ENV_ACL_PROBE_PASSWORD_FILE, "").strip()
    if not username and not path:
        return None
    if not username:
        raise OperatorConfigError(f"{ENV_ACL_PROBE_PASSWORD_FILE} needs {ENV_ACL_PROBE_USERNAME}")
    try:
        password = read_password_file(path, ENV_ACL_PROBE_PASSWORD_FILE) if path else None
    except ValueError as exc:
        raise OperatorConfigError(str(exc)) from None
    # a login, not the operator's own certificate
    return dataclasses.replace(mqtt, username=username, password=password, identity=None)


def _on_acl_violation(env: Mapping[str, str]) -> bool:
    text = env.get(ENV_GATING_ON_ACL_VIOLATION, "").strip().lower() or "hold"
    if text not in ("hold", "proceed"):
        raise OperatorConfigError(
            f"{ENV_GATING_ON_ACL_VIOLATION}: expected hold or proceed, got {text!r}"
        )
    return text == "hold"


def _identity_ca(env: Mapping[str, str]) -> IdentityAuthority | None:
    cert = env.get(ENV_IDENTITY_CA_FILE, "").strip()
    key = env.get(ENV_IDENTITY_CA_KEY_FILE, "").strip()
    if not cert and not key:
        return None
    if not cert or not key:
        raise OperatorConfigError(
            f"{ENV_IDENTITY_CA_FILE} and {ENV_IDENTITY_CA_KEY_FILE} go together"
        )
    text = env.get(ENV_CREDENTIAL_LIFETIME, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_LIFETIME.total_seconds()
    except ValueError:
        raise OperatorConfigError(f"{ENV_CREDENTIAL_LIFETIME}: not a number: {text!r}") from None
    if not MIN_LIFETIME <= seconds <= 366 * 86400:
        raise OperatorConfigError(
            f"{ENV_CREDENTIAL_LIFETIME}: {MIN_LIFETIME:g} to {366 * 86400} seconds, got {seconds:g}"
        )
    try:
        return IdentityAuthority.from_files(
            Path(cert), Path(key), lifetime=timedelta(seconds=seconds)
        )
    except AuthorityError as exc:
        raise OperatorConfigError(f"{ENV_IDENTITY_CA_FILE}={cert!r}: {exc}") from None
