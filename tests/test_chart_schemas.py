"""Every manifest the chart renders validates against the Kubernetes OpenAPI schemas of the
oldest and the newest supported versions (custom resources against their CRD's schema or the
transcribed third-party parts in chart_kit); the CRDs and the examples too.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

from chart_kit import CHART, EXAMPLES, ROOT, VARIANTS, docs, one, operator_deployment, schema_errors
from netval.model.spec import NetworkValidationSpec

# --- CRDs ---------------------------------------------------------------------------------


def test_chart_crd_is_the_crds_file() -> None:
    ours = (ROOT / "crds" / "networkvalidations.netval.io.yaml").read_bytes()
    assert (CHART / "crds" / "networkvalidations.netval.io.yaml").read_bytes() == ours


def test_chart_ships_both_crds() -> None:
    with helm.Chart.load(CHART) as chart:
        crds = {yaml.safe_load(c["data"])["metadata"]["name"] for c in chart.crds}
    assert crds == {"networkvalidations.netval.io", "clusterkopfpeerings.kopf.dev"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_manifests_validate(variant: str) -> None:
    rendered_docs = docs(variant)
    assert rendered_docs
    for doc in rendered_docs:
        where = f"{variant}: {doc['kind']}/{doc['metadata']['name']}"
        assert schema_errors(doc) == [], where


def test_chart_crds_validate() -> None:
    for path in sorted((CHART / "crds").glob("*.yaml")):
        assert schema_errors(yaml.safe_load(path.read_text())) == [], path.name


def test_schema_validation_catches_mistakes() -> None:
    deployment = operator_deployment("default")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnly"] = True
    assert schema_errors(deployment)
    deployment = operator_deployment("default")
    deployment["spec"]["replicas"] = "2"
    assert schema_errors(deployment)
    certificate = one("cert-manager", "Certificate", "netval-webhook")
    certificate["spec"]["dnsName"] = ["x"]
    assert schema_errors(certificate)
    peering = one("default", "ClusterKopfPeering", "netval")
    peering["status"] = "x"
    assert schema_errors(peering)


def _example_docs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                found.append((path.name, doc))
    return found


def test_examples_validate() -> None:
    found = _example_docs()
    names = {name for name, _ in found}
    assert {"roce-training-pool.yaml", "inference-pool-storage.yaml", "gated-job.yaml"} <= names
    for name, doc in found:
        assert schema_errors(doc) == [], name
        if doc["kind"] == "NetworkValidation":
            NetworkValidationSpec.model_validate(doc["spec"])


def test_examples_say_what_they_promise() -> None:
    by_name = {d["metadata"]["name"]: d for _, d in _example_docs()}
    pool = NetworkValidationSpec.model_validate(by_name["roce-training-pool"]["spec"])
    assert pool.node_selector == {"nvidia.com/gpu.present": "true"}
    assert any(t.get("key") == "nvidia.com/gpu" for t in pool.tolerations)
    assert pool.interval_seconds == 30
    assert pool.checks.pfc.priorities == [3] and pool.checks.ecn_priorities == [3]
    assert pool.checks.pfc.trust.value == "dscp"
    assert pool.checks.mtu.interface_mtu == 9000
    assert pool.checks.rdma.min_rate_gbps == 400
    assert pool.gating.node_label and pool.gating.taint
    inference = NetworkValidationSpec.model_validate(by_name["inference-pool"]["spec"])
    assert {e.protocol.value for e in inference.checks.storage.endpoints} >= {"s3", "nfs", "ceph"}
    job = by_name["allreduce-smoke"]
    assert job["kind"] == "Job"
    assert job["metadata"]["annotations"]["netval.io/require-healthy"] == "roce-training-pool"
    assert "roce-training-pool" in by_name
