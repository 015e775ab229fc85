"""The operator's identity service, wired in one place: the enrollment HTTPS server, which
signs agents' certificate requests with the identity CA, and the leader's broker ACL check.

Enabled by `NETVAL_ENROLL_ADDR` with the identity CA (`NETVAL_IDENTITY_CA_FILE`,
`NETVAL_IDENTITY_CA_KEY_FILE`; docs/architecture.md "Broker identity"). Enrollment is
answered by every replica (the Service routes agents to any ready one; signing needs only
the CA, which both mount): `netval operator` starts the service for the whole process
(`OperatorProcess`). The duties that write on their own, the broker ACL check and the
agents' CA ConfigMap, are the leader's: Kopf's startup handler calls `start_identity` in each
term, which starts them (and starts the service itself when no process did, in tests).
Nothing is revoked or expired here: the brokers hold no per-client state, certificates
expire by themselves, and the operator's targeting decides whose reports count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import ssl
import tempfile
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import kopf
from prometheus_client import CollectorRegistry

from netval.infra.broker_acl import PROBE_VALIDATION, PROBER_NODE
from netval.infra.metrics_server import parse_host_port
from netval.infra.mqtt_settings import MqttSettings
from netval.infra.task_stop import cancel_and_wait
from netval.model.identity import OBSERVER_IDENTITY, node_identity
from netval.model.keys import MANAGED_BY_OPERATOR, LabelKey
from netval.model.shards import shard_of
from netval.operator.agents.manifests import AGENT_APP_NAME
from netval.operator.broker_check import AclHold, BrokerAclCheck
from netval.operator.identity.authority import IdentityAuthority, MintedIdentity
from netval.operator.identity.enroll_server import EnrollmentServer
from netval.operator.identity.metrics import IdentityCollector
from netval.operator.identity.review import PodTokenReviewer
from netval.operator.identity.tls_reload import RELOAD_EVERY, CertReloader
from netval.operator.kube import certs
from netval.operator.kube.api import KubeApi, load_kube_client
from netval.operator.settings import OperatorConfigError, OperatorSettings

log = logging.getLogger("netval.operator.identity")

ENV_ENROLL_ADDR: Final = "NETVAL_ENROLL_ADDR"
ENV_ENROLL_CERT_FILE: Final = "NETVAL_ENROLL_CERT_FILE"
ENV_ENROLL_KEY_FILE: Final = "NETVAL_ENROLL_KEY_FILE"
ENV_ENROLL_CA_BUNDLE_FILE: Final = "NETVAL_ENROLL_CA_BUNDLE_FILE"
MEMO_KEY: Final = "identity"  # Kopf memo: IdentitySettings before start, IdentityService after
SHARED_MEMO_KEY: Final = "identity_shared"  # the process's IdentityService, leader or not


@dataclass(frozen=True, slots=True)
class IdentitySettings:
    host: str
    port: int  # 0: a free port (tests)
    cert_file: Path | None = None  # None: a self-signed certificate (development only)
    key_file: Path | None = None
    ca_file: Path | None = None  # the CA agents verify the server with (None: the cert's)
    cert_reload_every: float = RELOAD_EVERY  # seconds between looks at cert_file/key_file


def identity_settings_from_env(env: Mapping[str, str] = os.environ) -> IdentitySettings | None:
    """None when `NETVAL_ENROLL_ADDR` is unset or `off`: no enrollment (shared credentials)."""
    text = env.get(ENV_ENROLL_ADDR, "").strip()
    if not text:
        return None
    try:
        addr = parse_host_port(text, variable=ENV_ENROLL_ADDR)
    except ValueError as exc:
        raise OperatorConfigError(str(exc)) from None
    if addr is None:
        return None
    cert, key = env.get(ENV_ENROLL_CERT_FILE, "").strip(), env.get(ENV_ENROLL_KEY_FILE, "").strip()
    if bool(cert) != bool(key):
        raise OperatorConfigError(f"{ENV_ENROLL_CERT_FILE} and {ENV_ENROLL_KEY_FILE} go together")
    ca = env.get(ENV_ENROLL_CA_BUNDLE_FILE, "").strip()
    return IdentitySettings(
        host=addr[0], port=addr[1], cert_file=Path(cert) if cert else None,
        key_file=Path(key) if key else None, ca_file=Path(ca) if ca else None,
    )  # fmt: skip


def server_tls(settings: IdentitySettings) -> tuple[ssl.SSLContext, Path]:
    """The server's TLS context, and the CA bundle agents verify it with."""
    cert, key, ca = settings.cert_file, settings.key_file, settings.ca_file
    if cert is None or key is None:
        directory = Path(tempfile.mkdtemp(prefix="netval-enroll-"))
        files = certs.generate_self_signed(directory, certs.server_sans(settings.host))
        cert, key, ca = files.cert, files.key, files.ca
        log.warning(
            "enrollment: no certificate given, generated a self-signed one in %s", directory
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context, ca or cert


def ca_configmap(namespace: str, name: str, ca_pem: str) -> dict[str, Any]:
    """The agents' copy of the enrollment CA (the operator's pods have it mounted; the
    agents' namespace may be another one, and a CA is no secret)."""
    labels = {LabelKey.NAME.value: AGENT_APP_NAME, LabelKey.MANAGED_BY.value: MANAGED_BY_OPERATOR}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"ca.crt": ca_pem},
    }


def probe_identity(authority: IdentityAuthority) -> MintedIdentity:
    """The ACL probe's own identity: a reserved node of a reserved validation."""
    return MintedIdentity(authority, node_identity(PROBE_VALIDATION, PROBER_NODE))


class IdentityService:
    def __init__(
        self,
        settings: IdentitySettings,
        mqtt: MqttSettings,
        reviewer: PodTokenReviewer,
        authority: IdentityAuthority,
        shards: Sequence[MqttSettings] = (),
    ) -> None:
        self.settings = settings
        self.mqtt = mqtt  # the operator's own session: the ACL check's observer
        self.shards = tuple(shards)
        self.authority = authority
        self.server = EnrollmentServer(reviewer, authority)
        self.background: set[asyncio.Task[None]] = set()  # one-shot tasks, cancelled at stop
        self.ca_file: Path | None = None
        self.cert_reloader: CertReloader | None = None
        self._reload_task: asyncio.Task[None] | None = None
        self.leading = False

    async def start(self) -> int:
        """Serve enrollments (every replica). A certificate given as files is picked up
        again when they change (cert-manager renewals)."""
        context, self.ca_file = server_tls(self.settings)
        port = await self.server.start(self.settings.host, self.settings.port, context)
        cert, key = self.settings.cert_file, self.settings.key_file
        if cert is not None and key is not None:
            self.cert_reloader = CertReloader(
                context, cert, key, every=self.settings.cert_reload_every
            )
            self._reload_task = asyncio.create_task(
                self.cert_reloader.run(), name="netval-enroll-cert-reload"
            )
        return port

    def lead(self, registry: CollectorRegistry | None, hold: AclHold | None = None) -> None:
        """The leader's duties, for one term: the broker ACL check."""
        if self.leading:
            return
        self.leading = True
        if hold is not None:
            hold.expect()
        self._once(self.check_broker_acl(registry, hold), "netval-broker-acl-check")

    def _once(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def stop_leading(self) -> None:
        await cancel_and_wait(list(self.background))
        self.background.clear()
        self.leading = False

    async def stop(self) -> None:
        await self.stop_leading()
        if self._reload_task is not None:
            await cancel_and_wait([self._reload_task])
        await self.server.stop()

    def check(self, hold: AclHold | None = None) -> BrokerAclCheck:
        """The ACL check: a certificate for a reserved node, probing a reserved neighbour of
        the same validation (the identity's own topics are the fences), observed by the
        observer identity (not the operator's own: the broker binds the client id to the
        identity, and a second session would end the ingest's), on the shard the reserved
        node's topics live on."""
        own = (PROBE_VALIDATION, PROBER_NODE)
        base = self.shards[shard_of(PROBER_NODE, len(self.shards))] if self.shards else self.mqtt
        identity = node_identity(*own)
        probe = dataclasses.replace(
            base, username=None, password=None, cert_file=None, key_file=None,
            identity=probe_identity(self.authority), client_id=identity,
        )  # fmt: skip
        observer = dataclasses.replace(
            probe, identity=MintedIdentity(self.authority, OBSERVER_IDENTITY),
            client_id=OBSERVER_IDENTITY,
        )  # fmt: skip
        return BrokerAclCheck(probe, observer=observer, own=own, own_client_id=True, hold=hold)

    async def check_broker_acl(
        self, registry: CollectorRegistry | None, hold: AclHold | None = None
    ) -> None:
        """Once per term: the probe identity must get nothing of another node through
        (logged, `netval_broker_acl_violations`, and gating held while it does)."""
        check = self.check(hold)
        if registry is not None:
            registry.register(check)
        await check.run()

    def forget_node(self, node: str) -> None:
        """A deleted Node: its pods' cached token reviews go (a new pod of that name must
        pass a TokenReview of its own)."""
        self.server.forget_node(node)


def build_identity(settings: IdentitySettings, operator: OperatorSettings) -> IdentityService:
    if operator.identity_ca is None:
        raise OperatorConfigError(
            f"{ENV_ENROLL_ADDR} needs the identity CA (NETVAL_IDENTITY_CA_FILE and "
            "NETVAL_IDENTITY_CA_KEY_FILE): it signs the agents' certificates"
        )
    reviewer = PodTokenReviewer(load_kube_client(), namespace=operator.agent_namespace)
    return IdentityService(
        settings, operator.mqtt, reviewer, operator.identity_ca, operator.mqtt_shards
    )


async def start_identity(memo: kopf.Memo, operator: OperatorSettings, hold: AclHold) -> None:
    """A term's start: the leader's duties on the process's service (memo `identity_shared`),
    or, without one, a service of this term's own if enrollment is configured (memo
    `identity` or the environment)."""
    registry = memo.get("metrics_registry")
    registry = registry if isinstance(registry, CollectorRegistry) else None
    service: Any = memo.get(SHARED_MEMO_KEY)
    if not isinstance(service, IdentityService):
        service = memo.get(MEMO_KEY)  # a retried start-up: started before, not again
    if not isinstance(service, IdentityService):
        settings: Any = memo.get(MEMO_KEY)
        if settings is None:
            settings = identity_settings_from_env()
        if not isinstance(settings, IdentitySettings):
            return
        service = build_identity(settings, operator)
        await service.start()
        if registry is not None:
            registry.register(IdentityCollector(service))
    memo[MEMO_KEY] = service
    service.lead(registry, hold)
    if operator.agent_enroll_ca_configmap and service.ca_file is not None:
        body = ca_configmap(
            operator.agent_namespace,
            operator.agent_enroll_ca_configmap,
            service.ca_file.read_text(),
        )
        kube = KubeApi(load_kube_client())
        try:
            await kube.apply_configmap(body)
        finally:
            kube.close()


async def stop_identity(memo: kopf.Memo) -> None:
    """A term's end: the process's service stays up (it still answers enrollments)."""
    service = memo.get(MEMO_KEY)
    if not isinstance(service, IdentityService):
        return
    shared = memo.get(SHARED_MEMO_KEY) is service
    if shared:
        await service.stop_leading()
    else:
        await service.stop()


def started_identity(memo: kopf.Memo) -> IdentityService | None:
    service = memo.get(MEMO_KEY)
    return service if isinstance(service, IdentityService) else None
