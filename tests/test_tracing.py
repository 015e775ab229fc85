"""Traces as OpenTelemetry users expect them: MQTT messaging spans, k8s resource attributes,
standard sampling and OTLP headers.

- The agent's ReportPublisher and the operator's ReportIngest against a real Mosquitto, with
  in-memory span exporters: a PRODUCER span per report publish (child of the probe cycle), its
  context in the MQTT v5 user property `traceparent`, and a CONSUMER span on the operator side
  that is that producer span's child across the broker; `messaging.*` attributes per the
  current semantic conventions.
- The real `netval agent` process exporting OTLP/HTTP to a receiver in this test: the resource
  carries service.version and k8s.node/pod/namespace names from the downward-API variables,
  OTEL_EXPORTER_OTLP_HEADERS reach the receiver, OTEL_TRACES_SAMPLER=always_off samples out.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind

import mosquitto
from kube import wait_for
from netns import netval_script
from netval import __version__
from netval.agent.publish import ReportPublisher
from netval.infra.mqtt_settings import MqttSettings
from netval.infra.telemetry import (
    TelemetryConfigError,
    make_tracer_provider,
    process_span,
    sampler_from_env,
    topic_template,
)
from netval.model import CheckId, CheckResult, Report, Status
from netval.operator.ingest.subscriber import ReportIngest
from test_agent import (
    LO_CHECKS,
    NODE,
    PREFIX,
    VALIDATION,
    agent_config,
    stop_process,
    tail,
    write_agent_files,
)

pytestmark = pytest.mark.timeout(60)

CYCLE_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CYCLE_SPAN = "00f067aa0ba902b7"
TEMPLATE = "netval/v1/{validation}/{node}/report"
SRC = Path(__file__).resolve().parents[1] / "src"


def _settings(broker: mosquitto.MosquittoBroker, client_id: str) -> MqttSettings:
    return MqttSettings(
        host=broker.host,
        port=broker.port,
        username=broker.username,
        password=broker.password,
        client_id=client_id,
    )


def _report() -> Report:
    result = CheckResult(
        check=CheckId.LINK_CARRIER, subject="ens1np0", status=Status.PASS, message="up"
    )
    return Report(
        validation=VALIDATION,
        generation=1,
        node=NODE,
        started_at=datetime.now(UTC),
        duration_ms=1.0,
        status=Status.PASS,
        results=[result],
        traceparent=f"00-{CYCLE_TRACE}-{CYCLE_SPAN}-01",
    )


def _only(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> ReadableSpan:
    (span,) = [s for s in spans if s.kind is kind]
    return span


def test_topic_template_hides_node_names() -> None:
    assert topic_template(f"{PREFIX}/report") == TEMPLATE
    assert topic_template("other/topic") == "other/topic"


def test_report_publish_and_consume_spans_across_the_broker(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    agent_spans, operator_spans = InMemorySpanExporter(), InMemorySpanExporter()
    agent_provider = make_tracer_provider({}, default_service="netval-agent", exporter=agent_spans)
    operator_provider = make_tracer_provider(
        {}, default_service="netval-operator", exporter=operator_spans
    )
    received: list[Report] = []

    async def scenario() -> list[Any]:
        ingest = ReportIngest(
            _settings(mosquitto_broker, "netval-operator-test"),
            on_report=lambda r, _retained: received.append(r),
            on_state=lambda _s: None,
            tracer=operator_provider.get_tracer("netval.operator"),
        )
        properties: list[Any] = []
        task = asyncio.create_task(ingest.run())
        try:
            await asyncio.wait_for(ingest.synced.wait(), 10)
            async with aiomqtt.Client(
                mosquitto_broker.host,
                mosquitto_broker.port,
                username=mosquitto_broker.username,
                password=mosquitto_broker.password,
                protocol=aiomqtt.ProtocolVersion.V5,
            ) as watcher:
                await watcher.subscribe(f"{PREFIX}/report", qos=1)
                async with ReportPublisher(
                    _settings(mosquitto_broker, f"netval-agent-{VALIDATION}-{NODE}"),
                    VALIDATION,
                    NODE,
                    tracer=agent_provider.get_tracer("netval.agent"),
                ) as publisher:
                    await publisher.publish(_report())
                    message = await asyncio.wait_for(anext(aiter(watcher.messages)), 10)
                    properties.append(message.properties)
                await asyncio.to_thread(wait_for, lambda: received, timeout=10, what="ingest")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return properties

    try:
        (props,) = asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        agent_provider.shutdown()
        operator_provider.shutdown()

    producer = _only(agent_spans.get_finished_spans(), SpanKind.PRODUCER)
    assert producer.name == f"publish {TEMPLATE}"
    # part of the probe cycle's trace: the report's traceparent is its parent
    assert producer.parent is not None
    assert f"{producer.context.trace_id:032x}" == CYCLE_TRACE
    assert f"{producer.parent.span_id:016x}" == CYCLE_SPAN
    body = len(_report().to_json().encode())
    assert dict(producer.attributes or {}) == {
        "messaging.system": "mqtt",
        "messaging.destination.name": f"{PREFIX}/report",
        "messaging.destination.template": TEMPLATE,
        "messaging.operation.name": "publish",
        "messaging.operation.type": "send",
        "messaging.message.body.size": pytest.approx(body, abs=200),
        "messaging.client.id": f"netval-agent-{VALIDATION}-{NODE}",
    }
    # the producer's context travels as the W3C MQTT user property
    user = dict(props.UserProperty)
    assert user["traceparent"] == (
        f"00-{producer.context.trace_id:032x}-{producer.context.span_id:016x}-01"
    )

    consumer = next(
        s
        for s in operator_spans.get_finished_spans()
        if s.kind is SpanKind.CONSUMER
        and (s.attributes or {}).get("messaging.destination.name") == f"{PREFIX}/report"
    )
    assert consumer.name == f"process {TEMPLATE}"
    assert consumer.parent is not None
    assert consumer.parent.span_id == producer.context.span_id
    assert consumer.context.trace_id == producer.context.trace_id
    attributes = dict(consumer.attributes or {})
    assert attributes["messaging.system"] == "mqtt"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.operation.name"] == "process"
    assert attributes["messaging.destination.template"] == TEMPLATE
    assert attributes["messaging.client.id"] == "netval-operator-test"
    assert attributes["netval.retained"] is False
    assert received and received[0].node == NODE


def test_a_message_without_trace_context_gets_a_root_consumer_span(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    spans = InMemorySpanExporter()
    provider = make_tracer_provider({}, default_service="netval-operator", exporter=spans)
    states: list[Any] = []

    async def scenario() -> None:
        ingest = ReportIngest(
            _settings(mosquitto_broker, "netval-operator-test"),
            on_report=lambda _r, _retained: None,
            on_state=states.append,
            tracer=provider.get_tracer("netval.operator"),
        )
        task = asyncio.create_task(ingest.run())
        try:
            await asyncio.wait_for(ingest.synced.wait(), 10)
            async with aiomqtt.Client(
                mosquitto_broker.host,
                mosquitto_broker.port,
                username=mosquitto_broker.username,
                password=mosquitto_broker.password,
                protocol=aiomqtt.ProtocolVersion.V5,
            ) as client:
                await client.publish(f"{PREFIX}/state", b"online", qos=1)
            await asyncio.to_thread(wait_for, lambda: states, timeout=10, what="state")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        provider.shutdown()
    consumer = _only(spans.get_finished_spans(), SpanKind.CONSUMER)
    assert consumer.parent is None
    assert consumer.name == "process netval/v1/{validation}/{node}/state"


def test_resource_attributes_from_the_downward_api() -> None:
    env = {
        "NETVAL_NODE_NAME": "gpu-7",
        "NETVAL_POD_NAME": "netval-agent-pool-a-x2k9q",
        "NETVAL_POD_NAMESPACE": "netval-agents",
    }
    provider = make_tracer_provider(env, default_service="netval-agent")
    attributes = dict(provider.resource.attributes)
    provider.shutdown()
    assert attributes["service.name"] == "netval-agent"
    assert attributes["service.version"] == __version__
    assert attributes["k8s.node.name"] == "gpu-7"
    assert attributes["k8s.pod.name"] == "netval-agent-pool-a-x2k9q"
    assert attributes["k8s.namespace.name"] == "netval-agents"
    bare = make_tracer_provider({}, default_service="netval-agent")
    assert "k8s.pod.name" not in bare.resource.attributes
    bare.shutdown()


def test_sampler_from_env() -> None:
    assert sampler_from_env({}).get_description().startswith("ParentBased{root:AlwaysOnSampler")
    assert sampler_from_env({"OTEL_TRACES_SAMPLER": "always_off"}) is ALWAYS_OFF
    assert sampler_from_env({"OTEL_TRACES_SAMPLER": "ALWAYS_ON"}) is ALWAYS_ON
    ratio = sampler_from_env(
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}
    )
    assert isinstance(ratio, ParentBased)
    assert "TraceIdRatioBased{0.01}" in ratio.get_description()
    with pytest.raises(TelemetryConfigError, match="unknown sampler 'sometimes'"):
        sampler_from_env({"OTEL_TRACES_SAMPLER": "sometimes"})
    for arg in ("2", "-0.1", "half"):
        with pytest.raises(TelemetryConfigError, match="OTEL_TRACES_SAMPLER_ARG"):
            sampler_from_env(
                {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": arg}
            )


# -- the real agent process exporting OTLP/HTTP ----------------------------------------------


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint (POST /v1/traces, protobuf) on a free loopback port."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], ExportTraceServiceRequest]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append((headers, request))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) of everything received."""
        out = []
        for _headers, request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope.spans)
        return out


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


def _run_agent(
    tmp_path: Path, broker: mosquitto.MosquittoBroker, otlp: OtlpReceiver, **extra: str
) -> tuple[subprocess.Popen[bytes], Path]:
    env = write_agent_files(tmp_path, broker, agent_config(LO_CHECKS, interval="5s"))
    env.update(
        PYTHONPATH=str(SRC),
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{otlp.port}",
        OTEL_BSP_SCHEDULE_DELAY="200",
        NETVAL_POD_NAME="netval-agent-v-abcde",
        NETVAL_POD_NAMESPACE="netval-agents",
        **extra,
    )
    log_path = tmp_path / "agent.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [netval_script(), "agent"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, log_path


def test_agent_process_exports_with_k8s_resource_and_headers(
    tmp_path: Path, mosquitto_broker: mosquitto.MosquittoBroker, otlp: OtlpReceiver
) -> None:
    proc, log_path = _run_agent(
        tmp_path,
        mosquitto_broker,
        otlp,
        OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer%20t0ken",
        OTEL_TRACES_SAMPLER="parentbased_always_on",
    )
    try:
        wait_for(
            lambda: any(s.name == f"publish {TEMPLATE}" for _r, s in otlp.spans()),
            timeout=20,
            what=f"a publish span exported\n{tail(log_path)}",
        )
    finally:
        stop_process(proc)
    resource, producer = next((r, s) for r, s in otlp.spans() if s.name == f"publish {TEMPLATE}")
    assert resource["service.name"] == "netval-agent"
    assert resource["service.version"] == __version__
    assert resource["k8s.node.name"] == NODE
    assert resource["k8s.pod.name"] == "netval-agent-v-abcde"
    assert resource["k8s.namespace.name"] == "netval-agents"
    assert producer.kind == producer.SPAN_KIND_PRODUCER
    attributes = {a.key: a.value.string_value for a in producer.attributes}
    assert attributes["messaging.system"] == "mqtt"
    assert attributes["messaging.destination.name"] == f"{PREFIX}/report"
    cycle = next(s for _r, s in otlp.spans() if s.name == "netval.probe_cycle")
    assert producer.parent_span_id == cycle.span_id and producer.trace_id == cycle.trace_id
    assert all(h.get("authorization") == "Bearer t0ken" for h, _ in otlp.requests)


def test_agent_process_samples_out_with_always_off(
    tmp_path: Path, mosquitto_broker: mosquitto.MosquittoBroker, otlp: OtlpReceiver
) -> None:
    proc, log_path = _run_agent(tmp_path, mosquitto_broker, otlp, OTEL_TRACES_SAMPLER="always_off")

    async def first_report() -> Report:
        async with aiomqtt.Client(
            mosquitto_broker.host,
            mosquitto_broker.port,
            username=mosquitto_broker.username,
            password=mosquitto_broker.password,
        ) as client:
            await client.subscribe(f"{PREFIX}/report", qos=1)
            message = await asyncio.wait_for(anext(aiter(client.messages)), 12)
            assert isinstance(message.payload, bytes)
            return Report.model_validate_json(message.payload)

    try:
        report = asyncio.run(first_report())
    except TimeoutError:
        raise AssertionError(f"no report\n{tail(log_path)}") from None
    finally:
        stop_process(proc)  # SIGTERM: the batch processor flushes whatever it holds
    # the trace context still travels, flagged not sampled; nothing was exported
    assert report.traceparent is not None
    assert int(report.traceparent.rsplit("-", 1)[1], 16) & 0x01 == 0  # the sampled flag
    assert otlp.spans() == []


def test_agent_refuses_an_unknown_sampler(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(agent_config(LO_CHECKS)))
    proc = subprocess.run(
        [netval_script(), "agent"],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(SRC),
            "NETVAL_CONFIG": str(config),
            "NETVAL_NODE_NAME": NODE,
            "NETVAL_MQTT_URL": f"mqtt://127.0.0.1:{mosquitto.free_port()}",
            "NETVAL_METRICS_ADDR": "off",
            "OTEL_TRACES_SAMPLER": "sometimes",
        },
        capture_output=True,
        text=True,
        timeout=15,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("netval: error: OTEL_TRACES_SAMPLER: unknown sampler")
    assert "Traceback" not in proc.stderr


# -- the trace context of a received message is untrusted ------------------------------------

_TEXT = st.text(max_size=80) | st.sampled_from(
    [
        f"00-{CYCLE_TRACE}-{CYCLE_SPAN}-01",
        f"00-{'0' * 32}-{CYCLE_SPAN}-01",  # invalid all-zero trace id
        f"ff-{CYCLE_TRACE}-{CYCLE_SPAN}-01",  # reserved version
        f"00-{CYCLE_TRACE}-{CYCLE_SPAN}-01" + "x" * 600,
        "",
    ]
)
_PAIR = st.tuples(st.sampled_from(["traceparent", "tracestate", "other"]) | st.text(), _TEXT)
_GARBAGE = st.one_of(
    st.none(),
    st.integers(),
    st.text(),
    st.lists(_PAIR, max_size=4),
    st.lists(st.one_of(st.integers(), st.text(), st.tuples(st.text()), _PAIR), max_size=4),
)


class _Props:
    def __init__(self, user: object) -> None:
        self.UserProperty = user


_FUZZ_SPANS = InMemorySpanExporter()
_FUZZ_TRACER = make_tracer_provider(
    {}, default_service="netval-operator", exporter=_FUZZ_SPANS
).get_tracer("fuzz")


@settings(max_examples=300, deadline=None)
@given(user=_GARBAGE, topic=st.text(max_size=60) | st.just(f"{PREFIX}/report"))
def test_hostile_trace_properties_never_break_consumption(user: object, topic: str) -> None:
    _FUZZ_SPANS.clear()
    with process_span(_FUZZ_TRACER, topic, body_size=1, properties=_Props(user)) as span:
        assert span.is_recording()
    (finished,) = _FUZZ_SPANS.get_finished_spans()
    assert finished.kind is SpanKind.CONSUMER
    if finished.parent is not None:
        # only a well-formed W3C traceparent is ever followed
        assert finished.parent.is_valid and finished.parent.is_remote
        assert f"{finished.context.trace_id:032x}" == CYCLE_TRACE
