"""Kubernetes API faults against the operator's API calls, over real HTTP (tests/kube.py's
fault injection): 500/503, 409 conflicts and hanging requests on status and Node patches.
Every call is bounded and retried; one validation's failing status never holds another's;
hung Node PATCHes never delay a status write; after the faults the operator converges and
never writes a status older than one it computed since.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.keys import LabelKey
from netval.operator.kube import api as kube_api
from netval.operator.kube.api import KubeApi
from netval.operator.term_runtime import OperatorRuntime
from operator_env import NV, add_node, publish, report, report_msg, validation

TAINT = "netval.io/fabric-unhealthy"
STATUS = r"/networkvalidations/pool-a/status$"
FAST = (1.0, 0.5)  # (connect, read) seconds: a hung request ends quickly here


def fast_api(kube: KubeCluster, **kwargs: Any) -> KubeApi:
    return KubeApi(kube.api_client(), timeout=FAST, backoff=(0.01, 0.05), **kwargs)


def make_pool(kube: KubeCluster, name: str = "pool-a") -> None:
    kube.create(validation(name))


def stored_status(kube: KubeCluster, name: str = "pool-a") -> dict[str, Any]:
    obj = kube.stored(NV, "networkvalidations", name)
    return dict((obj or {}).get("status") or {})


# -- KubeApi against the real HTTP API ---------------------------------------------------


def test_node_and_pod_names_are_listed_in_pages_of_metadata_and_a_failed_page_is_retried(
    kube: KubeCluster,
) -> None:
    names = {f"gpu-{i:02d}" for i in range(7)}
    for name in names:
        add_node(kube, name, {"nvidia.com/gpu.present": "true"})
    api = fast_api(kube)
    failing = kube.inject("GET", r"/api/v1/nodes\?", status=503, times=1)
    seen: list[dict[str, Any]] = []
    original = api._metadata_page

    def page(lister: Any, limit: int, after: str | None) -> dict[str, Any]:
        found = original(lister, limit, after)
        seen.append(found)
        return found

    api._metadata_page = page  # type: ignore[method-assign]
    assert asyncio.run(api.list_node_names(page=3)) == names
    assert failing.hits == 1
    assert [len(p["items"]) for p in seen] == [3, 3, 1]
    assert {p["kind"] for p in seen} == {"PartialObjectMetadataList"}
    assert all(set(item) == {"apiVersion", "kind", "metadata"} for p in seen for item in p["items"])
    # Pods the same way, in one namespace and by label.
    kube.ensure_namespace("agents")
    for i in range(4):
        labels = {"app.kubernetes.io/name": "netval-agent"} if i < 3 else {}
        kube.create({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"agent-{i}", "namespace": "agents", "labels": labels},
                     "spec": {"containers": [{"name": "a", "image": "x"}]}})  # fmt: skip
    pods = asyncio.run(api.list_pod_names("agents", "app.kubernetes.io/name=netval-agent", page=2))
    assert pods == {"agent-0", "agent-1", "agent-2"}


def test_node_writes_retry_5xx_and_conflicts(kube: KubeCluster) -> None:
    add_node(kube, "gpu-a", {})
    api = fast_api(kube)
    errors = kube.inject("PATCH", r"/api/v1/nodes/gpu-a$", status=503, times=1)
    conflict = kube.inject("PATCH", r"/api/v1/nodes/gpu-a$", status=409, times=1)
    assert asyncio.run(api.set_node_gating("gpu-a", "unhealthy", True))
    assert (errors.hits, conflict.hits) == (1, 1)
    node = kube.get("v1", "nodes", "gpu-a")
    assert node["metadata"]["labels"][LabelKey.FABRIC.value] == "unhealthy"
    assert [t["key"] for t in node["spec"]["taints"]] == [TAINT]
    kube.inject("PATCH", r"/api/v1/nodes/gpu-a$", status=500, times=1)
    assert asyncio.run(api.set_node_label("gpu-a", "healthy"))
    assert api.retries == 2  # the 503 and the 500; the 409 re-reads the Node in its own loop


def test_a_failure_that_outlasts_the_retries_is_raised(kube: KubeCluster) -> None:
    add_node(kube, "gpu-a", {})
    api = fast_api(kube)
    fault = kube.inject("PATCH", r"/api/v1/nodes/gpu-a$", status=500)
    with pytest.raises(ApiException) as info:
        asyncio.run(api.set_node_label("gpu-a", "healthy"))
    assert info.value.status == 500 and fault.hits == kube_api.API_ATTEMPTS


def test_a_hung_request_times_out(kube: KubeCluster) -> None:
    make_pool(kube)
    api = fast_api(kube, attempts=2)
    fault = kube.inject("PATCH", STATUS, hang=30)
    with pytest.raises(urllib3.exceptions.HTTPError):  # ReadTimeoutError / MaxRetryError
        asyncio.run(api.patch_status("pool-a", {"observedGeneration": 1}))
    assert fault.hits == 1  # a status patch is tried once: the writer retries next window
    fault.times = 0
    lists = kube.inject("GET", r"/networkvalidations$", hang=30, times=1)
    assert asyncio.run(api.list_validation_names()) == ["pool-a"]  # the 2nd attempt
    assert lists.hits == 1


def test_hung_node_patches_do_not_delay_a_status_write(kube: KubeCluster) -> None:
    """The issue's case: 6 hung Node PATCHes (16 before, in the shared default pool) held a
    status write ~10 s. Status writes have their own threads."""
    make_pool(kube)
    for i in range(6):
        add_node(kube, f"gpu-{i}", {})
    api = KubeApi(kube.api_client(), timeout=(1.0, 20.0), attempts=1)
    hung = kube.inject("PATCH", r"/api/v1/nodes/", hang=20)

    async def main() -> None:
        nodes = [asyncio.create_task(api.set_node_label(f"gpu-{i}", "healthy")) for i in range(6)]
        await asyncio.sleep(0)
        await api.patch_status("pool-a", {"observedGeneration": 7})
        assert not any(t.done() for t in nodes)  # still hanging, and the status is written
        for t in nodes:
            t.cancel()

    asyncio.run(main())
    assert stored_status(kube)["observedGeneration"] == 7
    wait_for(lambda: hung.hits == 6, timeout=10, what="the 6 hung node patches")
    kube.clear_faults()
    api.close()


# -- the operator under API faults -------------------------------------------------------


@pytest.fixture
def fast_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_api, "API_TIMEOUT", FAST)
    monkeypatch.setattr(kube_api, "BACKOFF_BASE", 0.01)


@pytest.fixture
def faulty_operator(
    fast_timeouts: None, operator: tuple[OperatorRuntime, InMemorySpanExporter]
) -> Iterator[OperatorRuntime]:
    yield operator[0]


def versions(kube: KubeCluster, name: str) -> list[dict[str, Any]]:
    """Every stored status of `name`, oldest first (each write that changed something)."""
    out = []
    for obj in kube.history(NV, "networkvalidations", name):
        status = (obj or {}).get("status")
        if status and (not out or out[-1] != status):
            out.append(status)
    return out


def nodes_of(kube: KubeCluster, name: str) -> dict[str, int]:
    return dict(stored_status(kube, name).get("nodes") or {})


def test_one_failing_validation_does_not_hold_another_and_catches_up(
    cluster: KubeCluster, faulty_operator: OperatorRuntime, mosquitto_broker: MosquittoBroker
) -> None:
    runtime = faulty_operator
    failing = cluster.inject("PATCH", STATUS, status=503)
    hung = cluster.inject("PATCH", STATUS, hang=30)  # after the 503s stop: a hang
    hung.times = 0
    make_pool(cluster, "pool-a")
    make_pool(cluster, "pool-b")
    wait_for(lambda: nodes_of(cluster, "pool-b").get("targeted") == 4, what="pool-b written")
    # gpu-a fails, then passes again, while pool-a's writes fail and then hang
    publish(mosquitto_broker, [report_msg(report("gpu-a", Status.FAIL))])
    publish(mosquitto_broker, [report_msg(report("gpu-a", validation_name="pool-b"))])
    wait_for(lambda: nodes_of(cluster, "pool-b").get("reporting") == 1, what="pool-b folds")
    wait_for(lambda: failing.hits >= 3, what="pool-a's failing writes")
    failing.times, hung.times = 0, None
    wait_for(lambda: hung.hits >= 2, what="pool-a's hung writes")
    publish(mosquitto_broker, [report_msg(report("gpu-a", Status.PASS))])
    publish(mosquitto_broker, [report_msg(report("gpu-b", validation_name="pool-b"))])
    wait_for(lambda: nodes_of(cluster, "pool-b").get("reporting") == 2, what="pool-b, hung a")
    assert stored_status(cluster, "pool-a") == {}  # nothing of pool-a got through
    pool_a = runtime.store.states["pool-a"]
    wait_for(lambda: pool_a.nodes["gpu-a"].status is Status.PASS, what="gpu-a passes again")
    cluster.clear_faults()
    wait_for(
        lambda: nodes_of(cluster, "pool-a").get("reporting") == 1,
        what="pool-a converges after the faults",
    )
    # the first status of pool-a that got through is the newest: gpu-a's superseded
    # failure was never written
    assert all(v["nodes"]["failing"] == 0 for v in versions(cluster, "pool-a"))
    assert runtime.status.write_failures >= 5


def test_node_gating_converges_through_5xx_and_conflicts(
    cluster: KubeCluster, faulty_operator: OperatorRuntime, mosquitto_broker: MosquittoBroker
) -> None:
    nodes = r"/api/v1/nodes/gpu-[a-d]$"
    errors = cluster.inject("PATCH", nodes, status=500, times=6)
    conflicts = cluster.inject("PATCH", nodes, status=409, times=6)
    cluster.create(validation(gating={"taint": True, "maxUnhealthyPercent": 50}))
    wait_for(lambda: nodes_of(cluster, "pool-a").get("targeted") == 4, what="pool-a written")
    msgs = [report_msg(report("gpu-a", Status.FAIL))]
    msgs += [report_msg(report(n)) for n in ("gpu-b", "gpu-c", "gpu-d")]
    publish(mosquitto_broker, msgs)

    def gating() -> dict[str, tuple[str | None, bool]] | None:
        out = {}
        for n in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
            node = cluster.stored("v1", "nodes", n) or {}
            label = (node["metadata"].get("labels") or {}).get(LabelKey.FABRIC.value)
            taints = [t["key"] for t in (node.get("spec") or {}).get("taints") or []]
            out[n] = (label, TAINT in taints)
        return out if all(label is not None for label, _ in out.values()) else None

    seen = wait_for(gating, timeout=30, what="labels and taints despite the faults")
    wait_for(lambda: (gating() or {}).get("gpu-a") == ("unhealthy", True), what="taint")
    assert errors.hits == 6 and conflicts.hits == 6
    # the queue writes one node at a time (first queued first): the others converge after
    healthy = {n: ("healthy", False) for n in ("gpu-b", "gpu-c", "gpu-d")}
    wait_for(
        lambda: {n: v for n, v in (gating() or {}).items() if n != "gpu-a"} == healthy,
        timeout=30,
        what="the other nodes labelled healthy",
    )
    assert not any(tainted for n, (_, tainted) in seen.items() if n != "gpu-a")
