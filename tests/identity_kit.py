"""Shared parts of the per-node identity tests (test_identity.py, test_enrollment.py) and of
bench/identity_scale.py: an asyncio loop in a thread (the operator's async parts, driven from a
sync test), and a paho MQTT client that records what it receives and how its connection
ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kube import wait_for

T = TypeVar("T")


class LoopThread:
    """An event loop in its own thread; `run(coro)` waits (bounded) for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Any, *args: Any) -> Any:
        async def call() -> Any:
            return fn(*args)

        return self.run(call())

    def close(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Mqtt:
    """A paho MQTT 3.1.1 client: `connect()` returns the CONNACK reason; `messages` holds
    every (topic, payload) received in order; `disconnects` the reasons of lost connections."""

    def __init__(
        self,
        port: int,
        username: str | None,
        password: str | None,
        *,
        client_id: str = "",
        will: tuple[str, bytes] | None = None,
        tls: Any = None,
        host: str = "127.0.0.1",
    ) -> None:
        import paho.mqtt.client as paho

        self.messages: list[tuple[str, bytes]] = []
        self.connacks: list[Any] = []
        self.disconnects: list[Any] = []
        self.lock = threading.Lock()
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        if tls is not None:  # an ssl.SSLContext (a client certificate in it: per-node identity)
            self.client.tls_set_context(tls)
        if will is not None:
            self.client.will_set(will[0], will[1], qos=1, retain=True)
        self.client.on_connect = lambda c, u, f, reason, p: self.connacks.append(reason)
        self.client.on_disconnect = lambda c, u, f, reason, p: self.disconnects.append(reason)
        self.client.on_message = self._on_message
        self.port = port
        self.host = host

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self.lock:
            self.messages.append((message.topic, bytes(message.payload)))

    def connect(self) -> Any:
        self.client.connect(self.host, self.port, keepalive=30)
        self.client.loop_start()
        return wait_for(lambda: self.connacks[-1] if self.connacks else None, 10, what="CONNACK")

    def connect_fails(self, timeout: float = 10.0) -> bool:
        """A connect the broker refuses: a failure CONNACK, or (a certificate it does not
        accept) a connection lost before any CONNACK."""
        try:
            self.client.connect(self.host, self.port, keepalive=30)
        except OSError:
            return True
        self.client.loop_start()
        wait_for(lambda: self.connacks or self.disconnects, timeout, what="CONNACK or close")
        return not self.connacks or self.connacks[-1].is_failure

    @property
    def accepted(self) -> bool:
        return bool(self.connacks) and not self.connacks[-1].is_failure

    def subscribe(self, *filters: str) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *a: done.set()
        self.client.subscribe([(f, 1) for f in filters])
        assert done.wait(10), "no SUBACK"

    def publish(self, topic: str, payload: bytes, *, retain: bool = True) -> None:
        """QoS 1: returns once the broker acknowledged it (Mosquitto acknowledges an
        unauthorised publish too and drops it: check delivery at a subscriber)."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(10)

    def received(self, topic: str) -> list[bytes]:
        with self.lock:
            return [p for t, p in self.messages if t == topic]

    def topics(self) -> set[str]:
        with self.lock:
            return {t for t, _ in self.messages}

    def wait_message(self, topic: str, payload: bytes, timeout: float = 10.0) -> None:
        wait_for(lambda: payload in self.received(topic), timeout, what=f"{topic} {payload!r}")

    def drop(self) -> None:
        """Lose the connection without DISCONNECT (as a SIGKILL would): the will fires."""
        sock = self.client.socket()
        self.client.loop_stop()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # already closed by the broker
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class BrokerRestarts:
    """SIGKILL and restart of the Mosquitto `test_chart_broker.run_chart_broker` started in
    `workdir` (same configuration and port; `start(empty=True)`: its data directory emptied
    first, a new broker pod). Restarted processes are this object's to stop (`close`)."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        self.port = port
        self.procs: list[subprocess.Popen[bytes]] = []

    def _pid(self) -> int:
        needle = str(self.conf).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and cmd and cmd[0].endswith(b"mosquitto") and needle in cmd:
                return int(entry.name)
        raise AssertionError(f"no mosquitto runs with {self.conf}")

    def kill(self) -> None:
        os.kill(self._pid(), signal.SIGKILL)
        wait_for(lambda: not _listening(self.port), 10, what="the broker gone")

    def start(self, *, empty: bool = False) -> None:
        if empty:  # a new pod: its emptyDir (retained messages, persistence) starts empty
            data = self.conf.parent / "data"
            for path in data.iterdir() if data.is_dir() else ():
                path.unlink()
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                [str(_mosquitto_binary()), "-c", str(self.conf)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.procs.append(proc)
        wait_for(lambda: _listening(self.port), 10, what="the restarted broker listening")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _mosquitto_binary() -> Path:
    import mosquitto

    assert mosquitto.MOSQUITTO, mosquitto.MISSING_REASON
    return Path(mosquitto.MOSQUITTO)


AGENT_LABELS = {
    "app.kubernetes.io/name": "netval-agent",
    "app.kubernetes.io/managed-by": "netval-operator",
}


def agent_daemonset(kube: Any, namespace: str, validation: str = "pool") -> dict[str, Any]:
    """The agents' DaemonSet of `validation` as the operator renders it (labels, the
    NetworkValidation as its controller: the validation its pods' certificates are for),
    created once per namespace and validation; the controller reference its pods carry."""
    name = f"netval-agent-{validation}"
    found = [
        d for d in kube.list("apps/v1", "daemonsets", namespace) if d["metadata"]["name"] == name
    ]
    ds = found[0] if found else kube.create({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": AGENT_LABELS,
                     "ownerReferences": [{"apiVersion": "netval.io/v1alpha1",
                                          "kind": "NetworkValidation", "name": validation,
                                          "uid": f"nv-uid-{validation}", "controller": True}]},
        "spec": {"selector": {"matchLabels": AGENT_LABELS},
                 "template": {"metadata": {"labels": AGENT_LABELS},
                              "spec": {"containers": [{"name": "agent", "image": "netval"}]}}},
    })  # fmt: skip
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
            "uid": ds["metadata"]["uid"], "controller": True}  # fmt: skip


def agent_pod(
    kube: Any,
    name: str,
    node: str,
    namespace: str,
    *,
    labels: dict[str, str] | None = None,
    service_account: str = "netval-agent",
    owner: dict[str, Any] | None = None,
    validation: str = "pool",
) -> dict[str, Any]:
    """An agent Pod of `validation`'s DaemonSet (`owner`: another controller reference)."""
    return dict(kube.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": AGENT_LABELS if labels is None else labels,
                     "ownerReferences": [owner or agent_daemonset(kube, namespace, validation)]},
        "spec": {"nodeName": node, "serviceAccountName": service_account,
                 "containers": [{"name": "agent", "image": "netval"}]},
    }))  # fmt: skip


@dataclass
class IdentityBrokerLogin:
    """What `operator_processes.OperatorProc` needs of the chart's broker with per-node
    identity: no login (the operator mints its certificate), and the environment that says
    so (`env`: TLS to the broker by address, the identity CA)."""

    port: int
    secrets: dict[str, str]
    host: str = "127.0.0.1"
    username: str = ""
    password: str = ""

    @property
    def env(self) -> dict[str, str]:
        return {
            "NETVAL_MQTT_URL": f"mqtts://127.0.0.1:{self.port}",
            "NETVAL_MQTT_CA_FILE": self.secrets["broker_ca"],
            "NETVAL_MQTT_USERNAME": "",
            "NETVAL_MQTT_PASSWORD_FILE": "",
            "NETVAL_IDENTITY_CA_FILE": self.secrets["identity_ca"],
            "NETVAL_IDENTITY_CA_KEY_FILE": self.secrets["identity_key"],
        }


def minted_context(secrets: dict[str, str], identity: str) -> Any:
    """A TLS client context for the chart's broker by address, showing a certificate for
    `identity` minted by its identity CA."""
    from netval.infra.mqtt_settings import MqttSettings
    from netval.operator.identity.authority import IdentityAuthority, MintedIdentity

    ca = IdentityAuthority.from_files(Path(secrets["identity_ca"]), Path(secrets["identity_key"]))
    settings = MqttSettings("127.0.0.1", 1, tls=True, ca_file=Path(secrets["broker_ca"]),
                            identity=MintedIdentity(ca, identity))  # fmt: skip
    return settings.ssl_context()
