"""`netval status` against a Kubernetes API: healthy, failing and stale validations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kube import KubeCluster
from netval.cli import main

NV = "netval.io/v1alpha1"
NOW = datetime.now(UTC)


def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": NOW.isoformat(), "observedGeneration": 1}  # fmt: skip


def make(kube: KubeCluster, name: str, status: dict[str, Any]) -> None:
    # "last report N ago" is relative to now: stamp it when the object is made
    status = {**status, "lastReportTime": (datetime.now(UTC) - timedelta(seconds=12)).isoformat()}
    kube.create({"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": name},
                 "spec": {"nodeSelector": {"pool": name}}})  # fmt: skip
    kube.patch(NV, "networkvalidations", name, {"status": status}, subresource="status")


def nodes(targeted: int, reporting: int, failing: int, stale: int) -> dict[str, int]:
    return {"targeted": targeted, "reporting": reporting, "passing": reporting - failing,
            "warning": 0, "failing": failing, "stale": stale}  # fmt: skip


@pytest.fixture
def api(kube: KubeCluster) -> KubeCluster:
    now = datetime.now(UTC)  # the rendering is relative to now: stamp times when made
    make(kube, "healthy-pool", {
        "observedGeneration": 1,
        "conditions": [cond("Ready", "True", "AgentsReporting", "all 2 nodes reporting"),
                       cond("Healthy", "True", "AllChecksPassing", "2 nodes passing")],
        "nodes": nodes(2, 2, 0, 0), "checks": {"mtu.interface": {"pass": 2, "warn": 0, "fail": 0}},
        "failures": [],
    })  # fmt: skip
    make(kube, "failing-pool", {
        "observedGeneration": 1,
        "conditions": [cond("Ready", "False", "NodesStale", "1 of 3 nodes stale: gpu-c (offline)"),
                       cond("Healthy", "False", "ChecksFailing", "gpu-b fails pfc.priorities"),
                       cond("Usable", "True", "CapacityAvailable",
                            "1 of 3 targeted nodes healthy, 1 failing")],
        "nodes": nodes(3, 2, 1, 1),
        "checks": {"pfc.priorities": {"pass": 1, "warn": 0, "fail": 1}},
        "failures": [{"node": "gpu-b", "check": "pfc.priorities", "subject": "ens1np0",
                      "message": "PFC enabled on no priority, expected exactly [3]",
                      "since": (now - timedelta(minutes=7)).isoformat()}],
    })  # fmt: skip
    for name, label, tainted in (("gpu-a", "healthy", False), ("gpu-b", "unhealthy", True),
                                 ("gpu-c", "unknown", False), ("gpu-d", "suspect", False)):  # fmt: skip
        node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {"pool": "failing-pool", "netval.io/fabric": label}}}  # fmt: skip
        if tainted:
            node["spec"] = {"taints": [{"key": "netval.io/fabric-unhealthy", "value": "true",
                                        "effect": "NoSchedule"}]}  # fmt: skip
        kube.create(node)
    return kube


def test_all_validations(api: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["status"])
    out = capsys.readouterr().out
    assert code == 1  # one validation is not Healthy
    assert "NetworkValidation failing-pool" in out and "NetworkValidation healthy-pool" in out
    assert "Ready    False   NodesStale: 1 of 3 nodes stale: gpu-c (offline)" in out
    assert "Usable   True    CapacityAvailable: 1 of 3 targeted nodes healthy" in out
    assert "3 targeted, 2 reporting, 1 passing, 0 warning, 1 failing, 1 stale" in out
    assert "failing checks: pfc.priorities (1 node(s))" in out
    assert "gpu-b" in out and "since 7m ago" in out
    assert "last report 12s ago" in out


def test_one_healthy_validation(api: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "healthy-pool"]) == 0
    out = capsys.readouterr().out
    assert "Healthy  True    AllChecksPassing" in out and "failing-pool" not in out


def test_per_node_view(api: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    main(["status", "failing-pool", "--nodes"])
    out = capsys.readouterr().out
    table = out[out.index("NODE") :].splitlines()
    assert [line.split()[0] for line in table[1:]] == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    lines = table
    row = next(line for line in lines if line.strip().startswith("gpu-b"))
    assert "unhealthy" in row and "tainted" in row and "pfc.priorities ens1np0" in row
    assert any(line.strip().startswith("gpu-c") and "unknown" in line for line in lines)
    suspect = next(line for line in lines if line.strip().startswith("gpu-d"))
    assert "suspect" in suspect and "failing (breaker)" in suspect


def test_unknown_validation_is_bad_input(
    api: KubeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "nope"]) == 2
    assert capsys.readouterr().err == "netval: error: NetworkValidation 'nope' not found\n"


def test_no_status_yet(kube: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    kube.create({"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": "new"},
                 "spec": {}})  # fmt: skip
    assert main(["status", "new"]) == 1
    assert "no status yet (is the operator running?)" in capsys.readouterr().out
