"""netval's broker identity on a real clustered broker: RabbitMQ 3.10's MQTT plugin (Debian's
rabbitmq-server), two nodes of this test's own joined in a cluster, TLS with client
certificates of netval's identity CA, and topic permissions that expand `{username}` (the
certificate's DNS name, `<validation>.<node>`), as docs/operations.md "External brokers"
configures it. MQTT 3.1.1 (RabbitMQ before 3.13 has no MQTT 5): a refused publish or
subscription closes the connection.

What is shown here, on both nodes of the cluster: a node's identity publishes its own
topics and nothing of another node's or validation's (the operator, connected to the other
cluster node, receives exactly its own); netval's ACL probe (every kind, both ways, the
will) finds it enforced; and what RabbitMQ lacks: retained messages live on the node that
took them (a subscriber on the other node does not get them), and a `.` in a topic level
becomes a level separator on delivery (names with dots cannot be carried).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rabbitmq
import tls_certs
from identity_kit import Mqtt
from kube import wait_for
from netval.infra.broker_acl import PROBE_VALIDATION, PROBER_NODE, AclVerdict, probe_broker_acl
from netval.infra.mqtt_settings import MqttSettings, PemIdentity
from netval.model.identity import OBSERVER_IDENTITY, OPERATOR_IDENTITY, amqp_identity
from netval.operator.identity.authority import IdentityAuthority

pytestmark = [
    pytest.mark.skipif(not rabbitmq.available(), reason=rabbitmq.MISSING_REASON),
    pytest.mark.timeout(600),  # two RabbitMQ nodes start and join (minutes when loaded)
]

V = "pool"
# Topic permissions (regular expressions on AMQP routing keys: `/` becomes `.`), the same
# for every node identity: `{username}` is its `<validation>.<node>`, quoted (\Q...\E) so a
# name is matched literally.
NODE_WRITE = r"^netval\.v1\.\Q{username}\E\.(report|beat|state|endpoint|loadresult)$"
NODE_READ = r"^netval\.v1\.\Q{username}\E\.(assignment|loadplan|state)$"
OPERATOR_WRITE = r"^netval\.v1\.[^.]+\.[^.]+\.(assignment|loadplan|report|beat|state|endpoint)$"
OPERATOR_READ = r"^netval\..*"
OBSERVER_WRITE = rf"^netval\.v1\.{PROBE_VALIDATION}\.[^.]+\.(assignment|loadplan)$"
QUEUES = r"^(amq\.topic|mqtt-subscription-.*)$"  # the plugin's own queues and exchange


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        tls = tmp_path / "tls"
        tls.mkdir()
        broker_ca = tls_certs.make_ca(tls, "broker-ca")
        leaf = tls_certs.issue(broker_ca, tls, "rabbit", ip_addresses=("127.0.0.1",))
        identity_ca = tls_certs.make_ca(tls, "identity-ca")
        self.authority = IdentityAuthority(identity_ca.cert, identity_ca.key)
        self.broker_ca = broker_ca.cert_file
        self.rabbit = rabbitmq.RabbitCluster(
            tmp_path / "rabbit", size=2, server_cert=(leaf.cert_file, leaf.key_file),
            client_ca=identity_ca.cert_file,
        ).start()  # fmt: skip
        self.clients: list[Mqtt] = []

    def user(self, name: str, write: str, read: str) -> None:
        """A password-less user (certificate login only) with netval's permissions; the
        cluster's metadata store replicates it to every node."""
        self.rabbit.ctl(0, "add_user", name, secrets.token_hex(16))
        self.rabbit.ctl(0, "clear_password", name)
        self.rabbit.ctl(0, "set_permissions", "-p", "/", name, QUEUES, QUEUES, QUEUES)
        self.rabbit.ctl(0, "set_topic_permissions", "-p", "/", name, "amq.topic", write, read)

    def settings(self, node: int, identity: str, client_id: str) -> MqttSettings:
        # the DNS name RabbitMQ logs in by: a node identity's `/` as `.` (what enrollment
        # writes into an agent's certificate, `amqp_identity`)
        issued, key = self.authority.mint(identity, identity.replace("/", "."))
        return MqttSettings("127.0.0.1", self.rabbit.nodes[node].mqtt_port, tls=True,
                            ca_file=self.broker_ca, identity=PemIdentity(issued.cert_pem, key),
                            client_id=client_id, protocol="3.1.1")  # fmt: skip

    def client(self, node: int, identity: str, client_id: str, **kw: Any) -> Mqtt:
        settings = self.settings(node, identity, client_id)
        context = settings.ssl_context()
        assert context is not None
        context.check_hostname = False  # (an IP SAN: verified, but paho's own check is by name)
        client = Mqtt(settings.port, None, None, tls=context, client_id=client_id, **kw)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.rabbit.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("rabbit-cluster"))
    try:
        for node in ("gpu-a", "gpu-b", PROBER_NODE):
            validation = PROBE_VALIDATION if node == PROBER_NODE else V
            c.user(amqp_identity(validation, node), NODE_WRITE, NODE_READ)
        c.user(OPERATOR_IDENTITY, OPERATOR_WRITE, OPERATOR_READ)
        c.user(OBSERVER_IDENTITY, OBSERVER_WRITE, OPERATOR_READ)
        yield c
    finally:
        c.close()


def _closed(client: Mqtt) -> bool:
    return bool(client.disconnects)


def test_a_node_speaks_for_itself_only_on_every_cluster_node(cluster: Cluster) -> None:
    """gpu-a's certificate on each node: its own report reaches the operator, which is
    connected to the other node (routing crosses the cluster); another node's report, its
    own node under another validation, an assignment: refused (RabbitMQ closes the
    connection) and never delivered."""
    for own, other in ((0, 1), (1, 0)):
        op = cluster.client(other, OPERATOR_IDENTITY, f"operator-{own}")
        assert not op.connect().is_failure
        op.subscribe("netval/v1/#")
        for forged in (f"netval/v1/{V}/gpu-b/report", "netval/v1/other/gpu-a/report",
                       f"netval/v1/{V}/gpu-a/assignment"):  # fmt: skip
            a = cluster.client(own, f"{V}/gpu-a", f"agent-a-{own}")
            assert not a.connect().is_failure
            a.client.publish(forged, b"forged", qos=1)
            wait_for(lambda c=a: _closed(c), 30, what=f"the connection closed for {forged}")
        a = cluster.client(own, f"{V}/gpu-a", f"agent-a-{own}-ok")
        assert not a.connect().is_failure
        a.publish(f"netval/v1/{V}/gpu-a/report", f"mine {own}".encode(), retain=False)
        op.wait_message(f"netval/v1/{V}/gpu-a/report", f"mine {own}".encode(), timeout=30)
        assert b"forged" not in [p for _, p in op.messages]


def test_the_acl_probe_finds_the_cluster_enforcing_both_ways(cluster: Cluster) -> None:
    """netval's start check as the operator runs it (a reserved node's certificate, the
    observer identity), with the probe on one cluster node and the observer on the other."""
    own = (PROBE_VALIDATION, PROBER_NODE)
    probe = cluster.settings(1, f"{PROBE_VALIDATION}/{PROBER_NODE}", "probe")
    observer = cluster.settings(0, OBSERVER_IDENTITY, OBSERVER_IDENTITY)
    contexts = []
    for settings in (probe, observer):
        context = settings.ssl_context()
        assert context is not None
        context.check_hostname = False
        contexts.append(context)
    result = probe_broker_acl(probe, contexts[0], observer=observer, observer_tls=contexts[1],
                              own=own, timeout=20)  # fmt: skip
    assert result.error is None, result.error
    assert result.verdict is AclVerdict.ENFORCED, result.outcomes
    assert result.control is True and len(result.outcomes) == 8


def test_retained_messages_only_for_exact_topics_and_only_on_their_node(cluster: Cluster) -> None:
    """What RabbitMQ's MQTT plugin lacks (3.10): a retained message is replayed only to a
    subscription of its exact topic (a wildcard gets none: the operator's replay of
    `netval/v1/+/+/report` is empty), and only on the node that took it (its retained
    store is node-local). netval's answers are in docs/operations.md "External brokers"."""
    topic = f"netval/v1/{V}/gpu-b/report"
    a = cluster.client(0, f"{V}/gpu-b", "agent-b")
    assert not a.connect().is_failure
    a.publish(topic, b"retained on node 0", retain=True)
    same = cluster.client(0, OPERATOR_IDENTITY, "operator-same")
    assert not same.connect().is_failure
    same.subscribe(topic)  # the exact topic, on the node that took it: replayed
    same.wait_message(topic, b"retained on node 0", timeout=30)
    for node, filt in ((0, f"netval/v1/{V}/+/report"), (1, topic)):
        other = cluster.client(node, OPERATOR_IDENTITY, f"operator-{node}-{len(filt)}")
        assert not other.connect().is_failure
        other.subscribe(filt)
        # a fence: a live message after the subscription arrives; the retained one never did
        live = f"live {node}".encode()
        a.publish(topic, live, retain=False)
        other.wait_message(topic, live, timeout=30)
        assert other.received(topic) == [live], (node, filt)


def test_a_dot_in_a_name_becomes_a_topic_level(cluster: Cluster) -> None:
    """RabbitMQ maps MQTT's `/` to `.` in routing keys and back: a `.` of a name comes back
    as `/`, so `gpu-c.example.com` is delivered as three levels (the operator drops such a
    topic as `bad_topic`): with RabbitMQ, node and validation names must have no dots."""
    cluster.user(amqp_identity(V, "gpu-c.example.com"), NODE_WRITE, NODE_READ)
    op = cluster.client(0, OPERATOR_IDENTITY, "operator-dots")
    assert not op.connect().is_failure
    op.subscribe("netval/v1/#")
    c = cluster.client(0, f"{V}/gpu-c.example.com", "agent-c")
    assert not c.connect().is_failure
    c.publish(f"netval/v1/{V}/gpu-c.example.com/report", b"dotted", retain=False)
    wait_for(lambda: b"dotted" in [p for _, p in op.messages], 30, what="the report")
    assert [t for t, p in op.messages if p == b"dotted"] == [
        f"netval/v1/{V}/gpu-c/example/com/report"
    ]
