"""OpenTelemetry set-up shared by agent and operator (agent: one trace per probe cycle).

The tracer provider is built from the standard OTEL_* variables (or the spec's
telemetry.otlpEndpoint); with no endpoint configured, spans are still made (their W3C
traceparent goes into the report so the operator can continue the trace) but nothing is
exported and no network call is made. The resource names the service, its version and,
in a pod, the Kubernetes node, pod and namespace (OTel's k8s.* resource conventions).

MQTT messages get messaging spans as the OpenTelemetry semantic conventions define them: a
PRODUCER span per publish (`publish <topic template>`), a CONSUMER span per message
processed (`process <topic template>`), with `messaging.system=mqtt`,
`messaging.destination.name` (the topic), `.template`, `messaging.operation.type/name`. The
producer's context travels in the MQTT v5 user property `traceparent` (the W3C Trace Context
MQTT format), so the consumer span is the producer span's child across the broker.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from netval import __version__
from netval.model.topics import parse_topic

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
ENV_TRACES_SAMPLER: Final = "OTEL_TRACES_SAMPLER"
ENV_TRACES_SAMPLER_ARG: Final = "OTEL_TRACES_SAMPLER_ARG"
MESSAGING_SYSTEM: Final = "mqtt"
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
# Downward-API variables both pod templates set (the agent DaemonSet, the chart's operator
# Deployment): the k8s.* resource attributes.
ENV_NODE_NAME: Final = "NETVAL_NODE_NAME"
ENV_POD_NAME: Final = "NETVAL_POD_NAME"
ENV_POD_NAMESPACE: Final = "NETVAL_POD_NAMESPACE"
_K8S_RESOURCE: Final = (
    ("k8s.node.name", ENV_NODE_NAME),
    ("k8s.pod.name", ENV_POD_NAME),
    ("k8s.namespace.name", ENV_POD_NAMESPACE),
)


class TelemetryConfigError(ValueError):
    pass


def make_tracer_provider(
    env: Mapping[str, str],
    *,
    default_service: str,
    otlp_endpoint: str | None = None,
    exporter: SpanExporter | None = None,
    resource_attributes: Mapping[str, str | None] | None = None,
) -> TracerProvider:
    """`exporter` is for tests (an in-memory exporter); production exports OTLP/HTTP.
    The resource: service.name, service.version, k8s.node/pod/namespace names from the
    downward-API variables, then `resource_attributes`; unset ones (None, "") are left
    out. OTEL_RESOURCE_ATTRIBUTES (read by the SDK) adds to these."""
    service = env.get("OTEL_SERVICE_NAME") or default_service
    attributes: dict[str, AttributeValue] = {
        "service.name": service,
        "service.version": __version__,
    }
    extra: dict[str, str | None] = {k: env.get(v, "").strip() for k, v in _K8S_RESOURCE}
    extra.update(resource_attributes or {})
    attributes.update({k: v for k, v in extra.items() if v})
    sampler = sampler_from_env(env)  # checked even when nothing exports: a typo fails now
    processor: SpanProcessor | None = None
    if exporter is not None:
        processor = SimpleSpanProcessor(exporter)
    elif env.get("OTEL_TRACES_EXPORTER", "").lower() != "none" and (
        otlp_endpoint or any(env.get(v) for v in _ENDPOINT_VARS)
    ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if otlp_endpoint and not any(env.get(v) for v in _ENDPOINT_VARS):
            otlp = OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces")
        else:
            otlp = OTLPSpanExporter()  # reads the OTEL_EXPORTER_OTLP_* variables itself
        processor = BatchSpanProcessor(otlp)
    if processor is None:
        # Nothing exports: record nothing. Span contexts (trace and span ids, so every
        # report's traceparent) are still made and propagated, but no span is kept: at
        # 10,000 nodes recording spans for nobody cost the operator 150 MiB and a fifth of
        # a core in garbage collection (bench/ingest.py).
        sampler = ALWAYS_OFF
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
    if processor is not None:
        provider.add_span_processor(processor)
    return provider


def sampler_from_env(env: Mapping[str, str]) -> Sampler:
    """OTEL_TRACES_SAMPLER(_ARG) as the SDK reads them, but from `env` (the settings'
    mapping, not os.environ) and refusing an unknown name or a bad ratio instead of falling
    back silently: a 10,000-node fleet that meant to keep 1 % must not export everything."""
    name = env.get(ENV_TRACES_SAMPLER, "").strip().lower() or "parentbased_always_on"
    arg = env.get(ENV_TRACES_SAMPLER_ARG, "").strip()
    ratio = 1.0
    if name.endswith("traceidratio") and arg:
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TelemetryConfigError(
                f"{ENV_TRACES_SAMPLER_ARG}: expected a ratio between 0 and 1, got {arg!r}"
            )
    roots: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
    }
    if name in roots:
        return roots[name]
    if name.startswith("parentbased_") and name.removeprefix("parentbased_") in roots:
        return ParentBased(roots[name.removeprefix("parentbased_")])
    known = ", ".join([*roots, *(f"parentbased_{r}" for r in roots)])
    raise TelemetryConfigError(f"{ENV_TRACES_SAMPLER}: unknown sampler {name!r} ({known})")


def traceparent_of(span: trace.Span) -> str | None:
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


# --- MQTT messaging spans -------------------------------------------------------------------


def topic_template(topic: str) -> str:
    """The low-cardinality form of a netval topic (span names must not carry node names)."""
    parsed = parse_topic(topic)
    if parsed is None:
        return topic
    return f"netval/v1/{{validation}}/{{node}}/{parsed.kind.value}"


def _messaging_attributes(
    topic: str, operation: str, kind: str, client_id: str | None, body_size: int
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": topic,
        "messaging.destination.template": topic_template(topic),
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
        "messaging.message.body.size": body_size,
    }
    if client_id:
        attributes["messaging.client.id"] = client_id
    return attributes


def _context_of(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    if not traceparent:
        return None
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier[TRACESTATE] = tracestate
    return TraceContextTextMapPropagator().extract(carrier)


@contextmanager
def publish_span(
    tracer: Tracer,
    topic: str,
    *,
    body_size: int,
    client_id: str | None = None,
    parent_traceparent: str | None = None,
) -> Iterator[Span]:
    """PRODUCER span around one MQTT publish; `parent_traceparent` (the report's probe
    cycle) makes it part of that cycle's trace. An exception marks it failed and goes on."""
    with tracer.start_as_current_span(
        f"publish {topic_template(topic)}",
        context=_context_of(parent_traceparent),
        kind=SpanKind.PRODUCER,
        attributes=_messaging_attributes(topic, "publish", "send", client_id, body_size),
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span


def trace_properties(span: Span) -> Properties | None:
    """MQTT v5 PUBLISH properties carrying `span`'s context as user properties
    (`traceparent`, `tracestate`); None for a span that is not sampled or not valid."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    if TRACEPARENT not in carrier:
        return None
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    properties.UserProperty = sorted(carrier.items())
    return properties


def _user_property(properties: object, key: str) -> str | None:
    pairs = getattr(properties, "UserProperty", None)
    if not isinstance(pairs, Sequence):
        return None
    for pair in pairs:
        if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == key:
            value = pair[1]
            # untrusted: the propagator ignores a malformed value, but not an endless one
            return value if isinstance(value, str) and len(value) <= 512 else None
    return None


@contextmanager
def process_span(
    tracer: Tracer,
    topic: str,
    *,
    body_size: int,
    properties: object = None,
    client_id: str | None = None,
    retained: bool = False,
) -> Iterator[Span]:
    """CONSUMER span around processing one received MQTT message, the child of the
    producer's span when the message carries its `traceparent` user property. Made
    current, so what processing starts (netval.ingest) nests under it."""
    parent = _context_of(
        _user_property(properties, TRACEPARENT), _user_property(properties, TRACESTATE)
    )
    attributes = _messaging_attributes(topic, "process", "process", client_id, body_size)
    attributes["netval.retained"] = retained
    with tracer.start_as_current_span(
        f"process {topic_template(topic)}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    ) as span:
        try:
            yield span
        except Exception as exc:
            span.set_status(StatusCode.ERROR, type(exc).__name__)
            raise
