"""The agent ConfigMap and DaemonSet rendered for one NetworkValidation (pure functions)."""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from netval.agent import config as agent_config  # test only: operator never imports agent
from netval.agent.config import AgentConfig
from netval.infra.mqtt_settings import mqtt_settings_from_env
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents import manifests as m
from netval.operator.agents.manifests import (
    AgentMqttWiring,
    agent_config_document,
    agent_object_name,
    config_hash,
    render_configmap,
    render_daemonset,
    validation_label_value,
)

OPERATOR_PACKAGE = Path(m.__file__).resolve().parent.parent

OWNER: dict[str, Any] = {
    "apiVersion": "netval.io/v1alpha1",
    "kind": "NetworkValidation",
    "metadata": {"name": "pool-a", "uid": "0f6c7d5e-1111-2222-3333-444455556666"},
    "spec": {},
}
OWNER_REF = {
    "apiVersion": "netval.io/v1alpha1",
    "kind": "NetworkValidation",
    "name": "pool-a",
    "uid": "0f6c7d5e-1111-2222-3333-444455556666",
    "controller": True,
    "blockOwnerDeletion": True,
}
IMAGE = "ghcr.io/example/netval:0.1.0"
MQTT = AgentMqttWiring(
    url="mqtts://netval-mqtt.netval-system:8883",
    username="agent",
    password_secret="netval-mqtt-agent",
    ca_secret="netval-mqtt-ca",
)
SPEC = NetworkValidationSpec.model_validate(
    {
        "nodeSelector": {"nvidia.com/gpu.present": "true", "pool": "a"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
        ],
        "interval": "15s",
        "checks": {
            "pfc": {"priorities": [3]},
            "rdma": {"minRateGbps": 1e-05},
            "storage": {"endpoints": [{"name": "ceph", "protocol": "ceph", "host": "10.0.0.5"}]},
        },
        "telemetry": {"otlpEndpoint": "http://otel-collector.observability:4318"},
    }
)


def _configmap(spec: NetworkValidationSpec = SPEC, generation: int = 4) -> dict[str, Any]:
    return render_configmap("pool-a", generation, spec, namespace="netval-system", owner=OWNER)


def _daemonset(
    spec: NetworkValidationSpec = SPEC,
    generation: int = 4,
    mqtt: AgentMqttWiring = MQTT,
    **kwargs: Any,
) -> dict[str, Any]:
    return render_daemonset(
        "pool-a",
        generation,
        spec,
        namespace="netval-system",
        owner=OWNER,
        image=IMAGE,
        mqtt=mqtt,
        restart_hash=m.restart_hash("pool-a", spec),
        **kwargs,
    )


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


def _env(ds: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(ds)["env"]}


# --- the config document and ConfigMap ------------------------------------------------------


def test_config_document_is_the_agent_config_format() -> None:
    doc = agent_config_document("pool-a", 4, SPEC)
    assert set(doc) == {"validation", "generation", "spec"}
    assert doc["validation"] == "pool-a"
    assert doc["generation"] == 4
    assert doc["spec"] == SPEC.model_dump(mode="json", by_alias=True)
    assert doc["spec"]["checks"]["mtu"]["interfaceMTU"] == 9000  # by alias, defaults included
    assert AgentConfig.model_validate(doc) == AgentConfig(
        validation="pool-a", generation=4, spec=SPEC
    )


def test_configmap() -> None:
    cm = _configmap()
    assert cm["apiVersion"] == "v1"
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"] == {
        "name": "netval-agent-pool-a",
        "namespace": "netval-system",
        "labels": {
            "app.kubernetes.io/name": "netval-agent",
            "app.kubernetes.io/managed-by": "netval-operator",
            "netval.io/validation": "pool-a",
        },
        "annotations": {
            "netval.io/config-hash": config_hash(agent_config_document("pool-a", 4, SPEC))
        },
        "ownerReferences": [OWNER_REF],
    }
    assert list(cm["data"]) == [m.AGENT_CONFIG_KEY] == ["agent.yaml"]


def test_configmap_content_parses_back_with_the_agent_model() -> None:
    text = _configmap()["data"][m.AGENT_CONFIG_KEY]
    parsed = AgentConfig.model_validate(yaml.safe_load(text))
    assert parsed == AgentConfig(validation="pool-a", generation=4, spec=SPEC)
    assert parsed.spec.checks.rdma.min_rate_gbps == 1e-05  # a float, not the string "1e-05"


def test_configmap_content_loads_with_the_agent_loader(tmp_path: Path) -> None:
    # What the agent does at start: NETVAL_CONFIG names the file mounted from the ConfigMap.
    path = tmp_path / m.AGENT_CONFIG_KEY
    path.write_text(_configmap()["data"][m.AGENT_CONFIG_KEY], encoding="utf-8")
    loaded = agent_config.load_agent_config(path)
    assert loaded == AgentConfig(validation="pool-a", generation=4, spec=SPEC)


def test_configmap_does_not_alias_the_spec() -> None:
    cm = _configmap()
    cm["metadata"]["labels"]["x"] = "y"
    assert "x" not in _configmap()["metadata"]["labels"]


# --- the config hash ----------------------------------------------------------------------


def test_config_hash_shape_and_canonical_form() -> None:
    doc = agent_config_document("pool-a", 4, SPEC)
    digest = config_hash(doc)
    assert len(digest) == 16
    assert int(digest, 16) >= 0
    reordered = {"spec": copy.deepcopy(doc["spec"]), "generation": 4, "validation": "pool-a"}
    reordered["spec"]["nodeSelector"] = dict(reversed(list(doc["spec"]["nodeSelector"].items())))
    assert config_hash(reordered) == digest


def test_config_hash_changes_with_the_spec_and_only_then() -> None:
    base = config_hash(agent_config_document("pool-a", 4, SPEC))
    same = NetworkValidationSpec.model_validate(SPEC.model_dump(mode="json", by_alias=True))
    assert config_hash(agent_config_document("pool-a", 4, same)) == base
    # A spec written differently but meaning the same (defaults spelled out, snake_case).
    written = SPEC.model_dump(mode="json", by_alias=False, exclude_defaults=True)
    written["gating"] = {"node_label": True, "admission": "gate"}  # defaults, spelled out
    spelled = NetworkValidationSpec.model_validate(written)
    assert written != SPEC.model_dump(mode="json", by_alias=True)
    assert config_hash(agent_config_document("pool-a", 4, spelled)) == base

    changed = NetworkValidationSpec.model_validate(
        {**SPEC.model_dump(mode="json", by_alias=True), "interval": "20s"}
    )
    assert config_hash(agent_config_document("pool-a", 4, changed)) != base
    deeper = SPEC.model_dump(mode="json", by_alias=True)
    deeper["checks"]["pfc"]["maxPausePercent"] = 25.0
    assert (
        config_hash(
            agent_config_document("pool-a", 4, NetworkValidationSpec.model_validate(deeper))
        )
        != base
    )
    # A new generation is a new config too: its agents must report the new generation.
    assert config_hash(agent_config_document("pool-a", 5, SPEC)) != base


def test_daemonset_pod_template_rolls_only_when_what_the_pod_runs_changes() -> None:
    template = _daemonset()["spec"]["template"]
    assert template == _daemonset()["spec"]["template"]
    restart = template["metadata"]["annotations"]["netval.io/restart-hash"]
    assert restart == m.restart_hash("pool-a", SPEC)
    assert "netval.io/config-hash" not in template["metadata"]["annotations"]
    # What the agent reloads live (interval, thresholds, gating) and a new generation leave
    # the template as it was: the DaemonSet does not roll.
    live = SPEC.model_dump(mode="json", by_alias=True)
    live["interval"] = "1m"
    live["checks"]["pfc"]["maxPausePercent"] = 25.0
    live["gating"] = {"nodeLabel": False, "admission": "deny"}
    reloaded = NetworkValidationSpec.model_validate(live)
    assert _daemonset(reloaded, generation=5)["spec"]["template"] == template
    # What it reads only at start rolls it: the peer responder's interface, port, enabling.
    for peers in ({"enabled": True}, {"enabled": True, "interface": "ib0"}):
        changed = SPEC.model_dump(mode="json", by_alias=True)
        changed["checks"]["peers"].update(peers)
        rolled = _daemonset(NetworkValidationSpec.model_validate(changed), generation=5)
        annotations = rolled["spec"]["template"]["metadata"]["annotations"]
        assert annotations["netval.io/restart-hash"] != restart
    # ...and so does another validation name (the agent's MQTT identity).
    other = render_daemonset(
        "pool-b", 4, SPEC, namespace="netval-system", owner=OWNER, image=IMAGE, mqtt=MQTT,
        restart_hash=m.restart_hash("pool-b", SPEC),
    )  # fmt: skip
    assert other["spec"]["template"]["metadata"]["annotations"]["netval.io/restart-hash"] != (
        restart
    )
    # ...and the DaemonSet selector never changes (it is immutable).
    assert (
        _daemonset(reloaded, generation=5)["spec"]["selector"] == _daemonset()["spec"]["selector"]
    )


# --- the DaemonSet ------------------------------------------------------------------------


def test_daemonset_metadata_and_strategy() -> None:
    ds = _daemonset()
    assert ds["apiVersion"] == "apps/v1"
    assert ds["kind"] == "DaemonSet"
    assert ds["metadata"] == {
        "name": "netval-agent-pool-a",
        "namespace": "netval-system",
        "labels": {
            "app.kubernetes.io/name": "netval-agent",
            "app.kubernetes.io/managed-by": "netval-operator",
            "netval.io/validation": "pool-a",
        },
        "annotations": {"netval.io/generation": "4"},
        "ownerReferences": [OWNER_REF],
    }
    assert ds["spec"]["selector"] == {
        "matchLabels": {"app.kubernetes.io/name": "netval-agent", "netval.io/validation": "pool-a"}
    }
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels["app.kubernetes.io/managed-by"] == "netval-operator"
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%"},
    }


def test_daemonset_pod_placement() -> None:
    pod = _daemonset()["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "a"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
        {"key": "netval.io/fabric-unhealthy", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["serviceAccountName"] == "netval-agent"
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False


def test_daemonset_without_a_node_selector_or_tolerations() -> None:
    pod = _daemonset(NetworkValidationSpec())["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod  # every node (the DaemonSet default)
    assert pod["tolerations"] == [
        {"key": "netval.io/fabric-unhealthy", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_daemonset_tolerations_are_copies() -> None:
    ds = _daemonset()
    ds["spec"]["template"]["spec"]["tolerations"][0]["key"] = "changed"
    ds["spec"]["template"]["spec"]["nodeSelector"]["pool"] = "changed"
    assert SPEC.tolerations[0]["key"] == "nvidia.com/gpu"
    assert SPEC.node_selector["pool"] == "a"


def test_daemonset_container() -> None:
    container = _container(_daemonset())
    assert container["name"] == "agent"
    assert container["image"] == IMAGE
    assert container["command"] == ["netval", "agent"]
    assert container["ports"] == [
        {"name": "metrics", "containerPort": 9477, "hostPort": 9477, "protocol": "TCP"}
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["resources"] == {
        "requests": {"cpu": "20m", "memory": "64Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod_security = _daemonset()["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == pod_security["fsGroup"] == 65532
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_lldp_runs_the_capability_interpreter_with_net_raw_only() -> None:
    lldp = SPEC.model_copy(
        update={"topology": SPEC.topology.model_copy(update={"lldp": True})}, deep=True
    )
    container = _container(_daemonset(lldp))
    assert container["command"] == ["/opt/netval/bin/python-netraw", "-m", "netval", "agent"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}
    # A file capability is ignored under no_new_privs, which allowPrivilegeEscalation=false sets
    assert security["allowPrivilegeEscalation"] is True
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 65532
    assert security["readOnlyRootFilesystem"] is True
    # Without lldp: nothing added, and the DaemonSet is what it was.
    assert _container(_daemonset())["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_daemonset_env() -> None:
    ds = _daemonset()
    env = _env(ds)
    assert env == {
        "NETVAL_NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        "NETVAL_POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "NETVAL_POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "NETVAL_CONFIG": "/etc/netval/config/agent.yaml",
        "NETVAL_MQTT_URL": "mqtts://netval-mqtt.netval-system:8883",
        "NETVAL_MQTT_USERNAME": "agent",
        "NETVAL_MQTT_PASSWORD_FILE": "/etc/netval/mqtt/password",
        "NETVAL_MQTT_CA_FILE": "/etc/netval/mqtt/ca.crt",
        "NETVAL_HOST_IP": {"fieldRef": {"fieldPath": "status.hostIP"}},
        "NETVAL_METRICS_ADDR": "[$(NETVAL_HOST_IP)]:9477",
        "OTEL_SERVICE_NAME": "netval-agent",
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.node.name=$(NETVAL_NODE_NAME),netval.validation=pool-a",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability:4318",
    }
    # $(NETVAL_NODE_NAME) expands only when it is defined earlier in the list.
    assert _container(ds)["env"][0]["name"] == "NETVAL_NODE_NAME"
    # The password is never in the environment.
    assert all("secretKeyRef" not in str(e) for e in _container(ds)["env"])


def test_env_names_are_the_ones_the_agent_reads() -> None:
    assert m.ENV_CONFIG == agent_config.ENV_CONFIG
    assert m.ENV_NODE == agent_config.ENV_NODE
    assert m.ENV_METRICS_ADDR == agent_config.ENV_METRICS_ADDR
    assert m.ENV_HOST_IP == agent_config.ENV_HOST_IP
    assert m.METRICS_PORT == agent_config.DEFAULT_METRICS_PORT
    # $(NETVAL_HOST_IP) expands only when it is defined earlier in the list.
    names = [e["name"] for e in _container(_daemonset())["env"]]
    assert names.index("NETVAL_HOST_IP") < names.index("NETVAL_METRICS_ADDR")


def test_daemonset_env_without_optional_parts() -> None:
    ds = _daemonset(NetworkValidationSpec(), mqtt=AgentMqttWiring(url="mqtt://broker:1883"))
    env = _env(ds)
    assert "NETVAL_MQTT_USERNAME" not in env
    assert "NETVAL_MQTT_PASSWORD_FILE" not in env
    assert "NETVAL_MQTT_CA_FILE" not in env
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env
    pod = ds["spec"]["template"]["spec"]
    assert "mqtt" not in {v["name"] for v in pod["volumes"]}
    assert "mqtt" not in {v["name"] for v in _container(ds)["volumeMounts"]}


def test_daemonset_volumes_and_mounts() -> None:
    ds = _daemonset()
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    mounts = {v["name"]: v for v in _container(ds)["volumeMounts"]}
    assert volumes["config"] == {
        "name": "config",
        "configMap": {"name": "netval-agent-pool-a", "defaultMode": 0o444},
    }
    assert mounts["config"] == {
        "name": "config",
        "mountPath": "/etc/netval/config",
        "readOnly": True,
    }
    assert volumes["sys"] == {"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}}
    # (no recursiveReadOnly: the 1.29 schema has no such field, tests/test_agent_daemonset.py)
    assert mounts["sys"] == {"name": "sys", "mountPath": "/sys", "readOnly": True}
    assert volumes["mqtt"] == {
        "name": "mqtt",
        "projected": {
            "defaultMode": 0o440,
            "sources": [
                {
                    "secret": {
                        "name": "netval-mqtt-agent",
                        "items": [{"key": "password", "path": "password"}],
                    }
                },
                {
                    "secret": {
                        "name": "netval-mqtt-ca",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
            ],
        },
    }
    assert mounts["mqtt"] == {"name": "mqtt", "mountPath": "/etc/netval/mqtt", "readOnly": True}
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}
    assert mounts["tmp"]["mountPath"] == "/tmp"
    # Every hostPath volume is mounted read-only, and only /sys is taken from the host.
    host_paths = [v for v in volumes.values() if "hostPath" in v]
    assert [v["hostPath"]["path"] for v in host_paths] == ["/sys"]
    assert all(mounts[v["name"]]["readOnly"] is True for v in host_paths)
    # The config mount holds the file NETVAL_CONFIG names.
    assert _env(ds)["NETVAL_CONFIG"] == f"{mounts['config']['mountPath']}/{m.AGENT_CONFIG_KEY}"


def test_the_agent_reads_the_mounted_files(tmp_path: Path) -> None:
    # The env the DaemonSet sets, with the mount points moved under tmp_path, is accepted by
    # the settings code the agent runs at start.
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    env = {k: v for k, v in _env(_daemonset()).items() if isinstance(v, str)}
    env["NETVAL_MQTT_PASSWORD_FILE"] = str(password)
    del env["NETVAL_MQTT_CA_FILE"]  # (a real PEM bundle is needed to load one)
    env["NETVAL_MQTT_URL"] = env["NETVAL_MQTT_URL"].replace("mqtts://", "mqtt://")
    settings = mqtt_settings_from_env(env)
    assert (settings.username, settings.password) == ("agent", "s3cret")


def test_peer_port_is_declared_when_peers_are_enabled() -> None:
    spec = NetworkValidationSpec.model_validate(
        {"checks": {"peers": {"enabled": True, "port": 7600}}}
    )
    ports = _container(_daemonset(spec))["ports"]
    assert ports[1] == {"name": "peer", "containerPort": 7600, "hostPort": 7600, "protocol": "TCP"}


def test_metrics_port_can_be_moved() -> None:
    ds = _daemonset(metrics_port=9480)
    assert _env(ds)["NETVAL_METRICS_ADDR"] == "[$(NETVAL_HOST_IP)]:9480"
    assert _container(ds)["ports"][0]["containerPort"] == 9480
    assert _container(ds)["livenessProbe"]["httpGet"]["port"] == "metrics"


# --- names, owners, wiring ----------------------------------------------------------------


def test_agent_object_names() -> None:
    assert agent_object_name("pool-a") == "netval-agent-pool-a"
    exact = "x" * (63 - len("netval-agent-"))
    assert agent_object_name(exact) == f"netval-agent-{exact}"
    long = "gpu-training-pool-" + "a" * 80 + ".example"
    name = agent_object_name(long)
    assert len(name) == 63
    assert name.startswith("netval-agent-gpu-training-pool-")
    assert name == agent_object_name(long)  # stable
    assert name != agent_object_name(long + "x")  # and distinct for distinct names
    # Truncation never leaves a '-' or '.' before the hash suffix.
    dotted = "a" * 40 + "." + "b" * 40
    assert not agent_object_name(dotted)[:-9].endswith((".", "-"))


def test_long_validation_names_give_valid_label_values() -> None:
    assert validation_label_value("pool-a") == "pool-a"
    long = "p" * 200
    value = validation_label_value(long)
    assert len(value) == 63
    ds = _daemonset()
    ds_long = render_daemonset(
        long,
        1,
        SPEC,
        namespace="ns",
        owner={**OWNER, "metadata": {"name": long, "uid": "u"}},
        image=IMAGE,
        mqtt=MQTT,
        restart_hash="0" * 16,
    )
    assert ds_long["spec"]["selector"]["matchLabels"]["netval.io/validation"] == value
    assert len(ds_long["metadata"]["name"]) == 63
    assert ds_long["metadata"]["ownerReferences"][0]["name"] == long
    assert ds["spec"]["selector"]["matchLabels"]["netval.io/validation"] == "pool-a"


def test_owner_reference_needs_uid() -> None:
    with pytest.raises(ValueError, match="uid"):
        render_configmap(
            "pool-a",
            1,
            SPEC,
            namespace="ns",
            owner={**OWNER, "metadata": {"name": "pool-a"}},
        )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"url": "http://broker"}, "unsupported scheme"),
        ({"url": "mqtt://broker", "password_secret": "s"}, "needs a username"),
        ({"url": "mqtt://broker", "ca_secret": "s"}, "mqtts://"),
    ],
)
def test_mqtt_wiring_is_checked(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        AgentMqttWiring(**kwargs)


def test_renderers_are_pure() -> None:
    spec_before = SPEC.model_dump()
    owner_before = copy.deepcopy(OWNER)
    assert _daemonset() == _daemonset()
    assert _configmap() == _configmap()
    assert SPEC.model_dump() == spec_before
    assert owner_before == OWNER


# --- the operator does not import the agent -------------------------------------------------


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against netval.operator.<module>
                base = ["netval", "operator"][: max(0, 2 - (node.level - 1))]
                found.append(".".join([*base, *(node.module or "").split(".")]).rstrip("."))
                found += [f"{found[-1]}.{alias.name}" for alias in node.names]
            else:
                found.append(node.module or "")
                found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def test_operator_package_never_imports_the_agent() -> None:
    files = sorted(OPERATOR_PACKAGE.rglob("*.py"))
    assert OPERATOR_PACKAGE / "agents" / "manifests.py" in files
    offenders = {
        str(path.relative_to(OPERATOR_PACKAGE)): name
        for path in files
        for name in _imports(path)
        if name == "netval.agent" or name.startswith("netval.agent.")
    }
    assert offenders == {}


def test_import_scan_sees_agent_imports(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text(
        "from netval import agent\nfrom ..agent import runner\nimport netval.agent.main\n"
    )
    names = _imports(sample)
    assert "netval.agent" in names
    assert "netval.agent.runner" in names
    assert "netval.agent.main" in names


def test_owner_may_be_a_flat_reference() -> None:
    # What the handlers pass: {apiVersion, kind, name, uid} instead of the whole object.
    flat = {
        "apiVersion": "netval.io/v1alpha1",
        "kind": "NetworkValidation",
        "name": "pool-a",
        "uid": OWNER["metadata"]["uid"],
    }
    cm = render_configmap("pool-a", 4, SPEC, namespace="netval-system", owner=flat)
    assert cm["metadata"]["ownerReferences"] == [OWNER_REF]


def test_secret_keys_can_be_chosen() -> None:
    wiring = AgentMqttWiring(
        url="mqtts://broker",
        username="agent",
        password_secret="creds",
        password_key="agent-password",
        ca_secret="tls",
        ca_key="tls.crt",
    )
    ds = _daemonset(mqtt=wiring)
    (volume,) = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "mqtt"]
    assert volume["projected"]["sources"] == [
        {"secret": {"name": "creds", "items": [{"key": "agent-password", "path": "password"}]}},
        {"secret": {"name": "tls", "items": [{"key": "tls.crt", "path": "ca.crt"}]}},
    ]
