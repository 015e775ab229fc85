"""Per-NIC health in `netval status` and `netval report` (from a status file, as a user
runs them): the NIC line, each node's named NICs and NetworkFabricReady condition, and the
report page's NIC section."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from netval.cli.main import main

NOW = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _node(name: str, fabric: str, condition: tuple[str, str] | None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if condition is not None:
        status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                                {"type": "NetworkFabricReady", "status": condition[0],
                                 "reason": condition[1], "message": "pool-a: ..."}]  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"pool": "a", "netval.io/fabric": fabric}},
            "spec": {}, "status": status}  # fmt: skip


def _validation() -> dict[str, Any]:
    return {
        "apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
        "metadata": {"name": "pool-a", "generation": 1},
        "spec": {"nodeSelector": {"pool": "a"}, "gating": {"deviceTaints": True,
                                                           "maxFailedDevicesPerNode": 1}},
        "status": {
            "observedGeneration": 1,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AgentsReporting", "message": "",
                 "lastTransitionTime": NOW, "observedGeneration": 1},
                {"type": "Healthy", "status": "False", "reason": "ChecksFailing",
                 "message": "1 node failing", "lastTransitionTime": NOW, "observedGeneration": 1},
            ],
            "nodes": {"targeted": 2, "reporting": 2, "passing": 1, "warning": 0, "failing": 1,
                      "stale": 0, "excluded": 0, "admissible": 2},
            "nics": {"total": 16, "failing": 1, "warning": 1, "tainted": 1, "nodesDegraded": 1,
                     "deviceTaints": "Active", "message": "",
                     "entries": [
                         {"node": "gpu-1", "device": "mlx5_3", "state": "failing",
                          "pciAddress": "0000:1b:00.0", "netdevs": ["ens3np0"],
                          "checks": ["rdma.port_state"], "tainted": True},
                         {"node": "gpu-2", "device": "mlx5_5", "state": "warning",
                          "checks": ["pfc.pause_storm"]},
                     ]},
        },
    }  # fmt: skip


def test_status_shows_nic_counts_and_each_nodes_nics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            _validation(),
            _node("gpu-1", "degraded", ("False", "DevicesFailing")),
            _node("gpu-2", "degraded", ("True", "ChecksWarning")),
            _node("gpu-3", "healthy", None),
        ],
    }
    path = tmp_path / "status.yaml"
    path.write_text(yaml.safe_dump(doc))
    main(["status", "--from", str(path)])
    out = capsys.readouterr().out
    assert ("nics     16 reported, 1 failing, 1 warning; device taints active: 1 NIC(s) "
            "tainted, 1 node(s) degraded") in out  # fmt: skip
    main(["status", "--from", str(path), "--nodes"])
    out = capsys.readouterr().out
    gpu1 = next(line for line in out.splitlines() if "gpu-1" in line)
    assert "failing NIC(s), degraded" in gpu1 and "False DevicesFailing" in gpu1
    assert "mlx5_3 0000:1b:00.0 failing (rdma.port_state), tainted" in gpu1
    gpu2 = next(line for line in out.splitlines() if "gpu-2" in line)
    assert "mlx5_5 warning (pfc.pause_storm)" in gpu2 and "True ChecksWarning" in gpu2
    main(["status", "--from", str(path), "--nodes", "--failing"])
    out = capsys.readouterr().out
    assert "gpu-1" in out and "gpu-2" not in out


def test_the_report_page_has_the_nics_per_node(tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(_validation()))
    page = tmp_path / "r.html"
    main(["report", "--from", str(path), "--html", str(page)])
    html = page.read_text()
    assert '<section id="nics">' in html
    assert "Device taints in force: 1 NIC(s) tainted as DRA devices" in html
    assert "<td class='nw'>mlx5_3</td><td class='nw'>0000:1b:00.0</td>" in html
    assert "<td class='nw'>ens3np0</td><td class='nw'>failing</td>" in html


def test_unavailable_device_taints_say_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _validation()
    doc["status"]["nics"].update(deviceTaints="Unavailable", tainted=0, nodesDegraded=0,
                                 message="the cluster serves no DeviceTaintRule API")  # fmt: skip
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(doc))
    main(["status", "--from", str(path)])
    assert "device taints unavailable: the cluster serves no DeviceTaintRule API" in (
        capsys.readouterr().out
    )
