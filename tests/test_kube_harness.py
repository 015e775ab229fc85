"""The test harness itself: the stateful kube API (tests/kube.py) and in-process Kopf
(tests/kopf_harness.py), driven as clients drive them -- over HTTP, with the official client."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

pytest.importorskip("kmock")
kopf = pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")

from kopf_harness import kopf_operator  # noqa: E402
from kube import KubeAPIError, KubeCluster, wait_for  # noqa: E402

NV = "netval.io/v1alpha1"
WD = "harness.test/v1"

# A CRD of the harness's own (the project's CRD evolves): a status subresource, a schema that
# prunes undeclared spec fields and defaults spec.size, a status that keeps anything.
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.harness.test"},
    "spec": {
        "group": "harness.test",
        "scope": "Cluster",
        "names": {
            "kind": "Widget",
            "plural": "widgets",
            "singular": "widget",
            "shortNames": ["wd"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "color": {"type": "string"},
                                    "size": {"type": "integer", "default": 1},
                                },
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def widgets(kube: KubeCluster) -> KubeCluster:
    kube.add_crd(WIDGET_CRD)
    return kube


def _nv(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": name}, "spec": spec}


def _wd(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": WD, "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def _cm(
    name: str, namespace: str = "default", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "data": {"k": "v"},
    }


# --- stamping, status subresource, concurrency ----------------------------------------------


def test_create_stamps_uid_resource_version_generation_timestamp(kube: KubeCluster) -> None:
    first = kube.create(_nv("a", interval="60s"))
    second = kube.create(_nv("b", interval="60s"))
    for obj in (first, second):
        meta = obj["metadata"]
        assert meta["generation"] == 1
        assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
        assert obj["kind"] == "NetworkValidation" and obj["apiVersion"] == NV
    assert first["metadata"]["uid"] != second["metadata"]["uid"]
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert kube.stored(NV, "netval", "a") == first  # what the client got is what is stored


def test_generation_counts_spec_changes_only(widgets: KubeCluster) -> None:
    kube = widgets
    created = kube.create({**_wd("w", color="red"), "status": {"phase": "dropped on create"}})
    assert "status" not in created  # the status subresource: status is not set by create
    rv0 = int(created["metadata"]["resourceVersion"])

    status = kube.patch(WD, "wd", "w", {"status": {"phase": "Running"}}, subresource="status")
    assert status["status"] == {"phase": "Running"}
    assert status["metadata"]["generation"] == 1
    rv1 = int(status["metadata"]["resourceVersion"])
    assert rv1 > rv0

    labelled = kube.patch(WD, "widget", "w", {"metadata": {"labels": {"team": "net"}}})
    assert labelled["metadata"]["generation"] == 1  # metadata-only write
    rv2 = int(labelled["metadata"]["resourceVersion"])
    assert rv2 > rv1

    changed = kube.patch(WD, "widgets", "w", {"spec": {"color": "blue"}, "status": {"phase": "no"}})
    assert changed["metadata"]["generation"] == 2
    assert changed["spec"] == {"color": "blue", "size": 1}
    assert changed["status"] == {"phase": "Running"}  # the main resource ignores status
    assert int(changed["metadata"]["resourceVersion"]) > rv2

    # /status ignores everything but status; a no-op write changes nothing at all.
    again = kube.patch(WD, "wd", "w", {"spec": {"color": "green"}}, subresource="status")
    assert again == changed
    assert kube.stored(WD, "wd", "w") == changed


def test_crd_schema_prunes_and_defaults(widgets: KubeCluster) -> None:
    created = widgets.create(_wd("w", color="red", undeclared=True))
    assert created["spec"] == {"color": "red", "size": 1}
    patched = widgets.patch(WD, "wd", "w", {"spec": {"size": 3, "bogus": 1}})
    assert patched["spec"] == {"color": "red", "size": 3}
    assert patched["metadata"]["generation"] == 2
    kept = widgets.patch(WD, "wd", "w", {"status": {"any": {"thing": 1}}}, subresource="status")
    assert kept["status"] == {"any": {"thing": 1}}  # x-kubernetes-preserve-unknown-fields


def test_official_client_create_answers_201_and_returns_the_object(kube: KubeCluster) -> None:
    with kube.api_client() as client:
        core = kubernetes.client.CoreV1Api(client)
        body = kubernetes.client.V1ConfigMap(
            metadata=kubernetes.client.V1ObjectMeta(name="cm"), data={"a": "1"}
        )
        data, status, _ = core.create_namespaced_config_map_with_http_info("default", body)
        assert status == 201
        created = core.create_namespaced_config_map("default", {**_cm("cm2")})
        assert isinstance(created, kubernetes.client.V1ConfigMap)
        assert created.metadata.uid and created.metadata.resource_version
        assert data.metadata.name == "cm"

        # Strategic merge patch (the client's default for dicts) behaves as a merge patch.
        patched = core.patch_namespaced_config_map("cm", "default", {"data": {"b": "2"}})
        assert patched.data == {"a": "1", "b": "2"}

        listed = core.list_namespaced_config_map("default")
        assert listed.kind == "ConfigMapList"
        assert {item.metadata.name for item in listed.items} == {"cm", "cm2"}

        nv = kubernetes.client.CustomObjectsApi(client).create_cluster_custom_object(
            "netval.io", "v1alpha1", "networkvalidations", _nv("x")
        )
        assert nv["metadata"]["generation"] == 1

        with pytest.raises(kubernetes.client.ApiException) as exc:
            core.create_namespaced_config_map("default", body)
        assert exc.value.status == 409
        with pytest.raises(kubernetes.client.ApiException) as exc:
            core.create_namespaced_config_map("no-such-namespace", _cm("cm", "no-such-namespace"))
        assert exc.value.status == 404


def test_stale_resource_version_is_a_conflict(kube: KubeCluster) -> None:
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}, "spec": {}})
    node = kube.get("v1", "nodes", "gpu-1")
    stale_rv = node["metadata"]["resourceVersion"]
    kube.patch("v1", "nodes", "gpu-1", {"metadata": {"labels": {"someone": "else"}}})

    taints = [{"key": "netval.io/unhealthy", "effect": "NoSchedule"}]
    # merge patch with the read resourceVersion (read-modify-write of the taint list)
    with pytest.raises(KubeAPIError) as exc:
        kube.patch(
            "v1",
            "nodes",
            "gpu-1",
            {"metadata": {"resourceVersion": stale_rv}, "spec": {"taints": taints}},
        )
    assert exc.value.status == 409 and exc.value.body["reason"] == "Conflict"
    # PUT with the stale object
    with pytest.raises(KubeAPIError) as exc:
        kube.replace({**node, "spec": {"taints": taints}})
    assert exc.value.status == 409
    # JSON patch: a failed test op is 422 (what Kopf expects), a stale replace is 409
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": stale_rv}]
    with pytest.raises(KubeAPIError) as exc:
        kube.patch("v1", "nodes", "gpu-1", ops, patch_type="json")
    assert exc.value.status == 422
    # the official client: strategic merge patch carrying the stale resourceVersion
    with kube.api_client() as client, pytest.raises(kubernetes.client.ApiException) as api_exc:
        kubernetes.client.CoreV1Api(client).patch_node(
            "gpu-1", {"metadata": {"resourceVersion": stale_rv}, "spec": {"taints": taints}}
        )
    assert api_exc.value.status == 409

    # With the fresh resourceVersion the same write succeeds.
    fresh = kube.get("v1", "nodes", "gpu-1")
    fresh["spec"]["taints"] = taints
    written = kube.replace(fresh)
    assert written["spec"]["taints"] == taints
    assert int(written["metadata"]["resourceVersion"]) > int(fresh["metadata"]["resourceVersion"])
    # A PUT without resourceVersion: unconditional for built-in types, refused for CRDs.
    kube.replace({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}, "spec": {}})
    kube.create(_nv("nv"))
    with pytest.raises(KubeAPIError) as exc:
        kube.replace(_nv("nv", interval="10s"))
    assert exc.value.status == 422


def test_label_and_field_selectors_filter_lists(kube: KubeCluster) -> None:
    kube.ensure_namespace("netval-system")
    kube.create(_cm("a", labels={"app": "netval", "tier": "agent"}))
    kube.create(_cm("b", labels={"app": "netval", "tier": "operator"}))
    kube.create(_cm("c", labels={"app": "other"}))
    kube.create(_cm("d", "netval-system", labels={"app": "netval", "tier": "agent"}))

    def names(**kw: Any) -> set[str]:
        return {item["metadata"]["name"] for item in kube.list("v1", "configmaps", **kw)}

    assert names(label_selector="app=netval") == {"a", "b", "d"}
    assert names(label_selector="app=netval,tier!=agent") == {"b"}
    assert names(label_selector="tier in (agent, operator)", namespace="default") == {"a", "b"}
    assert names(label_selector="tier notin (agent),app") == {"b", "c"}
    assert names(label_selector="!tier") == {"c"}
    assert names(field_selector="metadata.name=c") == {"c"}
    assert names(field_selector="metadata.namespace!=default") == {"d"}
    with pytest.raises(KubeAPIError) as exc:
        kube.list("v1", "configmaps", label_selector="app in in (")
    assert exc.value.status == 400


def test_delete_removes_and_finalizers_delay_it(kube: KubeCluster) -> None:
    kube.create(_cm("plain"))
    kube.delete("v1", "configmaps", "plain", "default")
    assert kube.stored("v1", "configmaps", "plain", "default") is None
    with pytest.raises(KubeAPIError) as exc:
        kube.get("v1", "configmaps", "plain", "default")
    assert exc.value.status == 404

    held = {
        **_cm("held"),
        "metadata": {"name": "held", "namespace": "default", "finalizers": ["a/b"]},
    }
    kube.create(held)
    marked = kube.delete("v1", "configmaps", "held", "default")
    assert marked["metadata"]["deletionTimestamp"]
    assert kube.stored("v1", "configmaps", "held", "default") is not None
    with pytest.raises(KubeAPIError) as exc:  # no new finalizers on a terminating object
        kube.patch("v1", "cm", "held", {"metadata": {"finalizers": ["a/b", "x/y"]}}, "default")
    assert exc.value.status == 422
    kube.patch("v1", "cm", "held", {"metadata": {"finalizers": None}}, "default")
    assert kube.stored("v1", "configmaps", "held", "default") is None
    assert kube.history("v1", "configmaps", "held", "default")[-1] is None


def test_watch_streams_added_modified_deleted(kube: KubeCluster) -> None:
    start_rv = kube.create(_cm("before"))["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []

    def consume() -> None:
        with kube.api_client() as client:
            core = kubernetes.client.CoreV1Api(client)
            watch = kubernetes.watch.Watch()
            for event in watch.stream(
                core.list_namespaced_config_map, "default", timeout_seconds=1
            ):
                events.append({"type": event["type"], "name": event["object"].metadata.name})

    thread = threading.Thread(target=consume)
    thread.start()
    wait_for(lambda: kube.watchers("v1", "configmaps") == 1, what="the watch to connect")
    kube.create(_cm("w"))
    kube.patch("v1", "configmaps", "w", {"data": {"k": "v2"}}, "default")
    kube.delete("v1", "configmaps", "w", "default")
    thread.join(10)
    assert not thread.is_alive()  # timeoutSeconds ended the stream
    assert events == [
        {"type": "ADDED", "name": "before"},
        {"type": "ADDED", "name": "w"},
        {"type": "MODIFIED", "name": "w"},
        {"type": "DELETED", "name": "w"},
    ]

    # Resuming from a resourceVersion replays only what came after it; selectors apply.
    replay = list(
        kube.watch("v1", "configmaps", "default", resource_version=start_rv, timeout_seconds=0.3)
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in replay] == [
        ("ADDED", "w"),
        ("MODIFIED", "w"),
        ("DELETED", "w"),
    ]
    kube.create(_cm("sel", labels={"pick": "yes"}))
    rv = kube.get("v1", "configmaps", "sel", "default")["metadata"]["resourceVersion"]
    kube.patch("v1", "configmaps", "sel", {"metadata": {"labels": {"pick": "no"}}}, "default")
    selected = list(
        kube.watch(
            "v1",
            "configmaps",
            "default",
            resource_version=rv,
            label_selector="pick=yes",
            timeout_seconds=0.3,
        )
    )
    assert [e["type"] for e in selected] == ["DELETED"]  # it stopped matching the selector


def test_discovery_serves_what_the_operator_needs(kube: KubeCluster) -> None:
    assert kube.request("GET", "/api/v1").body["groupVersion"] == "v1"
    kueue = kube.request("GET", "/apis/kueue.x-k8s.io").body
    assert {v["version"] for v in kueue["versions"]} == {"v1beta1", "v1beta2"}
    wanted = {
        "v1": {"namespaces", "nodes", "pods", "configmaps", "secrets", "events", "serviceaccounts"},
        "apps/v1": {"daemonsets", "deployments"},
        "batch/v1": {"jobs"},
        "coordination.k8s.io/v1": {"leases"},
        "events.k8s.io/v1": {"events"},
        "kopf.dev/v1": {"clusterkopfpeerings", "kopfpeerings"},
        "kueue.x-k8s.io/v1beta1": {"workloads", "admissionchecks", "clusterqueues"},
        "kueue.x-k8s.io/v1beta2": {"workloads", "admissionchecks", "clusterqueues"},
        NV: {"networkvalidations", "networkvalidations/status"},
    }
    for group_version, plurals in wanted.items():
        path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        served = {r["name"]: r for r in kube.request("GET", path).body["resources"]}
        assert plurals <= set(served), group_version
    netval = {r["name"]: r for r in kube.request("GET", f"/apis/{NV}").body["resources"]}[
        "networkvalidations"
    ]
    assert netval["kind"] == "NetworkValidation" and netval["namespaced"] is False
    assert "netval" in netval["shortNames"]


# --- in-process Kopf ------------------------------------------------------------------------

REGISTRY = kopf.OperatorRegistry()  # never the global one: see kopf_harness's docstring


@kopf.on.create("netval.io", "v1alpha1", "networkvalidations", registry=REGISTRY)
def _create_report(name: str, spec: Any, meta: Any, body: Any, patch: Any, **_: Any) -> None:
    with kubernetes.config.new_client_from_config() as client:  # KUBECONFIG -> the kube API
        kubernetes.client.CoreV1Api(client).create_namespaced_config_map(
            "default",
            kubernetes.client.V1ConfigMap(
                metadata=kubernetes.client.V1ObjectMeta(
                    name=f"{name}-report", labels={"netval.io/owner": name}
                ),
                data={"interval": str(spec.get("interval"))},
            ),
        )
    patch.status["observedGeneration"] = meta["generation"]  # a field the project's CRD declares
    kopf.info(body, reason="Deployed", message="report created")  # a k8s Event, posted by Kopf


@kopf.on.delete("netval.io", "v1alpha1", "networkvalidations", registry=REGISTRY)
def _delete_report(name: str, **_: Any) -> None:
    with kubernetes.config.new_client_from_config() as client:
        kubernetes.client.CoreV1Api(client).delete_namespaced_config_map(
            f"{name}-report", "default"
        )


def test_kopf_round_trip(kube: KubeCluster) -> None:
    started = time.monotonic()
    with kopf_operator(kube, registry=REGISTRY) as run:
        run.wait_for_watch(NV, "networkvalidations")
        kube.create(_nv("fabric", interval="30s"))

        done = wait_for(
            lambda: (obj := kube.stored(NV, "netval", "fabric")) and "status" in obj and obj,
            what="the status patched by the handler",
        )
        assert done["status"]["observedGeneration"] == 1
        assert done["metadata"]["generation"] == 1  # Kopf's annotations/finalizers are metadata
        assert "kopf.zalando.org/KopfFinalizerMarker" in done["metadata"]["finalizers"]
        report = kube.get("v1", "configmaps", "fabric-report", "default")
        assert report["data"] == {"interval": "30s"}
        events = wait_for(
            lambda: [
                e
                for e in kube.list("v1", "events", "default")
                if e["involvedObject"]["name"] == "fabric" and e["message"] == "report created"
            ],
            what="the k8s Event posted by Kopf",
        )
        assert events[0]["involvedObject"]["uid"] == done["metadata"]["uid"]

        # Deletion goes through Kopf's finalizer: the handler runs, then the object is gone.
        kube.delete(NV, "netval", "fabric")
        wait_for(lambda: kube.stored(NV, "netval", "fabric") is None, what="the finalizer released")
        assert kube.stored("v1", "configmaps", "fabric-report", "default") is None

    assert not run.errors(logging.WARNING), run.messages(logging.WARNING)
    assert time.monotonic() - started < 10


FAILING = kopf.OperatorRegistry()


@kopf.on.create("netval.io", "v1alpha1", "networkvalidations", registry=FAILING)
def _always_fails(**_: Any) -> None:
    raise RuntimeError("boom")


def test_kopf_handler_errors_fail_the_run(kube: KubeCluster) -> None:
    """Kopf only logs a failing handler and retries it; the harness makes that a test failure."""
    with pytest.raises(AssertionError, match="boom"), kopf_operator(kube, registry=FAILING) as run:
        kube.create(_nv("fabric"))
        run.wait_for_log("failed with an exception")
