"""The agent objects the operator renders, from the environment the chart gives it.

For every chart variant (rendered with the real Helm library, tests/chart_kit.py): the
operator's settings are built from the operator container's env exactly as `netval operator`
builds them, the agent ConfigMap and DaemonSet are rendered from those settings, and both
validate against the Kubernetes OpenAPI schemas of the oldest (1.29) and newest supported
versions. The chart's agent values (namespace, pull secrets, priority, trace sampler, OTLP
headers Secret) reach the DaemonSet.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from chart_kit import (
    AGENT_NAMESPACE,
    KUBE_VERSIONS,
    NAMESPACE,
    VARIANTS,
    operator_container,
    schema_errors,
)
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents.rollout import render_agents
from netval.operator.settings import (
    OperatorConfigError,
    OperatorSettings,
    operator_settings_from_env,
)
from tls_certs import key_pem, make_ca

OWNER: dict[str, Any] = {
    "apiVersion": "netval.io/v1alpha1",
    "kind": "NetworkValidation",
    "metadata": {"name": "pool-a", "uid": "0f6c7d5e-1111-2222-3333-444455556666"},
}
SPEC = NetworkValidationSpec.model_validate(
    {
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "checks": {"peers": {"enabled": True}},
        "telemetry": {"otlpEndpoint": "http://otel-collector.observability:4318"},
    }
)


def _files(tmp: Path) -> dict[str, str]:
    """The files the chart mounts: the broker password and (TLS by default) the broker's CA."""
    password = tmp / "password"
    password.write_text("pw\n")
    return {
        "NETVAL_MQTT_PASSWORD_FILE": str(password),
        "NETVAL_MQTT_CA_FILE": str(make_ca(tmp).cert_file),
    }


@cache
def _operator_env(variant: str) -> dict[str, str]:
    """The operator container's literal env values (secretKeyRef ones left out)."""
    env = operator_container(variant)["env"]
    return {e["name"]: e["value"] for e in env if "value" in e}


def _operator_env_files(variant: str, tmp: Path) -> dict[str, str]:
    """The operator's environment as the chart renders it, its mounted files made real."""
    env = {**_operator_env(variant), **_files(tmp)}
    if not env["NETVAL_MQTT_URL"].startswith("mqtts://"):
        env.pop("NETVAL_MQTT_CA_FILE")  # a plaintext variant mounts no CA
    if "NETVAL_MQTT_USERNAME" not in env:  # per-node identity: the operator mints its own
        env.pop("NETVAL_MQTT_PASSWORD_FILE")
    if "NETVAL_IDENTITY_CA_FILE" in env:  # the identity CA Secret, stood in for
        ca = make_ca(tmp, "identity-ca")
        key = tmp / "identity-ca.key"
        key.write_bytes(key_pem(ca.key))
        env["NETVAL_IDENTITY_CA_FILE"], env["NETVAL_IDENTITY_CA_KEY_FILE"] = (
            str(ca.cert_file),
            str(key),
        )
    if "NETVAL_ACL_PROBE_PASSWORD_FILE" in env:  # an external broker: the probe's password
        env["NETVAL_ACL_PROBE_PASSWORD_FILE"] = env["NETVAL_MQTT_PASSWORD_FILE"]
    return env


def settings_of(variant: str, tmp: Path) -> OperatorSettings:
    return operator_settings_from_env(_operator_env_files(variant, tmp))


def daemonset_of(variant: str, tmp: Path) -> dict[str, Any]:
    _cm, ds = render_agents(settings_of(variant, tmp), OWNER, 3, SPEC)
    return ds


def _pod(ds: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    return pod


def _env(ds: dict[str, Any]) -> dict[str, Any]:
    (container,) = _pod(ds)["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_agent_objects_validate_on_oldest_and_newest(variant: str, tmp_path: Path) -> None:
    configmap, daemonset = render_agents(settings_of(variant, tmp_path), OWNER, 3, SPEC)
    for doc in (configmap, daemonset):
        assert schema_errors(doc) == [], f"{variant}: {doc['kind']}"


def test_the_schema_check_refuses_recursive_read_only_on_1_29(tmp_path: Path) -> None:
    """What the DaemonSet used to carry: the oldest supported version has no such field."""
    ds = copy.deepcopy(daemonset_of("default", tmp_path))
    (container,) = _pod(ds)["containers"]
    sys_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/sys")
    assert sys_mount == {"name": "sys", "mountPath": "/sys", "readOnly": True}
    sys_mount["recursiveReadOnly"] = "IfPossible"
    errors = schema_errors(ds)
    assert errors and all(e.startswith(KUBE_VERSIONS[0]) for e in errors), errors
    assert "recursiveReadOnly" in errors[0]


def test_defaults_render_into_the_release_namespace_without_extras(tmp_path: Path) -> None:
    settings = settings_of("default", tmp_path)
    assert settings.agent_namespace == NAMESPACE
    ds = daemonset_of("default", tmp_path)
    assert ds["metadata"]["namespace"] == NAMESPACE
    pod = _pod(ds)
    assert "imagePullSecrets" not in pod and "priorityClassName" not in pod
    env = _env(ds)
    assert not {"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"} & set(env)
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in env


def test_agent_values_reach_the_daemonset(tmp_path: Path) -> None:
    configmap, ds = render_agents(settings_of("agents-namespace", tmp_path), OWNER, 3, SPEC)
    assert configmap["metadata"]["namespace"] == ds["metadata"]["namespace"] == AGENT_NAMESPACE
    pod = _pod(ds)
    # agent.imagePullSecrets wins over the release-wide imagePullSecrets
    assert pod["imagePullSecrets"] == [{"name": "gpu-registry"}]
    assert pod["priorityClassName"] == "system-node-critical"


def test_telemetry_values_reach_the_agents_env(tmp_path: Path) -> None:
    ds = daemonset_of("all-on", tmp_path)
    assert ds["metadata"]["namespace"] == AGENT_NAMESPACE
    env = _env(ds)
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.01"
    # the headers (a bearer token) from the Secret's key, never a literal value
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == {
        "secretKeyRef": {"name": "otlp-headers", "key": "headers"}
    }
    # the pod's own identity for the trace resource, from the downward API
    assert env["NETVAL_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["NETVAL_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # release-wide pull secrets stand in when agent.imagePullSecrets is empty: none here
    assert "imagePullSecrets" not in _pod(ds)


def test_release_pull_secrets_reach_the_agents_by_default(tmp_path: Path) -> None:
    env = {
        **_operator_env_files("default", tmp_path),
        "NETVAL_AGENT_IMAGE_PULL_SECRETS": '[{"name": "registry"}, "other", {"name": "registry"}]',
    }
    settings = operator_settings_from_env(env)
    assert settings.agent_image_pull_secrets == ("registry", "other")
    _cm, ds = render_agents(settings, OWNER, 3, SPEC)
    assert _pod(ds)["imagePullSecrets"] == [{"name": "registry"}, {"name": "other"}]


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("NETVAL_AGENT_NAMESPACE", "Agents", "NETVAL_AGENT_NAMESPACE: not a valid Kubernetes name"),
        ("NETVAL_AGENT_NAMESPACE", "a.b", "NETVAL_AGENT_NAMESPACE: not a valid Kubernetes name"),
        ("NETVAL_AGENT_PRIORITY_CLASS_NAME", "x y", "NETVAL_AGENT_PRIORITY_CLASS_NAME"),
        ("NETVAL_AGENT_OTEL_HEADERS_SECRET", "-x", "NETVAL_AGENT_OTEL_HEADERS_SECRET"),
        ("NETVAL_AGENT_IMAGE_PULL_SECRETS", "{}", "expected a JSON list"),
        ("NETVAL_AGENT_IMAGE_PULL_SECRETS", "[{}]", "expected a JSON list of {name: SECRET}"),
        ("NETVAL_AGENT_IMAGE_PULL_SECRETS", "[1]", "expected a JSON list of {name: SECRET}"),
        ("NETVAL_AGENT_IMAGE_PULL_SECRETS", "[", "not valid JSON"),
        # an agent would refuse to start with it: refused here, before any rollout
        (
            "NETVAL_AGENT_OTEL_TRACES_SAMPLER",
            "sometimes",
            "NETVAL_AGENT_OTEL_TRACES_SAMPLER(_ARG): OTEL_TRACES_SAMPLER: unknown sampler",
        ),
        ("OTEL_TRACES_SAMPLER_ARG", "2", "OTEL_TRACES_SAMPLER_ARG: expected a ratio"),
    ],
)
def test_bad_agent_settings_are_refused(name: str, value: str, error: str, tmp_path: Path) -> None:
    env = {**_operator_env_files("default", tmp_path), name: value}
    if name == "OTEL_TRACES_SAMPLER_ARG":
        env["OTEL_TRACES_SAMPLER"] = "traceidratio"
    with pytest.raises(OperatorConfigError, match=re.escape(error)):
        operator_settings_from_env(env)


def test_empty_agent_settings_count_as_unset(tmp_path: Path) -> None:
    env = {
        **_operator_env_files("default", tmp_path),
        "NETVAL_AGENT_NAMESPACE": "",
        "NETVAL_AGENT_PRIORITY_CLASS_NAME": " ",
        "NETVAL_AGENT_IMAGE_PULL_SECRETS": "[]",
        "NETVAL_AGENT_OTEL_TRACES_SAMPLER": "",
    }
    settings = operator_settings_from_env(env)
    assert settings.agent_namespace == NAMESPACE
    assert settings.agent_priority_class_name is None
    assert settings.agent_image_pull_secrets == ()
    assert settings.agent_traces_sampler is None
