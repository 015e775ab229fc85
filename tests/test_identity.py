"""Per-node MQTT identity, enforced by the broker: the chart's rendered Mosquitto (plugin,
password_file, acl_file; tests/test_chart_broker.py runs it) with clients the operator's
`CredentialIssuer` creates through the dynamic security plugin.

Mosquitto acknowledges an unauthorised publish and drops it, so every "refused" below is
checked at a subscriber: the forbidden messages go first, then a permitted one from the same
client (QoS 1, one publisher: delivered in order), and once that one arrived the forbidden
ones can no longer come.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from identity_kit import LoopThread, Mqtt
from kube import wait_for
from netval.infra.mqtt_settings import MqttSettings
from netval.operator.identity.credentials import CredentialIssuer, IssuedCredential
from netval.operator.identity.dynsec import DynsecAdmin
from test_chart_broker import plaintext_listener, run_chart_broker

V = "roce-pool"


def base(node: str, validation: str = V) -> str:
    return f"netval/v1/{validation}/{node}"


class Identity:
    """The chart's broker, the operator's issuer on it, and MQTT clients to close."""

    def __init__(self, port: int, secrets: dict[str, str]) -> None:
        self.port = port
        self.secrets = secrets
        self.loop = LoopThread()
        settings = MqttSettings(
            host="127.0.0.1", port=port, username="netval-operator",
            password=secrets["operator"], client_id="operator-identity",
        )  # fmt: skip
        self.admin = DynsecAdmin(settings, timeout=10)
        # as the leader's NodeRoleSync would say: these validations target every node
        self.issuer = CredentialIssuer(self.admin, validations_of=lambda node: {V, "vx", "vy"})
        self.loop.call(self.admin.start)
        self.loop.run(self.issuer.prepare())
        self.clients: list[Mqtt] = []

    def issue(self, node: str, pod: str | None = None) -> IssuedCredential:
        return self.loop.run(self.issuer.issue(node, pod or f"agent-{node}"))

    def client(self, username: str, password: str, **kw: Any) -> Mqtt:
        client = Mqtt(self.port, username, password, **kw)
        self.clients.append(client)
        return client

    def node(self, cred: IssuedCredential, **kw: Any) -> Mqtt:
        kw.setdefault("client_id", cred.client_id)  # the broker binds the credential to it
        client = self.client(cred.username, cred.password, **kw)
        assert client.connect().is_failure is False
        return client

    def operator(self, *filters: str) -> Mqtt:
        op = self.client("netval-operator", self.secrets["operator"])
        assert op.connect().is_failure is False
        op.subscribe(*(filters or ("netval/#",)))
        return op

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.loop.run(self.admin.stop())
        self.loop.close()


@pytest.fixture
def identity(tmp_path: Path) -> Iterator[Identity]:
    with run_chart_broker(tmp_path, plaintext_listener) as (port, secrets):
        ident = Identity(port, secrets)
        try:
            yield ident
        finally:
            ident.close()


def test_a_node_publishes_only_for_itself(identity: Identity) -> None:
    a = identity.node(identity.issue("node-a"))
    b = identity.node(identity.issue("node-b"))
    op = identity.operator()
    for kind in ("report", "state", "beat", "endpoint"):  # as node B, in two validations
        a.publish(f"{base('node-b')}/{kind}", b"forged")
        a.publish(f"{base('node-b', 'other')}/{kind}", b"forged")
    a.publish(f"{base('node-b')}/assignment", b"forged")
    a.publish(f"{base('node-a')}/assignment", b"forged")  # its own assignment: operator's
    a.publish("netval/v1/x", b"forged")
    for kind in ("report", "state", "beat", "endpoint"):
        a.publish(f"{base('node-a')}/{kind}", b"a")
        b.publish(f"{base('node-b')}/{kind}", b"b")
    op.wait_message(f"{base('node-a')}/endpoint", b"a")
    op.wait_message(f"{base('node-b')}/endpoint", b"b")
    # The operator got every legitimate message, and nothing forged.
    assert sorted(op.messages) == sorted(
        [(f"{base(n)}/{k}", n[-1].encode()) for n in ("node-a", "node-b")
         for k in ("report", "state", "beat", "endpoint")]
    )  # fmt: skip


def test_a_node_reads_only_its_own_assignment_not_even_peers_endpoints(
    identity: Identity,
) -> None:
    """Its peers' endpoints come inside its assignment (issue 24): reading every endpoint
    of a validation was N messages per node after each broker restart."""
    op = identity.operator()
    b = identity.node(identity.issue("node-b"))
    b.publish(f"{base('node-b')}/report", b"b-report")
    b.publish(f"{base('node-b')}/state", b"online")
    b.publish(f"{base('node-b')}/endpoint", b"b-endpoint")
    op.wait_message(f"{base('node-b')}/endpoint", b"b-endpoint")
    a = identity.node(identity.issue("node-a"))
    # Everything it might try; the broker grants or refuses each filter.
    a.subscribe("#", "netval/#", "$CONTROL/#", f"{base('node-b')}/assignment",
                f"{base('node-b')}/report", f"{V}/+/+/endpoint", "netval/v1/+/+/endpoint",
                f"{base('node-a')}/assignment", "$SYS/#")  # fmt: skip
    # The operator issues another node's credential: its answer travels on $CONTROL.
    identity.issue("node-c")
    op.publish(f"{base('node-b')}/assignment", b"b-domain")
    op.publish(f"{base('node-a')}/assignment", b"a-domain")
    a.wait_message(f"{base('node-a')}/assignment", b"a-domain")
    assert a.topics() == {f"{base('node-a')}/assignment"}


def test_offline_comes_only_from_the_node_itself(identity: Identity) -> None:
    op = identity.operator(f"{V}/#", "netval/v1/+/+/state")
    b_cred = identity.issue("node-b")
    b = identity.node(b_cred, will=(f"{base('node-b')}/state", b"offline"))
    b.publish(f"{base('node-b')}/state", b"online")
    op.wait_message(f"{base('node-b')}/state", b"online")
    # Node A: an explicit offline for B, and a will on B's state that the broker would fire.
    a_cred = identity.issue("node-a")
    a = identity.client(a_cred.username, a_cred.password, client_id=a_cred.client_id,
                        will=(f"{base('node-b')}/state", b"offline"))  # fmt: skip
    a.connect()  # Mosquitto 2.0 refuses a will the ACL forbids; either way it must not fire
    if a.accepted:
        a.publish(f"{base('node-b')}/state", b"offline")
        a.publish(f"{base('node-a')}/state", b"online")
        op.wait_message(f"{base('node-a')}/state", b"online")
        a.drop()
    sentinel = identity.node(a_cred)
    sentinel.publish(f"{base('node-a')}/state", b"sentinel")
    op.wait_message(f"{base('node-a')}/state", b"sentinel")
    assert op.received(f"{base('node-b')}/state") == [b"online"]
    # B's own will does fire.
    b.drop()
    op.wait_message(f"{base('node-b')}/state", b"offline")


def test_revocation_disconnects_and_refuses(identity: Identity) -> None:
    op = identity.operator()
    a_cred, b_cred = identity.issue("node-a"), identity.issue("node-b")
    a, b = identity.node(a_cred), identity.node(b_cred)
    revoked = identity.loop.run(identity.issuer.revoke_node("node-a"))
    assert revoked == [a_cred.username]
    wait_for(lambda: a.disconnects, 10, what="node A disconnected")
    a.close()
    again = identity.client(a_cred.username, a_cred.password, client_id=a_cred.client_id)
    assert again.connect().is_failure
    # B is untouched; the operator still gets its reports.
    b.publish(f"{base('node-b')}/report", b"b")
    op.wait_message(f"{base('node-b')}/report", b"b")
    assert not b.disconnects


def test_rotation_refuses_the_old_password(identity: Identity) -> None:
    first = identity.issue("node-a", "agent-1")
    a = identity.node(first)
    second = identity.issue("node-a", "agent-1")
    assert second.username == first.username and second.password != first.password
    wait_for(lambda: a.disconnects, 10, what="the old session disconnected")
    a.close()
    old = identity.client(first.username, first.password, client_id=first.client_id)
    assert old.connect().is_failure
    op = identity.operator()
    new = identity.node(second)
    new.publish(f"{base('node-a')}/report", b"rotated")
    op.wait_message(f"{base('node-a')}/report", b"rotated")


def test_two_agent_pods_on_one_node_do_not_evict_each_other(identity: Identity) -> None:
    one, two = identity.issue("node-a", "agent-x"), identity.issue("node-a", "agent-y")
    x, y = identity.node(one), identity.node(two)
    op = identity.operator()
    x.publish(f"{base('node-a', 'vx')}/report", b"x")
    y.publish(f"{base('node-a', 'vy')}/report", b"y")
    op.wait_message(f"{base('node-a', 'vy')}/report", b"y")
    op.wait_message(f"{base('node-a', 'vx')}/report", b"x")
    assert not x.disconnects and not y.disconnects


def test_expired_credentials_are_deleted(identity: Identity) -> None:
    from datetime import UTC, datetime, timedelta

    cred = identity.issue("node-a")
    a = identity.node(cred)
    later = datetime.now(UTC) + timedelta(days=2)
    identity.issuer.clock = lambda: later
    assert identity.loop.run(identity.issuer.expire()) == [cred.username]
    wait_for(lambda: a.disconnects, 10, what="the expired client disconnected")


# --- the pure checks of what the API server said (operator/identity/review.py) ----------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from netval.operator.identity.review import (  # noqa: E402
    EnrollmentDenied,
    PodRef,
    agent_node_of,
    pod_ref_of,
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=10,
)
_name = st.one_of(st.just("agent-a"), st.just("node-a"), st.text(max_size=30))
_extra = st.fixed_dictionaries({}, optional={
    "authentication.kubernetes.io/pod-name": st.lists(_name, max_size=2) | _json,
    "authentication.kubernetes.io/pod-uid": st.lists(_name, max_size=2) | _json,
    "authentication.kubernetes.io/node-name": st.lists(_name, max_size=2) | _json,
})  # fmt: skip
_status = st.fixed_dictionaries({}, optional={
    "authenticated": st.booleans() | _json,
    "audiences": st.lists(st.sampled_from(["netval", "api", ""]), max_size=2) | _json,
    "user": st.fixed_dictionaries({}, optional={
        "username": st.sampled_from(["system:serviceaccount:ns:netval-agent",
                                     "system:serviceaccount:ns:default", "admin"]) | _json,
        "extra": _extra | _json,
    }) | _json,
})  # fmt: skip
_pod = st.none() | st.fixed_dictionaries({}, optional={
    "metadata": st.fixed_dictionaries({}, optional={
        "uid": _name | _json, "deletionTimestamp": st.none() | st.text(max_size=5),
        "labels": st.just({"app.kubernetes.io/name": "netval-agent",
                           "app.kubernetes.io/managed-by": "netval-operator"}) | _json,
    }),
    "spec": st.fixed_dictionaries({}, optional={
        "serviceAccountName": st.sampled_from(["netval-agent", "default"]) | _json,
        "nodeName": _name | _json,
    }),
})  # fmt: skip


_VALID_STATUS = {
    "authenticated": True, "audiences": ["netval"],
    "user": {"username": "system:serviceaccount:ns:netval-agent",
             "extra": {"authentication.kubernetes.io/pod-name": ["agent-a"],
                       "authentication.kubernetes.io/pod-uid": ["u1"]}},
}  # fmt: skip
_VALID_POD = {
    "metadata": {"uid": "u1", "labels": {"app.kubernetes.io/name": "netval-agent",
                                         "app.kubernetes.io/managed-by": "netval-operator"}},
    "spec": {"serviceAccountName": "netval-agent", "nodeName": "node-a"},
}  # fmt: skip


def _mutated(base: dict[str, Any]) -> Any:
    """`base` with one nested value replaced by hostile JSON (or left valid)."""

    def replace(doc: Any, path: list[str], value: Any) -> Any:
        if not path or not isinstance(doc, dict):
            return value
        return {**doc, path[0]: replace(doc.get(path[0]), path[1:], value)}

    paths = st.sampled_from([["authenticated"], ["audiences"], ["user"], ["user", "username"],
                             ["user", "extra"], ["metadata"], ["metadata", "uid"],
                             ["metadata", "labels"], ["spec"], ["spec", "nodeName"],
                             ["spec", "serviceAccountName"], ["metadata", "deletionTimestamp"]])  # fmt: skip
    return st.one_of(
        st.just(base), st.builds(lambda p, v: replace(base, p, v), paths, _json | _name)
    )


@settings(max_examples=300, deadline=None)
@given(status=_status | _mutated(_VALID_STATUS), pod=_pod | _mutated(_VALID_POD))
def test_hostile_review_answers_give_a_node_or_a_refusal(status: Any, pod: Any) -> None:
    try:
        ref = pod_ref_of(status, namespace="ns")
    except EnrollmentDenied:
        return
    assert status["authenticated"] is True and "netval" in status["audiences"]
    assert status["user"]["username"] == "system:serviceaccount:ns:netval-agent"
    try:
        agent = agent_node_of(ref, pod)
    except EnrollmentDenied:
        return
    # Only a pod that is the token's, the agents', scheduled (on the token's node, if named).
    assert pod["metadata"]["uid"] == ref.uid and agent.node == pod["spec"]["nodeName"]
    assert ref.node in (None, agent.node)
    assert pod["spec"]["serviceAccountName"] == "netval-agent"


def test_the_node_comes_from_the_pod_not_the_token_alone() -> None:
    ref = PodRef("ns", "agent-a", "u1", None)
    pod = {"metadata": {"uid": "u1", "labels": {"app.kubernetes.io/name": "netval-agent",
                                                "app.kubernetes.io/managed-by": "netval-operator"}},
           "spec": {"serviceAccountName": "netval-agent", "nodeName": "node-a"}}  # fmt: skip
    assert agent_node_of(ref, pod).node == "node-a"
    with pytest.raises(EnrollmentDenied, match="another node"):
        agent_node_of(PodRef("ns", "agent-a", "u1", "node-b"), pod)
    with pytest.raises(EnrollmentDenied, match="node name"):
        agent_node_of(ref, {**pod, "spec": {**pod["spec"], "nodeName": "a/b"}})


def test_a_node_cannot_take_over_another_nodes_session(identity: Identity) -> None:
    """Mosquitto disconnects a session when another connection uses its client id; with
    node A's credential that must not end node B's session (nor fire B's will)."""
    op = identity.operator("netval/v1/+/+/state")
    b_cred = identity.issue("node-b")
    b = identity.node(b_cred, client_id=b_cred.client_id,
                      will=(f"{base('node-b')}/state", b"offline"))  # fmt: skip
    b.publish(f"{base('node-b')}/state", b"online")
    op.wait_message(f"{base('node-b')}/state", b"online")
    a_cred = identity.issue("node-a")
    thief = identity.client(a_cred.username, a_cred.password, client_id=b_cred.client_id)
    assert thief.connect().is_failure  # the credential is bound to its own client id
    a = identity.node(a_cred, client_id=a_cred.client_id)
    a.publish(f"{base('node-a')}/state", b"online")
    op.wait_message(f"{base('node-a')}/state", b"online")
    assert not b.disconnects
    assert op.received(f"{base('node-b')}/state") == [b"online"]


def test_a_publish_the_broker_refuses_counts_as_refused_and_asks_for_a_new_credential(
    identity: Identity,
) -> None:
    """The agent's publisher over MQTT 5: a report the broker refuses (PUBACK 0x87, here a
    node's credential publishing for another node, as after its role stopped covering a
    topic) is counted as refused, never as published, and once refusals lasted the grace the
    credential is reported refused (the enroller enrolls again on it); the same publisher
    for its own node publishes."""
    import datetime as dt

    from netval.agent.publish import ReportPublisher
    from netval.model import Report, Status

    cred = identity.issue("node-a")
    settings = MqttSettings(host="127.0.0.1", port=identity.port, username=cred.username,
                            password=cred.password, client_id=cred.client_id)  # fmt: skip

    def report(node: str) -> Report:
        return Report(validation=V, generation=1, node=node, started_at=dt.datetime.now(dt.UTC),
                      duration_ms=1.0, status=Status.PASS, results=[])  # fmt: skip

    async def run(node: str, grace: float = 0.0) -> tuple[Any, bool]:
        publisher = ReportPublisher(settings, V, node, backoff_base=0.05, backoff_cap=0.3,
                                    publish_refusal_grace=grace)  # fmt: skip
        await publisher.start()
        await publisher.publish(report(node))
        try:
            async with asyncio.timeout(10):
                # polls counters, bounded by the timeout
                while not (publisher.stats().published or publisher.stats().publish_refusals):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            return publisher.stats(), publisher.refused(cred.username, cred.password)
        finally:
            await publisher.stop()

    forged, refused = identity.loop.run(run("node-b"))
    assert forged.published == 0 and forged.publish_refusals >= 1
    assert forged.credential_refusals >= 1 and refused
    # by default only refusals that last 5 min ask for a new credential (a role being
    # updated for a new validation is not the credential's fault)
    forged, refused = identity.loop.run(run("node-b", grace=300.0))
    assert forged.published == 0 and forged.publish_refusals >= 1 and not refused
    own, refused = identity.loop.run(run("node-a"))
    assert own.published == 1 and own.publish_refusals == 0 and not refused


def test_a_node_role_covers_only_the_validations_that_target_it(identity: Identity) -> None:
    """The leader's NodeRoleSync keeps each node's role to the validations that target it:
    a node's credential can neither publish nor read under another validation; once one
    starts targeting it, it can (after one sync), and it cannot once it stopped."""
    from netval.operator.identity.node_roles import NodeRoleSync

    sync = NodeRoleSync(identity.admin, retry=0.2, hold=0.0)
    identity.issuer.validations_of = sync.validations_of
    task = identity.loop.call(lambda: asyncio.ensure_future(sync.run()))

    def set_targets(targets: dict[str, set[str]]) -> None:
        identity.loop.call(sync.update, {n: frozenset(v) for n, v in targets.items()})
        wait_for(lambda: sync.synced.is_set(), 10, what="roles synced")

    try:
        set_targets({"node-a": {"pool-1"}, "node-b": {"pool-1", "pool-2"}})
        a = identity.node(identity.issue("node-a"))
        identity.node(identity.issue("node-b"))  # a peer that exists, unread by A
        op = identity.operator()
        a.subscribe(
            f"{base('node-a', 'pool-1')}/assignment", f"{base('node-a', 'pool-2')}/assignment"
        )
        op.publish(f"{base('node-a', 'pool-2')}/assignment", b"p2")  # not for A to read
        a.publish(f"{base('node-a', 'pool-2')}/report", b"forged")  # not A's validation
        a.publish(f"{base('node-a', 'pool-1')}/report", b"a1")
        op.publish(f"{base('node-a', 'pool-1')}/assignment", b"p1")
        a.wait_message(f"{base('node-a', 'pool-1')}/assignment", b"p1")
        op.wait_message(f"{base('node-a', 'pool-1')}/report", b"a1")
        assert op.received(f"{base('node-a', 'pool-2')}/report") == []
        assert a.received(f"{base('node-a', 'pool-2')}/assignment") == []

        # pool-2 starts targeting node-a: one modifyRole, and A may publish there
        sent = sync.commands
        set_targets({"node-a": {"pool-1", "pool-2"}, "node-b": {"pool-1", "pool-2"}})
        assert sync.commands - sent == 1
        a.publish(f"{base('node-a', 'pool-2')}/report", b"a2")
        op.wait_message(f"{base('node-a', 'pool-2')}/report", b"a2")

        # and pool-1 stops targeting it
        set_targets({"node-a": {"pool-2"}, "node-b": {"pool-1", "pool-2"}})
        a.publish(f"{base('node-a', 'pool-1')}/report", b"late")
        a.publish(f"{base('node-a', 'pool-2')}/report", b"a2-again")
        op.wait_message(f"{base('node-a', 'pool-2')}/report", b"a2-again")
        assert op.received(f"{base('node-a', 'pool-1')}/report") == [b"a1"]

        # a new term reads the broker's roles back: nothing to send
        sent = sync.commands
        identity.loop.call(sync.restart)
        identity.loop.call(sync.update, dict(sync.desired))
        wait_for(lambda: sync.synced.is_set(), 10, what="roles read back")
        assert sync.commands == sent
    finally:
        identity.loop.call(task.cancel)


def test_roles_gain_a_validation_at_once_and_lose_one_only_after_the_hold() -> None:
    """A term's first view of targeting may be partial (Nodes still being listed): a role is
    narrowed only once a validation has not targeted the node for the hold."""
    from netval.operator.identity.node_roles import role_changes

    since: dict[str, float] = {}
    applied = {"a": frozenset({"p1"}), "b": frozenset({"p1", "p2"})}
    desired = {"a": frozenset({"p1", "p2"}), "c": frozenset({"p2"})}  # b not listed yet
    assert role_changes(desired, applied, since, 0.0, 60.0) == {
        "a": frozenset({"p1", "p2"}),
        "c": frozenset({"p2"}),
    }
    assert role_changes(desired, applied, since, 59.0, 60.0) == {
        "a": frozenset({"p1", "p2"}),
        "c": frozenset({"p2"}),
    }
    assert role_changes(desired, applied, since, 60.0, 60.0)["b"] == frozenset()
    # b came back before the hold ran out: nothing to take away, the clock starts over
    desired["b"] = frozenset({"p1", "p2"})
    assert "b" not in role_changes(desired, applied, since, 61.0, 60.0) and "b" not in since
