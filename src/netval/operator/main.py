"""`netval operator`, started in one place: the Kopf operator with netval's handlers
(`run_operator`), Kopf's settings and the runtime built from Kopf's memo (the startup
handler calls `start_runtime`)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import TYPE_CHECKING, Any, Final

import kopf
from opentelemetry.sdk.trace.export import SpanExporter

from netval.infra.metrics_server import serve_metrics
from netval.infra.telemetry import make_tracer_provider
from netval.model.manifest import API_GROUP
from netval.operator.kube.api import KubeApi, load_kube_client
from netval.operator.metrics import operator_registry
from netval.operator.runtime import OperatorRuntime
from netval.operator.settings import OperatorSettings

if TYPE_CHECKING:
    from netval.operator.admission.options import WebhookOptions

PEERING_NAME: Final = "netval"
RUNTIME_KEY: Final = "runtime"  # Kopf memo: the started OperatorRuntime


async def run_operator(
    settings: OperatorSettings,
    *,
    standalone: bool,
    liveness_endpoint: str | None = None,
    metrics_addr: tuple[str, int] | None = None,
    stop_flag: asyncio.Event | None = None,
    webhook: WebhookOptions | None = None,
) -> None:
    """With peering (not standalone), several replicas run and one is active at a time.
    Without `webhook` no admission webhook is served."""
    # importing them registers the handlers with Kopf
    import netval.operator.admission.handlers  # admission webhooks, gate release
    import netval.operator.handlers

    if settings.kueue_enabled:  # Kopf watches Kueue objects only then (it needs their RBAC)
        import netval.operator.kueue.handlers  # noqa: F401  (Kueue AdmissionCheck controller)

    await kopf.operator(
        clusterwide=True,
        standalone=standalone,
        peering_name=PEERING_NAME,
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(settings=settings, metrics_addr=metrics_addr, webhook=webhook),
        stop_flag=stop_flag,
    )


def configure_kopf(settings: kopf.OperatorSettings, memo: kopf.Memo) -> None:
    # Kopf's own bookkeeping goes to annotations so status stays ours, and only warnings of
    # handler logs become Events (explicit Events are posted by the runtime).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Replicas with equal peering priorities all pause (Kopf treats them as a conflict); a
    # random priority per replica makes the highest one active and the others stand by.
    settings.peering.priority = random.randint(0, 32767)  # noqa: S311 - not crypto
    settings.watching.server_timeout = memo.get("watch_timeout", settings.watching.server_timeout)


def build_runtime(memo: kopf.Memo) -> OperatorRuntime:
    """From what `netval operator` (or a test) put in Kopf's memo."""
    settings: Any = memo.get("settings")
    if not isinstance(settings, OperatorSettings):
        raise kopf.PermanentError("netval operator started without settings in its memo")
    exporter: SpanExporter | None = memo.get("span_exporter")
    provider = make_tracer_provider(
        os.environ, default_service="netval-operator", exporter=exporter
    )
    return OperatorRuntime(settings, KubeApi(load_kube_client()), provider)


async def start_runtime(memo: kopf.Memo) -> None:
    """Build and start the runtime, put it in the memo, serve its metrics if asked to."""
    runtime = build_runtime(memo)
    memo[RUNTIME_KEY] = runtime
    runtime.start()
    addr = memo.get("metrics_addr")
    if addr is not None:
        host, port = addr
        registry = operator_registry(runtime)
        memo["metrics_registry"] = registry  # the identity service adds its own collector

        def healthy() -> tuple[bool, str]:
            connected = runtime.ingest.stats.connected
            return connected, "ok" if connected else "not connected to the MQTT broker"

        runtime.metrics_server = await serve_metrics(host, port, registry, healthy)


async def stop_runtime(memo: kopf.Memo) -> None:
    runtime = memo.get(RUNTIME_KEY)
    if isinstance(runtime, OperatorRuntime):
        await runtime.stop()
        if runtime.metrics_server is not None:
            runtime.metrics_server.close()


def started_runtime(memo: kopf.Memo) -> OperatorRuntime | None:
    """The runtime once `start_runtime` put it in the memo."""
    runtime = memo.get(RUNTIME_KEY)
    return runtime if isinstance(runtime, OperatorRuntime) else None
