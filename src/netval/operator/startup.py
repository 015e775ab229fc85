"""Build the operator runtime from what `netval operator` (or a test) put in Kopf's memo."""

from __future__ import annotations

import os
from typing import Any

import kopf
from kubernetes import client, config
from opentelemetry.sdk.trace.export import SpanExporter

from netval.infra.telemetry import make_tracer_provider
from netval.operator.kube_api import KubeApi
from netval.operator.runtime import OperatorRuntime
from netval.operator.settings import OperatorSettings


def load_kube_client() -> client.ApiClient:
    """In-cluster configuration inside a pod, else KUBECONFIG (development, tests)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    return client.ApiClient()


def build_runtime(memo: kopf.Memo) -> OperatorRuntime:
    settings: Any = memo.get("settings")
    if not isinstance(settings, OperatorSettings):
        raise kopf.PermanentError("netval operator started without settings in its memo")
    exporter: SpanExporter | None = memo.get("span_exporter")
    provider = make_tracer_provider(
        os.environ, default_service="netval-operator", exporter=exporter
    )
    return OperatorRuntime(settings, KubeApi(load_kube_client()), provider)
