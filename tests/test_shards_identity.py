"""Per-node MQTT identity over two broker shards: the chart's rendered Mosquitto (dynamic
security plugin, tests/test_chart_broker.py runs it) twice, and the operator's
`IdentityService` built with both. Each node's credential is created on its own shard
(`shard_of`): the broker of that shard accepts it, the other refuses it; revocation and the
listing of enrolled clients reach the right shard; with one shard down only its nodes'
enrollments fail, the other shard's go on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from identity_kit import LoopThread, Mqtt
from kube import wait_for
from netval.infra.mqtt_settings import MqttSettings
from netval.model.shards import shard_of
from netval.operator.identity.dynsec import DynsecError
from netval.operator.identity.service import IdentityService, IdentitySettings
from netval.operator.identity.shards import ShardedAdmin, ShardedIssuer, ShardedRoles
from test_chart_broker import plaintext_listener, run_chart_broker

SHARDS = 2
NODES = [f"gpu-{i}" for i in range(6)]


class ShardedIdentity:
    def __init__(self, stack: contextlib.ExitStack, tmp_path: Path) -> None:
        self.brokers: list[contextlib.ExitStack] = []
        self.ports: list[int] = []
        settings = []
        for i in range(SHARDS):
            own = contextlib.ExitStack()
            stack.enter_context(own)
            workdir = tmp_path / f"shard-{i}"
            workdir.mkdir()
            port, secrets = own.enter_context(run_chart_broker(workdir, plaintext_listener))
            self.brokers.append(own)
            self.ports.append(port)
            login = {"username": "netval-operator", "password": secrets["operator"]}
            settings.append(MqttSettings("127.0.0.1", port, client_id="operator", **login))
        self.loop = LoopThread()
        stack.callback(self.loop.close)
        self.service = IdentityService(
            IdentitySettings("127.0.0.1", 0),
            settings[0],
            reviewer=None,  # type: ignore[arg-type]  # no enrollment server: the issuer alone
            shards=settings,
        )
        assert isinstance(self.service.admin, ShardedAdmin)
        assert isinstance(self.service.issuer, ShardedIssuer)
        assert isinstance(self.service.roles, ShardedRoles)
        self.admin, self.issuer = self.service.admin, self.service.issuer
        self.loop.call(self.admin.start)
        stack.callback(lambda: self.loop.run(self.admin.stop()))
        wait_for(lambda: not self.admin.shards_down, 20, what="both admin connections")
        self.loop.run(self.issuer.prepare())
        self.service.roles.update({n: frozenset({"pool-a"}) for n in NODES})
        self.clients: list[Mqtt] = []
        stack.callback(lambda: [c.close() for c in self.clients])

    def connect(self, shard: int, username: str, password: str) -> bool:
        client = Mqtt(self.ports[shard], username, password, client_id=username)
        self.clients.append(client)
        return not client.connect().is_failure


@pytest.fixture
def sharded(tmp_path: Path) -> Iterator[ShardedIdentity]:
    with contextlib.ExitStack() as stack:
        yield ShardedIdentity(stack, tmp_path)


def test_a_credential_works_on_its_nodes_shard_only(sharded: ShardedIdentity) -> None:
    on = {n: shard_of(n, SHARDS) for n in NODES}
    assert set(on.values()) == {0, 1}
    creds = {n: sharded.loop.run(sharded.issuer.issue(n, f"agent-{n}")) for n in NODES}
    for node, cred in creds.items():
        assert sharded.connect(on[node], cred.username, cred.password), node
        assert not sharded.connect(1 - on[node], cred.username, cred.password), node
    assert sharded.issuer.issued == len(NODES)
    # the roles follow their node: each shard's role sync holds its nodes only
    for i, sync in enumerate(sharded.service.roles.shards):  # type: ignore[union-attr]
        assert set(sync.desired) == {n for n in NODES if on[n] == i}

    enrolled = sharded.loop.run(sharded.issuer.enrolled())
    assert {node for node, _pod in enrolled.values()} == set(NODES)
    # revoking by client name reaches the client's shard
    first, second = (next(n for n in NODES if on[n] == i) for i in range(SHARDS))
    sharded.loop.run(sharded.issuer.revoke_clients([creds[first].username, creds[second].username]))
    left = sharded.loop.run(sharded.issuer.enrolled())
    assert {node for node, _pod in left.values()} == set(NODES) - {first, second}
    for node in (first, second):
        assert not sharded.connect(on[node], creds[node].username, creds[node].password)
    third = next(n for n in NODES if n not in (first, second))
    sharded.loop.run(sharded.issuer.revoke_node(third))
    assert not sharded.connect(on[third], creds[third].username, creds[third].password)


def test_a_shard_down_fails_only_its_nodes_enrollments(sharded: ShardedIdentity) -> None:
    down = 1
    sharded.brokers[down].close()  # the broker process of shard 1 ends
    wait_for(lambda: sharded.admin.shards_down == [down], 20, what="shard 1's admin down")
    assert sharded.admin.connected  # the other shard's is up: enrollment is served
    for node in NODES:
        if shard_of(node, SHARDS) == down:
            with pytest.raises(DynsecError):
                sharded.loop.run(sharded.issuer.issue(node, f"agent-{node}"))
        else:
            cred = sharded.loop.run(sharded.issuer.issue(node, f"agent-{node}"))
            assert sharded.connect(1 - down, cred.username, cred.password)
    # the sweep goes on for the shard that answers
    sharded.loop.run(sharded.issuer.expire())
    sharded.loop.run(sharded.issuer.prepare())
