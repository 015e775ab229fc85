"""The bundled broker, for real: the chart's rendered mosquitto.conf, ACL and password init
script in a real Mosquitto (tests/mosquitto.py finds the binaries).
"""

from __future__ import annotations

import base64
import getpass
import os
import re
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mosquitto as broker_kit
from chart_kit import one

# --- the broker, for real -----------------------------------------------------------------


def _broker_parts() -> tuple[str, str, dict[str, Any], dict[str, str]]:
    config = one("default", "ConfigMap", "netval-mqtt")["data"]
    deployment = one("default", "Deployment", "netval-mqtt")
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    passwords = {
        who: base64.b64decode(
            one("default", "Secret", f"netval-mqtt-{who}")["data"]["password"]
        ).decode()
        for who in ("operator", "agent")
    }
    return config["mosquitto.conf"], config["acl"], init, passwords


def _free_port() -> int:
    return broker_kit.free_port()


class _Client:
    """A paho MQTT client, connected synchronously; collects messages."""

    def __init__(self, port: int, username: str | None, password: str | None) -> None:
        import paho.mqtt.client as paho

        self.messages: dict[str, bytes] = {}
        self.connected = threading.Event()
        self.reason: Any = None
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()
        self.connected.wait(5)

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        self.reason = reason
        self.connected.set()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.messages[message.topic] = message.payload

    @property
    def accepted(self) -> bool:
        return self.reason is not None and not self.reason.is_failure

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)

    def subscribe(self, topic: str, wait: float = 0.5) -> dict[str, bytes]:
        self.client.subscribe(topic, qos=1)
        time.sleep(wait)
        return dict(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def chart_broker(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    if not broker_kit.available():
        pytest.skip(broker_kit.MISSING_REASON)
    conf, acl, init, passwords = _broker_parts()
    auth = tmp_path / "auth"
    auth.mkdir()
    secrets = {}
    for who, password in passwords.items():
        (tmp_path / who).mkdir()
        (tmp_path / who / "password").write_text(password)
        secrets[who] = tmp_path / who / "password"
    # The init container's own script, with its file paths pointed at this directory.
    env = {e["name"]: e["value"] for e in init["env"]}
    env.update(
        PASSWD_FILE=str(auth / "passwd"),
        OPERATOR_PASSWORD_FILE=str(secrets["operator"]),
        AGENT_PASSWORD_FILE=str(secrets["agent"]),
        PATH=os.environ["PATH"] + ":" + str(Path(broker_kit.MOSQUITTO_PASSWD or "").parent),
    )
    assert init["command"][:2] == ["/bin/sh", "-ec"]
    subprocess.run(["/bin/sh", "-ec", init["command"][2]], env=env, check=True, timeout=30)
    (tmp_path / "acl").write_text(acl)
    (tmp_path / "data").mkdir()
    port = _free_port()
    replacements = {
        "listener 1883\n": f"listener {port} 127.0.0.1\n",
        "/mosquitto/auth/passwd": str(auth / "passwd"),
        "/mosquitto/config/acl": str(tmp_path / "acl"),
        "/mosquitto/data/": f"{tmp_path / 'data'}/",
    }
    for old, new in replacements.items():
        assert old in conf, old
        conf = conf.replace(old, new)
    # As root, mosquitto would switch to the "mosquitto" user (the image runs as it already).
    conf += f"\nuser {getpass.getuser()}\n"
    (tmp_path / "mosquitto.conf").write_text(conf)
    log = (tmp_path / "mosquitto.log").open("wb")
    proc = subprocess.Popen(
        [str(broker_kit.MOSQUITTO), "-c", str(tmp_path / "mosquitto.conf")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, (tmp_path / "mosquitto.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "broker did not listen"
                time.sleep(0.05)
        yield port, {**passwords, "passwd": (auth / "passwd").read_text()}
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_broker_configuration_works_in_a_real_mosquitto(
    chart_broker: tuple[int, dict[str, str]],
) -> None:
    port, secrets = chart_broker
    # The init container hashed both entries: no plain password reaches the broker's file.
    entries = dict(line.split(":", 1) for line in secrets["passwd"].splitlines())
    assert set(entries) == {"netval-operator", "netval-agent"}
    for user, hashed in entries.items():
        assert re.match(r"^\$[67]\$", hashed), user
        assert secrets["operator"] not in hashed and secrets["agent"] not in hashed
    clients = []
    try:
        for username, password in (
            (None, None),
            ("netval-operator", "wrong"),
            ("netval-agent", secrets["operator"]),
        ):
            refused = _Client(port, username, password)
            clients.append(refused)
            assert not refused.accepted, username
        operator = _Client(port, "netval-operator", secrets["operator"])
        agent = _Client(port, "netval-agent", secrets["agent"])
        clients += [operator, agent]
        assert operator.accepted and agent.accepted
        base = "netval/v1/roce-training-pool/gpu-node-1"
        operator.publish(f"{base}/assignment", b'{"domain": "zone-a"}')
        agent.publish(f"{base}/report", b"{}")
        agent.publish(f"{base}/state", b"online")
        agent.publish(f"{base}/endpoint", b'{"port": 7471}')
        agent.publish(f"{base}/assignment", b'{"domain": "forged"}')  # refused by the ACL
        agent.publish("netval/v2/elsewhere", b"x")  # refused by the ACL
        seen = operator.subscribe("netval/#")
        assert seen == {
            f"{base}/assignment": b'{"domain": "zone-a"}',
            f"{base}/report": b"{}",
            f"{base}/state": b"online",
            f"{base}/endpoint": b'{"port": 7471}',
        }
        # Agents read assignments and their peers' endpoints, not other agents' reports.
        agent.subscribe("netval/v1/roce-training-pool/+/assignment", wait=0)
        agent.subscribe("netval/v1/roce-training-pool/+/endpoint", wait=0)
        got = agent.subscribe("netval/v1/roce-training-pool/+/report")
        assert got == {
            f"{base}/assignment": b'{"domain": "zone-a"}',
            f"{base}/endpoint": b'{"port": 7471}',
        }
    finally:
        for client in clients:
            client.close()


def test_broker_password_file_is_private(tmp_path: Path) -> None:
    if not broker_kit.available():
        pytest.skip(broker_kit.MISSING_REASON)
    _, _, init, _ = _broker_parts()
    (tmp_path / "p").write_text("a")
    env = {
        "PASSWD_FILE": str(tmp_path / "passwd"),
        "OPERATOR_USERNAME": "o",
        "OPERATOR_PASSWORD_FILE": str(tmp_path / "p"),
        "AGENT_USERNAME": "a",
        "AGENT_PASSWORD_FILE": str(tmp_path / "p"),
        "PATH": os.environ["PATH"] + ":" + str(Path(broker_kit.MOSQUITTO_PASSWD or "").parent),
    }
    subprocess.run(["/bin/sh", "-ec", init["command"][2]], env=env, check=True, timeout=30)
    assert stat.S_IMODE((tmp_path / "passwd").stat().st_mode) == 0o600
    # No password on a command line: the script reads the files itself.
    assert "password" not in " ".join(init["command"][:2])
    assert "mosquitto_passwd -U" in init["command"][2]
