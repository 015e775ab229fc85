"""The admission webhooks end to end: the operator serves them over HTTPS in-process (Kopf's
server, a self-signed certificate made with `cryptography`), and each test POSTs
admission.k8s.io/v1 AdmissionReviews to the URL the operator wrote into its webhook
configurations, verifying TLS with the caBundle it wrote there -- as the API server would.
Health comes from real MQTT reports; gated Pods are stored in the Kubernetes API and the
operator removes the gate through it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import socket
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
import pytest
from cryptography import x509
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.model.keys import AnnotationKey, LabelKey, SchedulingGate
from netval.operator.admission import gate_release, mutate
from netval.operator.admission.configurations import (
    MUTATE_JOBS,
    MUTATE_PODS,
    VALIDATE_JOBS,
    VALIDATE_PODS,
)
from netval.operator.admission.gate_release import RELEASER_MEMO_KEY, GateReleaser
from netval.operator.admission.options import (
    ServiceRef,
    WebhookOptions,
    parse_addr,
    parse_service,
    webhook_options,
)
from netval.operator.admission.reviewer import Reviewer
from netval.operator.term_runtime import OperatorRuntime
from operator_env import NODES, NS, NV, publish, report, report_msg, settings_for, validation

ADMISSIONREG = "admissionregistration.k8s.io/v1"
MODULES = [
    "netval.operator.handlers",
    "netval.operator.admission.handlers",
    "netval.operator.kueue.handlers",
]
FABRIC = {"key": "netval.io/fabric", "operator": "NotIn", "values": ["unhealthy"]}


@dataclass
class Webhook:
    kube: KubeCluster
    runtime: OperatorRuntime
    mutating: dict[str, Any]
    validating: dict[str, Any]
    ca_file: Path
    releaser: GateReleaser

    def hook(self, handler_id: str) -> dict[str, Any]:
        for config in (self.mutating, self.validating):
            for hook in config["webhooks"]:
                url = hook["clientConfig"].get("url", "")
                path = hook["clientConfig"].get("service", {}).get("path", "")
                if url.endswith(f"/{handler_id}") or path == f"/{handler_id}":
                    return dict(hook)
        raise LookupError(handler_id)

    def review(self, handler_id: str, obj: dict[str, Any]) -> dict[str, Any]:
        """POST an AdmissionReview for creating `obj` to the URL of the webhook, trusting only
        the caBundle of its configuration; the AdmissionReview response."""
        hook = self.hook(handler_id)
        ctx = ssl.create_default_context(
            cadata=base64.b64decode(hook["clientConfig"]["caBundle"]).decode()
        )
        request = urllib.request.Request(
            hook["clientConfig"]["url"],
            data=json.dumps(admission_review(obj)).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
        )
        with opener.open(request, timeout=hook["timeoutSeconds"]) as response:
            body: dict[str, Any] = json.loads(response.read())
        return body

    def wait_known(self, name: str = "pool-a") -> None:
        wait_for(lambda: self.runtime.validation_view(name), timeout=30, what=f"{name} loaded")


def admission_review(obj: dict[str, Any]) -> dict[str, Any]:
    """A CREATE request as kube-apiserver sends it (admission.k8s.io/v1)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    plural = {"Pod": "pods", "Job": "jobs"}[obj["kind"]]
    gvk = {"group": group, "version": version, "kind": obj["kind"]}
    gvr = {"group": group, "version": version, "resource": plural}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": obj["metadata"].get("name", ""),
            "namespace": obj["metadata"].get("namespace", "default"),
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:job-controller",
                "uid": str(uuid.uuid4()),
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def pod(name: str, validation_name: str | None = "pool-a", **spec: Any) -> dict[str, Any]:
    annotations = {AnnotationKey.REQUIRE_HEALTHY: validation_name} if validation_name else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


def job(name: str, validation_name: str = "pool-a") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {AnnotationKey.REQUIRE_HEALTHY: validation_name},
        },
        "spec": {
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            }
        },
    }


def patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server stores it after applying the response's JSONPatch."""
    payload = response["response"]
    if "patch" not in payload:
        return copy.deepcopy(obj)
    assert payload["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(payload["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return result


def required_terms(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = pod_spec["affinity"]["nodeAffinity"]
    terms: list[dict[str, Any]] = affinity["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(
    cluster: KubeCluster, broker: MosquittoBroker, options: WebhookOptions
) -> Iterator[Webhook]:
    memo = kopf.Memo(
        settings=settings_for(broker), span_exporter=InMemorySpanExporter(), webhook=options
    )
    with kopf_operator(cluster, modules=MODULES, memo=memo):
        runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="operator runtime")
        assert isinstance(runtime, OperatorRuntime)
        wait_for(lambda: runtime.ingest.synced.is_set(), timeout=30, what="MQTT ingest synced")
        mutating = wait_for(
            lambda: cluster.stored(ADMISSIONREG, "mutatingwebhookconfigurations", "netval.io"),
            timeout=30,
            what="the mutating webhook configuration",
        )
        validating = wait_for(
            lambda: cluster.stored(ADMISSIONREG, "validatingwebhookconfigurations", "netval.io"),
            timeout=30,
            what="the validating webhook configuration",
        )
        assert options.cert_dir is not None
        releaser = memo.get(RELEASER_MEMO_KEY)
        assert isinstance(releaser, GateReleaser)
        yield Webhook(cluster, runtime, mutating, validating, options.cert_dir / "ca.crt", releaser)


@pytest.fixture
def webhook(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> Iterator[Webhook]:
    options = WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path / "certs")
    with serving(cluster, mosquitto_broker, options) as served:
        yield served


def healthy_reports(broker: MosquittoBroker, name: str = "pool-a") -> None:
    publish(broker, [report_msg(report(n, validation_name=name)) for n in NODES])


def wait_healthy(webhook: Webhook, healthy: bool, name: str = "pool-a") -> None:
    wait_for(
        lambda: (v := webhook.runtime.validation_view(name)) is not None and v.healthy == healthy,
        timeout=30,
        what=f"{name} Healthy={healthy}",
    )


# -- the configurations --------------------------------------------------------------------------


def test_configurations_point_at_the_server_and_carry_its_ca(webhook: Webhook) -> None:
    ca = webhook.ca_file.read_bytes()
    port = None
    for config, ids in (
        (webhook.mutating, [MUTATE_PODS, MUTATE_JOBS]),
        (webhook.validating, [VALIDATE_PODS, VALIDATE_JOBS]),
    ):
        assert config["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "netval-operator"
        assert len(config["webhooks"]) == 2
        for handler_id in ids:
            hook = webhook.hook(handler_id)
            url = hook["clientConfig"]["url"]
            assert url.startswith("https://127.0.0.1:") and url.endswith(f"/{handler_id}")
            port = port or url.split(":")[2].split("/")[0]
            assert f":{port}/" in url  # one server for all four
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca
            assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] == 10
            assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
            (rule,) = hook["rules"]
            assert rule["operations"] == ["CREATE"]
            assert rule["resources"] == (["pods"] if "pods" in handler_id else ["jobs"])
            assert rule["apiGroups"] == ([""] if "pods" in handler_id else ["batch"])
            (cond,) = hook["matchConditions"]
            assert AnnotationKey.REQUIRE_HEALTHY in cond["expression"]
            (expr,) = hook["namespaceSelector"]["matchExpressions"]
            assert expr["operator"] == "NotIn" and set(expr["values"]) == {"kube-system", NS}
            assert ("reinvocationPolicy" in hook) == (config is webhook.mutating)
    # the server presents a certificate for 127.0.0.1 signed by that CA (TLS verified here)
    response = webhook.review(MUTATE_PODS, pod("plain", None))
    assert response["response"]["allowed"] is True
    # what is not an AdmissionReview for one of the four webhooks is an HTTP error
    hook = webhook.hook(MUTATE_PODS)
    ctx = ssl.create_default_context(cafile=str(webhook.ca_file))
    for url, body, code in (
        (hook["clientConfig"]["url"].replace(MUTATE_PODS, "nope"), admission_review(pod("p")), 404),
        (hook["clientConfig"]["url"], {"kind": "AdmissionReview"}, 400),
    ):
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
            ).open(request, timeout=5)
        assert info.value.code == code


def test_service_mode_policy_and_timeout(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    port = free_port()
    options = WebhookOptions(
        host="127.0.0.1",
        port=port,
        cert_dir=tmp_path / "certs",
        service=ServiceRef("netval-system", "netval-webhook"),
        failure_policy="Ignore",
        timeout_seconds=5,
    )
    with serving(cluster, mosquitto_broker, options) as served:
        ca = served.ca_file.read_bytes()
        for handler_id in (MUTATE_PODS, MUTATE_JOBS, VALIDATE_PODS, VALIDATE_JOBS):
            hook = served.hook(handler_id)
            assert "url" not in hook["clientConfig"]
            assert hook["clientConfig"]["service"] == {
                "namespace": "netval-system",
                "name": "netval-webhook",
                "port": 443,
                "path": f"/{handler_id}",
            }
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca
            assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 5)
        # the certificate is valid for the Service's names: connect as the API server would
        ctx = ssl.create_default_context(cadata=ca.decode())
        for name in ("netval-webhook.netval-system.svc",
                     "netval-webhook.netval-system.svc.cluster.local"):  # fmt: skip
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                ctx.wrap_socket(raw, server_hostname=name) as tls,
            ):
                assert tls.version() is not None
        cert = x509.load_pem_x509_certificate((tmp_path / "certs" / "tls.crt").read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "netval-webhook.netval-system.svc" in sans.get_values_for_type(x509.DNSName)
        assert (tmp_path / "certs" / "tls.key").stat().st_mode & 0o077 == 0


# -- gate mode ------------------------------------------------------------------------------------


def test_gated_while_unhealthy_and_released_when_healthy(
    webhook: Webhook, mosquitto_broker: MosquittoBroker
) -> None:
    kube = webhook.kube
    kube.create(validation())
    webhook.wait_known()  # no report yet: Healthy is Unknown, so not Healthy

    existing = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In",
                                      "values": ["gpu-a"]}]},
                ]
            }
        }
    }  # fmt: skip
    original = pod(
        "trainer-0",
        affinity=existing,
        schedulingGates=[{"name": "example.com/other"}],
    )
    response = webhook.review(MUTATE_PODS, original)
    assert response["response"]["allowed"] is True
    assert any("held by scheduling gate" in w for w in response["response"]["warnings"])
    admitted = patched(original, response)
    assert admitted["spec"]["schedulingGates"] == [
        {"name": "example.com/other"},
        {"name": SchedulingGate.FABRIC},
    ]
    assert admitted["metadata"]["labels"][LabelKey.GATED_BY] == "pool-a"
    first, second = required_terms(admitted["spec"])
    assert first["matchExpressions"] == [{"key": "pool", "operator": "In", "values": ["a"]},
                                         FABRIC]  # fmt: skip
    assert second["matchFields"] == existing["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][1]["matchFields"]  # fmt: skip
    assert second["matchExpressions"] == [FABRIC]
    # the validating webhook admits in gate mode
    assert webhook.review(VALIDATE_PODS, admitted)["response"]["allowed"] is True

    # the API server stores the mutated pod; a second gated pod without other gates
    kube.create(admitted)
    other = patched(pod("trainer-1"), webhook.review(MUTATE_PODS, pod("trainer-1")))
    kube.create(other)
    bystander = pod("bystander", None, schedulingGates=[{"name": SchedulingGate.FABRIC}])
    kube.create(bystander)  # not labelled by netval: never touched

    healthy_reports(mosquitto_broker)

    def released() -> dict[str, Any] | None:
        stored = kube.get("v1", "pods", "trainer-0", "default")
        return stored if LabelKey.GATED_BY not in stored["metadata"].get("labels", {}) else None

    stored = wait_for(released, timeout=30, what="trainer-0 released")
    assert stored["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    assert required_terms(stored["spec"])[0]["matchExpressions"][-1] == FABRIC
    stored = wait_for(
        lambda: (
            (p := kube.get("v1", "pods", "trainer-1", "default"))
            and LabelKey.GATED_BY not in (p["metadata"].get("labels") or {})
            and p
        ),
        what="trainer-1 released",
    )
    assert not stored["spec"].get("schedulingGates")
    assert kube.get("v1", "pods", "bystander", "default")["spec"]["schedulingGates"] == [
        {"name": SchedulingGate.FABRIC}
    ]

    # Usable now: a new pod gets the affinity only -- and loses a gate from its template.
    # The webhook reuses a view for 0.25 s, and the release can beat that on a fast machine
    # (the view cached by trainer-1's review said "no status yet"): poll the review itself.
    inherited = pod("trainer-2", schedulingGates=[{"name": SchedulingGate.FABRIC}])
    inherited["metadata"]["labels"] = {LabelKey.GATED_BY: "pool-a", "app": "t"}
    response = wait_for(
        lambda: (
            (r := webhook.review(MUTATE_PODS, inherited))
            and not r["response"].get("warnings")
            and r
        ),
        what="the webhook sees pool-a Usable",
    )
    assert response["response"]["allowed"] is True
    admitted = patched(inherited, response)
    assert "schedulingGates" not in admitted["spec"]
    assert admitted["metadata"]["labels"] == {"app": "t"}
    assert required_terms(admitted["spec"]) == [{"matchExpressions": [FABRIC]}]


def test_pod_gated_for_a_deleted_validation_says_so_and_stays_gated(
    webhook: Webhook, mosquitto_broker: MosquittoBroker
) -> None:
    kube = webhook.kube
    webhook.releaser.resync = 0.3  # how often gated pods are re-listed (default 15 s)
    kube.create(validation())
    webhook.wait_known()
    gated = patched(pod("trainer-0"), webhook.review(MUTATE_PODS, pod("trainer-0")))
    assert gated["spec"]["schedulingGates"] == [{"name": SchedulingGate.FABRIC}]
    kube.create(gated)

    def annotations() -> dict[str, str]:
        meta = kube.get("v1", "pods", "trainer-0", "default")["metadata"]
        return dict(meta.get("annotations") or {})

    # pool-a exists (not Healthy yet): the pod waits, unannotated
    checks = webhook.releaser.orphan_checks
    wait_for(lambda: webhook.releaser.orphan_checks >= checks + 2, what="two orphan checks")
    assert AnnotationKey.GATE_MESSAGE not in annotations()
    assert webhook.releaser.orphans_marked == 0

    kube.delete(NV, "networkvalidations", "pool-a")
    message = wait_for(
        lambda: annotations().get(AnnotationKey.GATE_MESSAGE), what="the gate message"
    )
    assert "NetworkValidation 'pool-a' does not exist" in message
    assert "'netval.io/fabric' scheduling gate" in message
    stored = kube.get("v1", "pods", "trainer-0", "default")
    assert stored["spec"]["schedulingGates"] == [{"name": SchedulingGate.FABRIC}]  # still gated
    assert webhook.releaser.orphans_marked == 1

    # recreated and Healthy: released, and the message goes with the gate
    kube.create(validation())
    webhook.wait_known()
    healthy_reports(mosquitto_broker)
    stored = wait_for(
        lambda: (
            (p := kube.get("v1", "pods", "trainer-0", "default"))
            and not p["spec"].get("schedulingGates")
            and p
        ),
        what="trainer-0 released",
    )
    assert AnnotationKey.GATE_MESSAGE not in (stored["metadata"].get("annotations") or {})
    assert LabelKey.GATED_BY not in (stored["metadata"].get("labels") or {})
    assert webhook.releaser.orphans_marked == 1


def test_job_template_is_gated_and_annotated(webhook: Webhook) -> None:
    webhook.kube.create(validation())
    webhook.wait_known()
    original = job("allreduce")
    response = webhook.review(MUTATE_JOBS, original)
    assert response["response"]["allowed"] is True
    template = patched(original, response)["spec"]["template"]
    assert template["metadata"]["annotations"] == {AnnotationKey.REQUIRE_HEALTHY: "pool-a"}
    assert template["metadata"]["labels"] == {"app": "allreduce", LabelKey.GATED_BY: "pool-a"}
    assert template["spec"]["schedulingGates"] == [{"name": SchedulingGate.FABRIC}]
    assert required_terms(template["spec"]) == [{"matchExpressions": [FABRIC]}]
    assert webhook.review(VALIDATE_JOBS, original)["response"]["allowed"] is True


# -- deny mode ------------------------------------------------------------------------------------


def test_deny_mode_refuses_with_failing_nodes_and_checks(
    webhook: Webhook, mosquitto_broker: MosquittoBroker
) -> None:
    # strict: one failing node of four refuses everything (under the default policy,
    # capacity, one of four is within the breaker's cap: see the next test)
    webhook.kube.create(validation(gating={"admission": "deny", "admissionPolicy": "strict"}))
    webhook.wait_known()
    publish(
        mosquitto_broker,
        [report_msg(report(n, Status.FAIL if n == "gpu-b" else Status.PASS)) for n in NODES],
    )
    wait_for(
        lambda: (v := webhook.runtime.validation_view("pool-a")) is not None and v.failures,
        timeout=30,
        what="pool-a failing on gpu-b",
    )
    for handler_id, obj in ((VALIDATE_PODS, pod("p")), (VALIDATE_JOBS, job("j"))):
        response = webhook.review(handler_id, obj)["response"]
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        message = response["status"]["message"]
        assert "'pool-a' is not Healthy" in message
        assert "gpu-b (mtu.interface)" in message and "gpu-a" not in message
        assert "retry" in message
    # the mutating webhook in deny mode: the affinity, never a gate
    admitted = patched(pod("p"), webhook.review(MUTATE_PODS, pod("p")))
    assert "schedulingGates" not in admitted["spec"]
    assert LabelKey.GATED_BY not in (admitted["metadata"].get("labels") or {})
    assert required_terms(admitted["spec"]) == [{"matchExpressions": [FABRIC]}]

    healthy_reports(mosquitto_broker)
    wait_healthy(webhook, True)
    wait_for(
        lambda: webhook.review(VALIDATE_PODS, pod("p"))["response"]["allowed"],
        what="admitted once Healthy",
    )


def test_capacity_policy_admits_with_one_failing_node_and_counts_healthy_nodes(
    webhook: Webhook, mosquitto_broker: MosquittoBroker
) -> None:
    """Policy capacity (the default): one failing node of four is within the breaker's cap
    (at least one node), so the validation is Usable and pods are admitted -- the affinity
    keeps them off gpu-b. A pod that needs more healthy nodes than there are waits."""
    webhook.kube.create(validation(gating={"admission": "deny"}))
    webhook.wait_known()
    publish(
        mosquitto_broker,
        [report_msg(report(n, Status.FAIL if n == "gpu-b" else Status.PASS)) for n in NODES],
    )
    view = wait_for(
        lambda: (v := webhook.runtime.validation_view("pool-a")) is not None and v.usable and v,
        timeout=30,
        what="pool-a Usable with gpu-b failing",
    )
    assert not view.healthy and view.healthy_nodes == 3
    response = webhook.review(VALIDATE_PODS, pod("p"))["response"]
    assert response["allowed"] is True
    assert required_terms(patched(pod("p"), webhook.review(MUTATE_PODS, pod("p")))["spec"]) == [
        {"matchExpressions": [FABRIC]}
    ]

    def needing(count: str) -> dict[str, Any]:
        obj = pod("big")
        obj["metadata"]["annotations"][AnnotationKey.MIN_HEALTHY_NODES] = count
        return obj

    assert webhook.review(VALIDATE_PODS, needing("3"))["response"]["allowed"] is True
    refused = webhook.review(VALIDATE_PODS, needing("4"))["response"]
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    assert "has 3 healthy node(s), the workload needs 4" in refused["status"]["message"]
    bad = webhook.review(VALIDATE_PODS, needing("many"))["response"]
    assert bad["status"]["code"] == 400 and "min-healthy-nodes" in bad["status"]["message"]
    # the Job's pods carry the count too
    big_job = job("j")
    big_job["metadata"]["annotations"][AnnotationKey.MIN_HEALTHY_NODES] = "4"
    assert webhook.review(VALIDATE_JOBS, big_job)["response"]["allowed"] is False
    template = patched(big_job, webhook.review(MUTATE_JOBS, big_job))["spec"]["template"]
    assert template["metadata"]["annotations"][AnnotationKey.MIN_HEALTHY_NODES] == "4"


def test_gate_release_follows_capacity(webhook: Webhook, mosquitto_broker: MosquittoBroker) -> None:
    """Gated pods are released when the validation is Usable (not only when Healthy); a pod
    that needs more healthy nodes stays gated until there are that many."""
    kube = webhook.kube
    kube.create(validation(gating={"recoveryReports": 1}))  # gpu-b back after one report
    webhook.wait_known()  # no report yet: Usable is Unknown, so both are gated
    small = pod("small")
    big = pod("big")
    big["metadata"]["annotations"][AnnotationKey.MIN_HEALTHY_NODES] = "4"
    for obj in (small, big):
        response = webhook.review(MUTATE_PODS, obj)["response"]
        assert any("until it is Usable" in w for w in response["warnings"])
        kube.create(patched(obj, {"response": response}))

    def gated(name: str) -> bool:
        return bool(kube.get("v1", "pods", name, "default")["spec"].get("schedulingGates"))

    publish(
        mosquitto_broker,
        [report_msg(report(n, Status.FAIL if n == "gpu-b" else Status.PASS)) for n in NODES],
    )
    wait_for(lambda: not gated("small"), timeout=30, what="small released while gpu-b fails")
    assert gated("big")  # 3 healthy nodes, it needs 4
    # a gated pod asking for 4 is gated at admission, with the count in the warning
    response = webhook.review(MUTATE_PODS, big)["response"]
    assert any("the workload needs 4" in w for w in response["warnings"])
    healthy_reports(mosquitto_broker)
    wait_for(lambda: not gated("big"), timeout=30, what="big released with 4 healthy nodes")


def test_gate_release_lists_gated_pods_by_selector_in_pages(
    webhook: Webhook, mosquitto_broker: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The releaser lists only the Pods gated for the validation (a label selector), page by
    page, and releases the Pods of every page."""
    monkeypatch.setattr(gate_release, "PAGE", 2)
    kube = webhook.kube
    kube.create(validation())
    webhook.wait_known()
    names = [f"gated-{i}" for i in range(5)]
    for name in names:
        obj = pod(name)
        kube.create(patched(obj, webhook.review(MUTATE_PODS, obj)))
    kube.create(pod("plain", None))
    before = len(kube.requests())
    healthy_reports(mosquitto_broker)

    def gated(name: str) -> bool:
        return bool(kube.get("v1", "pods", name, "default")["spec"].get("schedulingGates"))

    wait_for(lambda: not any(gated(n) for n in names), timeout=30, what="all 5 released")
    lists = [
        path
        for method, path in kube.requests()[before:]
        if method == "GET" and path.startswith("/api/v1/pods?")
    ]
    assert lists and all("labelSelector=netval.io/gated-by" in p for p in lists)
    assert all("limit=2" in p for p in lists)
    assert any("continue=" in p for p in lists), "5 gated pods take 3 pages of 2"


def test_gate_release_retries_a_conflict_on_fresh_data(
    webhook: Webhook, mosquitto_broker: MosquittoBroker
) -> None:
    """A release patch that meets another writer (409) re-reads the Pod and patches again
    with its new resourceVersion (kube.read_modify_write), instead of giving up on it."""
    kube = webhook.kube
    kube.create(validation())
    webhook.wait_known()
    obj = pod("contended")
    kube.create(patched(obj, webhook.review(MUTATE_PODS, obj)))
    conflict = kube.inject("PATCH", r"/namespaces/default/pods/contended$", status=409, times=1)
    before = len(kube.requests())
    healthy_reports(mosquitto_broker)

    def gated() -> bool:
        return bool(kube.get("v1", "pods", "contended", "default")["spec"].get("schedulingGates"))

    wait_for(lambda: not gated(), timeout=30, what="the contended pod released")
    assert conflict.hits == 1
    assert ("GET", "/api/v1/namespaces/default/pods/contended") in kube.requests()[before:]


# -- what is not judged ---------------------------------------------------------------------------


def test_unknown_validation_is_refused(webhook: Webhook) -> None:
    for handler_id, obj in (
        (MUTATE_PODS, pod("p", "nope")),
        (VALIDATE_PODS, pod("p", "nope")),
        (MUTATE_JOBS, job("j", "nope")),
    ):
        response = webhook.review(handler_id, obj)["response"]
        assert response["allowed"] is False
        assert response["status"]["code"] == 400
        assert "no NetworkValidation named 'nope'" in response["status"]["message"]
        assert "patch" not in response


def test_unannotated_pod_is_allowed_untouched(webhook: Webhook) -> None:
    for handler_id in (MUTATE_PODS, VALIDATE_PODS):
        response = webhook.review(handler_id, pod("plain", None))["response"]
        assert response["allowed"] is True
        assert "patch" not in response and not response.get("warnings")


# -- a validation the runtime has not loaded (standby replica, restart) --------------------------


def test_validation_not_loaded_is_judged_by_its_object(kube: KubeCluster) -> None:
    """Without the runtime (a standby replica behind the Service, or a restart before Kopf
    resumed the validations) the reviewer judges by the validation's object in the API."""
    kube.create(validation("pool-b", gating={"admission": "deny", "admissionPolicy": "strict"}))
    # pool-c (capacity): Healthy False but Usable True, as the active replica wrote it
    kube.create(validation("pool-c", gating={"admission": "deny"}))
    kube.patch(NV, "networkvalidations", "pool-c", {"status": {"conditions": [
        {"type": "Usable", "status": "True", "reason": "CapacityAvailable",
         "message": "3 of 4 targeted nodes healthy",
         "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
        "nodes": {"targeted": 4, "reporting": 4, "passing": 3, "failing": 1}}},
        subresource="status")  # fmt: skip
    kube.patch(NV, "networkvalidations", "pool-b", {"status": {"conditions": [
        {"type": "Healthy", "status": "False", "reason": "ChecksFailing",
         "message": "1 of 4 reporting nodes failing: gpu-c (rdma.port_state)",
         "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
        "failures": [{"node": "gpu-c", "check": "rdma.port_state", "subject": "mlx5_0/1",
                      "message": "port DOWN", "since": "2026-01-01T00:00:00Z"}]}},
        subresource="status")  # fmt: skip
    reviewer = Reviewer({})

    async def reviews() -> list[dict[str, Any]]:
        out = []
        for handler_id, obj in (
            (VALIDATE_PODS, pod("p", "pool-b")),
            (VALIDATE_PODS, pod("q", "pool-b")),
            (MUTATE_PODS, pod("p", "pool-b")),
            (VALIDATE_PODS, pod("p", "nope")),
            (VALIDATE_PODS, pod("p", "pool-c")),
            (VALIDATE_PODS, needs_four),
        ):
            out.append((await reviewer(admission_review(obj), webhook=handler_id))["response"])
        return out

    needs_four = pod("q", "pool-c")
    needs_four["metadata"]["annotations"][AnnotationKey.MIN_HEALTHY_NODES] = "4"
    before = len(kube.requests())
    denied, again, mutated, unknown, usable, short = asyncio.run(reviews())
    assert usable["allowed"] is True
    assert short["allowed"] is False and "has 3 healthy node(s)" in short["status"]["message"]
    assert denied["allowed"] is False and denied["status"]["code"] == 403
    assert "gpu-c (rdma.port_state)" in denied["status"]["message"]
    assert again == {**denied, "uid": again["uid"]}
    assert mutated["allowed"] is True and "patch" in mutated  # affinity; deny mode: no gate
    assert unknown["status"]["code"] == 400
    reads = [p for m, p in kube.requests()[before:] if m == "GET"]
    assert len(reads) == 3, reads  # pool-b once (cached), nope once, pool-c once


def test_annotation_not_a_validation_name_is_refused_before_any_lookup(kube: KubeCluster) -> None:
    """The annotation is written by whoever creates a Pod: a value no NetworkValidation can be
    named is refused without an API read, and however many names are asked for, the caches
    stay bounded."""
    reviewer = Reviewer({})
    reviewer.max_cached = 4

    async def review(name: str) -> dict[str, Any]:
        answer = await reviewer(admission_review(pod("p", name)), webhook=VALIDATE_PODS)
        return dict(answer["response"])

    async def reviews() -> list[dict[str, Any]]:
        bad = ["Pool-A", "a/b", "x" * 254, "-a", "a..b", "ä", "a b", "pool_a"]
        return [await review(name) for name in bad]

    before = len(kube.requests())
    for response in asyncio.run(reviews()):
        assert response["allowed"] is False and response["status"]["code"] == 400
        assert "is not a NetworkValidation name" in response["status"]["message"]
    assert [p for m, p in kube.requests()[before:] if m == "GET"] == []

    async def many() -> None:
        for i in range(20):
            assert (await review(f"missing-{i}"))["status"]["code"] == 400

    asyncio.run(many())
    assert len(reviewer._cache) == 4 and "missing-19" in reviewer._cache


# -- pure parts ----------------------------------------------------------------------------------


def test_json_patch_adds_missing_parents_and_replaces_subtrees() -> None:
    original = job("j")
    del original["spec"]["template"]["metadata"]
    original["spec"]["template"]["spec"]["affinity"] = None
    paths = mutate.JOB_PATHS
    new = mutate.detached(original, paths)
    mutate.mutate_job(new, gate=True, validation="pool-a")
    assert "metadata" not in original["spec"]["template"]  # the original is left alone
    ops = mutate.json_patch(original, new, paths)
    assert [(op["op"], op["path"]) for op in ops] == [
        ("add", "/spec/template/metadata"),
        ("replace", "/spec/template/spec/affinity"),
        ("add", "/spec/template/spec/schedulingGates"),
    ]
    assert jsonpatch.apply_patch(original, ops) == new

    nulls = pod("p")
    nulls["metadata"]["labels"] = None
    nulls["spec"]["affinity"] = {"nodeAffinity": None}
    new = mutate.detached(nulls, mutate.POD_PATHS)
    mutate.mutate_pod(new, gate=True, validation="pool-a")
    ops = mutate.json_patch(nulls, new, mutate.POD_PATHS)
    assert [op["op"] for op in ops] == ["replace", "replace", "add"]
    patched_pod = jsonpatch.apply_patch(nulls, ops)
    assert patched_pod == new and required_terms(patched_pod["spec"]) == [
        {"matchExpressions": [FABRIC]}
    ]
    job_with_null_meta = job("j")
    job_with_null_meta["spec"]["template"]["metadata"] = None
    new = mutate.detached(job_with_null_meta, mutate.JOB_PATHS)
    mutate.mutate_job(new, gate=False, validation="pool-a")
    ops = mutate.json_patch(job_with_null_meta, new, mutate.JOB_PATHS)
    assert ops[0]["op"] == "replace" and ops[0]["path"] == "/spec/template/metadata"
    assert jsonpatch.apply_patch(job_with_null_meta, ops) == new


def test_options_from_flags() -> None:
    assert webhook_options(None) is None
    with pytest.raises(ValueError, match="--webhook-cert needs --webhook-addr"):
        webhook_options(None, cert=Path("c"))
    with pytest.raises(ValueError, match="go together"):
        webhook_options("0.0.0.0:9443", cert=Path("/etc/hostname"))
    with pytest.raises(ValueError, match=r"1\.\.30"):
        webhook_options("0.0.0.0:9443", timeout_seconds=31)
    options = webhook_options(
        "[::]:9443", service="netval-system/netval-webhook:8443", failure_policy="Ignore"
    )
    assert options == replace(
        WebhookOptions(host="::", port=9443),
        service=ServiceRef("netval-system", "netval-webhook", 8443),
        failure_policy="Ignore",
    )
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_service("just-a-name")
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_addr("9443")
    assert parse_addr(":9443") == ("0.0.0.0", 9443)


def test_affinity_merge_is_idempotent_and_label_values_fit() -> None:
    spec: dict[str, Any] = {"affinity": None}
    mutate.add_fabric_affinity(spec)
    mutate.add_fabric_affinity(spec)
    assert required_terms(spec) == [{"matchExpressions": [FABRIC]}]
    long_name = "a" * 70 + ".example"
    value = mutate.validation_label(long_name)
    assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum()
    assert mutate.validation_label("pool-a") == "pool-a"


def test_cli_refuses_inconsistent_webhook_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from netval.cli import main

    monkeypatch.setenv("NETVAL_MQTT_URL", "mqtt://127.0.0.1:1")
    cert = tmp_path / "tls.crt"
    cert.write_text("x")
    for argv, message in (
        (["--webhook-cert", str(cert)], "--webhook-cert needs --webhook-addr"),
        (["--webhook-addr", "0.0.0.0:9443", "--webhook-cert", str(cert)], "go together"),
        (["--webhook-addr", "0.0.0.0:9443", "--webhook-timeout", "45"], "1..30 seconds"),
        (["--webhook-addr", "nowhere"], "expected HOST:PORT"),
        (["--webhook-addr", ":9443", "--webhook-service", "web"], "NAMESPACE/NAME"),
    ):
        assert main(["operator", "--standalone", *argv]) == 2
        assert message in capsys.readouterr().err
