"""Broker shards (mqtt.shards, docs/operations.md "Brokers beyond one process"): the shard
hash (stable across processes, in range, the documented formula), the shard URL settings of
agent and operator, and the chain chart -> operator -> agent DaemonSet -> agent: every agent
connects to the shard the operator routes its node's messages to. With one shard the chart
renders today's broker objects (names, selectors, env) and the DaemonSet no shard variable."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from chart_kit import ROOT, env_of, render, schema_errors
from netval.agent.config import agent_settings_from_env
from netval.infra.mqtt_settings import mqtt_env_for_node, shard_count, shard_urls
from netval.model.shards import MAX_SHARDS, shard_of, shard_url
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents.rollout import render_agents
from netval.operator.settings import OperatorConfigError, operator_settings_from_env
from tls_certs import make_ca

PATTERN = "mqtts://netval-mqtt-{shard}.netval-system.svc:8883"
NO_DYNSEC = {"identity": {"enabled": False}}
OWNER: dict[str, Any] = {
    "apiVersion": "netval.io/v1alpha1",
    "kind": "NetworkValidation",
    "metadata": {"name": "pool-a", "uid": "0f6c7d5e-1111-2222-3333-444455556666"},
}
SPEC = NetworkValidationSpec.model_validate({"nodeSelector": {"nvidia.com/gpu.present": "true"}})


# -- the hash ------------------------------------------------------------------------------


@given(st.text(max_size=300), st.integers(1, MAX_SHARDS))
def test_shard_of_is_the_documented_hash_and_in_range(node: str, shards: int) -> None:
    shard = shard_of(node, shards)
    assert 0 <= shard < shards
    assert shard == shard_of(node, shards)
    if shards > 1:  # the formula docs/operations.md gives, computed apart
        raw = node.encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(raw, digest_size=8).digest()
        assert shard == int.from_bytes(digest, "big") % shards


def test_shard_of_is_pinned_and_agrees_across_processes() -> None:
    """Fixed values (an accidental change of the hash would move every node) and another
    interpreter with another hash seed (Python's hash() would not agree) computes the same."""
    names = [f"gpu-node-{i:04d}" for i in range(200)]
    mine = [shard_of(n, 7) for n in names]
    code = (
        "import sys, json; from netval.model.shards import shard_of; "
        "print(json.dumps([shard_of(n, 7) for n in json.loads(sys.stdin.read())]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT / "src")}
    other = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(names),
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    assert json.loads(other.stdout) == mine
    assert [shard_of(n, 7) for n in ("gpu-a", "gpu-b", "gpu-c", "node-1")] == [1, 2, 2, 6]
    assert len(set(mine)) == 7  # 200 names reach every shard


@pytest.mark.parametrize("shards", [0, -1, MAX_SHARDS + 1])
def test_shard_counts_out_of_range_are_refused(shards: int) -> None:
    with pytest.raises(ValueError, match="shards must be"):
        shard_of("gpu-a", shards)


# -- settings ------------------------------------------------------------------------------


def test_one_shard_leaves_the_url_alone() -> None:
    env = {"NETVAL_MQTT_URL": "mqtts://netval-mqtt.netval-system.svc:8883"}
    assert mqtt_env_for_node(env, "gpu-a") is env
    assert shard_urls(env) == [env["NETVAL_MQTT_URL"]]
    assert shard_count({**env, "NETVAL_MQTT_SHARDS": ""}) == 1


def test_an_agent_takes_its_nodes_shard() -> None:
    env = {"NETVAL_MQTT_SHARDS": "3", "NETVAL_MQTT_URL_PATTERN": PATTERN}
    for node in ("gpu-a", "gpu-b", "gpu-c", "node-1"):
        url = mqtt_env_for_node(env, node)["NETVAL_MQTT_URL"]
        assert url == shard_url(PATTERN, shard_of(node, 3))


@pytest.mark.parametrize(
    ("env", "error"),
    [
        ({"NETVAL_MQTT_SHARDS": "two"}, "NETVAL_MQTT_SHARDS='two': not a whole number"),
        ({"NETVAL_MQTT_SHARDS": "65"}, "NETVAL_MQTT_SHARDS=65: must be 1..64"),
        ({"NETVAL_MQTT_SHARDS": "2"}, "needs NETVAL_MQTT_URL_PATTERN"),
        (
            {"NETVAL_MQTT_SHARDS": "2", "NETVAL_MQTT_URL_PATTERN": "mqtt://broker:1883"},
            "has no {shard}",
        ),
        (
            {"NETVAL_MQTT_SHARDS": "2", "NETVAL_MQTT_URL_PATTERN": "http://b-{shard}:1"},
            "NETVAL_MQTT_URL_PATTERN=.*unsupported scheme",
        ),
    ],
)
def test_bad_shard_settings_name_the_variable(env: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        mqtt_env_for_node({"NETVAL_MQTT_URL": "mqtt://b:1883", **env}, "gpu-a")


def test_the_operator_connects_to_every_shard(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("pw\n")
    env = {
        "NETVAL_MQTT_SHARDS": "3",
        "NETVAL_MQTT_URL_PATTERN": "mqtt://broker-{shard}:1883",
        "NETVAL_MQTT_USERNAME": "netval-operator",
        "NETVAL_MQTT_PASSWORD_FILE": str(password),
    }
    settings = operator_settings_from_env(env)
    assert [s.url for s in settings.mqtt_shards] == [f"mqtt://broker-{i}:1883" for i in range(3)]
    assert {s.username for s in settings.mqtt_shards} == {"netval-operator"}
    assert settings.mqtt.url == "mqtt://broker-0:1883" and settings.shard_count == 3
    assert settings.agent_mqtt_url_pattern == "mqtt://broker-{shard}:1883"
    one = operator_settings_from_env({"NETVAL_MQTT_URL": "mqtt://broker:1883"})
    assert one.mqtt_shards == () and one.shard_count == 1 and one.agent_mqtt_url_pattern is None
    with pytest.raises(OperatorConfigError, match="NETVAL_AGENT_MQTT_URL_PATTERN"):
        operator_settings_from_env({**env, "NETVAL_AGENT_MQTT_URL_PATTERN": "mqtt://b:1883"})


# -- the chart, the operator and the agents agree -----------------------------------------


def _docs(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for path, text in sorted(render(values).items()):
        if path.endswith(".yaml"):
            out += [d for d in yaml.safe_load_all(text) if d]
    return out


def _broker_objects(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in ("Deployment", "Service")
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "mqtt"
    }


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (op,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "netval-operator"
    ]
    container = op["spec"]["template"]["spec"]["containers"][0]
    return {k: v for k, v in env_of(container).items() if isinstance(v, str)}


def test_one_shard_renders_todays_broker() -> None:
    """Names, selectors and env as before sharding existed (an upgrade moves nothing); the
    byte-for-byte comparison with the chart before this change is in the branch's report."""
    for values in ({}, {"mqtt": {"shards": 1}}):
        docs = _docs(values)
        broker = _broker_objects(docs)
        assert set(broker) == {("Deployment", "netval-mqtt"), ("Service", "netval-mqtt")}
        assert "netval.io/mqtt-shard" not in broker["Service", "netval-mqtt"]["spec"]["selector"]
        env = _operator_env(docs)
        assert env["NETVAL_MQTT_URL"] == "mqtts://netval-mqtt.netval-system.svc:8883"
        assert not {"NETVAL_MQTT_SHARDS", "NETVAL_MQTT_URL_PATTERN"} & set(env)


@pytest.mark.parametrize("identity", [True, False], ids=["per-node-identity", "shared-login"])
def test_three_shards_render_three_brokers(identity: bool) -> None:
    values: dict[str, Any] = {"shards": 3} if identity else {"shards": 3, **NO_DYNSEC}
    docs = _docs({"mqtt": values})
    assert [e for d in docs for e in schema_errors(d)] == []
    broker = _broker_objects(docs)
    names = [f"netval-mqtt-{i}" for i in range(3)]
    assert set(broker) == {(k, n) for k in ("Deployment", "Service") for n in names}
    for i, name in enumerate(names):
        deploy, service = broker["Deployment", name], broker["Service", name]
        selector = deploy["spec"]["selector"]["matchLabels"]
        assert selector["netval.io/mqtt-shard"] == str(i)
        assert service["spec"]["selector"] == selector  # each Service reaches its shard only
        pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["netval.io/mqtt-shard"] == str(i)
    env = _operator_env(docs)
    assert env["NETVAL_MQTT_SHARDS"] == "3"
    assert env["NETVAL_MQTT_URL_PATTERN"] == env["NETVAL_AGENT_MQTT_URL_PATTERN"] == PATTERN
    (cert,) = [
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "netval-mqtt-tls"
    ]
    assert cert["metadata"]["annotations"] == {"netval.io/mqtt-shards": "3"}


def test_the_certificate_names_every_shard() -> None:
    docs = _docs({"mqtt": {"shards": 2, "tls": {"certManager": {"enabled": True}}, **NO_DYNSEC}})
    (cert,) = [
        d for d in docs if d["kind"] == "Certificate" and d["metadata"]["name"] == "netval-mqtt"
    ]
    for i in range(2):
        assert f"netval-mqtt-{i}.netval-system.svc" in cert["spec"]["dnsNames"]


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (
            {
                "mqtt": {
                    "shards": 2,
                    "external": {"enabled": True, "url": "mqtt://b:1883"},
                    **NO_DYNSEC,
                }
            },
            "does not apply to mqtt.external",
        ),
        ({"mqtt": {"shards": 0}}, "minimum"),
        ({"mqtt": {"shards": 65, **NO_DYNSEC}}, "maximum"),
    ],
)
def test_bad_shard_values_are_refused(values: dict[str, Any], error: str) -> None:
    with pytest.raises(Exception, match=error):
        render(values)


def test_chart_operator_and_agents_agree_on_every_nodes_shard(tmp_path: Path) -> None:
    """The chart's env -> the operator's settings -> the DaemonSet it renders -> each agent's
    settings: an agent connects to the shard the operator routes its node's messages to."""
    env = _operator_env(_docs({"mqtt": {"shards": 3, **NO_DYNSEC}}))
    password = tmp_path / "password"
    password.write_text("pw\n")
    ca = str(make_ca(tmp_path).cert_file)
    env.update(NETVAL_MQTT_PASSWORD_FILE=str(password), NETVAL_MQTT_CA_FILE=ca)
    operator = operator_settings_from_env(env)
    configmap, ds = render_agents(operator, OWNER, 1, SPEC)
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    agent_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert agent_env["NETVAL_MQTT_SHARDS"] == "3"
    assert agent_env["NETVAL_MQTT_URL_PATTERN"] == PATTERN
    config = tmp_path / "agent.yaml"
    (text,) = configmap["data"].values()
    config.write_text(text)
    agent_env.update(
        NETVAL_CONFIG=str(config), NETVAL_MQTT_PASSWORD_FILE=str(password), NETVAL_MQTT_CA_FILE=ca
    )
    seen = set()
    for node in [f"gpu-{i}" for i in range(30)]:
        agent = agent_settings_from_env({**agent_env, "NETVAL_NODE_NAME": node})
        shard = shard_of(node, operator.shard_count)
        assert agent.mqtt.url == operator.mqtt_shards[shard].url
        seen.add(shard)
    assert seen == {0, 1, 2}


def test_one_shard_gives_the_agents_no_shard_variables(tmp_path: Path) -> None:
    settings = operator_settings_from_env({"NETVAL_MQTT_URL": "mqtt://netval-mqtt:1883"})
    _cm, ds = render_agents(settings, OWNER, 1, SPEC)
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    names = {e["name"] for e in container["env"]}
    assert "NETVAL_MQTT_URL" in names
    assert not {"NETVAL_MQTT_SHARDS", "NETVAL_MQTT_URL_PATTERN"} & names
