"""How users see `status.topology.domainPairs`: the "measured between domains" lines of
`netval status NAME --topology` and the table in `netval report`, read through a Kubernetes
API (kmock, which prunes by the CRD schema) from a status the operator's pure stages write:
the topology fold of test_topology and the domain pairs of a synthetic 3-leaf fabric (lone
flows from the continuous samples, the NetworkLoadTest run of test_loadtest_views at 3:1);
and hostile-valid pairs render without crashing, in bounded lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube import KubeCluster
from netval.cli import main
from netval.cli.report_html import render_html
from netval.cli.topology_view import render_topology
from netval.model.east_west import Cell, EastWest
from netval.model.topology import MAX_DOMAIN_PAIRS, TopologyStatus
from netval.operator.topology.pairs import domain_pairs
from test_loadtest_views import fabric_status
from test_report_html import browse, console_problems, needs_chromium
from test_status_matrix import Page, check_self_contained
from test_topology import topology_status_patch

NV = "netval.io/v1alpha1"
SRC = Path(__file__).resolve().parents[1] / "src"
LEAVES = ("leaf-0", "leaf-1", "leaf-2")


def continuous() -> EastWest:
    """Lone flows: leaf-0 <-> leaf-2 delivers a quarter (4:1, worse than the 3:1 under load
    everywhere), the other cross pairs 1:1."""
    ratios = {("leaf-0", "leaf-1"): 1.0, ("leaf-0", "leaf-2"): 4.0, ("leaf-1", "leaf-2"): 1.0}
    cells = [
        Cell(a=a, b=b, pairs=9, latency_p99_ms=0.05 if a == b else 0.08,
             loss_percent=0.0 if (a, b) != ("leaf-1", "leaf-2") else 0.5,
             throughput_mbps=200_000, capacity_ratio=ratios.get((a, b)))
        for i, a in enumerate(LEAVES)
        for b in LEAVES[i:]
    ]  # fmt: skip
    return EastWest(domains=3, nodes=9, min_throughput_ratio=0.5, cells=cells)


def measured_status() -> dict[str, Any]:
    """status with status.topology carrying the measured pairs, as the operator writes it."""
    patch = topology_status_patch()
    run = fabric_status().last_run
    assert run is not None
    pairs, omitted = domain_pairs(continuous(), run.east_west.cells)
    topo = TopologyStatus.model_validate(patch["topology"]).model_copy(
        update={
            "pairs_key": "x/leaf",
            "domain_pairs": pairs,
            "omitted_pairs": omitted,
            "load_test": f"fabric-under-load/{run.id}",
        }
    )
    patch["topology"] = topo.model_dump(mode="json", by_alias=True, exclude_none=True)
    return patch


@pytest.fixture
def api(kube: KubeCluster) -> KubeCluster:
    kube.create({"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": "fabric"},
                 "spec": {"topology": {"lldp": True, "levels": ["x/leaf"]},
                          "checks": {"peers": {"enabled": True}}}})  # fmt: skip
    kube.patch(NV, "networkvalidations", "fabric", {"status": measured_status()},
               subresource="status")  # fmt: skip
    return kube


def pair_rows(out: str) -> dict[tuple[str, str], list[str]]:
    lines = out[out.index("measured between domains") :].splitlines()
    assert lines[2].split() == ["A", "B", "PAIRS", "CAPACITY", "UNDER-LOAD", "P99-IDLE",
                                "P99-LOADED", "LOSS%"]  # fmt: skip
    return {(r.split()[0], r.split()[1]): r.split()[2:] for r in lines[3:6]}


def test_the_pairs_survive_the_api(api: KubeCluster) -> None:
    stored = api.stored(NV, "NetworkValidation", "fabric")
    assert stored is not None
    assert stored["status"]["topology"] == measured_status()["topology"]


def test_status_topology_shows_what_was_measured_between_domains(
    api: KubeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["status", "fabric", "--topology"])
    out = capsys.readouterr().out
    assert "measured between domains of x/leaf, worst first:" in out
    assert "under load: NetworkLoadTest fabric-under-load, run run-2" in out
    rows = pair_rows(out)
    # worst first: the 4:1 pair leads; every cross pair is 3:1 with all nodes sending
    assert list(rows) == [("leaf-0", "leaf-2"), ("leaf-0", "leaf-1"), ("leaf-1", "leaf-2")]
    assert rows["leaf-0", "leaf-2"] == ["9", "4.0:1", "3.0:1", "0.080", "0.237", "0.00"]
    assert rows["leaf-1", "leaf-2"] == ["9", "1.0:1", "3.0:1", "0.080", "0.237", "0.50"]
    assert "omittedPairs" not in out


def test_status_topology_says_omitted_pairs_and_nothing_when_unmeasured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = measured_status()
    status["topology"]["omittedPairs"] = 7
    del status["topology"]["loadTest"]
    obj = {"metadata": {"name": "v"}, "status": status}
    out = render_topology(obj)
    assert "… 7 more pairs not listed (omittedPairs)" in out
    assert "under load: no NetworkLoadTest run yet" in out
    page = Page(render_html(obj))
    assert "… and 7 more pairs (omittedPairs)." in page.text
    assert "No NetworkLoadTest run yet" in page.text
    # no pairs measured (peers off, or one domain): no section at all
    plain = topology_status_patch()
    assert "domainPairs" not in plain["topology"] or plain["topology"]["domainPairs"] == []
    bare = {"metadata": {"name": "v"}, "status": plain}
    assert "measured between domains" not in render_topology(bare)
    assert "Measured between domains" not in render_html(bare)


def test_the_real_process(api: KubeCluster) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "KUBECONFIG": str(api.kubeconfig_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "netval.cli", "status", "fabric", "--topology"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.stderr == ""
    assert proc.returncode in (0, 1), proc.returncode
    assert "topology of fabric" in proc.stdout
    assert pair_rows(proc.stdout)["leaf-0", "leaf-1"][1:3] == ["1.0:1", "3.0:1"]


def test_report_from_the_cluster(api: KubeCluster, tmp_path: Path) -> None:
    target = tmp_path / "fabric.html"
    main(["report", "fabric", "--html", str(target)])
    html = target.read_text(encoding="utf-8")
    page = Page(html)
    check_self_contained(page)
    assert "topology-pairs" in page.ids
    assert "Measured between domains of x/leaf" in page.text
    assert "Under load: NetworkLoadTest fabric-under-load, run run-2" in page.text
    table = html[html.index('id="topology-pairs"') :]
    table = table[: table.index("</table>")]
    rows = table.split("<tr>")[2:]
    assert "<strong>leaf-0</strong>" in rows[0] and "<strong>leaf-2</strong>" in rows[0]
    # the worst of each figure is outlined: the 4:1 capacity, the first 3:1, the 0.5 % loss
    assert 'title="the worst">4.0:1' in rows[0]
    assert 'title="the worst">3.0:1' in rows[0]
    assert 'title="the worst">0.50' in next(r for r in rows if "0.50" in r)
    assert table.count('title="the worst"') == 4  # capacity, load, loaded p99, loss


@needs_chromium
def test_the_table_in_a_browser(tmp_path: Path) -> None:
    dom, log = browse(
        tmp_path, render_html({"metadata": {"name": "v"}, "status": measured_status()})
    )
    assert console_problems(log) == [], log[-2000:]
    assert 'id="topology-pairs"' in dom and "leaf-0" in dom


# -- hostile but valid pairs --------------------------------------------------------------------

names = st.text(min_size=0, max_size=300)
numbers = st.none() | st.floats() | st.sampled_from([1.7e308, -1.7e308, 5e-324, 0.0])
counts = st.integers(min_value=0, max_value=2**63)
pairs = st.fixed_dictionaries(
    {"a": names, "b": names, "pairs": counts},
    optional={"capacityRatio": numbers, "latencyP99Ms": numbers, "lossPercent": numbers,
              "oversubscription": numbers, "loadedLatencyP99Ms": numbers},
)  # fmt: skip
topologies = st.fixed_dictionaries(
    {"domainPairs": st.lists(pairs, max_size=MAX_DOMAIN_PAIRS)},
    optional={"pairsKey": st.none() | names, "omittedPairs": counts,
              "loadTest": st.none() | names},
)  # fmt: skip


def bounded(text: str, width: int = 200) -> None:
    assert all(ch.isprintable() for ch in text.replace("\n", ""))
    assert max(len(line) for line in text.splitlines()) <= width


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=topologies, name=names)
def test_hostile_pairs_render(topology: dict[str, Any], name: str) -> None:
    TopologyStatus.model_validate(topology)  # valid: the API may hold it
    obj = {"metadata": {"name": name}, "status": {"topology": topology}}
    text = render_topology(obj)
    bounded(text)
    listed = topology["domainPairs"] or topology.get("omittedPairs")
    assert ("measured between domains" in text) == bool(listed)
    page = Page(render_html(obj))
    check_self_contained(page)
    assert ("topology-pairs" in page.ids) == bool(topology["domainPairs"])


def test_the_largest_and_the_emptiest_pairs_keep_their_width() -> None:
    """32 pairs of 300-character names, huge figures; then 32 pairs of nothing but names."""
    big = {"a": "a" * 300, "b": "\x1b[2J" * 75, "pairs": 2**63, "capacityRatio": 1.7e308,
           "latencyP99Ms": -1.7e308, "lossPercent": 1.7e308, "oversubscription": float("inf"),
           "loadedLatencyP99Ms": float("nan")}  # fmt: skip
    topology = {"domainPairs": [big] * MAX_DOMAIN_PAIRS, "omittedPairs": 2**63,
                "pairsKey": "k" * 1000, "loadTest": "t" * 500 + "/" + "r" * 500}  # fmt: skip
    obj = {"metadata": {"name": "big"}, "status": {"topology": topology}}
    text = render_topology(obj)
    bounded(text)
    assert ">999:1" in text and "\x1b" not in text
    check_self_contained(Page(render_html(obj)))
    empty = {"domainPairs": [{"a": "x", "b": "y"}] * MAX_DOMAIN_PAIRS}
    text = render_topology({"metadata": {"name": "e"}, "status": {"topology": empty}})
    bounded(text)
    assert pair_rows(text)["x", "y"] == ["0", "-", "-", "-", "-", "-"]
    page = render_html({"metadata": {"name": "e"}, "status": {"topology": empty}})
    assert 'title="the worst"' not in page  # nothing measured, nothing worst
