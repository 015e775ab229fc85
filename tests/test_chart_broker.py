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
import ssl
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

import mosquitto as broker_kit
from chart_kit import CHART, NAMESPACE, RELEASE, one, render
from kube import wait_for
from netval.model.topics import MAX_REPORT_PACKET_BYTES

# --- the broker, for real -----------------------------------------------------------------

# The name in the chart's URL and broker certificate. Clients here connect by it, with TLS and
# host name verification as netval's clients do; `_resolving_broker_name` stands in for the
# cluster DNS that points it at the Service.
BROKER_HOST = f"netval-mqtt.{NAMESPACE}.svc"


def rendered_ca(variant: str = "default") -> str:
    """The CA the chart gives the operator and agents (Secret netval-mqtt-ca), PEM."""
    return base64.b64decode(one(variant, "Secret", "netval-mqtt-ca")["data"]["ca.crt"]).decode()


def secure(client: Any) -> str:
    """TLS on a paho client as netval's clients do it (chart CA, host name verified); the
    host to connect to."""
    if client._ssl_context is None:  # reconnects keep the context set the first time
        client.tls_set_context(ssl.create_default_context(cadata=rendered_ca()))
    return BROKER_HOST


@contextlib.contextmanager
def _resolving_broker_name() -> Iterator[None]:
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == BROKER_HOST else host, port, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    try:
        yield
    finally:
        socket.getaddrinfo = real  # type: ignore[assignment]


def _broker_tls(directory: Path) -> None:
    """The broker's certificate, key and CA as the chart renders Secret netval-mqtt-tls."""
    directory.mkdir()
    data = one("default", "Secret", "netval-mqtt-tls")["data"]
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (directory / key).write_bytes(base64.b64decode(data[key]))
        (directory / key).chmod(0o600)


def identity_context(secrets: dict[str, str], identity: str) -> ssl.SSLContext:
    """A client TLS context as netval's clients build one with per-node identity: the
    broker verified by the chart's CA and host name, and a client certificate for
    `identity` (`<validation>/<node>`, or netval-operator) minted by the chart's identity CA."""
    from netval.infra.mqtt_settings import load_identity
    from netval.operator.identity.authority import IdentityAuthority

    authority = IdentityAuthority.from_files(
        Path(secrets["identity_ca"]), Path(secrets["identity_key"])
    )
    issued, key = authority.mint(identity, identity.replace("/", "."))
    context = ssl.create_default_context(cadata=rendered_ca())
    load_identity(context, _Pem(issued.cert_pem, key))
    return context


@dataclass(frozen=True)
class _Pem:
    cert: bytes
    key: bytes

    def pem(self) -> tuple[bytes, bytes]:
        return self.cert, self.key


def _broker_parts(
    variant: str = "default",
) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    config = one(variant, "ConfigMap", "netval-mqtt")["data"]
    deployment = one(variant, "Deployment", "netval-mqtt")
    inits = deployment["spec"]["template"]["spec"].get("initContainers") or [None]
    (init,) = inits
    passwords = {
        who: base64.b64decode(
            one(variant, "Secret", f"netval-mqtt-{who}")["data"]["password"]
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
        self.client.connect(secure(self.client), port, keepalive=10)
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


def plaintext_listener(conf: str) -> str:
    """The chart's configuration with its TLS listener turned plaintext: for tests of the
    shared login's access rules, which are the same either way; the TLS listener itself is
    tested on its own below. (Per-node identity is a TLS feature: not for it.)"""
    tls = re.compile(r"^(cafile|certfile|keyfile|tls_version) .*\n", re.M)
    assert len(tls.findall(conf)) == 4, conf
    assert "require_certificate" not in conf, "client certificates need the TLS listener"
    return tls.sub("", conf)


@contextlib.contextmanager
def run_chart_broker(
    tmp_path: Path,
    edit: Callable[[str], str] | None = None,
    variant: str = "default",
    *,
    by_address: bool = False,
) -> Iterator[tuple[int, dict[str, str]]]:
    """A variant's broker in a real Mosquitto: the ACL and mosquitto.conf with only its file
    paths and listener pointed here (and `edit` applied to the configuration, for controls);
    with per-node identity (the default) the chart's identity CA (yielded as `identity_ca`
    and `identity_key` file paths: tests mint clients' certificates with it), else the init
    container's password script (yielded: the passwords and the hashed file)."""
    if not broker_kit.available():
        pytest.skip(broker_kit.MISSING_REASON)
    conf, acl, init, passwords = _broker_parts(variant)
    auth = tmp_path / "auth"
    auth.mkdir()
    (tmp_path / "data").mkdir()
    extra: dict[str, str] = {}
    if init is None:  # per-node identity: the broker reads the identity CA's certificate
        identity = tmp_path / "identity"
        identity.mkdir()
        data = one(variant, "Secret", "netval-mqtt-identity-ca")["data"]
        (identity / "ca.crt").write_bytes(base64.b64decode(data["tls.crt"]))
        (identity / "ca.key").write_bytes(base64.b64decode(data["tls.key"]))
        extra = {"identity_ca": str(identity / "ca.crt"), "identity_key": str(identity / "ca.key")}
    else:
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
        extra = {"passwd": (auth / "passwd").read_text()}
    (tmp_path / "acl").write_text(acl)
    _broker_tls(tmp_path / "tls")
    if by_address:
        # a server certificate for 127.0.0.1 too (yielded: `broker_ca`), for processes that
        # cannot resolve the chart's Service name (agents run as subprocesses)
        import tls_certs

        ca = tls_certs.make_ca(tmp_path / "tls", "broker-test-ca")
        leaf = tls_certs.issue(ca, tmp_path / "tls", "broker-by-address",
                               dns_names=(BROKER_HOST,), ip_addresses=("127.0.0.1",))  # fmt: skip
        (tmp_path / "tls" / "tls.crt").write_bytes(leaf.cert_file.read_bytes())
        (tmp_path / "tls" / "tls.key").write_bytes(leaf.key_file.read_bytes())
        extra["broker_ca"] = str(ca.cert_file)
    port = _free_port()
    replacements = {
        "listener 8883\n": f"listener {port} 127.0.0.1\n",
        "/mosquitto/tls/": f"{tmp_path / 'tls'}/",
        "/mosquitto/identity/ca.crt": str(tmp_path / "identity" / "ca.crt"),
        "/mosquitto/auth/passwd": str(auth / "passwd"),
        "/mosquitto/config/acl": str(tmp_path / "acl"),
        "/mosquitto/data/": f"{tmp_path / 'data'}/",
    }
    for old, new in replacements.items():
        if old.startswith(("/mosquitto/identity/", "/mosquitto/auth/")) and old not in conf:
            continue  # the other kind of authentication
        if old.startswith("listener ") and old not in conf:
            continue  # plaintext (the variant's, or `edit`'s below)
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
        with _resolving_broker_name():
            yield port, {**passwords, **extra}
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
def chart_broker(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    with run_chart_broker(tmp_path) as broker:
        yield broker


def _cert_client(port: int, context: ssl.SSLContext, client_id: str = "x") -> Any:
    import paho.mqtt.client as paho

    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=paho.MQTTv5)  # fmt: skip
    client.tls_set_context(context)
    return client


def test_per_node_identity_takes_certificates_only(
    chart_broker: tuple[int, dict[str, str]],
) -> None:
    """Default chart (per-node identity): the broker asks every client for a certificate of
    the identity CA and keeps no password file: the operator's and the agents' passwords the
    chart still renders (for switching back) log nobody in, with or without a certificate of
    another CA; a certificate of the identity CA does."""
    port, secrets = chart_broker
    conf = one("default", "ConfigMap", "netval-mqtt")["data"]["mosquitto.conf"]
    assert "password_file" not in conf and "plugin " not in conf
    assert "require_certificate true\nuse_identity_as_username true\n" in conf
    assert "use_username_as_clientid true\n" in conf
    for username in ("netval-operator", "netval-agent"):
        shared = _Client(port, username, secrets["operator" if "operator" in username else "agent"])
        try:
            assert not shared.accepted, username  # no certificate: no TLS session at all
        finally:
            shared.close()
    ok = _cert_client(port, identity_context(secrets, "pool/gpu-node-1"))
    connected = threading.Event()
    ok.on_connect = lambda *a: connected.set()
    ok.connect(BROKER_HOST, port, keepalive=10)
    ok.loop_start()
    try:
        assert connected.wait(10)
    finally:
        ok.disconnect()
        ok.loop_stop()


def test_per_node_identity_without_the_webhook_or_tls_does_not_render() -> None:
    """Without the webhook nobody could enroll, and without TLS there are no client
    certificates: refused at render time, with what to do."""
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError, match=r"needs webhook.enabled"):
            chart.render({"webhook": {"enabled": False}}, name=RELEASE, namespace=NAMESPACE)
        with pytest.raises(helm.HelmError, match=r"needs mqtt.tls.enabled"):
            chart.render({"mqtt": {"tls": {"enabled": False}}}, name=RELEASE, namespace=NAMESPACE)


def test_broker_configuration_works_in_a_real_mosquitto(tmp_path: Path) -> None:
    """The shared agent login's rules (the chart without per-node identity)."""
    with run_chart_broker(tmp_path, variant="broker-shared-login") as chart_broker:
        _shared_login_rules(*chart_broker)


def _shared_login_rules(port: int, secrets: dict[str, str]) -> None:
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
        agent.publish(f"{base}/beat", b'{"seq": 1}')
        agent.publish(f"{base}/state", b"online")
        agent.publish(f"{base}/endpoint", b'{"port": 7471}')
        agent.publish(f"{base}/assignment", b'{"domain": "forged"}')  # refused by the ACL
        agent.publish("netval/v2/elsewhere", b"x")  # refused by the ACL
        seen = operator.subscribe("netval/#")
        assert seen == {
            f"{base}/assignment": b'{"domain": "zone-a"}',
            f"{base}/report": b"{}",
            f"{base}/beat": b'{"seq": 1}',
            f"{base}/state": b"online",
            f"{base}/endpoint": b'{"port": 7471}',
        }
        # Agents read assignments (their peers' endpoints inside: issue 24), not other
        # agents' endpoints or reports.
        agent.subscribe("netval/v1/roce-training-pool/+/assignment", wait=0)
        agent.subscribe("netval/v1/roce-training-pool/+/endpoint", wait=0)
        got = agent.subscribe("netval/v1/roce-training-pool/+/report")
        assert got == {f"{base}/assignment": b'{"domain": "zone-a"}'}
    finally:
        for client in clients:
            client.close()


def test_broker_password_file_is_private(tmp_path: Path) -> None:
    if not broker_kit.available():
        pytest.skip(broker_kit.MISSING_REASON)
    _, _, init, _ = _broker_parts("broker-shared-login")
    assert init is not None
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
        self.client.connect(secure(self.client), self.port, keepalive=60)
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


def _agent_publisher(port: int, password: str, username: str = "netval-operator") -> Any:
    """A publisher standing in for a fleet of agents (the broker's limits are what is measured,
    not who may publish: the default chart's per-node clients are tested in test_identity)."""
    import paho.mqtt.client as paho

    client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    client.username_pw_set(username, password)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    connected = threading.Event()
    client.on_connect = lambda *a: connected.set()
    client.connect(secure(client), port, keepalive=60)
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
    agent = _agent_publisher(port, secrets["operator"])
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
    agent = _agent_publisher(port, secrets["operator"])
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
    assert f"max_packet_size {MAX_REPORT_PACKET_BYTES}\n" in conf
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


# The limits are the same with either authentication; these clients log in with passwords.
LIMITS_VARIANT = "broker-shared-login"


def test_a_burst_reaches_slow_and_absent_subscribers(tmp_path: Path) -> None:
    with run_chart_broker(tmp_path, variant=LIMITS_VARIANT) as (port, secrets):
        start = time.monotonic()
        got = _burst(port, secrets)
        took = time.monotonic() - start
    print(f"chart limits: {BURST} QoS 1 burst -> {got} received in {took:.1f} s")
    assert got == {"away": BURST, "slow": BURST}


def test_a_resubscribing_operator_gets_every_retained_message(tmp_path: Path) -> None:
    with run_chart_broker(tmp_path, variant=LIMITS_VARIANT) as (port, secrets):
        got, took = _retained_replay(port, secrets)
    print(f"chart limits: {2 * RETAINED_NODES} retained -> {got} received in {took:.2f} s")
    assert got == 2 * RETAINED_NODES


def test_mosquitto_defaults_would_drop_both(tmp_path: Path) -> None:
    """The control: the same scenarios with Mosquitto's default per-client limits lose
    messages, so the tests above measure the chart's limits, not luck."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with run_chart_broker(tmp_path / "a", _mosquitto_defaults, LIMITS_VARIANT) as (port, secrets):
        burst = _burst(port, secrets)
    with run_chart_broker(tmp_path / "b", _mosquitto_defaults, LIMITS_VARIANT) as (port, secrets):
        replay, _ = _retained_replay(port, secrets)
    print(f"mosquitto defaults: burst -> {burst}, retained {2 * RETAINED_NODES} -> {replay}")
    assert burst["away"] < BURST and burst["slow"] < BURST
    assert replay < 2 * RETAINED_NODES


# --- TLS of the bundled broker -----------------------------------------------------------


def _netval_round_trip(settings: Any) -> bytes:
    import asyncio

    from netval.infra.mqtt_client import make_client

    async def main() -> bytes:
        async with make_client(
            settings, keepalive=10, timeout=5, tls_context=settings.ssl_context()
        ) as client:
            topic = "netval/v1/pool-a/gpu-node-1/state"
            await client.subscribe(topic, qos=1)
            await client.publish(topic, b"online", qos=1)
            async for message in client.messages:
                return bytes(message.payload)  # type: ignore[arg-type]
        raise AssertionError("no message")

    return asyncio.run(main())


def test_netval_clients_reach_the_chart_broker_over_verified_tls(tmp_path: Path) -> None:
    """The chart's TLS listener, certificate and CA in a real Mosquitto, reached by netval's
    own client built from the operator's rendered environment."""
    import dataclasses

    import aiomqtt

    from chart_kit import env_of as chart_env
    from chart_kit import operator_container

    env = chart_env(operator_container("default"))
    assert env["NETVAL_MQTT_URL"] == f"mqtts://{BROKER_HOST}:8883"
    assert env["NETVAL_AGENT_MQTT_URL"] == env["NETVAL_MQTT_URL"]
    assert env["NETVAL_AGENT_MQTT_CA_SECRET"] == "netval-mqtt-ca"
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text(rendered_ca())
    (tmp_path / "broker").mkdir()
    with run_chart_broker(tmp_path / "broker") as (port, secrets):
        env.update(
            NETVAL_MQTT_CA_FILE=str(ca_file),
            NETVAL_IDENTITY_CA_FILE=secrets["identity_ca"],
            NETVAL_IDENTITY_CA_KEY_FILE=secrets["identity_key"],
        )
        # the operator's own settings: its session shows a certificate it minted
        from netval.operator.settings import operator_settings_from_env

        env["NETVAL_NAMESPACE"] = NAMESPACE
        settings = dataclasses.replace(operator_settings_from_env(env).mqtt, port=port)
        assert settings.identity is not None and settings.username is None
        assert settings.tls and settings.host == BROKER_HOST
        assert _netval_round_trip(settings) == b"online"
        # the certificate names the Service, not an address: by IP, verification refuses it
        with pytest.raises(aiomqtt.MqttError, match=r"not valid for '127\.0\.0\.1'"):
            _netval_round_trip(dataclasses.replace(settings, host="127.0.0.1"))
        # and the listener speaks TLS only, with a certificate
        with pytest.raises(aiomqtt.MqttError):
            _netval_round_trip(
                dataclasses.replace(settings, tls=False, ca_file=None, identity=None)
            )
        with pytest.raises(aiomqtt.MqttError, match="does not accept this client's certificate"):
            _netval_round_trip(dataclasses.replace(settings, identity=None))


def _certificate(variant: str, secret: str) -> Any:
    from cryptography import x509

    data = one(variant, "Secret", secret)["data"]
    return x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"])), data


def test_chart_broker_certificate_names_the_service_and_chains_to_the_ca() -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    cert, data = _certificate("default", "netval-mqtt-tls")
    assert one("default", "Secret", "netval-mqtt-tls")["type"] == "kubernetes.io/tls"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    svc = "netval-mqtt"
    assert set(names.get_values_for_type(x509.DNSName)) == {
        svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc", f"{svc}.{NAMESPACE}.svc.cluster.local"
    }  # fmt: skip
    ca = x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"]))
    assert base64.b64decode(data["ca.crt"]).decode() == rendered_ca()
    assert cert.issuer == ca.subject
    public_key = ca.public_key()
    assert not isinstance(public_key, ec.EllipticCurvePublicKey)  # Sprig's genCA: RSA
    cert.verify_directly_issued_by(ca)


def test_tls_is_the_default_and_only_the_broker_mounts_its_key() -> None:
    from chart_kit import docs, notes

    conf = one("default", "ConfigMap", "netval-mqtt")["data"]["mosquitto.conf"]
    assert "listener 8883\nprotocol mqtt\n" in conf
    assert "\ncafile /mosquitto/identity/ca.crt\nrequire_certificate true\n" in conf
    assert "certfile /mosquitto/tls/tls.crt" in conf and "tls_version tlsv1.2" in conf
    assert conf.count("listener ") == 1  # no plaintext listener next to it
    (port,) = one("default", "Service", "netval-mqtt")["spec"]["ports"]
    assert port["port"] == 8883
    # The CA-only Secret holds no key; the key's Secret is mounted by the broker alone.
    assert set(one("default", "Secret", "netval-mqtt-ca")["data"]) == {"ca.crt"}
    mounting = [
        d["metadata"]["name"]
        for d in docs("default")
        if d["kind"] in ("Deployment", "DaemonSet", "Job")
        and any(
            (v.get("secret") or {}).get("secretName") == "netval-mqtt-tls"
            for v in d["spec"]["template"]["spec"].get("volumes", [])
        )
    ]
    assert mounting == ["netval-mqtt"]
    assert "PLAINTEXT" not in notes("default")
    # agents in their own namespace get the CA there, and only the CA
    cas = [s for s in docs("agents-namespace") if s["kind"] == "Secret"
           and s["metadata"]["name"] == "netval-mqtt-ca"]  # fmt: skip
    assert {s["metadata"]["namespace"] for s in cas} == {NAMESPACE, "netval-agents"}
    assert not [s for s in docs("agents-namespace") if s["metadata"]["name"] == "netval-mqtt-tls"
                and s["metadata"]["namespace"] != NAMESPACE]  # fmt: skip


def test_plaintext_only_when_asked_for_and_then_warned() -> None:
    from chart_kit import env_of as chart_env
    from chart_kit import find, notes, operator_container

    conf = one("broker-plaintext", "ConfigMap", "netval-mqtt")["data"]["mosquitto.conf"]
    assert "listener 1883\n" in conf and "/mosquitto/tls" not in conf
    assert not find("broker-plaintext", "Secret", "netval-mqtt-tls")
    assert not find("broker-plaintext", "Secret", "netval-mqtt-ca")
    env = chart_env(operator_container("broker-plaintext"))
    assert env["NETVAL_MQTT_URL"] == f"mqtt://{BROKER_HOST}:1883"
    assert "NETVAL_MQTT_CA_FILE" not in env and "NETVAL_AGENT_MQTT_CA_SECRET" not in env
    assert "WARNING: mqtt.tls.enabled=false" in notes("broker-plaintext")
    assert "PLAINTEXT" in notes("broker-plaintext")
    # an external broker reached in plaintext is warned about too
    external = render({"mqtt": {"external": {"enabled": True, "url": "mqtt://emqx.mqtt:1883"}}})
    assert (
        "WARNING: mqtt.external.url is mqtt:// (plaintext)"
        in external["netval/templates/NOTES.txt"]
    )
    assert "WARNING" not in notes("external-broker")  # mqtts://
    # The external broker's ACL: checked with the agents' login, or a warning that it is not.
    assert "checks it at start with the agents' login" in notes("external-broker")
    assert "WARNING: the broker's ACL is not checked" in external["netval/templates/NOTES.txt"]
    from chart_kit import VARIANTS

    disabled = {**VARIANTS["external-broker"]["mqtt"]["external"], "aclProbe": {"enabled": False}}
    off = render({"mqtt": {"external": disabled}})
    assert "WARNING: the broker's ACL is not checked" in off["netval/templates/NOTES.txt"]
    assert "NETVAL_ACL_PROBE" not in off["netval/templates/operator-deployment.yaml"]


def test_broker_certificate_from_cert_manager_or_the_users_secret() -> None:
    from chart_kit import env_of as chart_env
    from chart_kit import find, operator_container

    cert = one("broker-cert-manager", "Certificate", "netval-mqtt")["spec"]
    assert cert["secretName"] == "netval-mqtt-tls"
    assert cert["dnsNames"][2] == BROKER_HOST and cert["commonName"] == BROKER_HOST
    assert cert["issuerRef"] == {
        "name": "netval-mqtt-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert one("broker-cert-manager", "Issuer", "netval-mqtt-ca")["spec"] == {
        "ca": {"secretName": "netval-mqtt-issuer-ca"}
    }
    assert not find("broker-cert-manager", "Secret", "netval-mqtt-tls")  # cert-manager's
    env = chart_env(operator_container("broker-cert-manager"))
    assert env["NETVAL_AGENT_MQTT_CA_SECRET"] == "netval-mqtt-tls"  # ca.crt of it, same namespace

    # the user's Secret: nothing generated; agents elsewhere read their CA-only Secret
    assert not [d for d in find("broker-tls-existing", "Secret") if "mqtt-tls" in d["metadata"]["name"]
                or d["metadata"]["name"] == "netval-mqtt-ca"]  # fmt: skip
    deployment = one("broker-tls-existing", "Deployment", "netval-mqtt")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "corp-mqtt-tls"
    env = chart_env(operator_container("broker-tls-existing"))
    assert env["NETVAL_AGENT_MQTT_CA_SECRET"] == "corp-mqtt-ca"
    operator = one("broker-tls-existing", "Deployment", "netval-operator")["spec"]["template"]
    (ca_volume,) = [v for v in operator["spec"]["volumes"] if v["name"] == "mqtt-ca"]
    assert ca_volume["secret"] == {
        "secretName": "corp-mqtt-tls", "defaultMode": 0o444,
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }  # fmt: skip
    # agents in another namespace without their CA Secret: a clear render error
    with pytest.raises(Exception, match=r"mqtt\.tls\.agentCaSecret is required"):
        render({"agent": {"namespace": "netval-agents"},
                "mqtt": {"tls": {"certManager": {"enabled": True}}}})  # fmt: skip


def test_the_largest_legal_report_passes_and_a_bigger_packet_ends_only_its_sender(
    tmp_path: Path,
) -> None:
    """max_packet_size is the largest legal report's packet: a report of MAX_REPORT_BYTES on
    the longest topic, with a traceparent property (as the agent sends it, MQTT 5), reaches
    the operator; a bigger packet ends the session of its sender and of nobody else."""
    import paho.mqtt.client as paho
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from netval.model.topics import MAX_REPORT_BYTES, TopicKind
    from netval.model.topics import topic as report_topic

    with run_chart_broker(tmp_path, plaintext_listener, "broker-shared-login") as (port, secrets):
        clients: list[Any] = []
        got: dict[str, list[bytes]] = {}
        gone: dict[str, list[Any]] = {}

        def client(name: str) -> Any:
            c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=name,
                            protocol=paho.MQTTv5)  # fmt: skip
            c.username_pw_set("netval-operator", secrets["operator"])
            c.on_message = lambda _c, _u, m: got.setdefault(name, []).append(bytes(m.payload))
            c.on_disconnect = lambda _c, _u, _f, reason, _p: gone.setdefault(name, []).append(
                reason
            )
            c.connect("127.0.0.1", port, keepalive=30)
            c.loop_start()
            wait_for(c.is_connected, 10, what=f"{name} connected")
            clients.append(c)
            return c

        try:
            watcher, sender, bystander = client("watcher"), client("sender"), client("bystander")
            done = threading.Event()
            watcher.on_subscribe = lambda *a: done.set()
            watcher.subscribe("netval/v1/#", qos=1)
            assert done.wait(10)
            longest = report_topic("v" * 253, "n" * 253, TopicKind.REPORT)
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [("traceparent", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")]
            legal = b"x" * MAX_REPORT_BYTES
            sender.publish(longest, legal, qos=1, properties=props).wait_for_publish(10)
            wait_for(lambda: legal in got.get("watcher", []), 20, what="the largest report")
            sender.publish(longest, legal + b"x" * 8192, qos=1, properties=props)
            wait_for(lambda: gone.get("sender"), 20, what="the oversize sender disconnected")
            bystander.publish("netval/v1/pool/node/state", b"online", qos=1).wait_for_publish(10)
            wait_for(lambda: b"online" in got.get("watcher", []), 20, what="others unaffected")
            assert "watcher" not in gone and "bystander" not in gone
            assert len(got["watcher"]) == 2  # the oversize one never reached anyone
        finally:
            for c in clients:
                c.loop_stop()
                c.disconnect()
