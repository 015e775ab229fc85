"""Per-node MQTT identity, enforced by the broker: the chart's rendered Mosquitto (TLS
listener with `require_certificate`, `use_identity_as_username`, `use_username_as_clientid`
and the pattern ACL; tests/test_chart_broker.py runs it) with clients whose certificates the
operator's identity CA (`IdentityAuthority`) signs, as enrollment leaves them.

Mosquitto acknowledges an unauthorised publish from an MQTT 3.1.1 client and drops it, so
every "refused" below is checked at a subscriber: the forbidden messages go first, then a
permitted one from the same client (QoS 1, one publisher: delivered in order), and once that
one arrived the forbidden ones can no longer come.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from identity_kit import LoopThread, Mqtt
from netval.infra.broker_acl import AclVerdict, Outcome, probe_broker_acl
from netval.infra.mqtt_settings import MqttSettings, PemIdentity
from netval.model.identity import (
    OBSERVER_IDENTITY,
    OPERATOR_IDENTITY,
    amqp_identity,
    node_identity,
)
from netval.operator.identity.authority import IdentityAuthority
from netval.operator.identity.review import EnrollmentDenied, PodRef, agent_node_of, pod_ref_of
from test_chart_broker import BROKER_HOST, rendered_ca, run_chart_broker

V = "roce-pool"


def base(node: str, validation: str = V) -> str:
    return f"netval/v1/{validation}/{node}"


class Identity:
    """The chart's broker, the identity CA it trusts, and MQTT clients to close."""

    def __init__(self, tmp_path: Path, port: int, secrets: dict[str, str]) -> None:
        self.port = port
        self.authority = IdentityAuthority.from_files(
            Path(secrets["identity_ca"]), Path(secrets["identity_key"])
        )
        self.ca_file = tmp_path / "broker-ca.crt"
        self.ca_file.write_text(rendered_ca())
        self.clients: list[Mqtt] = []

    def pem(self, identity: str, authority: IdentityAuthority | None = None) -> PemIdentity:
        issued, key = (authority or self.authority).mint(identity, identity.replace("/", "."))
        return PemIdentity(issued.cert_pem, key)

    def settings(self, pem: PemIdentity | None, client_id: str = "x") -> MqttSettings:
        return MqttSettings(host=BROKER_HOST, port=self.port, tls=True, ca_file=self.ca_file,
                            identity=pem, client_id=client_id)  # fmt: skip

    def client(self, identity: str | None, *, pem: PemIdentity | None = None, **kw: Any) -> Mqtt:
        """A paho client showing a certificate for `identity` (or `pem`, or none)."""
        pem = pem or (self.pem(identity) if identity is not None else None)
        context = self.settings(pem).ssl_context()
        client = Mqtt(self.port, None, None, tls=context, host=BROKER_HOST, **kw)
        self.clients.append(client)
        return client

    def node(self, node: str, validation: str = V, **kw: Any) -> Mqtt:
        client = self.client(node_identity(validation, node), **kw)
        assert client.connect().is_failure is False
        return client

    def operator(self, *filters: str) -> Mqtt:
        op = self.client(OPERATOR_IDENTITY)
        assert op.connect().is_failure is False
        op.subscribe(*(filters or ("netval/#",)))
        return op

    def close(self) -> None:
        for client in self.clients:
            client.close()


@pytest.fixture
def identity(tmp_path: Path) -> Iterator[Identity]:
    with run_chart_broker(tmp_path) as (port, secrets):
        ident = Identity(tmp_path, port, secrets)
        try:
            yield ident
        finally:
            ident.close()


def test_a_node_publishes_only_for_itself_in_its_own_validation(identity: Identity) -> None:
    """Every kind a node publishes, on its own node's topics of its own validation, arrives;
    the same kinds for another node, or for its own node under another validation, do not."""
    op = identity.operator()
    a = identity.node("node-a")
    kinds = ("report", "beat", "endpoint", "loadresult", "state")
    for kind in kinds:
        a.publish(f"{base('node-b')}/{kind}", b"forged")  # another node
        a.publish(f"{base('node-a', 'other-validation')}/{kind}", b"forged")  # another validation
        a.publish(f"netval/v1/{V}/+/{kind}".replace("+", "node-a/x"), b"forged")  # deeper
    a.publish(f"{base('node-a')}/assignment", b"forged")  # the operator's topic
    for kind in kinds:
        a.publish(f"{base('node-a')}/{kind}", b"own " + kind.encode())
    op.wait_message(f"{base('node-a')}/state", b"own state")
    assert {t for t in op.topics()} == {f"{base('node-a')}/{k}" for k in kinds}
    assert b"forged" not in [p for _, p in op.messages]


def test_a_node_reads_only_its_own_assignment_and_plan(identity: Identity) -> None:
    op = identity.operator()
    a = identity.node("node-a")
    a.subscribe(f"{base('node-b')}/assignment", f"{base('node-b')}/loadplan",
                f"netval/v1/{V}/+/endpoint", f"netval/v1/{V}/+/report",
                f"{base('node-a')}/loadplan", f"{base('node-a')}/assignment")  # fmt: skip
    op.publish(f"{base('node-b')}/assignment", b"b's peers", retain=False)
    op.publish(f"{base('node-b')}/loadplan", b"b's plan", retain=False)
    b = identity.node("node-b")
    b.publish(f"{base('node-b')}/endpoint", b"b's endpoint")
    b.publish(f"{base('node-b')}/report", b"b's report")
    op.wait_message(f"{base('node-b')}/report", b"b's report")
    op.publish(f"{base('node-a')}/loadplan", b"a's plan", retain=False)
    op.publish(f"{base('node-a')}/assignment", b"a's peers", retain=False)
    a.wait_message(f"{base('node-a')}/assignment", b"a's peers")
    assert a.topics() == {f"{base('node-a')}/loadplan", f"{base('node-a')}/assignment"}


def test_offline_comes_only_from_the_node_itself(identity: Identity) -> None:
    """A last will on another node's state is never published (Mosquitto checks it against
    the ACL when it fires); a node's own will is."""
    op = identity.operator(f"netval/v1/{V}/+/state")
    forger = identity.node("node-a", will=(f"{base('node-b')}/state", b"offline"))
    honest = identity.node("node-c", will=(f"{base('node-c')}/state", b"offline"))
    forger.drop()
    honest.drop()
    op.wait_message(f"{base('node-c')}/state", b"offline")
    late = identity.node("node-a")  # a fence: published after both wills were handled
    late.publish(f"{base('node-a')}/state", b"online")
    op.wait_message(f"{base('node-a')}/state", b"online")
    assert op.received(f"{base('node-b')}/state") == []


def test_a_node_cannot_take_over_another_nodes_session(identity: Identity) -> None:
    """The broker takes the client id from the certificate (use_username_as_clientid): a
    connection asking for node B's client id with node A's certificate is node A's session,
    so it neither ends B's session nor fires B's will."""
    op = identity.operator(f"netval/v1/{V}/+/state")
    b_id = node_identity(V, "node-b")
    b = identity.node("node-b", client_id=b_id, will=(f"{base('node-b')}/state", b"offline"))
    b.publish(f"{base('node-b')}/state", b"online")
    op.wait_message(f"{base('node-b')}/state", b"online")
    thief = identity.node("node-a", client_id=b_id)
    thief.publish(f"{base('node-a')}/state", b"online")
    op.wait_message(f"{base('node-a')}/state", b"online")
    assert not b.disconnects
    assert op.received(f"{base('node-b')}/state") == [b"online"]


def test_two_agent_pods_on_one_node_do_not_evict_each_other(identity: Identity) -> None:
    """Two validations on one node: two identities (`vx/n`, `vy/n`), two sessions."""
    op = identity.operator()
    x = identity.node("node-a", "vx")
    y = identity.node("node-a", "vy")
    x.publish(f"{base('node-a', 'vx')}/report", b"x")
    y.publish(f"{base('node-a', 'vy')}/report", b"y")
    op.wait_message(f"{base('node-a', 'vy')}/report", b"y")
    op.wait_message(f"{base('node-a', 'vx')}/report", b"x")
    assert not x.disconnects and not y.disconnects


def test_certificates_the_broker_must_refuse(identity: Identity, tmp_path: Path) -> None:
    """No certificate, one of another CA, an expired one: the broker ends the TLS session,
    and netval's client says so as a refusal of the credential (the agent enrolls again),
    at once rather than after a timeout."""
    from netval.infra.mqtt_client import CertificateRefused, credential_refused, make_client

    other = IdentityAuthority(*_ca(tmp_path))
    expired = IdentityAuthority(
        identity.authority.ca_cert, identity.authority.ca_key,
        clock=lambda: dt.datetime.now(dt.UTC) - dt.timedelta(days=3),
    )  # fmt: skip
    cases = {
        "none": None,
        "another CA": identity.pem(node_identity(V, "node-a"), other),
        "expired": identity.pem(node_identity(V, "node-a"), expired),
    }

    async def attempt(pem: PemIdentity | None) -> BaseException:
        settings = identity.settings(pem)
        try:
            async with make_client(settings, keepalive=10, timeout=20,
                                   tls_context=settings.ssl_context()):  # fmt: skip
                pass
        except Exception as exc:
            return exc
        raise AssertionError("connected")

    loop = LoopThread()
    try:
        for what, pem in cases.items():
            exc = loop.run(attempt(pem))
            assert isinstance(exc, CertificateRefused), (what, exc)
            assert credential_refused(exc), what
    finally:
        loop.close()
    good = identity.client(node_identity(V, "node-a"))
    assert not good.connect().is_failure


def _ca(tmp_path: Path) -> tuple[Any, Any]:
    import tls_certs

    ca = tls_certs.make_ca(tmp_path, "another-ca")
    return ca.cert, ca.key


def test_the_acl_probe_finds_the_chart_broker_enforcing(identity: Identity) -> None:
    """The operator's start check against the chart's broker: every topic kind of another
    node, both directions and the last will, refused or dropped; the probe identity's own
    topics get through (the fences)."""
    own = ("_netval-acl-probe", "_netval-acl-prober")
    probe = identity.settings(identity.pem(node_identity(*own)), node_identity(*own))
    observer = identity.settings(identity.pem(OBSERVER_IDENTITY), OBSERVER_IDENTITY)
    result = probe_broker_acl(probe, probe.ssl_context(), observer=observer,
                              observer_tls=observer.ssl_context(), own=own,
                              exact_client_id=True, timeout=10)  # fmt: skip
    assert result.error is None, result.error
    assert result.control is True
    assert set(result.outcomes) == {
        "publish report", "publish beat", "publish endpoint", "publish loadresult",
        "publish state", "read assignment", "read loadplan", "will state",
    }  # fmt: skip
    assert all(o in (Outcome.REFUSED, Outcome.DROPPED) for o in result.outcomes.values()), (
        result.outcomes
    )
    assert result.verdict is AclVerdict.ENFORCED


def test_a_certificate_names_the_identity_for_every_broker() -> None:
    """The common name is what Mosquitto, EMQX and VerneMQ take as the user name; the DNS
    name is RabbitMQ's form of it (`/` read as `.` in routing keys)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    import tls_certs

    with __import__("tempfile").TemporaryDirectory() as tmp:
        ca = tls_certs.make_ca(Path(tmp), "ca")
        authority = IdentityAuthority(ca.cert, ca.key)
        issued, _ = authority.mint(node_identity(V, "gpu-1"), amqp_identity(V, "gpu-1"))
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "roce-pool/gpu-1"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["roce-pool.gpu-1"]
    cert.verify_directly_issued_by(ca.cert)


def test_a_publish_the_broker_refuses_counts_as_refused_and_asks_for_a_new_credential(
    identity: Identity,
) -> None:
    """The agent's publisher over MQTT 5: a report the broker refuses (PUBACK 0x87: here a
    node's certificate publishing for another node) is counted as refused, never as
    published, and once refusals lasted the grace the credential is reported refused (the
    enroller enrolls again on it); the same publisher for its own node publishes."""
    from netval.agent.publish import ReportPublisher, login_of
    from netval.model import Report, Status

    settings = identity.settings(identity.pem(node_identity(V, "node-a")))

    def report(node: str) -> Report:
        return Report(validation=V, generation=1, node=node, started_at=dt.datetime.now(dt.UTC),
                      duration_ms=1.0, status=Status.PASS, results=[])  # fmt: skip

    async def run(node: str, grace: float = 0.0) -> tuple[Any, bool]:
        publisher = ReportPublisher(settings, V, node, backoff_base=0.05, backoff_cap=0.3,
                                    publish_refusal_grace=grace)  # fmt: skip
        await publisher.start()
        await publisher.publish(report(node))
        try:
            async with asyncio.timeout(15):
                # polls counters, bounded by the timeout
                while not (publisher.stats().published or publisher.stats().publish_refusals):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            return publisher.stats(), publisher.refused(login_of(settings))
        finally:
            await publisher.stop()

    loop = LoopThread()
    try:
        forged, refused = loop.run(run("node-b"))
        assert forged.published == 0 and forged.publish_refusals >= 1
        assert forged.credential_refusals >= 1 and refused
        forged, refused = loop.run(run("node-b", grace=300.0))
        assert forged.published == 0 and forged.publish_refusals >= 1 and not refused
        own, refused = loop.run(run("node-a"))
        assert own.published == 1 and own.publish_refusals == 0 and not refused
    finally:
        loop.close()


def test_the_agent_certificate_goes_into_a_tls_context_without_a_file(identity: Identity) -> None:
    """The key is loaded through an anonymous memory file: nothing is written anywhere."""
    before = set(Path("/tmp").iterdir())
    settings = identity.settings(identity.pem(node_identity(V, "node-a")))
    assert settings.ssl_context() is not None
    assert set(Path("/tmp").iterdir()) == before
    assert "PRIVATE" not in repr(settings) and "BEGIN" not in repr(settings)
    assert dataclasses.replace(settings).identity is settings.identity


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
