"""Per-node MQTT identity over two broker shards: the chart's rendered Mosquitto twice, both
trusting the chart's one identity CA. A node's certificate is good on every shard (no shard
holds anything of it; the operator drops a node's messages on a shard not its own, counted
as `wrong_shard`, tests/test_shards_brokers.py), so a reshard costs no enrollment; the
operator's ACL check runs on the shard of its reserved probe node; signing needs no broker
at all: with every shard down, agents still get their certificates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from identity_kit import BrokerRestarts, LoopThread, Mqtt
from netval.agent.enroll import make_csr
from netval.infra.broker_acl import PROBER_NODE, AclVerdict
from netval.infra.mqtt_settings import MqttSettings, PemIdentity
from netval.model.identity import OPERATOR_IDENTITY, node_identity
from netval.model.shards import shard_of
from netval.operator.identity.authority import IdentityAuthority, MintedIdentity
from netval.operator.identity.service import IdentityService, IdentitySettings
from test_chart_broker import run_chart_broker

SHARDS = 2


class Shards:
    def __init__(self, stack: contextlib.ExitStack, tmp_path: Path) -> None:
        self.ports: list[int] = []
        self.workdirs: list[Path] = []
        secrets: dict[str, str] = {}
        for i in range(SHARDS):
            workdir = tmp_path / f"shard-{i}"
            workdir.mkdir()
            port, secrets = stack.enter_context(run_chart_broker(workdir, by_address=True))
            self.ports.append(port)
            self.workdirs.append(workdir)
        self.secrets = secrets
        self.ca = IdentityAuthority.from_files(
            Path(secrets["identity_ca"]), Path(secrets["identity_key"])
        )
        self.settings = [
            self.mqtt(i, MintedIdentity(self.ca, OPERATOR_IDENTITY)) for i in range(SHARDS)
        ]
        self.clients: list[Mqtt] = []
        stack.callback(lambda: [c.close() for c in self.clients])

    def mqtt(self, shard: int, identity: object) -> MqttSettings:
        # every shard's broker certificate here is signed by its own test CA: verify each
        # with its own (in a cluster one CA signs every shard's)
        ca = self.workdirs[shard] / "tls" / "broker-test-ca.crt"
        return MqttSettings("127.0.0.1", self.ports[shard], tls=True, ca_file=ca,
                            identity=identity, client_id="operator")  # type: ignore[arg-type]  # fmt: skip

    def connect(self, shard: int, pem: PemIdentity) -> bool:
        context = self.mqtt(shard, pem).ssl_context()
        client = Mqtt(self.ports[shard], None, None, tls=context)
        self.clients.append(client)
        return not client.connect().is_failure


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[Shards]:
    with contextlib.ExitStack() as stack:
        yield Shards(stack, tmp_path)


def test_a_certificate_is_good_on_every_shard_and_signing_needs_none(shards: Shards) -> None:
    key, csr = make_csr("pool/gpu-3")
    issued = shards.ca.issue_node(csr, "pool", "gpu-3")
    pem = PemIdentity(issued.cert_pem, key)
    assert all(shards.connect(i, pem) for i in range(SHARDS))
    for i, workdir in enumerate(shards.workdirs):
        BrokerRestarts(workdir, shards.ports[i]).kill()
    # every broker down: the identity CA still signs
    key, csr = make_csr("pool/gpu-4")
    assert shards.ca.issue_node(csr, "pool", "gpu-4").identity == "pool/gpu-4"


def test_the_acl_check_runs_on_the_probe_nodes_shard(shards: Shards, tmp_path: Path) -> None:
    service = IdentityService(
        IdentitySettings("127.0.0.1", 0), shards.settings[0],
        reviewer=None,  # type: ignore[arg-type]  # no enrollment here: the check alone
        authority=shards.ca, shards=shards.settings,
    )  # fmt: skip
    check = service.check()
    shard = shard_of(PROBER_NODE, SHARDS)
    assert check.settings.port == shards.ports[shard]
    assert check.observer is not None and check.observer.port == shards.ports[shard]
    assert check.settings.client_id == node_identity("_netval-acl-probe", PROBER_NODE)
    loop = LoopThread()
    try:
        result = loop.run(check.run(), timeout=90)
    finally:
        loop.close()
    assert result.verdict is AclVerdict.ENFORCED, (result.error, result.outcomes)
