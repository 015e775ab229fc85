"""The operator's identity service, wired in one place: the dynamic security admin
connection, the credential issuer, the enrollment HTTPS server and the expiry sweep.

Enabled by `NETVAL_ENROLL_ADDR` (docs/architecture.md, "Processes and configuration").
Enrollment is answered by every replica (the Service routes agents to any ready one; the
credentials live in the broker's dynamic security store, so any replica can issue them):
`netval operator` starts the service for the whole process (`OperatorProcess`). The duties
that write on their own, the expiry sweep, the broker ACL check and the agents' CA ConfigMap,
are the leader's: Kopf's startup handler calls `start_identity` in each term, which starts
them (and starts the service itself when no process did, in tests). The Node handler calls
`revoke_node`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Final

import kopf
from prometheus_client import CollectorRegistry

from netval.infra.metrics_server import parse_host_port
from netval.infra.mqtt_settings import MqttSettings
from netval.infra.task_stop import cancel_and_wait
from netval.model.keys import MANAGED_BY_OPERATOR, LabelKey
from netval.model.shards import shard_of
from netval.operator.agents.manifests import AGENT_APP_NAME
from netval.operator.broker_check import BrokerAclCheck
from netval.operator.identity.credentials import DEFAULT_LIFETIME, CredentialIssuer
from netval.operator.identity.dynsec import DynsecAdmin, DynsecError
from netval.operator.identity.enroll_server import MIN_REISSUE_SECONDS, EnrollmentServer
from netval.operator.identity.metrics import IdentityCollector
from netval.operator.identity.node_roles import NodeRoleSync
from netval.operator.identity.review import AGENT_POD_LABELS, PodTokenReviewer
from netval.operator.identity.shards import ShardedAdmin, ShardedIssuer, ShardedRoles
from netval.operator.identity.tls_reload import RELOAD_EVERY, CertReloader
from netval.operator.kube import certs
from netval.operator.kube.api import KubeApi, error_text, load_kube_client
from netval.operator.settings import OperatorConfigError, OperatorSettings
from netval.operator.term_runtime import OperatorRuntime
from netval.operator.term_startup import RUNTIME_KEY

log = logging.getLogger("netval.operator.identity")

# (Node names, agent Pod names): what the leader compares the issued credentials with.
Listers = tuple[Callable[[], Awaitable[set[str]]], Callable[[], Awaitable[set[str]]]]

ENV_ENROLL_ADDR: Final = "NETVAL_ENROLL_ADDR"
ENV_ENROLL_CERT_FILE: Final = "NETVAL_ENROLL_CERT_FILE"
ENV_ENROLL_KEY_FILE: Final = "NETVAL_ENROLL_KEY_FILE"
ENV_ENROLL_CA_BUNDLE_FILE: Final = "NETVAL_ENROLL_CA_BUNDLE_FILE"
ENV_CREDENTIAL_LIFETIME: Final = "NETVAL_CREDENTIAL_LIFETIME_SECONDS"
MEMO_KEY: Final = "identity"  # Kopf memo: IdentitySettings before start, IdentityService after
SHARED_MEMO_KEY: Final = "identity_shared"  # the process's IdentityService, leader or not
MIN_LIFETIME: Final = 60.0
MAX_SWEEP_SECONDS: Final = 300.0
DEPARTED_SWEEP_SECONDS: Final = 600.0  # two metadata lists (Nodes, agent Pods) per run
# The broker ACL check's own identity: a node name no Kubernetes Node can have (leading "_"),
# other than the node it probes (netval.infra.broker_acl.PROBE_NODE).
ACL_PROBE_NODE: Final = "_netval-acl-prober"
ACL_PROBE_POD: Final = "acl-check"


@dataclass(frozen=True, slots=True)
class IdentitySettings:
    host: str
    port: int  # 0: a free port (tests)
    cert_file: Path | None = None  # None: a self-signed certificate (development only)
    key_file: Path | None = None
    lifetime: timedelta = DEFAULT_LIFETIME
    ca_file: Path | None = None  # the CA agents verify the server with (None: the cert's)
    min_reissue_seconds: float = MIN_REISSUE_SECONDS  # per pod (tests: 0)
    departed_every: float = DEPARTED_SWEEP_SECONDS  # (tests: shorter)
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
    lifetime_text = env.get(ENV_CREDENTIAL_LIFETIME, "").strip()
    try:
        seconds = float(lifetime_text) if lifetime_text else DEFAULT_LIFETIME.total_seconds()
    except ValueError:
        raise OperatorConfigError(
            f"{ENV_CREDENTIAL_LIFETIME}: not a number: {lifetime_text!r}"
        ) from None
    if seconds < MIN_LIFETIME:
        raise OperatorConfigError(
            f"{ENV_CREDENTIAL_LIFETIME}: at least {MIN_LIFETIME:g}, got {seconds:g}"
        )
    ca = env.get(ENV_ENROLL_CA_BUNDLE_FILE, "").strip()
    return IdentitySettings(
        host=addr[0], port=addr[1], cert_file=Path(cert) if cert else None,
        key_file=Path(key) if key else None, lifetime=timedelta(seconds=seconds),
        ca_file=Path(ca) if ca else None,
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


class IdentityService:
    def __init__(
        self,
        settings: IdentitySettings,
        mqtt: MqttSettings,
        reviewer: PodTokenReviewer,
        shards: Sequence[MqttSettings] = (),
    ) -> None:
        self.settings = settings
        admin_id = f"{mqtt.client_id}-identity" if mqtt.client_id else None
        self.mqtt = mqtt
        self.shards = tuple(shards)  # mqtt.shards > 1: each node's identity on its shard
        self.admin: DynsecAdmin | ShardedAdmin
        self.roles: NodeRoleSync | ShardedRoles
        self.issuer: CredentialIssuer | ShardedIssuer
        if len(self.shards) > 1:
            admins = [DynsecAdmin(dataclasses.replace(s, client_id=admin_id)) for s in shards]
            self.admin = ShardedAdmin(admins)
            self.roles = ShardedRoles([NodeRoleSync(a) for a in admins])
            self.issuer = ShardedIssuer(
                self.admin,
                [
                    CredentialIssuer(
                        a, lifetime=settings.lifetime, validations_of=self.roles.validations_of
                    )
                    for a in admins
                ],
            )
        else:
            self.admin = DynsecAdmin(dataclasses.replace(mqtt, client_id=admin_id))
            self.roles = NodeRoleSync(self.admin)
            self.issuer = CredentialIssuer(
                self.admin, lifetime=settings.lifetime, validations_of=self.roles.validations_of
            )
        self.server = EnrollmentServer(
            reviewer,
            self.issuer,
            min_reissue=settings.min_reissue_seconds,
            broker_ready=lambda: self.admin.connected,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._listers: Listers | None = None
        self.background: set[asyncio.Task[None]] = set()  # one-shot tasks, cancelled at stop
        self.ca_file: Path | None = None
        self.cert_reloader: CertReloader | None = None
        self._reload_task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Serve enrollments (every replica). The port first: a port that cannot be bound
        leaves nothing running (no broker connection half-open at exit). A certificate
        given as files is picked up again when they change (cert-manager renewals)."""
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
        self.admin.start()
        return port

    def lead(self, registry: CollectorRegistry | None, *, listers: Listers | None = None) -> None:
        """The leader's duties, for one term: the expiry sweep, the broker ACL check and,
        given Node and agent Pod names (`listers`), revoking the credentials of Nodes and
        Pods that are gone (at once, then every `departed_every` seconds)."""
        if self._tasks:
            return
        self._listers = listers
        self._tasks.append(asyncio.create_task(self._maintain(), name="netval-identity-sweep"))
        self.roles.restart()  # read what the broker holds again: another leader wrote since
        self._tasks.append(asyncio.create_task(self.roles.run(), name="netval-node-roles"))
        self._once(self.check_broker_acl(registry), "netval-broker-acl-check")

    def _once(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def stop_leading(self) -> None:
        await cancel_and_wait([*self._tasks, *self.background])
        self._tasks.clear()
        self.background.clear()

    async def stop(self) -> None:
        await self.stop_leading()
        if self._reload_task is not None:
            await cancel_and_wait([self._reload_task])
        await self.server.stop()
        await self.admin.stop()

    async def check_broker_acl(self, registry: CollectorRegistry | None) -> None:
        """Once per start: a credential for a reserved probe node must not publish for another
        node (logged, and `netval_broker_acl_violations`); the credential is revoked after."""
        try:
            cred = await self.issuer.issue(ACL_PROBE_NODE, ACL_PROBE_POD)
        except DynsecError as exc:
            log.warning("broker ACL check could not run: no probe credential: %s", exc)
            return
        try:
            probe = dataclasses.replace(
                self.shards[shard_of(ACL_PROBE_NODE, len(self.shards))]
                if self.shards
                else self.mqtt,
                username=cred.username,
                password=cred.password,
                client_id=cred.client_id,
            )
            check = BrokerAclCheck(probe, own_client_id=True)
            if registry is not None:
                registry.register(check)
            await check.run()
        finally:
            await self.revoke_node(ACL_PROBE_NODE)

    async def revoke_node(self, node: str) -> None:
        self.server.forget_node(node)
        self.roles.forget(node)
        try:
            await self.issuer.revoke_node(node)
        except DynsecError as exc:  # an event handler is not retried: the expiry sweep is
            log.warning("cannot revoke node %s now (it expires with its credential): %s", node, exc)

    async def revoke_departed(self, listers: Listers) -> tuple[list[str], list[str]]:
        """Revoke what holds a credential but no longer exists: (nodes, pod clients).
        A Node deleted while no replica led (a SIGKILL, a rollout) was seen by nobody; an
        agent Pod replaced by a rollout, or gone when its node left every validation, would
        keep its credential until expiry. Credentials are listed before Nodes and Pods, so
        one issued for a Pod that exists is never taken for a departed one; reserved names
        (the ACL probe's, "_...") are no Node's."""
        node_names, pod_names = listers
        try:
            clients = await self.issuer.enrolled()
            nodes = await node_names()
            pods = await pod_names()
        except Exception as exc:  # the expiry sweep still ends them
            log.warning(
                "cannot look for departed nodes now (their credentials expire): %s", error_text(exc)
            )
            return [], []
        owned = {u: (n, p) for u, (n, p) in clients.items() if not n.startswith("_")}
        departed = sorted({n for n, _ in owned.values() if n not in nodes})
        for node in departed:
            log.info("node %s holds an MQTT identity but no longer exists: revoking it", node)
            await self.revoke_node(node)
        stale = sorted(u for u, (n, p) in owned.items() if n in nodes and p not in pods)
        if stale:
            log.info("revoking %d MQTT credentials of agent pods that no longer exist", len(stale))
            try:
                await self.issuer.revoke_clients(stale)
            except DynsecError as exc:
                log.warning("cannot revoke them now (they expire): %s", exc)
                stale = []
        return departed, stale

    async def _maintain(self) -> None:
        """After each (re)connect, deny by default; then expire credentials periodically,
        and revoke departed Nodes' and Pods' at once and every `departed_every` seconds."""
        every = min(MAX_SWEEP_SECONDS, self.settings.lifetime.total_seconds() / 12)
        if self._listers is not None:
            every = min(every, self.settings.departed_every)
        prepared_for = 0
        departed_at = float("-inf")
        while True:
            with contextlib.suppress(DynsecError):
                if self.admin.connects != prepared_for and self.admin.connected:
                    await self.issuer.prepare()
                    prepared_for = self.admin.connects
                await self.issuer.expire()
            now = time.monotonic()
            if (
                self._listers is not None
                and prepared_for
                and now - departed_at >= self.settings.departed_every
            ):
                departed_at = now
                await self.revoke_departed(self._listers)
            await asyncio.sleep(every if prepared_for == self.admin.connects else 1.0)


def build_identity(settings: IdentitySettings, operator: OperatorSettings) -> IdentityService:
    reviewer = PodTokenReviewer(load_kube_client(), namespace=operator.agent_namespace)
    return IdentityService(settings, operator.mqtt, reviewer, operator.mqtt_shards)


async def start_identity(memo: kopf.Memo, operator: OperatorSettings) -> None:
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
    service.lead(registry, listers=(_node_names, partial(_agent_pod_names, operator)))
    runtime = memo.get(RUNTIME_KEY)
    if isinstance(runtime, OperatorRuntime):
        # each node's role follows the validations that target it (in the next status window)
        runtime.on_node_targets = service.roles.update
        runtime.targets_changed()
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


async def _node_names() -> set[str]:
    kube = KubeApi(load_kube_client())
    try:
        return await kube.list_node_names()
    finally:
        kube.close()


async def _agent_pod_names(operator: OperatorSettings) -> set[str]:
    selector = ",".join(f"{k}={v}" for k, v in AGENT_POD_LABELS.items())
    kube = KubeApi(load_kube_client())
    try:
        return await kube.list_pod_names(operator.agent_namespace, selector)
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
