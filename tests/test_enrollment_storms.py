"""Per-node identity through the real processes: `netval operator` (serving enrollment,
its own session by a certificate it mints), three `netval agent` processes, each with its
own pod token, and the chart's Mosquitto requiring client certificates, SIGKILLed under them
and started again with its data kept (a restarted container) or emptied (a new pod).

The broker holds no per-client state: either way every agent comes back with the
certificate it holds, and nobody enrolls again. Only a broker that refuses a certificate
(expired, another CA) makes an agent enroll again (tests/test_enrollment.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from identity_kit import BrokerRestarts, IdentityBrokerLogin, Mqtt, agent_pod, minted_context
from kube import KubeCluster, wait_for
from mosquitto import free_port
from netval.model.identity import OBSERVER_IDENTITY, node_identity
from netval.operator.kube import certs
from operator_env import GPU, NS, add_node, status_of, validation
from operator_processes import OperatorProc
from test_agent import LO_CHECKS, VALIDATION, agent_config, netval_script, stop_process
from test_chart_broker import run_chart_broker
from test_enrollment import Claims, TokenAuthority

NODES = ("gpu-a", "gpu-b", "gpu-c")


def _metric(text: str, name: str) -> float:
    total = 0.0
    for match in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M):
        total += float(match.group(1))
    return total


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


class Fleet:
    def __init__(self, tmp_path: Path, kube: KubeCluster, port: int, secrets: dict[str, str]):
        self.tmp_path, self.kube, self.port = tmp_path, kube, port
        kube.ensure_namespace(NS)
        authority = TokenAuthority()
        kube.api.token_reviewer = authority.review
        tls = certs.generate_self_signed(tmp_path / "enroll-tls", ["127.0.0.1"])
        enroll_port = free_port()
        env = {
            "NETVAL_ENROLL_ADDR": f"127.0.0.1:{enroll_port}",
            "NETVAL_ENROLL_CERT_FILE": str(tls.cert), "NETVAL_ENROLL_KEY_FILE": str(tls.key),
            "NETVAL_ENROLL_CA_BUNDLE_FILE": str(tls.ca),
        }  # fmt: skip
        login = IdentityBrokerLogin(port, secrets)
        self.operator = OperatorProc(kube, login, tmp_path / "op", "op", standalone=True,
                                     env={**env, **login.env})  # fmt: skip
        self.secrets = secrets
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.metrics_ports: dict[str, int] = {}
        config = tmp_path / "agent.yaml"
        config.write_text(yaml.safe_dump(agent_config(LO_CHECKS, interval="5s")))
        self.agent_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NETVAL_CONFIG": str(config),
            "NETVAL_MQTT_URL": f"mqtts://127.0.0.1:{port}",
            "NETVAL_MQTT_CA_FILE": secrets["broker_ca"],
            "NETVAL_ENROLL_URL": f"https://127.0.0.1:{enroll_port}/v1/enroll",
            "NETVAL_ENROLL_CA_FILE": str(tls.ca),
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        }  # fmt: skip
        # the validation the agents report for: the leader gives each node's role its topics
        kube.create(validation(VALIDATION))
        self.tokens: dict[str, Path] = {}
        for node in NODES:
            add_node(kube, node, GPU)
            pod = agent_pod(kube, f"agent-{node}", node, NS, validation=VALIDATION)
            self.tokens[node] = tmp_path / f"token-{node}"
            self.tokens[node].write_text(
                authority.mint(Claims(f"agent-{node}", pod["metadata"]["uid"], node))
            )

    def start(self) -> None:
        self.operator.start()
        for node in NODES:
            self.metrics_ports[node] = free_port()
            env = {**self.agent_env, "NETVAL_NODE_NAME": node,
                   "NETVAL_ENROLL_TOKEN_FILE": str(self.tokens[node]),
                   "NETVAL_METRICS_ADDR": f"127.0.0.1:{self.metrics_ports[node]}"}  # fmt: skip
            with (self.tmp_path / f"agent-{node}.log").open("ab") as log:
                self.agents[node] = subprocess.Popen(
                    [netval_script(), "agent"], env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )  # fmt: skip

    def agent(self, node: str, name: str) -> float:
        return _metric(_scrape(self.metrics_ports[node]), name)

    def issued(self) -> float:
        text = _scrape(self.operator.metrics_port)
        return _metric(text, r'netval_operator_enrollments_total\{outcome="issued"\}')

    def requests(self) -> float:
        return _metric(_scrape(self.operator.metrics_port), "netval_operator_enrollments_total")

    def client(self, identity: str, **kw: object) -> Mqtt:
        return Mqtt(self.port, None, None, tls=minted_context(self.secrets, identity), **kw)  # type: ignore[arg-type]

    def all_connected(self) -> bool:
        return all(self.agent(n, "netval_mqtt_connected") == 1 for n in NODES)

    def close(self) -> None:
        for proc in self.agents.values():
            stop_process(proc, 10)
        self.operator.terminate()

    def logs(self) -> str:
        return (
            "\n".join(
                f"--- {n}\n"
                + (self.tmp_path / f"agent-{n}.log").read_text(errors="replace")[-2000:]
                for n in NODES
            )
            + "\n--- operator\n"
            + self.operator.log()[-3000:]
        )


@pytest.fixture
def fleet(tmp_path: Path, kube: KubeCluster) -> Iterator[tuple[Fleet, BrokerRestarts]]:
    (tmp_path / "broker").mkdir()
    with run_chart_broker(tmp_path / "broker", by_address=True) as (port, secrets):
        restarts = BrokerRestarts(tmp_path / "broker", port)
        f = Fleet(tmp_path, kube, port, secrets)
        try:
            f.start()
            yield f, restarts
        finally:
            f.close()
            restarts.close()
        assert "Traceback" not in f.logs(), f.logs()


@pytest.mark.parametrize("pod", ["restarted container", "new empty pod"])
def test_a_broker_replaced_takes_every_agent_back_without_enrolling_again(
    fleet: tuple[Fleet, BrokerRestarts], pod: str
) -> None:
    f, broker = fleet
    wait_for(f.all_connected, 60, what="every agent connected")
    assert f.issued() == len(NODES)
    requests = f.requests()
    for node in NODES:
        assert f.agent(node, "netval_enrolled") == 1
    before = {n: f.agent(n, "netval_mqtt_reconnects_total") for n in NODES}
    broker.kill()
    # Down until every agent failed to connect twice.
    wait_for(
        lambda: all(f.agent(n, "netval_mqtt_reconnects_total") >= before[n] + 2 for n in NODES),
        60, what="every agent failing to reconnect",
    )  # fmt: skip
    assert all(f.agent(n, "netval_mqtt_connected") == 0 for n in NODES)
    broker.start(empty=pod == "new empty pod")
    wait_for(f.all_connected, 60, what="every session restored")
    # Held: each agent publishes again on the restored session (an operator-side subscriber
    # sees a new report or beat from each: a second message on either topic, as the broker
    # retains one of each), and nobody asked for a certificate meanwhile.
    op = f.client(OBSERVER_IDENTITY)
    topic = f"netval/v1/{VALIDATION}"

    def published_again(node: str) -> bool:
        return any(len(op.received(f"{topic}/{node}/{k}")) >= 2 for k in ("report", "beat"))

    try:
        assert not op.connect().is_failure
        op.subscribe(f"{topic}/+/report", f"{topic}/+/beat")
        for node in NODES:
            wait_for(lambda n=node: published_again(n), 30,
                     what=f"fresh reports or beats from {node}")  # fmt: skip
    finally:
        op.close()
    assert f.all_connected()
    assert f.issued() == len(NODES) and f.requests() == requests
    assert sum(f.agent(n, "netval_enrollments_total") for n in NODES) == len(NODES)
    assert sum(f.agent(n, "netval_mqtt_credential_refusals_total") for n in NODES) == 0
    for node in NODES:
        assert f.agent(node, "netval_enrolled") == 1


def test_forged_beats_endpoints_and_wills_from_another_identity_are_refused(
    fleet: tuple[Fleet, BrokerRestarts],
) -> None:
    """Another node's identity (its certificate, as an attacker with root on gpu-x holds
    it; gpu-x runs no agent here, or the two sessions would end each other: the broker binds
    the client id to the identity) publishes a beat contradicting gpu-b's report, an
    endpoint claiming gpu-b, and leaves a last will `offline` on gpu-b's state: the broker
    delivers none of them, and the operator keeps counting gpu-b fresh and reporting."""
    f, _ = fleet
    wait_for(f.all_connected, 60, what="every agent connected")
    topic = f"netval/v1/{VALIDATION}"
    wait_for(lambda: (status_of(f.kube, VALIDATION).get("nodes") or {}).get("reporting") == 3,
             60, what="three nodes reporting")  # fmt: skip
    watcher = f.client(OBSERVER_IDENTITY)
    assert not watcher.connect().is_failure
    watcher.subscribe(f"{topic}/gpu-b/#", f"{topic}/gpu-x/state")
    forger = f.client(node_identity(VALIDATION, "gpu-x"),
                      will=(f"{topic}/gpu-b/state", b"offline"))  # fmt: skip
    try:
        assert not forger.connect().is_failure
        forged_beat = b'{"schema":1,"seq":99,"cycleAt":"2026-12-07T00:00:00Z","digest":"' + (
            b"0" * 32 + b'","worst":"fail"}'
        )
        forger.publish(f"{topic}/gpu-b/beat", forged_beat)
        forger.publish(f"{topic}/gpu-b/endpoint", b'{"address":"10.0.0.1","port":7471}')
        forger.publish(f"{topic}/gpu-b/report", b"{}")
        forger.drop()  # the will fires, for gpu-b's state
        # the fence: gpu-x's own state, published by its identity after all of that
        fence = f.client(node_identity(VALIDATION, "gpu-x"))
        assert not fence.connect().is_failure
        fence.publish(f"{topic}/gpu-x/state", b"fence")
        watcher.wait_message(f"{topic}/gpu-x/state", b"fence")
        fence.close()
        got = {t: p for t, p in watcher.messages}
        assert forged_beat not in got.values() and b"offline" not in [
            p for t, p in watcher.messages if t == f"{topic}/gpu-b/state"
        ]
        assert all(b"10.0.0.1" not in p for _, p in watcher.messages)
        nodes = status_of(f.kube, VALIDATION).get("nodes") or {}
        assert nodes.get("reporting") == 3 and nodes.get("stale", 0) == 0
    finally:
        watcher.close()


def test_an_agent_waiting_for_enrollment_is_alive_and_says_so(tmp_path: Path) -> None:
    """The enrollment server is down (nothing listens): the agent is alive for its liveness
    probe ("enrolling"), not enrolled, and retrying; it never reaches the broker."""
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(agent_config(LO_CHECKS, interval="5s")))
    token = tmp_path / "token"
    token.write_text("x.y.z")
    metrics_port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NETVAL_CONFIG": str(config),
        "NETVAL_NODE_NAME": "gpu-a", "NETVAL_MQTT_URL": f"mqtt://127.0.0.1:{free_port()}",
        "NETVAL_ENROLL_URL": f"https://127.0.0.1:{free_port()}/v1/enroll",
        "NETVAL_ENROLL_TOKEN_FILE": str(token),
        "NETVAL_METRICS_ADDR": f"127.0.0.1:{metrics_port}",
        **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
    }  # fmt: skip
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([netval_script(), "agent"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    try:

        def health() -> tuple[int, str] | None:
            try:
                url = f"http://127.0.0.1:{metrics_port}/healthz"
                with urllib.request.urlopen(url, timeout=5) as response:
                    return response.status, response.read().decode().strip()
            except OSError:
                return None

        assert wait_for(health, 30, what="/healthz") == (200, "enrolling")
        wait_for(lambda: _metric(_scrape(metrics_port), "netval_enrollment_failures_total") >= 2,
                 30, what="enrollment retried")  # fmt: skip
        text = _scrape(metrics_port)
        assert _metric(text, "netval_enrolled") == 0 and _metric(text, "netval_enrolling") == 1
        assert health() == (200, "enrolling") and proc.poll() is None
    finally:
        stop_process(proc, 10)
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    ("rc", "refused"),
    [(0x86, True), (0x87, True), (0x88, False), (0x80, False), (0x9C, False),
     (4, True), (5, True), (3, False), (2, False)],
)  # fmt: skip
def test_only_a_connack_refusing_the_credential_counts(rc: int, refused: bool) -> None:
    from aiomqtt.exceptions import MqttConnectError, MqttError
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    from netval.agent.refusal import credential_refused

    error = MqttConnectError(ReasonCode(PacketTypes.CONNACK, identifier=rc) if rc > 5 else rc)
    assert credential_refused(error) is refused
    assert not credential_refused(MqttError("[Errno 111] Connection refused"))
    assert not credential_refused(TimeoutError())


def test_refused_publishes_ask_for_a_new_credential_after_the_grace_and_once() -> None:
    from netval.agent.refusal import PublishRefusals

    now = [0.0]
    rule = PublishRefusals(grace=300.0, clock=lambda: now[0])
    login = (None, None, b"cert-a")
    rule.refused(0x97, login)  # quota exceeded: counted, not the credential's fault
    rule.refused(0x87, login)
    now[0] = 299.0
    rule.refused(0x87, login)
    assert not rule.asks(login) and rule.credential_refusals == 0  # a role being updated
    now[0] = 300.0
    rule.refused(0x86, login)
    assert rule.asks(login) and not rule.asks((None, None, b"cert-b"))
    assert (rule.refusals, rule.credential_refusals) == (4, 1)
    new = (None, None, b"cert-a2")  # the new credential is refused as well: no second ask
    now[0] = 1000.0
    rule.refused(0x87, new)
    assert not rule.asks(new) and rule.credential_refusals == 1
    rule.taken()  # a publish taken: the next lasting refusal asks again
    rule.refused(0x87, new)
    now[0] = 1300.0
    rule.refused(0x87, new)
    assert rule.asks(new) and rule.credential_refusals == 2
