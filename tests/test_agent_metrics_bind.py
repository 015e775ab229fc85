"""Where the agent serves /metrics and /healthz: the node's own address (downward API
status.hostIP), not every interface of the host network.

The real `netval agent` process runs with the environment the operator's DaemonSet renders,
`$(VAR)` references expanded as the kubelet does, the node's address played by 127.0.0.2.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

import mosquitto
from kube import wait_for
from netns import netval_script
from netval.agent.config import ENV_HOST_IP, ENV_METRICS_ADDR, default_metrics_addr
from netval.infra.metrics_server import parse_host_port
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents.manifests import AgentMqttWiring, render_daemonset
from test_agent import LO_CHECKS, agent_config, stop_process, tail, write_agent_files

OWNER = {
    "apiVersion": "netval.io/v1alpha1",
    "kind": "NetworkValidation",
    "metadata": {"name": "pool-a", "uid": "0f6c7d5e-1111-2222-3333-444455556666"},
}
NODE_IP = "127.0.0.2"  # all of 127/8 is loopback on Linux: a second address to tell apart


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ("127.0.0.1", 9477)),  # outside Kubernetes: loopback only
        ({ENV_HOST_IP: "10.1.2.3"}, ("10.1.2.3", 9477)),
        ({ENV_HOST_IP: "fd00::5"}, ("fd00::5", 9477)),
        ({ENV_HOST_IP: "10.1.2.3", ENV_METRICS_ADDR: ":9480"}, ("0.0.0.0", 9480)),  # asked for
        ({ENV_HOST_IP: "10.1.2.3", ENV_METRICS_ADDR: "off"}, None),
    ],
)
def test_default_bind_address(env: dict[str, str], expected: tuple[str, int] | None) -> None:
    assert parse_host_port(default_metrics_addr(env), variable=ENV_METRICS_ADDR) == expected


def _kubelet_env(port: int) -> dict[str, str]:
    """NETVAL_HOST_IP and NETVAL_METRICS_ADDR as the DaemonSet renders them, expanded."""
    ds = render_daemonset(
        "pool-a",
        1,
        NetworkValidationSpec(),
        namespace="netval-system",
        owner=OWNER,
        image="netval:test",
        mqtt=AgentMqttWiring(url="mqtt://broker:1883"),
        restart_hash="0",
        metrics_port=port,
    )
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for item in container["env"]:
        if item["name"] == ENV_HOST_IP:
            assert item["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
            env[ENV_HOST_IP] = NODE_IP
        elif item["name"] == ENV_METRICS_ADDR:
            env[ENV_METRICS_ADDR] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], item["value"])
    return env


def _healthz(host: str, port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=1) as answer:
            status: int = answer.status
            return status
    except OSError:
        return None


@pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)
def test_agent_serves_on_the_node_address_only(tmp_path: Path) -> None:
    broker = mosquitto.MosquittoBroker(tmp_path)
    broker.start()
    port = mosquitto.free_port()
    env = write_agent_files(tmp_path, broker, agent_config(LO_CHECKS)) | _kubelet_env(port)
    assert env[ENV_METRICS_ADDR] == f"[{NODE_IP}]:{port}"
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # this tree's netval, not the venv's
    log_file = tmp_path / "agent.log"
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            [netval_script(), "agent"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for(
            lambda: _healthz(NODE_IP, port) == 200,
            timeout=30,
            what=f"/healthz on {NODE_IP}:{port}:\n{tail(log_file)}",
        )
        # nothing listens on the port at any other address
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
    finally:
        stop_process(proc)
        broker.close()
