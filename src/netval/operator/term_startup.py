"""A leadership term's start-up and stop: Kopf's settings, and the term's runtime
(`netval.operator.term_runtime`) built from Kopf's memo (the start-up handler calls
`start_runtime`, the clean-up `stop_runtime`). The process that runs the terms, and
`run_operator`, are `netval.operator.process`."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, Final

import kopf
from opentelemetry.sdk.trace.export import SpanExporter

from netval.infra.metrics_server import serve_metrics
from netval.infra.telemetry import make_tracer_provider
from netval.model.manifest import API_GROUP
from netval.operator.ingest.shards import broker_health
from netval.operator.kube.api import KubeApi, load_kube_client
from netval.operator.metrics import operator_registry
from netval.operator.settings import OperatorSettings
from netval.operator.term_runtime import OperatorRuntime

RUNTIME_KEY: Final = "runtime"  # Kopf memo: the started OperatorRuntime
SIGNALS_KEY: Final = "install_signals"  # Kopf memo: the process's signal handlers, if any
LIST_CHUNK: Final = 500  # objects per page of the initial lists of Kopf's watches


def configure_kopf(settings: kopf.OperatorSettings, memo: kopf.Memo) -> None:
    # Kopf's own bookkeeping goes to annotations so status stays ours, and only warnings of
    # handler logs become Events (explicit Events are posted by the runtime).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # No Kopf peering: Kopf runs only in the Lease holder (netval.operator.process); Kopf's
    # peering would pause its watches, not our loops.
    settings.peering.standalone = True
    settings.watching.server_timeout = memo.get("watch_timeout", settings.watching.server_timeout)
    # Initial lists in pages (Kopf keeps one in memory): 10,000 Nodes in one response would
    # be over 100 MiB of JSON at every start and watch restart.
    settings.watching.chunk_size = LIST_CHUNK


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
    """Build the runtime, bind its metrics port if asked to, then start it and put it in the
    memo. Transactional: if a step fails nothing of it keeps running, so Kopf's retry of the
    start-up activity starts from scratch; idempotent: a runtime already in the memo is kept
    (never a second MQTT ingest with the same client id)."""
    if started_runtime(memo) is not None:
        return
    runtime = build_runtime(memo)
    addr = memo.get("metrics_addr")
    server: asyncio.Server | None = None
    registry = operator_registry(runtime)
    memo["metrics_registry"] = registry  # the identity service adds its own collector
    try:
        if addr is not None:
            host, port = addr
            server = await serve_metrics(host, port, registry, _healthy(runtime))
        runtime.start()
    except BaseException:
        if server is not None:
            server.close()
        await runtime.stop()
        raise
    runtime.metrics_server = server
    memo[RUNTIME_KEY] = runtime


def _healthy(runtime: OperatorRuntime) -> Callable[[], tuple[bool, str]]:
    def healthy() -> tuple[bool, str]:
        return broker_health(runtime.ingest)

    return healthy


async def stop_runtime(memo: kopf.Memo) -> None:
    """Idempotent (Kopf's clean-up and the end of a leadership term both call it)."""
    runtime = memo.get(RUNTIME_KEY)
    if isinstance(runtime, OperatorRuntime):
        if runtime.metrics_server is not None:
            runtime.metrics_server.close()
            runtime.metrics_server = None
        await runtime.stop()


def started_runtime(memo: kopf.Memo) -> OperatorRuntime | None:
    """The runtime once `start_runtime` put it in the memo."""
    runtime = memo.get(RUNTIME_KEY)
    return runtime if isinstance(runtime, OperatorRuntime) else None


def required_runtime(memo: kopf.Memo) -> OperatorRuntime:
    """The runtime for a resource handler; before it started, Kopf retries the event."""
    runtime = started_runtime(memo)
    if runtime is None:
        raise kopf.TemporaryError("operator runtime not started yet", delay=1)
    return runtime
