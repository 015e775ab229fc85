"""Every manifest the chart renders validates against the Kubernetes OpenAPI schemas of the
oldest and the newest supported versions (custom resources against their CRD's schema or the
transcribed third-party parts in chart_kit); the CRDs and the examples too.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

from chart_kit import (
    CHART,
    EXAMPLES,
    ROOT,
    VARIANTS,
    docs,
    find,
    one,
    operator_deployment,
    render,
    schema_errors,
)
from netval.model.spec import NetworkValidationSpec

# --- CRDs ---------------------------------------------------------------------------------


CRD_FILES = ("networkvalidations.netval.io.yaml", "networkloadtests.netval.io.yaml")
CRD_NAMES = {f.removesuffix(".yaml") for f in CRD_FILES}


def test_the_crds_folder_is_these_files() -> None:
    assert {p.name for p in (ROOT / "crds").glob("*.yaml")} == set(CRD_FILES)


@pytest.mark.parametrize("crd_file", CRD_FILES)
def test_chart_crd_is_the_crds_file(crd_file: str) -> None:
    """The chart ships the repository's CRD file byte for byte (files/crds/, read by
    templates/crds.yaml)."""
    ours = (ROOT / "crds" / crd_file).read_bytes()
    assert (CHART / "files" / "crds" / crd_file).read_bytes() == ours


def _templated(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render(values)["netval/templates/crds.yaml"]) if d]


@pytest.mark.parametrize("crd_file", CRD_FILES)
def test_templated_crd_is_the_file_plus_labels_and_keep(crd_file: str) -> None:
    source = yaml.safe_load((ROOT / "crds" / crd_file).read_text())
    (crd,) = find("default", "CustomResourceDefinition", source["metadata"]["name"])
    meta = crd["metadata"]
    assert meta["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert source["metadata"]["labels"].items() <= meta["labels"].items()
    # Everything else is the file's, value for value (the YAML round trip of fromYaml/toYaml
    # changes layout and comments only).
    stripped = {**crd, "metadata": {"name": meta["name"], "labels": source["metadata"]["labels"]}}
    assert stripped == source
    # crds.keep=false: no keep annotation; crds.install=false: no CRD at all.
    (unkept,) = [
        d for d in _templated({"crds": {"keep": False}}) if d["metadata"]["name"] == meta["name"]
    ]
    assert "annotations" not in unkept["metadata"]
    assert not _templated({"crds": {"install": False}})


def test_crd_is_installed_once() -> None:
    """Not in crds/ as well: Helm would create it from there first, and then refuse the
    template's (an object it does not own)."""
    with helm.Chart.load(CHART) as chart:
        crds = {yaml.safe_load(c["data"])["metadata"]["name"] for c in chart.crds}
    # No crds/ at all: Kopf's peering CRD went with Kopf's peering (a Lease elects).
    assert crds == set()
    templated = [
        d["metadata"]["name"]
        for variant in VARIANTS
        for d in docs(variant)
        if d["kind"] == "CustomResourceDefinition"
    ]
    assert set(templated) == CRD_NAMES
    assert len(templated) == len(VARIANTS) * len(CRD_NAMES)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_manifests_validate(variant: str) -> None:
    rendered_docs = docs(variant)
    assert rendered_docs
    for doc in rendered_docs:
        where = f"{variant}: {doc['kind']}/{doc['metadata']['name']}"
        assert schema_errors(doc) == [], where


def test_chart_crds_validate() -> None:
    for path in sorted([*(CHART / "crds").glob("*.yaml"), *(CHART / "files/crds").glob("*.yaml")]):
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
