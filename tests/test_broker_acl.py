"""The broker ACL probe (netval.infra.broker_acl) and the operator's start check, against a
real Mosquitto: one that enforces netval's per-node ACL and one that does not."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import mosquitto
from netval.infra.broker_acl import PROBE_KINDS, Outcome, probe_node_topics
from netval.infra.mqtt_settings import MqttSettings
from netval.operator.broker_check import BrokerAclCheck

pytestmark = pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)

OPERATOR = ("netval-operator", "op-pw")
NODE_A = ("gpu-a", "a-pw")

# docs/operations.md "Broker ACL", in Mosquitto's syntax: the operator reads all and writes
# assignments; a node writes its own report/state/endpoint, reads its assignment and peers'
# endpoints.
NETVAL_ACL = """\
user netval-operator
topic read netval/#
topic write netval/v1/+/+/assignment

pattern write netval/v1/+/%u/report
pattern readwrite netval/v1/+/%u/state
pattern write netval/v1/+/%u/endpoint
pattern read netval/v1/+/%u/assignment
pattern read netval/v1/+/+/endpoint
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
        assert probe.violations == []
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


def test_probe_errors_are_reported_not_raised(enforcing: mosquitto.MosquittoBroker) -> None:
    wrong = probe_node_topics(as_(enforcing, (OPERATOR[0], "wrong")), None, timeout=5)
    assert wrong.error is not None and "refused" in wrong.error and not wrong.outcomes
    port = mosquitto.free_port()
    closed = probe_node_topics(MqttSettings(host="127.0.0.1", port=port), None, timeout=2)
    assert closed.error is not None and "cannot connect" in closed.error


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
