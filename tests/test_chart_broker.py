"""The bundled broker, for real: the chart's rendered mosquitto.conf, ACL and password init
script in a real Mosquitto (tests/mosquitto.py finds the binaries).
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import os
import re
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mosquitto as broker_kit
from chart_kit import one, render

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


@contextlib.contextmanager
def run_chart_broker(
    tmp_path: Path, edit: Callable[[str], str] | None = None
) -> Iterator[tuple[int, dict[str, str]]]:
    """The default variant's broker in a real Mosquitto: the init container's password
    script, the ACL and mosquitto.conf with only its file paths and listener pointed here
    (and `edit` applied to the configuration, for controls)."""
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
        DYNSEC_FILE=str(tmp_path / "data" / "dynamic-security.json"),
        PATH=os.environ["PATH"] + ":" + str(Path(broker_kit.MOSQUITTO_PASSWD or "").parent),
    )
    assert init["command"][:2] == ["/bin/sh", "-ec"]
    (tmp_path / "data").mkdir()
    subprocess.run(["/bin/sh", "-ec", init["command"][2]], env=env, check=True, timeout=30)
    (tmp_path / "acl").write_text(acl)
    port = _free_port()
    replacements = {
        "listener 1883\n": f"listener {port} 127.0.0.1\n",
        "/mosquitto/auth/passwd": str(auth / "passwd"),
        "/mosquitto/config/acl": str(tmp_path / "acl"),
        "/mosquitto/data/": f"{tmp_path / 'data'}/",
        "plugin /usr/lib/mosquitto_dynamic_security.so\n": f"plugin {broker_kit.DYNSEC_PLUGIN}\n",
    }
    for old, new in replacements.items():
        assert old in conf, old
        conf = conf.replace(old, new)
    if edit is not None:
        conf = edit(conf)
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


@pytest.fixture
def chart_broker(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    with run_chart_broker(tmp_path) as broker:
        yield broker


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
        "DYNSEC_FILE": str(tmp_path / "dynamic-security.json"),
        "PATH": os.environ["PATH"] + ":" + str(Path(broker_kit.MOSQUITTO_PASSWD or "").parent),
    }
    subprocess.run(["/bin/sh", "-ec", init["command"][2]], env=env, check=True, timeout=30)
    assert stat.S_IMODE((tmp_path / "passwd").stat().st_mode) == 0o600
    # No password on a command line: the script reads the files itself.
    assert "password" not in " ".join(init["command"][:2])
    assert "mosquitto_passwd -U" in init["command"][2]


# --- per-client limits: nothing the operator must see is dropped ------------------------------
#
# Mosquitto drops QoS 1 messages for a client whose queue (max_queued_messages, default 1000)
# is full; messages beyond max_inflight_messages (default 20) wait in that queue. Both bite
# the operator: after a restart it resubscribes and the broker replays every retained report
# and state at once; while it is slow or away (persistent session) a burst piles up. The
# chart sizes the limits for the fleet (values mqtt.broker.limits); these tests run its
# rendered configuration, and the same scenario with Mosquitto's defaults as the control.

BURST = 5000
RETAINED_NODES = 4000  # a report and a state each: 8,000 retained messages on subscribe
LIMIT_KEYS = ("max_queued_messages", "max_queued_bytes", "max_inflight_messages")


def _mosquitto_defaults(conf: str) -> str:
    """The chart's configuration without its per-client limits: Mosquitto's defaults."""
    return "\n".join(line for line in conf.splitlines() if not line.startswith(LIMIT_KEYS))


class _Counter:
    """A paho client that counts what it receives, by topic and by payload."""

    def __init__(self, port: int, password: str, client_id: str, *, clean: bool = True) -> None:
        import paho.mqtt.client as paho

        self.topics: set[str] = set()
        self.payloads: set[bytes] = set()
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean,
            protocol=paho.MQTTv311,
        )
        self.client.username_pw_set("netval-operator", password)
        self.client.on_connect = lambda *a: self.connected.set()
        self.client.on_message = self._on_message
        self.port = port

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self.lock:
            self.topics.add(message.topic)
            self.payloads.add(message.payload)

    def connect(self) -> None:
        self.connected.clear()
        self.client.connect("127.0.0.1", self.port, keepalive=60)
        self.client.loop_start()
        assert self.connected.wait(5)

    def subscribe(self, *topics: str) -> None:
        result, _mid = self.client.subscribe([(t, 1) for t in topics])
        assert result == 0

    def count(self, what: str = "payloads") -> int:
        with self.lock:
            return len(self.topics if what == "topics" else self.payloads)

    def wait_for(self, expected: int, what: str = "payloads", timeout: float = 10.0) -> int:
        """Until `expected` arrived or nothing new came for 1.5 s (drops never arrive)."""
        deadline = time.monotonic() + timeout
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            n = self.count(what)
            if n >= expected:
                return n
            if n != last:
                last, last_change = n, time.monotonic()
            elif time.monotonic() - last_change > 1.5:
                break
            time.sleep(0.05)
        return self.count(what)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _agent_publisher(port: int, password: str) -> Any:
    import paho.mqtt.client as paho

    client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    client.username_pw_set("netval-agent", password)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    connected = threading.Event()
    client.on_connect = lambda *a: connected.set()
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    assert connected.wait(5)
    return client


def _publish_all(client: Any, messages: list[tuple[str, bytes]], *, retain: bool) -> float:
    start = time.monotonic()
    infos = [client.publish(topic, payload, qos=1, retain=retain) for topic, payload in messages]
    for info in infos:
        info.wait_for_publish(20)
        assert info.is_published()
    return time.monotonic() - start


def _burst(port: int, secrets: dict[str, str]) -> dict[str, int]:
    """BURST QoS 1 reports while one persistent-session subscriber is away and another is
    connected but not reading; what each then receives."""
    topic = "netval/v1/+/+/report"
    away = _Counter(port, secrets["operator"], "operator-away", clean=False)
    away.connect()
    away.subscribe(topic)
    time.sleep(0.2)
    away.close()  # the session (and its subscription) stays on the broker
    slow = _Counter(port, secrets["operator"], "operator-slow", clean=False)
    slow.connect()
    slow.subscribe(topic)
    time.sleep(0.2)
    slow.client.loop_stop()  # connected, reads nothing: TCP buffers, in-flight window, queue
    agent = _agent_publisher(port, secrets["agent"])
    try:
        messages = [
            (f"netval/v1/burst/node-{i:05d}/report", f'{{"seq": {i}}}'.encode())
            for i in range(BURST)
        ]
        _publish_all(agent, messages, retain=False)
        time.sleep(0.3)
        slow.client.loop_start()
        away.connect()  # same client id, persistent session: the queue is delivered
        return {"away": away.wait_for(BURST), "slow": slow.wait_for(BURST)}
    finally:
        for client in (away, slow):
            client.close()
        agent.disconnect()
        agent.loop_stop()


def _retained_replay(port: int, secrets: dict[str, str]) -> tuple[int, float]:
    """RETAINED_NODES agents' retained report and state, then a resubscribing operator
    (the ingest's two subscriptions): how many of the 2 x RETAINED_NODES it gets, how fast."""
    agent = _agent_publisher(port, secrets["agent"])
    try:
        report = b'{"schema": "netval.io/report/v1", "results": [' + b"0" * 2000 + b"]}"
        messages = []
        for i in range(RETAINED_NODES):
            base = f"netval/v1/pool/node-{i:05d}"
            messages += [(f"{base}/report", report), (f"{base}/state", b"online")]
        _publish_all(agent, messages, retain=True)
    finally:
        agent.disconnect()
        agent.loop_stop()
    operator = _Counter(port, secrets["operator"], "operator-restarted")
    operator.connect()
    try:
        start = time.monotonic()
        operator.subscribe("netval/v1/+/+/report", "netval/v1/+/+/state")
        got = operator.wait_for(2 * RETAINED_NODES, what="topics")
        return got, time.monotonic() - start
    finally:
        operator.close()


def test_broker_limits_come_from_values() -> None:
    conf = _broker_parts()[0]
    assert "max_queued_messages 100000\n" in conf
    assert "max_queued_bytes 0\n" in conf
    assert "max_inflight_messages 100\n" in conf
    assert "max_packet_size 2097152\n" in conf
    assert "persistent_client_expiration 1h\n" in conf
    values = {
        "mqtt": {
            "broker": {
                "limits": {
                    "maxQueuedMessages": 250000,
                    "maxInflightMessages": 500,
                    "maxPacketSize": 0,
                    "persistentClientExpiration": "",
                }
            }
        }
    }
    custom = render(values)["netval/templates/mqtt-broker.yaml"]
    assert "max_queued_messages 250000\n" in custom
    assert "max_inflight_messages 500\n" in custom
    assert "max_packet_size" not in custom and "persistent_client_expiration" not in custom


def test_a_burst_reaches_slow_and_absent_subscribers(tmp_path: Path) -> None:
    with run_chart_broker(tmp_path) as (port, secrets):
        start = time.monotonic()
        got = _burst(port, secrets)
        took = time.monotonic() - start
    print(f"chart limits: {BURST} QoS 1 burst -> {got} received in {took:.1f} s")
    assert got == {"away": BURST, "slow": BURST}


def test_a_resubscribing_operator_gets_every_retained_message(tmp_path: Path) -> None:
    with run_chart_broker(tmp_path) as (port, secrets):
        got, took = _retained_replay(port, secrets)
    print(f"chart limits: {2 * RETAINED_NODES} retained -> {got} received in {took:.2f} s")
    assert got == 2 * RETAINED_NODES


def test_mosquitto_defaults_would_drop_both(tmp_path: Path) -> None:
    """The control: the same scenarios with Mosquitto's default per-client limits lose
    messages, so the tests above measure the chart's limits, not luck."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with run_chart_broker(tmp_path / "a", _mosquitto_defaults) as (port, secrets):
        burst = _burst(port, secrets)
    with run_chart_broker(tmp_path / "b", _mosquitto_defaults) as (port, secrets):
        replay, _ = _retained_replay(port, secrets)
    print(f"mosquitto defaults: burst -> {burst}, retained {2 * RETAINED_NODES} -> {replay}")
    assert burst["away"] < BURST and burst["slow"] < BURST
    assert replay < 2 * RETAINED_NODES
