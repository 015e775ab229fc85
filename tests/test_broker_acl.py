"""The broker ACL probe (netval.infra.broker_acl) and the operator's start check, against a
real Mosquitto: one that enforces netval's per-node ACL and one that does not; the check in
real `netval operator` processes without per-node identity (an external broker)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import mosquitto
from kube import wait_for
from netval.infra.broker_acl import (
    PROBE_KINDS,
    PROBE_NODE,
    PROBE_VALIDATION,
    AclProbe,
    AclVerdict,
    Outcome,
    probe_node_topics,
)
from netval.infra.mqtt_settings import MqttSettings
from netval.operator.broker_check import BrokerAclCheck

pytestmark = pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)

OPERATOR = ("netval-operator", "op-pw")
NODE_A = ("gpu-a", "a-pw")
METRIC_LINE = "netval_broker_acl_violations"

# docs/operations.md "Broker ACL", in Mosquitto's syntax: the operator reads all and writes
# assignments; a node writes its own report/state/endpoint and reads its assignment (which
# carries its peers' endpoints).
NETVAL_ACL = """\
user netval-operator
topic read netval/#
topic write netval/v1/+/+/assignment

pattern write netval/v1/+/%u/report
pattern readwrite netval/v1/+/%u/state
pattern write netval/v1/+/%u/endpoint
pattern read netval/v1/+/%u/assignment
"""
# What a broker without per-node rules amounts to (and the chart's ACL before issue 13):
# every netval identity may write every netval topic.
PERMISSIVE_ACL = "user netval-operator\ntopic readwrite netval/#\n\npattern readwrite netval/#\n"


def broker_with(workdir: Path, acl: str) -> mosquitto.MosquittoBroker:
    workdir.mkdir()
    broker = mosquitto.MosquittoBroker(workdir, username=OPERATOR[0], password=OPERATOR[1])
    subprocess.run(
        [str(mosquitto.MOSQUITTO_PASSWD), "-b", str(workdir / "passwd"), *NODE_A],
        check=True,
        capture_output=True,
        timeout=10,
    )
    (workdir / "acl").write_text(acl)
    broker.config.write_text(broker.config.read_text() + f"acl_file {workdir / 'acl'}\n")
    broker.start()
    return broker


@pytest.fixture
def enforcing(tmp_path: Path) -> Iterator[mosquitto.MosquittoBroker]:
    broker = broker_with(tmp_path / "enforcing", NETVAL_ACL)
    yield broker
    broker.close()


@pytest.fixture
def permissive(tmp_path: Path) -> Iterator[mosquitto.MosquittoBroker]:
    broker = broker_with(tmp_path / "permissive", PERMISSIVE_ACL)
    yield broker
    broker.close()


def as_(broker: mosquitto.MosquittoBroker, who: tuple[str, str]) -> MqttSettings:
    return MqttSettings(
        host=broker.host, port=broker.port, username=who[0], password=who[1], client_id=who[0]
    )


def test_an_enforcing_broker_refuses_every_probe(enforcing: mosquitto.MosquittoBroker) -> None:
    for who in (OPERATOR, NODE_A):
        probe = probe_node_topics(as_(enforcing, who), None, timeout=5)
        assert probe.error is None
        assert len(probe.outcomes) == len(PROBE_KINDS)
        assert set(probe.outcomes.values()) == {Outcome.REFUSED}, (who, probe.outcomes)
        assert probe.violations == [] and probe.verdict is AclVerdict.ENFORCED
    # a control: the probe does see what a node may do on its own topics
    own = probe_node_topics(as_(enforcing, NODE_A), None, node="gpu-a", timeout=5)
    assert set(own.outcomes.values()) == {Outcome.ACCEPTED}
    # and another node's topics are refused to node A
    other = probe_node_topics(as_(enforcing, NODE_A), None, node="gpu-b", timeout=5)
    assert other.violations == []


def test_a_permissive_broker_is_caught(permissive: mosquitto.MosquittoBroker) -> None:
    for who in (OPERATOR, NODE_A):
        probe = probe_node_topics(as_(permissive, who), None, timeout=5)
        assert probe.error is None
        assert sorted(t.rsplit("/", 1)[1] for t in probe.violations) == sorted(PROBE_KINDS)
        assert probe.verdict is AclVerdict.VIOLATED


def test_probe_errors_are_reported_not_raised(enforcing: mosquitto.MosquittoBroker) -> None:
    wrong = probe_node_topics(as_(enforcing, (OPERATOR[0], "wrong")), None, timeout=5)
    assert wrong.error is not None and "refused" in wrong.error and not wrong.outcomes
    port = mosquitto.free_port()
    closed = probe_node_topics(MqttSettings(host="127.0.0.1", port=port), None, timeout=2)
    assert closed.error is not None and "cannot connect" in closed.error
    assert wrong.verdict is closed.verdict is AclVerdict.UNCHECKED


def test_a_probe_without_every_acknowledgement_is_not_called_enforced() -> None:
    topics = [f"netval/v1/{PROBE_VALIDATION}/{PROBE_NODE}/{k}" for k in PROBE_KINDS]
    late = AclProbe(
        "gpu-a", dict(zip(topics, [Outcome.REFUSED, Outcome.UNKNOWN, Outcome.REFUSED], strict=True))
    )
    assert late.verdict is AclVerdict.UNCONFIRMED and late.unacknowledged == [topics[1]]
    taken = AclProbe(
        "gpu-a",
        dict(zip(topics, [Outcome.UNKNOWN, Outcome.ACCEPTED, Outcome.REFUSED], strict=True)),
    )
    assert taken.verdict is AclVerdict.VIOLATED  # one publish taken outweighs a missing ack


def _gauge(registry: CollectorRegistry) -> str:
    lines = generate_latest(registry).decode().splitlines()
    return "\n".join(line for line in lines if "netval_broker_acl_violations" in line)


def test_operator_start_check_logs_and_exports_violations(
    permissive: mosquitto.MosquittoBroker,
    enforcing: mosquitto.MosquittoBroker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="netval.operator.broker_check")

    async def main() -> tuple[str, str, str]:
        registries = [CollectorRegistry() for _ in range(3)]
        checks = [
            BrokerAclCheck(as_(permissive, OPERATOR)),
            BrokerAclCheck(as_(enforcing, OPERATOR)),
            BrokerAclCheck(as_(enforcing, (OPERATOR[0], "wrong"))),
        ]
        for check, registry in zip(checks, registries, strict=True):
            registry.register(check)
        assert _gauge(registries[0]) == ""  # absent until the check has run
        async with asyncio.timeout(20):
            await asyncio.gather(*(c.run() for c in checks))
        return _gauge(registries[0]), _gauge(registries[1]), _gauge(registries[2])

    bad, good, failed = asyncio.run(main())
    assert "netval_broker_acl_violations 3.0" in bad
    assert "netval_broker_acl_violations 0.0" in good
    assert "netval_broker_acl_violations " not in failed.replace("# ", "")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3 and all("does not enforce netval's ACL" in e for e in errors)
    assert any("could not run" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("acl", ["permissive", "enforcing"])
def test_the_operator_process_probes_with_the_agents_login_without_per_node_identity(
    acl: str, request: pytest.FixtureRequest, kube: Any, tmp_path: Path
) -> None:
    """`netval operator` (the real process, leading) with an external broker and the agents'
    login as probe credential (what the chart sets): its /metrics and log tell whether that
    login may speak for another node."""
    from operator_processes import FAST_LEASE, OperatorProc

    broker: mosquitto.MosquittoBroker = request.getfixturevalue(acl)
    kube.ensure_namespace("netval-system")
    password = tmp_path / "agent-password"
    password.write_text(NODE_A[1] + "\n")
    env = {**FAST_LEASE, "NETVAL_ACL_PROBE_USERNAME": NODE_A[0],
           "NETVAL_ACL_PROBE_PASSWORD_FILE": str(password)}  # fmt: skip
    proc = OperatorProc(kube, broker, tmp_path / "op", "op-a", env=env).start()
    try:

        def gauge() -> str | None:
            try:
                url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                return None
            lines = [line for line in text.splitlines() if line.startswith(METRIC_LINE)]
            return lines[0] if lines else None

        line = wait_for(gauge, 60, what="the broker ACL start check on /metrics")
        if acl == "permissive":
            assert line == f"{METRIC_LINE} 3.0"
            assert "broker ACL: identity 'gpu-a' may publish to" in proc.log()
        else:
            assert line == f"{METRIC_LINE} 0.0"
            assert "cannot publish for a node (enforced)" in proc.log()
    finally:
        assert proc.terminate() == 0


def test_the_operator_says_the_acl_is_unchecked_without_a_probe_login(
    enforcing: mosquitto.MosquittoBroker, kube: Any, tmp_path: Path
) -> None:
    from operator_processes import FAST_LEASE, OperatorProc

    kube.ensure_namespace("netval-system")
    proc = OperatorProc(kube, enforcing, tmp_path / "op", "op-a", env=FAST_LEASE).start()
    try:
        wait_for(lambda: "broker ACL not checked" in proc.log(), 60, what="the warning")
    finally:
        assert proc.terminate() == 0
