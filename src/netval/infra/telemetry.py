"""OpenTelemetry set-up shared by agent and operator (agent: one trace per probe cycle).

The tracer provider is built from the standard OTEL_* variables (or the spec's
telemetry.otlpEndpoint); with no endpoint configured, spans are still made (their W3C
traceparent goes into the report so the operator can continue the trace) but nothing is
exported and no network call is made.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def make_tracer_provider(
    env: Mapping[str, str],
    *,
    default_service: str,
    otlp_endpoint: str | None = None,
    exporter: SpanExporter | None = None,
) -> TracerProvider:
    """`exporter` is for tests (an in-memory exporter); production exports OTLP/HTTP."""
    service = env.get("OTEL_SERVICE_NAME") or default_service
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif env.get("OTEL_TRACES_EXPORTER", "").lower() != "none" and (
        otlp_endpoint or any(env.get(v) for v in _ENDPOINT_VARS)
    ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if otlp_endpoint and not any(env.get(v) for v in _ENDPOINT_VARS):
            otlp = OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces")
        else:
            otlp = OTLPSpanExporter()  # reads the OTEL_EXPORTER_OTLP_* variables itself
        provider.add_span_processor(BatchSpanProcessor(otlp))
    return provider


def traceparent_of(span: trace.Span) -> str | None:
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")
