"""The `netval operator` process: its servers, its leadership and its terms.

In order, each step only once the one before it worked (a failure leaves nothing running):
1. configuration (checked by the CLI before this module runs);
2. the liveness and metrics ports, bound at once (a taken port ends the process, exit 2);
3. with `--standalone`: one term, at once. Otherwise the Lease (`leadership`): the replica
   that holds it runs a term, the others stand by, answering probes and serving metrics;
4. a term is one run of Kopf (all netval handlers, the runtime with its MQTT ingest, status
   writer and node gating, the gate releaser, the Kueue controller, the admission webhook and
   its configurations) with a fresh memo: a new leader starts from fresh state.

What a Service routes to any ready replica is served by the process, leader or not: the
admission webhook and agent enrollment (`identity`); a term adds only their writing duties.

Kopf's peering is not used: it pauses only Kopf's own watches, not the loops started at
Kopf's start-up, so a paused replica kept writing. Here a standby runs no Kopf at all.

One writer, for real: every Kubernetes write asks the write fence (`leadership.fence`) right
before it is sent, and a replica that loses leadership exits at once (EXIT_LEADERSHIP_LOST,
as controller-runtime does): nothing of its term, threads included, is left to write after
the next leader's first write. The Deployment restarts it; it then stands by.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import kopf
from kubernetes import client
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from netval.infra.metrics_server import serve_metrics
from netval.infra.supervised import TaskRestartsCollector
from netval.operator.admission.server import SHARED_SERVICE_MEMO_KEY
from netval.operator.identity.metrics import IdentityCollector
from netval.operator.identity.service import (
    SHARED_MEMO_KEY as SHARED_IDENTITY_MEMO_KEY,
)
from netval.operator.identity.service import (
    IdentityService,
    build_identity,
    identity_settings_from_env,
)
from netval.operator.ingest.shards import broker_health
from netval.operator.kube.api import load_kube_client
from netval.operator.leadership.elector import LeaderElector
from netval.operator.leadership.fence import WRITE_FENCE
from netval.operator.leadership.lease import LeaseClient
from netval.operator.leadership.settings import ElectionSettings, election_settings_from_env
from netval.operator.leadership.terms import run_term, run_terms
from netval.operator.metrics import operator_registry
from netval.operator.settings import OperatorSettings
from netval.operator.term_runtime import OperatorRuntime
from netval.operator.term_startup import SIGNALS_KEY, started_runtime, stop_runtime
from netval.operator.thread_pools import PROCESS_POOLS

if TYPE_CHECKING:
    from netval.operator.admission.options import WebhookOptions
    from netval.operator.admission.server import WebhookService

log = logging.getLogger("netval.operator")

STANDALONE_STOP_GRACE = 10.0  # seconds Kopf gets to stop when no Lease bounds it
EXIT_LEADERSHIP_LOST: Final = 1  # controller-runtime's exit on a lost Lease


class OperatorStartError(RuntimeError):
    """The process cannot start (e.g. a port is taken): one line, nothing left running."""


async def run_operator(
    settings: OperatorSettings,
    *,
    standalone: bool,
    liveness_endpoint: str | None = None,
    metrics_addr: tuple[str, int] | None = None,
    stop_flag: asyncio.Event | None = None,
    webhook: WebhookOptions | None = None,
    election: ElectionSettings | None = None,
) -> None:
    """Without `standalone`, replicas elect one leader on a Lease (`election`) and only the
    leader runs Kopf and every writer; standalone runs them at once, without a Lease. Kopf's
    own peering is never used. Without `webhook` no admission webhook is served."""
    _register_handlers(settings)
    process = OperatorProcess(settings, webhook=webhook)
    await process.run(
        standalone=standalone,
        election=election,
        liveness_endpoint=liveness_endpoint,
        metrics_addr=metrics_addr,
        stop_flag=stop_flag,
    )


def _register_handlers(settings: OperatorSettings) -> None:
    # importing them registers the handlers with Kopf
    import netval.operator.admission.handlers  # admission webhooks, gate release
    import netval.operator.handlers
    import netval.operator.leadership.kopf_session  # Kopf's writes ask the write fence

    if settings.kueue_enabled:  # Kopf watches Kueue objects only then (it needs their RBAC)
        import netval.operator.kueue.handlers  # noqa: F401  (Kueue AdmissionCheck controller)


def parse_liveness_url(url: str) -> tuple[str, int]:
    """`--liveness http://HOST:PORT/healthz` -> (host, port)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.port is None or parts.path not in ("", "/healthz"):
        raise ValueError(f"--liveness: expected http://HOST:PORT/healthz, got {url!r}")
    return parts.hostname or "0.0.0.0", parts.port  # noqa: S104 - a probe port


class OperatorProcess:
    def __init__(self, settings: OperatorSettings, *, webhook: WebhookOptions | None) -> None:
        self.settings = settings
        self.webhook = webhook
        self.memo: kopf.Memo | None = None  # the current term's
        self.elector: LeaderElector | None = None
        self.terms = 0
        self._stop = asyncio.Event()
        self._servers: list[asyncio.Server] = []
        self.webhook_service: WebhookService | None = None
        self.identity: IdentityService | None = None

    def runtime(self) -> OperatorRuntime | None:
        return None if self.memo is None else started_runtime(self.memo)

    def role(self) -> str:
        if self.elector is None:
            return "standalone"
        return "leader" if self.elector.leading else "standby"

    # -- the process ------------------------------------------------------------------------

    async def run(
        self,
        *,
        standalone: bool,
        election: ElectionSettings | None,
        liveness_endpoint: str | None,
        metrics_addr: tuple[str, int] | None,
        stop_flag: asyncio.Event | None,
    ) -> None:
        if stop_flag is not None:
            self._stop = stop_flag
        lease: LeaseClient | None = None
        try:
            if liveness_endpoint is not None:
                await self._serve("--liveness", parse_liveness_url(liveness_endpoint),
                                  CollectorRegistry(), self._alive)  # fmt: skip
            if metrics_addr is not None:
                await self._serve("--metrics-addr", metrics_addr, self._registry(), self._healthy)
            self._install_signals()
            _import_kube_apis()
            if self.webhook is not None:
                self.webhook_service = self._webhook_service(self.webhook)
            await self._start_identity()
            if standalone:
                await run_term(self._term, self._stop, grace=STANDALONE_STOP_GRACE)
                return
            election = election or election_settings_from_env(self.settings.namespace)
            WRITE_FENCE.arm(election.lease_duration, election.renew_deadline)
            lease = LeaseClient(_lease_api_client(), election.namespace, election.lease_name,
                                timeout=election.request_timeout)  # fmt: skip
            self.elector = LeaderElector(election, lease)
            log.info("leader election on Lease %s/%s as %s", election.namespace,
                     election.lease_name, election.identity)  # fmt: skip
            await run_terms(self.elector, self._term, self._stop, grace=election.stop_grace,
                            on_lost=exit_on_lost_leadership)  # fmt: skip
        finally:
            if self.webhook_service is not None:
                await self.webhook_service.stop()
            if self.identity is not None:
                await self.identity.stop()
            self._remove_signals()
            for server in self._servers:
                server.close()
            if lease is not None:
                lease.close()
            PROCESS_POOLS.close()  # after the services that submit to them stopped

    async def _serve(
        self,
        what: str,
        addr: tuple[str, int],
        registry: CollectorRegistry,
        healthy: Callable[[], tuple[bool, str]],
    ) -> None:
        host, port = addr
        try:
            self._servers.append(await serve_metrics(host, port, registry, healthy))
        except OSError as exc:
            raise OperatorStartError(f"{what} {host}:{port}: {exc.strerror or exc}") from None

    def _webhook_service(self, options: WebhookOptions) -> WebhookService:
        """Reviews are answered on every replica (the Service routes to any ready one): from
        the leader's runtime, or on a standby from the NetworkValidation objects the leader
        wrote. Only a term writes the webhook configurations (`admission_startup`)."""
        from netval.operator.admission.reviewer import Reviewer
        from netval.operator.admission.server import WebhookService

        excluded = [*options.excluded_namespaces, self.settings.namespace]
        service = WebhookService(options, Reviewer(_CurrentTerm(self)), excluded)
        service.writes_configurations = False
        service.start()
        return service

    async def _start_identity(self) -> None:
        settings = identity_settings_from_env()  # checked by the CLI
        if settings is None:
            return
        service = build_identity(settings, self.settings)
        try:
            await service.start()
        except OSError as exc:
            await service.stop()
            where = f"{settings.host}:{settings.port}"
            raise OperatorStartError(f"NETVAL_ENROLL_ADDR {where}: {exc.strerror or exc}") from None
        self.identity = service

    def _install_signals(self) -> None:
        # Kopf installs its own while a term runs (and stops the term on them); ours stop the
        # process otherwise, e.g. a standby on SIGTERM.
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._stop.set)

    def _remove_signals(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    # -- a term -----------------------------------------------------------------------------

    async def _term(self, stop: asyncio.Event) -> None:
        # Kopf stops itself on SIGTERM, but then waits 5 s for its own waiter of our stop flag
        # (a "hung" task): the start-up handler puts our handlers back (SIGNALS_KEY), which
        # stop the term through that flag at once.
        memo = kopf.Memo(settings=self.settings, webhook=self.webhook)
        memo[SIGNALS_KEY] = self._install_signals
        if self.webhook_service is not None:
            memo[SHARED_SERVICE_MEMO_KEY] = self.webhook_service
        if self.identity is not None:
            memo[SHARED_IDENTITY_MEMO_KEY] = self.identity
        self.memo = memo
        self.terms += 1
        try:
            await kopf.operator(clusterwide=True, standalone=True, memo=memo, stop_flag=stop)
        finally:
            await stop_runtime(memo)
            self.memo = None
            self._install_signals()

    # -- probes and metrics -----------------------------------------------------------------

    def _alive(self) -> tuple[bool, str]:
        return True, self.role()

    def _healthy(self) -> tuple[bool, str]:
        runtime = self.runtime()
        if runtime is None:
            holder = self.elector.holder if self.elector is not None else ""
            return True, f"{self.role()}: the Lease is held by {holder or 'nobody yet'}"
        return broker_health(runtime.ingest)

    def _registry(self) -> CollectorRegistry:
        registry = CollectorRegistry()
        registry.register(_ProcessCollector(self))
        registry.register(TaskRestartsCollector())
        registry.register(_IdentityOfProcess(self))
        return registry


def exit_on_lost_leadership() -> None:
    """End the process now: no term's task or thread gets to run again. The write fence is
    shut already, so nothing writes while the logs are flushed."""
    log.critical("leadership lost: exiting (%d) so that no write of this term can land after "
                 "the next leader's; the Deployment restarts this replica as a standby",
                 EXIT_LEADERSHIP_LOST)  # fmt: skip
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(EXIT_LEADERSHIP_LOST)


class _CurrentTerm(Mapping[str, Any]):
    """The current term's Kopf memo, or an empty one on a standby (what the Reviewer reads)."""

    def __init__(self, process: OperatorProcess) -> None:
        self._process = process

    def _memo(self) -> Mapping[str, Any]:
        memo = self._process.memo
        return {} if memo is None else memo

    def __getitem__(self, key: str) -> Any:
        return self._memo()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._memo())

    def __len__(self) -> int:
        return len(self._memo())


def _lease_api_client() -> client.ApiClient:
    """The Lease's own client: no urllib3 retries (three by default, each up to the timeout);
    the elector retries itself, every retry period, within its renew deadline."""
    load_kube_client()  # loads in-cluster or KUBECONFIG configuration as the default
    configuration = client.Configuration.get_default_copy()
    configuration.retries = False
    return client.ApiClient(configuration)


def _import_kube_apis() -> None:
    """The official client imports each API class on first use, ~1.5 s for these on a busy
    machine, blocking the event loop: done before leading, not in a term's first seconds
    (where it would delay the Lease's renewal)."""
    for name in ("AdmissionregistrationV1Api", "AppsV1Api", "CoordinationV1Api", "CoreV1Api",
                 "CustomObjectsApi"):  # fmt: skip
        getattr(client, name)


class _ProcessCollector(Collector):
    def __init__(self, process: OperatorProcess) -> None:
        self._process = process

    def collect(self) -> Iterator[Metric]:
        process = self._process
        elector = process.elector
        leading = elector is None or elector.leading
        yield GaugeMetricFamily(
            "netval_operator_leader", "1 while this replica holds the Lease (or is standalone)",
            value=int(leading),
        )  # fmt: skip
        yield CounterMetricFamily(
            "netval_operator_leader_terms", "Terms this replica led", value=process.terms
        )
        yield CounterMetricFamily(
            "netval_operator_leadership_losses",
            "Terms that ended because the Lease could not be renewed",
            value=elector.losses if elector is not None else 0,
        )
        # the term's own registry: the runtime's metrics and what a term's duties add (the
        # broker ACL check's outcome)
        memo = process.memo
        registry = None if memo is None else memo.get("metrics_registry")
        runtime = process.runtime()
        if isinstance(registry, CollectorRegistry):
            yield from registry.collect()
        elif runtime is not None:
            yield from operator_registry(runtime).collect()


class _IdentityOfProcess(Collector):
    """Enrollment metrics on every replica (each answers enrollments)."""

    def __init__(self, process: OperatorProcess) -> None:
        self._process = process

    def collect(self) -> Iterator[Metric]:
        if self._process.identity is not None:
            yield from IdentityCollector(self._process.identity).collect()
