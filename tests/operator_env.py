"""Shared pieces of the operator tests: settings, reports, MQTT publishing, and the fixtures
`cluster` (a kmock Kubernetes API with GPU nodes) and `operator` (in-process Kopf running
netval's handlers against it, with a real broker), registered in conftest.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import aiomqtt
import kopf
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.infra.mqtt_settings import MqttSettings
from netval.model import CheckId, CheckResult, Report, Status
from netval.operator.settings import OperatorSettings
from netval.operator.term_runtime import OperatorRuntime

NS = "netval-system"
NV = "netval.io/v1alpha1"
GPU = {"nvidia.com/gpu.present": "true"}
NODES = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def settings_for(broker: MosquittoBroker) -> OperatorSettings:
    mqtt = MqttSettings(
        host=broker.host,
        port=broker.port,
        tls=False,
        username=broker.username,
        password=broker.password,
        ca_file=None,
        client_id="netval-operator-test",
    )
    return OperatorSettings(
        namespace=NS,
        agent_image="registry.example/netval:test",
        mqtt=mqtt,
        agent_mqtt_url="mqtt://netval-mqtt.netval-system.svc:1883",
        agent_mqtt_username="netval-agent",
        agent_mqtt_secret="netval-mqtt-agent",
        agent_mqtt_ca_secret=None,
        status_window=0.2,
    )


def validation(name: str = "pool-a", **spec: Any) -> dict[str, Any]:
    # 60 s: a node turns stale by time after 3 intervals, longer than any test runs even on a
    # loaded machine; tests make nodes stale with `offline` or their own interval.
    return {
        "apiVersion": NV,
        "kind": "NetworkValidation",
        "metadata": {"name": name},
        "spec": {"nodeSelector": GPU, "interval": "60s", **spec},
    }


def report(
    node: str,
    status: Status = Status.PASS,
    *,
    generation: int = 1,
    validation_name: str = "pool-a",
    started: datetime | None = None,
    traceparent: str | None = None,
) -> Report:
    result = CheckResult(
        check=CheckId.MTU_INTERFACE,
        subject="ens1np0",
        status=status,
        message="MTU 9000" if status is Status.PASS else "MTU 1500, expected 9000",
        observed={"mtu": 9000 if status is Status.PASS else 1500},
        expected={"mtu": 9000},
    )
    return Report(
        validation=validation_name,
        generation=generation,
        node=node,
        started_at=started or datetime.now(UTC),
        duration_ms=2.0,
        status=status,
        results=[result],
        traceparent=traceparent,
    )


def publish(broker: MosquittoBroker, messages: list[tuple[str, bytes]]) -> None:
    async def main() -> None:
        async with aiomqtt.Client(
            broker.host, broker.port, username=broker.username, password=broker.password
        ) as client:
            for topic, payload in messages:
                await client.publish(topic, payload, qos=1, retain=True)

    asyncio.run(main())


def report_msg(r: Report) -> tuple[str, bytes]:
    return (f"netval/v1/{r.validation}/{r.node}/report", r.to_json().encode())


def state_msg(node: str, state: bytes, name: str = "pool-a") -> tuple[str, bytes]:
    return (f"netval/v1/{name}/{node}/state", state)


def add_node(kube: KubeCluster, name: str, labels: dict[str, str]) -> None:
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})


def status_of(kube: KubeCluster, name: str = "pool-a") -> dict[str, Any]:
    obj = kube.get(NV, "networkvalidations", name)
    return dict(obj.get("status") or {})


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


def wait_status(kube: KubeCluster, pred: Any, what: str, timeout: float = 30.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = status_of(kube)
        return status if status and pred(status) else None

    return wait_for(check, timeout=timeout, what=what)


@pytest.fixture
def cluster(kube: KubeCluster) -> KubeCluster:
    kube.ensure_namespace(NS)
    for node in NODES:
        add_node(kube, node, {**GPU, "topology.kubernetes.io/zone": "rack-1"})
    add_node(kube, "cpu-1", {})
    return kube


@pytest.fixture
def operator(
    request: pytest.FixtureRequest, cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> Iterator[tuple[OperatorRuntime, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    memo = kopf.Memo(
        settings=settings_for(mosquitto_broker),
        span_exporter=exporter,
        metrics_addr=("127.0.0.1", 0),
    )
    expected = request.node.get_closest_marker("handler_errors_expected") is not None
    fail_level = logging.CRITICAL if expected else logging.ERROR
    with kopf_operator(
        cluster, modules=["netval.operator.handlers"], memo=memo, fail_level=fail_level
    ):
        runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="operator runtime")
        assert isinstance(runtime, OperatorRuntime)
        wait_for(lambda: runtime.ingest.synced.is_set(), timeout=30, what="MQTT ingest synced")
        yield runtime, exporter
