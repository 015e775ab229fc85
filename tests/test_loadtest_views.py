"""How users see a NetworkLoadTest: `netval status --loadtests`, `--loadtest NAME`, the load-test
figures beside `--matrix`, and the "Load tests" section of `netval report`, read through a
Kubernetes API (kmock) from statuses the operator's pure stages write for a synthetic 3:1
fabric; and hostile-valid statuses render without crashing."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube import KubeCluster
from loadtest_fabric import leaf_spine
from netval.cli import main
from netval.cli.loadtest_view import render_beside_matrix, render_loadtest, render_loadtest_list
from netval.cli.report_html import render_html
from netval.cli.report_html_loadtest import loadtest_section
from netval.model.east_west import Cell, EastWest
from netval.model.loadtest import (
    MAX_BREACHES,
    MAX_LOAD_CELLS,
    Expectations,
    NetworkLoadTestStatus,
)
from netval.operator.loadtest import status as lt_status
from netval.operator.loadtest.aggregate import aggregate
from test_loadtest_aggregate import make_plan
from test_report_html import browse, console_problems, needs_chromium
from test_status_matrix import Page, check_self_contained

NV = "netval.io/v1alpha1"
SRC = Path(__file__).resolve().parents[1] / "src"


def fabric_status() -> NetworkLoadTestStatus:
    """Two finished runs on 3 leaves x 3 nodes, node ports = uplinks (3:1), a storage link
    shared by all: the second breaches maxOversubscription 1.5, the first is in the history."""
    fabric = leaf_spine(3, 3, port_mbps=200_000, uplink_mbps=200_000, storage_mbps=100_000)
    from loadtest_fabric import answer

    plan = make_plan(fabric)
    received = answer(fabric, plan)
    expect = Expectations(max_oversubscription=1.5)
    first = aggregate(plan, received, expect=expect, finished_at=plan.finished_by)
    now = plan.finished_by
    s1 = lt_status.finished(first, generation=1, now=now, previous=None, history_limit=5)
    second = first.model_copy(update={"id": "run-2"})
    s2 = lt_status.running(second, generation=1, now=now, previous=s1, history_limit=5)
    return lt_status.finished(second, generation=1, now=now, previous=s2, history_limit=5)


def east_west() -> dict[str, Any]:
    """The validation's single-flow view of the same fabric: 1:1 everywhere (lone flows)."""
    leaves = ["leaf-0", "leaf-1", "leaf-2"]
    cells = [
        Cell(a=a, b=b, pairs=9, throughput_mbps=200_000, capacity_ratio=None if a == b else 1.0)
        for i, a in enumerate(leaves)
        for b in leaves[i:]
    ]
    ew = EastWest(domains=3, nodes=9, min_throughput_ratio=0.5, cells=cells)
    return ew.to_status()


def loadtest(name: str, validation: str) -> dict[str, Any]:
    return {"apiVersion": NV, "kind": "NetworkLoadTest", "metadata": {"name": name},
            "spec": {"validation": validation, "expect": {"maxOversubscription": 1.5}}}  # fmt: skip


@pytest.fixture
def api(kube: KubeCluster) -> KubeCluster:
    kube.create({"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": "fabric"},
                 "spec": {"checks": {"peers": {"enabled": True}}}})  # fmt: skip
    kube.patch(NV, "networkvalidations", "fabric", {"status": {"eastWest": east_west()}},
               subresource="status")  # fmt: skip
    kube.create(loadtest("fabric-under-load", "fabric"))
    kube.patch(NV, "networkloadtests", "fabric-under-load",
               {"status": fabric_status().to_patch()}, subresource="status")  # fmt: skip
    kube.create(loadtest("weekly", "other-pool"))  # no status yet
    return kube


def test_the_status_survives_the_api(api: KubeCluster) -> None:
    stored = api.stored(NV, "NetworkLoadTest", "fabric-under-load")
    assert stored is not None
    assert NetworkLoadTestStatus.model_validate(stored["status"]) == fabric_status()


def test_list(api: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--loadtests"]) == 1  # fabric-under-load Failed
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "VALIDATION", "PHASE", "PASSED", "NODES", "MAX-OVERSUB",
                                "LAST-RUN", "NEXT-RUN"]  # fmt: skip
    row = lines[1].split()
    assert row[:6] == ["fabric-under-load", "fabric", "Failed", "False", "9", "3.0:1"]
    assert row[-1] == "-" and row[-2] == "ago"
    assert lines[2].split() == ["weekly", "other-pool", "no", "status", "-", "-", "-", "never", "-"]
    # NAME: the load tests of one validation
    assert main(["status", "other-pool", "--loadtests"]) == 0
    assert "fabric-under-load" not in capsys.readouterr().out
    assert main(["status", "nothing", "--loadtests"]) == 0
    assert capsys.readouterr().out == "no NetworkLoadTests of NetworkValidation 'nothing'\n"


def test_detail(api: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--loadtest", "fabric-under-load"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NetworkLoadTest fabric-under-load (validation fabric, generation 1)")
    assert "  phase    Failed" in out and "Passed   False   ExpectationsBreached" in out
    assert "9 node(s), 0 skipped, 0 flow(s) refused, max oversubscription 3.0:1" in out
    matrix = out[out.index("oversubscription per domain pair") :].splitlines()
    heads = matrix[4].split()  # after the legend's four lines
    assert heads == ["leaf-0", "leaf-1", "leaf-2"]
    rows = {line.split()[0]: line.split()[1:] for line in matrix[5:8]}
    assert rows["leaf-0"] == ["ref", "3.0:1", "!", "3.0:1", "!"]
    assert rows["leaf-1"][:3] == ["3.0:1", "!", "ref"]
    latency = next(line for line in out.splitlines() if "leaf-0 <-> leaf-1" in line).split()
    # rail, flows counted/planned, per node, aggregate (Mbit/s)
    assert latency[3:7] == ["0", "6/6", "66667", "400000"]
    assert "per domain pair and rail" in out and "INFLATION" in out
    assert "counted 44 of 44 planned flows and reads (100 %)" in out
    storage = next(line for line in out.splitlines() if line.strip().startswith("datasets"))
    # 9 nodes share a 100 Gbit/s link: 12500 MB/s in all, about 1389 each, 12500 alone
    assert storage.split()[:3] == ["datasets", "9/9", "12500"]
    assert storage.split()[-1] == "1.00"
    assert "maxOversubscription leaf-0/leaf-1: 3 (expected <= 1.5)" in out
    history = out[out.index("history (newest first)") :]
    row = history.splitlines()[2].split()
    assert (row[0], row[3], row[5], row[6], row[7]) == ("run-1", "Failed", "9", "3.0:1", "1389")


def test_matrix_shows_the_load_figure_beside_the_capacity_ratio(
    api: KubeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["status", "fabric", "--matrix"])
    out = capsys.readouterr().out
    assert "under load: NetworkLoadTest fabric-under-load, run run-2" in out
    assert "max oversubscription 3.0:1" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("leaf-0 <-> leaf-1"))
    assert row.split()[3:] == ["1.0:1", "3.0:1"]  # lone flows 1:1, under load 3:1


def test_usage_errors(api: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--loadtest", "nope"]) == 2
    assert capsys.readouterr().err == "netval: error: NetworkLoadTest 'nope' not found\n"
    assert main(["status", "--loadtest", "weekly", "--nodes"]) == 2
    assert "--nodes shows a validation" in capsys.readouterr().err
    assert main(["status", "fabric", "--loadtest", "weekly"]) == 2
    assert main(["status", "--loadtest", "weekly"]) == 0  # no status yet: not Failed
    assert "no status yet" in capsys.readouterr().out


def test_the_real_process(api: KubeCluster) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "KUBECONFIG": str(api.kubeconfig_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "netval.cli", "status", "--loadtest", "fabric-under-load"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "oversubscription per domain pair" in proc.stdout and "3.0:1 !" in proc.stdout
    assert proc.stderr == ""


def test_report_from_the_cluster(
    api: KubeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "fabric.html"
    main(["report", "fabric", "--html", str(target)])
    page = Page(target.read_text(encoding="utf-8"))
    check_self_contained(page)
    assert {"load-tests", "loadtest-0-oversubscription", "loadtest-0-latency"} <= page.ids
    text = page.text
    assert "NetworkLoadTest fabric-under-load" in text and "weekly" not in text
    assert "3.0:1 66.7 Gbit/s per node · 6 flows breached" in text
    assert "one node alone" in text and "12500 MB/s" in text
    assert "maxOversubscription leaf-0/leaf-1: 3 (expected <= 1.5)" in text


def test_report_and_status_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objs = [
        {"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": "fabric"},
         "spec": {}, "status": {"eastWest": east_west()}},
        {**loadtest("fabric-under-load", "fabric"), "status": fabric_status().to_patch()},
    ]  # fmt: skip
    source = tmp_path / "list.yaml"
    source.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objs}))
    target = tmp_path / "r.html"
    main(["report", "--from", str(source), "--html", str(target)])
    assert "loadtest-0-oversubscription" in Page(target.read_text(encoding="utf-8")).ids
    assert main(["status", "--from", str(source), "--loadtests"]) == 1
    assert "fabric-under-load" in capsys.readouterr().out
    # a file of load tests only: no validation for the validation views
    only = tmp_path / "lt.yaml"
    only.write_text(yaml.safe_dump(objs[1]))
    assert main(["status", "--from", str(only), "--loadtest", "fabric-under-load"]) == 1
    assert main(["status", "--from", str(only)]) == 2
    assert "holds no NetworkValidation" in capsys.readouterr().err


@needs_chromium
def test_the_report_section_in_a_browser(tmp_path: Path) -> None:
    obj = {"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": "fabric"},
           "spec": {}, "status": {"eastWest": east_west()}}  # fmt: skip
    lt = {**loadtest("fabric-under-load", "fabric"), "status": fabric_status().to_patch()}
    dom, log = browse(tmp_path, render_html(obj, loadtests=[lt]))
    assert console_problems(log) == [], log[-2000:]
    assert 'id="loadtest-0-oversubscription"' in dom and "one node alone" in dom


# -- hostile but valid statuses ---------------------------------------------------------------

NOW = datetime(2026, 3, 1, tzinfo=UTC)
names = st.text(min_size=0, max_size=300)
numbers = st.none() | st.floats(allow_nan=False, allow_infinity=False)
times = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.none() | st.just(UTC),
)
counts = st.integers(min_value=0, max_value=2**63)
domains = st.lists(names, min_size=0, max_size=17, unique=True)


@st.composite
def statuses(draw: st.DrawFn) -> dict[str, Any]:
    ds = draw(domains)
    pairs = [(a, b) for i, a in enumerate(ds) for b in ds[i:]][:MAX_LOAD_CELLS]
    cells = [
        {"a": a, "b": b, "flows": draw(counts), "perNodeMbps": draw(numbers),
         "aggregateMbps": draw(numbers), "oversubscription": draw(numbers),
         "lossPercent": draw(numbers), "idleLatencyP99Ms": draw(numbers),
         "loadedLatencyP99Ms": draw(numbers)}
        for a, b in pairs
    ]  # fmt: skip
    storage = [
        {"endpoint": draw(names), "nodes": draw(counts), "aggregateMBps": draw(numbers),
         "perNodeMBpsMin": draw(numbers), "perNodeMBpsMedian": draw(numbers),
         "singleNodeMBps": draw(numbers), "fairness": draw(numbers)}
        for _ in range(draw(st.integers(0, 3)))
    ]  # fmt: skip
    breaches = draw(st.lists(st.fixed_dictionaries({
        "expectation": names, "subject": names,
        "observed": st.floats(allow_nan=False, allow_infinity=False),
        "expected": st.floats(allow_nan=False, allow_infinity=False)}), max_size=MAX_BREACHES))  # fmt: skip
    run = {"id": draw(names), "startedAt": draw(times).isoformat(), "nodes": draw(counts),
           "skippedNodes": [{"node": draw(names), "reason": "Busy"}], "skippedCount": draw(counts),
           "refusedFlows": draw(counts), "maxOversubscription": draw(numbers),
           "eastWest": {"cells": cells, "omittedCells": draw(counts)}, "storage": storage,
           "breaches": breaches}  # fmt: skip
    history = [{"id": draw(names), "startedAt": draw(times).isoformat(), "phase": "Failed",
                "reason": "Aborted", "maxOversubscription": draw(numbers),
                "minStorageMBpsPerNode": draw(numbers), "breaches": draw(counts)}]  # fmt: skip
    condition = {"type": "Passed", "status": "False", "reason": "ExpectationsBreached",
                 "message": draw(names), "lastTransitionTime": draw(times).isoformat(),
                 "observedGeneration": 0}  # fmt: skip
    status = {"phase": "Failed", "conditions": [condition], "history": history,
              "nextRunAt": draw(times).isoformat()}  # fmt: skip
    if draw(st.booleans()):
        status["lastRun"] = run
    return status


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(status=statuses(), name=names, validation=names)
def test_hostile_statuses_render(status: dict[str, Any], name: str, validation: str) -> None:
    NetworkLoadTestStatus.model_validate(status)  # valid: the API may hold it
    obj = {"metadata": {"name": name, "generation": 1},
           "spec": {"validation": validation}, "status": status}  # fmt: skip
    text = render_loadtest(obj, NOW) + render_loadtest_list([obj], NOW)
    text += render_beside_matrix({}, [obj], NOW)
    assert all(ch.isprintable() for ch in text.replace("\n", ""))
    assert max(len(line) for line in text.splitlines()) <= 400
    page = Page(render_html({"metadata": {"name": "v"}}, now=NOW, loadtests=[obj]))
    check_self_contained(page)
    assert "load-tests" in page.ids


def test_empty_status_and_no_loadtests() -> None:
    obj = {"metadata": {"name": "x"}, "spec": {"validation": "v"}, "status": {}}
    assert "no status yet" in render_loadtest(obj, NOW)
    assert "No status yet" in loadtest_section([obj], NOW)
    broken = {**obj, "status": {"phase": "Exploded"}}
    assert "not readable by this netval version (phase" in render_loadtest(broken, NOW)
    assert render_loadtest_list([broken], NOW).splitlines()[1].split()[2] == "unreadable"
    assert render_beside_matrix({}, [obj], NOW) == ""
    # a report without load tests is the page it always was
    assert 'id="load-tests"' not in render_html({"metadata": {"name": "v"}}, now=NOW)


def test_timestamps_without_a_zone_read_as_utc() -> None:
    status = fabric_status().to_patch()
    status["lastRun"]["startedAt"] = (NOW - timedelta(minutes=5)).replace(tzinfo=None).isoformat()  # type: ignore[index]
    out = render_loadtest({"metadata": {"name": "x"}, "status": status}, NOW)
    assert "started 5m ago" in out


def test_matrix_and_report_without_access_to_load_tests(
    api: KubeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a viewer who may not list NetworkLoadTests (403), or a cluster without the CRD (404):
    # the validation's views as before; asking for load tests says why not
    for code in (403, 404):
        api.inject("GET", r"/networkloadtests", status=code)
        main(["status", "fabric", "--matrix"])
        out = capsys.readouterr().out
        assert "1.0:1" in out and "under load" not in out
        target = tmp_path / f"{code}.html"
        main(["report", "fabric", "--html", str(target)])
        assert "load-tests" not in Page(target.read_text(encoding="utf-8")).ids
        capsys.readouterr()
        assert main(["status", "--loadtests"]) == 2
        err = capsys.readouterr().err
        assert err == (
            "netval: error: this cluster has no NetworkLoadTest resource (the CRD "
            "networkloadtests.netval.io is not installed)\n"
            if code == 404
            else "netval: error: Kubernetes API error: 403 Forbidden\n"
        )
        api.clear_faults()


def test_the_largest_status_keeps_its_width() -> None:
    """136 cells of 16 domains with 63-character names, huge figures: bounded lines."""
    ds = [f"{'x' * 60}{i:03d}" for i in range(16)]
    big = 1.7e308
    cells = [
        {"a": a, "b": b, "flows": 2**40, "perNodeMbps": big, "aggregateMbps": big,
         "oversubscription": big, "lossPercent": -big, "idleLatencyP99Ms": 1e-300,
         "loadedLatencyP99Ms": big}
        for i, a in enumerate(ds) for b in ds[i:]
    ]  # fmt: skip
    assert len(cells) == MAX_LOAD_CELLS
    status = {"lastRun": {"id": "r" * 500, "startedAt": NOW.isoformat(), "nodes": 10_000,
                          "eastWest": {"cells": cells, "omittedCells": 392}}}  # fmt: skip
    obj = {"metadata": {"name": "big"}, "spec": {"validation": "v"}, "status": status}
    out = render_loadtest(obj, NOW)
    assert max(len(line) for line in out.splitlines()) <= 160
    assert "domains 9-16 of 16" in out and ">999:1" in out and "1.70e308" in out
    assert "... 96 more pair(s)" in out and "392 more domain pair(s)" in out
    page = Page(render_html({"metadata": {"name": "v"}}, now=NOW, loadtests=[obj]))
    check_self_contained(page)
    assert page.text.count(">999:1") == 2 * (MAX_LOAD_CELLS - 16)  # both halves, heatmap only


def test_verdicts_without_a_figure_say_why_per_rail_and_an_inconclusive_run_exits_1(
    tmp_path: Path,
) -> None:
    """Sender-limited cells (two rail planes), a partitioned one, a partial one: the matrix
    says so instead of a ratio, the pair table names rail, counts and the numbers, and an
    Inconclusive test counts as not passed for the exit code."""
    from loadtest_fabric import Fabric, answer
    from netval.cli.loadtest_format import is_failed
    from netval.operator.loadtest.rails import NodeRails

    fabric = leaf_spine(2, 3, port_mbps=3_000, uplink_mbps=3_000)
    plan = make_plan(fabric, {"phases": ["eastWest"]})
    two = dict.fromkeys(fabric.leaf_of, NodeRails(0b11, 0))
    from netval.operator.loadtest.plan import RunPlan, plan_run

    planned = plan_run(plan.settings, fabric.candidates(), run_id="r",
                       now=plan.stages[0].issued_at, seed=1, rails=two)  # fmt: skip
    assert isinstance(planned, RunPlan)
    received = answer(fabric, planned, cpu_demand=99.0, port_report=10_000)
    run = aggregate(planned, received, expect=Expectations(), finished_at=NOW)
    status = lt_status.finished(run, generation=1, now=NOW, previous=None, history_limit=3)
    obj = {"metadata": {"name": "lab", "generation": 1}, "spec": {"validation": "v"},
           "status": status.to_patch()}  # fmt: skip
    out = render_loadtest(obj, NOW)
    assert "phase    Inconclusive" in out and "Passed   Unknown Inconclusive" in out
    assert "sender-lim" in out and "CPU-bound engines: 3/3 senders" in out
    assert "leaf-0/leaf-1 rail 1: SenderLimited" in out
    assert is_failed(obj)  # exit 1: not passed
    assert "Inconclusive" in render_loadtest_list([obj], NOW)
    # a partial cell is a lower bound with "~", kept out of the maximum
    uneven = Fabric(leaves={"big": [f"b{i}" for i in range(6)], "small": ["s0", "s1"]},
                    port_mbps=100, uplink_mbps=10_000)  # fmt: skip
    plan2 = make_plan(uneven, {"phases": ["eastWest"]})
    run2 = aggregate(plan2, answer(uneven, plan2), expect=Expectations(), finished_at=NOW)
    status2 = lt_status.finished(run2, generation=1, now=NOW, previous=None, history_limit=3)
    obj2 = {"metadata": {"name": "uneven", "generation": 1}, "spec": {"validation": "v"},
            "status": status2.to_patch()}  # fmt: skip
    out2 = render_loadtest(obj2, NOW)
    assert "~3.0:1" in out2 and "Partial - unequal domains" in out2
    page = Page(render_html({"metadata": {"name": "v"}}, now=NOW, loadtests=[obj, obj2]))
    check_self_contained(page)
    assert "SenderLimited" in page.text and "partial:" in page.text
