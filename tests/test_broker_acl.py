"""The broker ACL probe (netval.infra.broker_acl) and the operator's start check, against a
real Mosquitto with password logins: one that enforces netval's per-node ACL and one that
does not; the check in real `netval operator` processes without per-node identity (an
external broker), and the hold it puts on gating. (Per-node identity, certificates on the
chart's broker: tests/test_identity.py.)"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import mosquitto
from fleet_sim import Agents, add_nodes
from kube import wait_for
from netval.infra.broker_acl import (
    PROBE_VALIDATION,
    PUBLISH_KINDS,
    READ_KINDS,
    AclProbe,
    AclVerdict,
    Outcome,
    probe_broker_acl,
)
from netval.infra.mqtt_settings import MqttSettings
from netval.model.ids import Status
from netval.operator.broker_check import AclHold, BrokerAclCheck

pytestmark = pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)

OPERATOR = ("netval-operator", "op-pw")
NODE_A = ("gpu-a", "a-pw")
METRIC_LINE = "netval_broker_acl_violations"
EVERY_KIND = (
    {f"publish {k}" for k in PUBLISH_KINDS} | {f"read {k}" for k in READ_KINDS} | {"will state"}
)

# docs/operations.md "Broker ACL", in Mosquitto's syntax with the node's login as its user
# name: the operator reads all and writes assignments and plans; a node writes its own
# report/beat/state/endpoint/loadresult and reads its own assignment and plan.
NETVAL_ACL = """\
user netval-operator
topic read netval/#
topic write netval/v1/+/+/assignment
topic write netval/v1/+/+/loadplan

pattern write netval/v1/+/%u/report
pattern write netval/v1/+/%u/beat
pattern readwrite netval/v1/+/%u/state
pattern write netval/v1/+/%u/endpoint
pattern write netval/v1/+/%u/loadresult
pattern read netval/v1/+/%u/assignment
pattern read netval/v1/+/%u/loadplan
"""
# What a broker without per-node rules amounts to: every identity may do anything under
# netval/ (one shared login for every agent, as the external-broker path had it).
PERMISSIVE_ACL = "user netval-operator\ntopic readwrite netval/#\n\npattern readwrite netval/#\n"
OWN = (PROBE_VALIDATION, NODE_A[0])  # node A's own topics: the probe's fences


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


def as_(
    broker: mosquitto.MosquittoBroker, who: tuple[str, str], protocol: str = "5"
) -> MqttSettings:
    return MqttSettings(host=broker.host, port=broker.port, username=who[0], password=who[1],
                        client_id=who[0], protocol=protocol)  # fmt: skip


def probe(broker: mosquitto.MosquittoBroker, protocol: str = "5", **kw: Any) -> AclProbe:
    return probe_broker_acl(
        as_(broker, NODE_A, protocol), None, observer=as_(broker, OPERATOR, protocol),
        own=OWN, timeout=10, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_an_enforcing_broker_refuses_every_kind_both_ways(
    enforcing: mosquitto.MosquittoBroker, protocol: str
) -> None:
    """Node A's login against a neighbour's topics: every publish kind, the will and both
    reads refused or dropped; its own topics get through (the fences). With MQTT 3.1.1
    Mosquitto acknowledges a refused publish and drops it: delivery tells."""
    result = probe(enforcing, protocol)
    assert result.error is None, result.error
    assert set(result.outcomes) == EVERY_KIND
    assert set(result.outcomes.values()) <= {Outcome.REFUSED, Outcome.DROPPED}, result.outcomes
    if protocol == "3.1.1":
        assert result.outcomes["publish report"] is Outcome.DROPPED
    else:
        assert result.outcomes["publish report"] is Outcome.REFUSED  # PUBACK 0x87
    assert result.control is True and result.verdict is AclVerdict.ENFORCED


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_permissive_broker_is_caught_on_every_kind(
    permissive: mosquitto.MosquittoBroker, protocol: str
) -> None:
    result = probe(permissive, protocol)
    assert result.error is None, result.error
    assert set(result.violations) == EVERY_KIND
    assert result.verdict is AclVerdict.VIOLATED


def test_a_broker_that_forbids_the_identity_everything_proves_nothing(tmp_path: Path) -> None:
    """A login that may not even publish its own report: every attempt is refused, but the
    fence never arrives, so the probe does not call that enforcement."""
    broker = broker_with(tmp_path / "deny-all", "user netval-operator\ntopic read netval/#\n")
    try:
        result = probe(broker)
    finally:
        broker.close()
    assert result.violations == [] and result.control is False
    assert result.verdict is AclVerdict.UNCONFIRMED


def test_without_an_observer_the_acknowledgements_decide(
    enforcing: mosquitto.MosquittoBroker, permissive: mosquitto.MosquittoBroker
) -> None:
    """`netval doctor` with a node's login only: MQTT 5 reason codes say refused; an
    acknowledged publish counts as taken."""
    good = probe_broker_acl(as_(enforcing, NODE_A), None, timeout=10)
    assert good.verdict is AclVerdict.ENFORCED, good.outcomes
    # reads and the will need an observer (a granted subscription proves nothing)
    assert set(good.outcomes) == {f"publish {k}" for k in PUBLISH_KINDS}
    bad = probe_broker_acl(as_(permissive, NODE_A), None, timeout=10)
    assert bad.verdict is AclVerdict.VIOLATED
    assert {f"publish {k}" for k in PUBLISH_KINDS} <= set(bad.violations)


def test_probe_errors_are_reported_not_raised(enforcing: mosquitto.MosquittoBroker) -> None:
    wrong = probe_broker_acl(as_(enforcing, (NODE_A[0], "wrong")), None, timeout=5)
    assert wrong.error is not None and "refused" in wrong.error and not wrong.outcomes
    closed = probe_broker_acl(MqttSettings(host="127.0.0.1", port=mosquitto.free_port()), None,
                              timeout=2)  # fmt: skip
    assert closed.error is not None and "cannot connect" in closed.error
    observer = probe_broker_acl(as_(enforcing, NODE_A), None,
                                observer=as_(enforcing, (OPERATOR[0], "wrong")), timeout=5)  # fmt: skip
    assert observer.error is not None and observer.error.startswith("the observer")
    assert wrong.verdict is closed.verdict is observer.verdict is AclVerdict.UNCHECKED


def test_a_probe_without_every_answer_is_not_called_enforced() -> None:
    late = AclProbe("gpu-a", {"publish report": Outcome.REFUSED, "publish beat": Outcome.UNKNOWN,
                              "read assignment": Outcome.DROPPED}, control=True)  # fmt: skip
    assert late.verdict is AclVerdict.UNCONFIRMED and late.unacknowledged == ["publish beat"]
    taken = AclProbe("gpu-a", {"publish report": Outcome.UNKNOWN, "will state": Outcome.ACCEPTED})
    assert taken.verdict is AclVerdict.VIOLATED  # one taken outweighs a missing answer
    assert AclProbe("gpu-a", {"publish report": Outcome.REFUSED}, control=True).verdict is (
        AclVerdict.ENFORCED
    )


def _gauges(registry: CollectorRegistry) -> str:
    lines = generate_latest(registry).decode().splitlines()
    return "\n".join(line for line in lines if line.startswith(("netval_broker_acl",
                                                                "netval_operator_gating_held")))  # fmt: skip


def test_operator_start_check_logs_exports_and_holds(
    permissive: mosquitto.MosquittoBroker,
    enforcing: mosquitto.MosquittoBroker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="netval.operator.broker_check")

    async def main() -> list[str]:
        holds = [AclHold(), AclHold(), AclHold(enabled=False), AclHold()]
        checks = [
            BrokerAclCheck(as_(permissive, NODE_A), observer=as_(permissive, OPERATOR),
                           own=OWN, hold=holds[0]),
            BrokerAclCheck(as_(enforcing, NODE_A), observer=as_(enforcing, OPERATOR),
                           own=OWN, hold=holds[1]),
            BrokerAclCheck(as_(permissive, NODE_A), observer=as_(permissive, OPERATOR),
                           own=OWN, hold=holds[2]),
            BrokerAclCheck(as_(enforcing, (NODE_A[0], "wrong")), hold=holds[3]),
        ]  # fmt: skip
        registries = [CollectorRegistry() for _ in checks]
        for check, registry in zip(checks, registries, strict=True):
            registry.register(check)
        assert METRIC_LINE not in _gauges(registries[0])  # absent until the check has run
        async with asyncio.timeout(60):
            await asyncio.gather(*(c.run() for c in checks))
        assert holds[0].held and not holds[1].held and not holds[2].held and not holds[3].held
        assert "gating held" in (holds[0].reason() or "")
        return [_gauges(r) for r in registries]

    bad, good, proceeding, failed = asyncio.run(main())
    assert f"{METRIC_LINE} {len(EVERY_KIND)}.0" in bad and "gating_held 1.0" in bad
    assert f"{METRIC_LINE} 0.0" in good and "gating_held 0.0" in good
    assert f"{METRIC_LINE} {len(EVERY_KIND)}.0" in proceeding and "gating_held 0.0" in proceeding
    assert METRIC_LINE not in failed
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert sum("does not enforce netval's ACL" in e for e in errors) == 2 * len(EVERY_KIND)
    assert any("gating held until" in e for e in errors)
    assert any("NETVAL_GATING_ON_ACL_VIOLATION=proceed" in r.getMessage() for r in caplog.records)
    assert any("could not run" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("on_violation", ["hold", "proceed"])
def test_a_permissive_external_broker_holds_gating_in_the_operator_process(
    on_violation: str, permissive: mosquitto.MosquittoBroker, kube: Any, tmp_path: Path
) -> None:
    """`netval operator` (the real process) with an external broker whose ACL lets the
    agents' login speak for any node: the start check finds it, and while it does no taint
    or label is written (a forged failing report must not taint a healthy node): the
    validation's Gating condition is False BrokerAclViolated, a Warning Event says so,
    `netval_operator_gating_held` is 1. With NETVAL_GATING_ON_ACL_VIOLATION=proceed the
    failing node is tainted as usual (the control)."""
    from verdict_process_kit import (
        FLEET,
        condition,
        events,
        fabric,
        fleet_validation,
        metrics,
        start_operator,
        status,
    )

    kube.ensure_namespace("netval-system")
    nodes = [f"acl-{i}" for i in range(5)]
    add_nodes(kube, [(n, {FLEET: "a"}) for n in nodes])
    kube.create(fleet_validation(taint=True))
    password = tmp_path / "agent-password"
    password.write_text(NODE_A[1] + "\n")
    env = {"NETVAL_ACL_PROBE_USERNAME": NODE_A[0], "NETVAL_ACL_PROBE_PASSWORD_FILE": str(password),
           "NETVAL_GATING_ON_ACL_VIOLATION": on_violation}  # fmt: skip
    proc = start_operator(kube, permissive, tmp_path / "op", env, kueue=False)
    with Agents([permissive], period=1.0) as agents:
        agents.set(nodes[1:], Status.PASS)
        agents.set(nodes[:1], Status.FAIL)
        agents.start()
        try:
            wait_for(lambda: (status(kube).get("nodes") or {}).get("failing") == 1, 90,
                     what="the failing node counted")  # fmt: skip
            gauge = f"{METRIC_LINE} {len(EVERY_KIND)}.0"
            wait_for(lambda: gauge in metrics(proc), 90, what="the ACL check's violations")
            if on_violation == "hold":
                gating = wait_for(
                    lambda: (c := condition(kube, "Gating")).get("reason") == "BrokerAclViolated"
                    and c,
                    60, what="Gating False BrokerAclViolated",
                )  # fmt: skip
                assert gating["status"] == "False" and "gating held" in gating["message"]
                wait_for(lambda: events(kube, "BrokerAclViolated"), 30, what="the Warning Event")
                assert "netval_operator_gating_held 1.0" in metrics(proc)
                # status rounds went by since the violation was found (the Event follows the
                # gating round); no Node was written in any of them
                assert all(label is None and not taint for label, taint in fabric(kube).values())
            else:
                wait_for(lambda: fabric(kube)[nodes[0]] == ("unhealthy", True), 60,
                         what="the failing node tainted")  # fmt: skip
                assert "netval_operator_gating_held 0.0" in metrics(proc)
                assert condition(kube, "Gating").get("reason") != "BrokerAclViolated"
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
