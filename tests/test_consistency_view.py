"""`netval status NAME --consistency` and the HTML report's "Fleet consistency" section, read
from the kmock API server (so the CRD's status schema must keep everything the operator
writes)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kube import KubeCluster
from netval.cli.consistency_view import NO_SUMMARY, render_consistency
from netval.cli.main import main
from netval.model.consistency import ConsistencyStatus
from netval.model.spec import Consistency
from netval.operator.consistency.fingerprint import Fleet, observe
from netval.operator.consistency.fold import configure, refresh
from netval.operator.consistency.status import consistency_status
from test_status_matrix import NV, Page, check_self_contained, cond, make

NOW = datetime(2026, 1, 1, tzinfo=UTC)
HOSTILE = "gpu-<b>x</b>"


def summary() -> ConsistencyStatus:
    fleet = Fleet()
    configure(fleet, Consistency(expect={"mtu": ["9000"]}))
    for i in range(10):
        facts = {"nic_model": "15B3:1021", "fw_ver": "28.40.1000", "mtu": "9000"}
        if i == 3:
            facts["fw_ver"] = "28.39.1002"
        if i == 5:
            facts["mtu"] = "1500"
        observe(fleet, HOSTILE if i == 3 else f"gpu-{i}", facts, None, NOW)
    for i in range(4):  # a second, split cohort
        observe(fleet, f"bx-{i}", {"nic_model": "14E4:1760", "fw_ver": str(i % 2)}, None, NOW)
    refresh(fleet, set(fleet.nodes), NOW)
    status = consistency_status(fleet, max_named=10)
    assert status is not None
    return status


@pytest.fixture
def api(kube: KubeCluster) -> KubeCluster:
    make(kube, "pool", {"nodeSelector": {"pool": "gpu"}}, {
        "observedGeneration": 1,
        "conditions": [cond("Healthy", "True", "AllChecksPassing", "10 nodes")],
        "consistency": summary().model_dump(mode="json", by_alias=True, exclude_none=True),
    })  # fmt: skip
    make(kube, "bare", {"nodeSelector": {"pool": "cpu"}}, None)
    return kube


def test_the_summary_survives_the_api(api: KubeCluster) -> None:
    raw = api.get(NV, "networkvalidations", "pool")["status"]["consistency"]
    assert ConsistencyStatus.model_validate(raw) == summary()


def test_status_consistency_lists_keys_majority_share_outliers(
    api: KubeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "pool", "--consistency"]) == 0
    out = capsys.readouterr().out
    assert "fleet consistency: 14 node(s) in 2 cohort(s), 1 violation(s)" in out
    fw = next(line for line in out.splitlines() if "15B3:1021" in line and "fw_ver" in line)
    assert "28.40.1000" in fw and "90%" in fw and "gpu-<b>x</b>=28.39.1002" in fw
    assert "violation: gpu-5 mtu=1500" in out
    assert main(["status", "bare", "--consistency"]) == 1  # no status: not Healthy
    assert NO_SUMMARY in capsys.readouterr().out


def test_a_small_cohort_shows_no_outliers() -> None:
    obj: dict[str, Any] = {
        "status": {"consistency": summary().model_dump(mode="json", by_alias=True)}
    }
    lines = [line for line in render_consistency(obj).splitlines() if "14E4:1760" in line]
    assert lines and all(line.rstrip().endswith("-") for line in lines)


def test_html_report_has_the_consistency_table(api: KubeCluster, tmp_path: Path) -> None:
    target = tmp_path / "pool.html"
    assert main(["report", "pool", "--html", str(target)]) == 0
    page = Page(target.read_text(encoding="utf-8"))
    check_self_contained(page)
    assert "consistency" in page.ids
    assert "Fleet consistency" in page.text and "28.39.1002" in page.text
    assert "<b>x</b>" in page.text  # escaped: text, not markup
    assert "b" not in page.tags
