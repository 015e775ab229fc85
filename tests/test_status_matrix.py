"""The east-west views: `render_matrix` (`netval status NAME --matrix`) and `render_html`
(`netval report NAME --html FILE`), on NetworkValidations stored in a Kubernetes API whose
`status.eastWest` the operator's own aggregation computed from agent-shaped peer results."""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from kube import KubeCluster
from netval.cli import build_parser, main
from netval.cli.report_html import render_html
from netval.cli.status_view import MATRIX_COLUMNS, NO_SUMMARY_YET, NOT_ENABLED, render_matrix
from netval.model.east_west import EastWest
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.operator.state.east_west_matrix import east_west

NV = "netval.io/v1alpha1"
NOW = datetime.now(UTC)
HOSTILE = "<script>alert(1)</script>"  # a node name as an agent (or anyone) may report it
HOSTILE_MESSAGE = '"><img src=x onerror=alert(2)>'
RACK_1 = ["gpu-1a", "gpu-1b", "gpu-1c"]
RACK_2 = ["gpu-2a", "gpu-2b", "gpu-2c", HOSTILE]
DOMAIN = {**dict.fromkeys(RACK_1, "rack-1"), **dict.fromkeys(RACK_2, "rack-2")}
ADDRESS = {n: f"10.0.{DOMAIN[n][-1]}.{i + 1}" for i, n in enumerate(RACK_1 + RACK_2)}
INTRA_MBPS, CROSS_MBPS = 400.0, 100.0  # the inter-rack uplink gives a quarter: 4:1
INTRA_MS, CROSS_MS = 0.05, 0.4


# -- peer results as the agent publishes them (netval.agent.peers.echo, .throughput) --------


def peer_results(prober: str, peer: str) -> list[CheckResult]:
    same = DOMAIN[prober] == DOMAIN[peer]
    base: dict[str, Any] = {"domain": DOMAIN[peer], "address": ADDRESS[peer]}
    p50 = INTRA_MS if same else CROSS_MS
    lost = 10 if HOSTILE in (prober, peer) else 0  # the hostile node's link drops 20%
    return [
        CheckResult(
            check=CheckId.PEER_LATENCY,
            subject=peer,
            status=Status.PASS,
            message="",
            observed={
                **base,
                "p50Ms": p50,
                "p99Ms": p50 * 3,
                "jitterMs": 0.01,
                "minMs": p50 / 2,
                "maxMs": p50 * 4,
                "samples": 50 - lost,
            },
            expected={"maxLatencyMs": 1.0},
        ),
        CheckResult(
            check=CheckId.PEER_LOSS,
            subject=peer,
            status=Status.FAIL if lost else Status.PASS,
            message="",
            observed={**base, "lossPercent": lost * 2.0, "sent": 50, "received": 50 - lost},
            expected={"maxLossPercent": 0.1},
        ),
        CheckResult(
            check=CheckId.PEER_PATH_MTU,
            subject=peer,
            status=Status.PASS,
            message="",
            observed={**base, "pathMTU": 9000, "method": "echo"},
            expected={"pathMTU": 9000},
        ),
        CheckResult(
            check=CheckId.PEER_THROUGHPUT,
            subject=peer,
            status=Status.PASS,
            message="",
            observed={
                **base,
                "mbps": INTRA_MBPS if same else CROSS_MBPS,
                "bytes": 50_000_000,
                "seconds": 1.0,
                "ageSeconds": 42.0,
            },
            expected={"minThroughputRatio": 0.5},
        ),
    ]


def fabric_east_west() -> EastWest:
    nodes = RACK_1 + RACK_2
    results: dict[str, list[CheckResult]] = {n: [] for n in nodes}
    for prober, peer in itertools.permutations(nodes, 2):
        results[prober] += peer_results(prober, peer)
    return east_west(results, dict(DOMAIN), min_throughput_ratio=0.5)


# -- the API -----------------------------------------------------------------------------------


def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": NOW.isoformat(), "observedGeneration": 1}  # fmt: skip


def make(kube: KubeCluster, name: str, spec: dict[str, Any], status: dict[str, Any] | None) -> None:
    kube.create({"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": name},
                 "spec": spec})  # fmt: skip
    if status is not None:
        kube.patch(NV, "networkvalidations", name, {"status": status}, subresource="status")


PEERS_ON = {"nodeSelector": {"pool": "gpu"},
            "checks": {"peers": {"enabled": True, "topologyKey": "netval.io/rack",
                                 "minThroughputRatio": 0.5, "maxLatencyMs": 1.0}}}  # fmt: skip


@pytest.fixture
def api(kube: KubeCluster) -> KubeCluster:
    failing = len(RACK_1 + RACK_2)
    make(kube, "fabric", PEERS_ON, {
        "observedGeneration": 1,
        "conditions": [cond("Ready", "True", "AgentsReporting", "all 7 nodes reporting"),
                       cond("Healthy", "False", "ChecksFailing",
                            f"{HOSTILE} fails peer.loss {HOSTILE_MESSAGE}")],
        "nodes": {"targeted": failing, "reporting": failing, "passing": 0, "warning": 0,
                  "failing": failing, "stale": 0},
        "checks": {"peer.loss": {"pass": 0, "warn": 0, "fail": failing},
                   "peer.latency": {"pass": failing, "warn": 0, "fail": 0}},
        "failures": [
            {"node": HOSTILE, "check": "peer.loss", "subject": "gpu-1a",
             "message": f"10 of 50 echoes to gpu-1a lost (20.00%) {HOSTILE_MESSAGE}",
             "since": (NOW - timedelta(minutes=3)).isoformat()},
            {"node": "gpu-1a", "check": "peer.loss", "subject": HOSTILE,
             "message": f"10 of 50 echoes to {HOSTILE} lost (20.00%)",
             "since": (NOW - timedelta(minutes=2)).isoformat()},
        ],
        "lastReportTime": NOW.isoformat(),
        "eastWest": fabric_east_west().to_status(),
    })  # fmt: skip
    make(kube, "calm", {"nodeSelector": {"pool": "cpu"}}, {
        "observedGeneration": 1,
        "conditions": [cond("Ready", "True", "AgentsReporting", "all 2 nodes reporting"),
                       cond("Healthy", "True", "AllChecksPassing", "2 nodes passing")],
        "nodes": {"targeted": 2, "reporting": 2, "passing": 2, "warning": 0, "failing": 0,
                  "stale": 0},
        "checks": {"mtu.interface": {"pass": 2, "warn": 0, "fail": 0}}, "failures": [],
        "lastReportTime": NOW.isoformat(),
    })  # fmt: skip
    make(kube, "waiting", PEERS_ON, None)
    return kube


def stored(kube: KubeCluster, name: str) -> dict[str, Any]:
    return kube.get(NV, "networkvalidations", name)


# -- HTML well-formedness ----------------------------------------------------------------------

VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                  "source", "track", "wbr"})  # fmt: skip


class Page(HTMLParser):
    """Tags, attributes and text of a page; `errors` lists unbalanced tags."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: Counter[str] = Counter()
        self.attrs: list[tuple[str, str | None]] = []
        self.ids: set[str] = set()
        self.chunks: list[str] = []
        self.feed(page)
        self.close()
        self.errors += [f"<{tag}> never closed" for tag in self.stack]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        self.attrs += attrs
        self.ids |= {v for k, v in attrs if k == "id" and v}
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        self.attrs += attrs

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            self.errors.append(f"</{tag}> for a void element")
        elif not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.chunks).split())


def check_self_contained(page: Page) -> None:
    assert not page.errors, page.errors
    assert page.tags["html"] == page.tags["head"] == page.tags["body"] == 1
    assert not {"script", "img", "link", "iframe", "object", "embed"} & set(page.tags)
    assert not [k for k, _ in page.attrs if k in {"src", "href"} or k.startswith("on")]


# -- render_matrix ------------------------------------------------------------------------------


def matrix_rows(out: str, columns: list[str]) -> dict[tuple[str, str], list[str]]:
    """(row domain, metric) -> the cells of that line, by the fixed widths of the table."""
    lines = out.splitlines()
    rows: dict[tuple[str, str], list[str]] = {}
    for i, line in enumerate(lines):
        if line.startswith("  ") and line.strip() in columns and not line.startswith("   "):
            for metric_line in lines[i + 1 : i + 6]:
                metric = metric_line[4:11].strip()
                cells = [metric_line[11 + 12 * k : 11 + 12 * (k + 1)] for k in range(len(columns))]
                assert all(c[:2] == "  " for c in cells), metric_line  # aligned columns
                rows[line.strip(), metric] = [c.strip() for c in cells]
    return rows


def test_the_aggregation_survives_the_api(api: KubeCluster) -> None:
    # the CRD schema prunes what it does not declare: everything must come back
    raw = stored(api, "fabric")["status"]["eastWest"]
    assert EastWest.model_validate(raw) == fabric_east_west()


def test_matrix_shows_the_4_to_1_capacity_ratio_between_the_racks(api: KubeCluster) -> None:
    out = render_matrix(stored(api, "fabric"))
    lines = out.splitlines()
    assert lines[0] == "  east-west: 2 domain(s), 7 node(s), minThroughputRatio 0.5"
    assert " " * 17 + "rack-1" + " " * 6 + "rack-2" in lines  # the column headings
    values = matrix_rows(out, ["rack-1", "rack-2"])
    assert values["rack-1", "cap"] == ["intra", "4.0:1 FLAG"]
    assert values["rack-2", "cap"] == ["4.0:1 FLAG", "intra"]
    assert values["rack-1", "Mbit/s"] == values["rack-2", "Mbit/s"][::-1] == ["400", "100"]
    assert values["rack-1", "p50 ms"] == ["0.050", "0.400"]
    # medians: 6 of 24 cross results involve the lossy node, 6 of 12 inside rack-2
    assert values["rack-2", "loss %"] == ["0.00", "10.0"]
    assert values["rack-1", "failing"] == ["0", "6"]
    assert values["rack-2", "failing"] == ["6", "6"]
    assert "  flagged pairs (cross/intra throughput ratio below 0.5):" in lines
    assert "    rack-1 <-> rack-2: ratio 0.25, capacity 4.0:1" in lines
    assert "    <script>alert(1)</script> (rack-2): failing with 6 of 6 peer(s): peer.loss" in lines
    assert (
        "  failing node pairs: 6, 0 not explained by a suspect; 6 observer(s), not degraded for it"
        in lines
    )


def test_matrix_when_not_enabled_or_not_there_yet(api: KubeCluster) -> None:
    assert render_matrix(stored(api, "calm")) == f"  {NOT_ENABLED}\n"
    assert NOT_ENABLED == "east-west probing is not enabled (spec.checks.peers.enabled)"
    assert render_matrix(stored(api, "waiting")) == f"  {NO_SUMMARY_YET}\n"
    assert "not readable" in render_matrix({"status": {"eastWest": {"cells": "?"}}})


def test_many_domains_wrap_into_tables_of_bounded_width() -> None:
    racks = [f"topology-zone-{i:02d}" for i in range(11)]
    nodes = {f"{r}-n{i}": r for r in racks for i in range(2)}
    results: dict[str, list[CheckResult]] = {}
    for n, p in itertools.permutations(nodes, 2):
        mbps = 400.0 if nodes[n] == nodes[p] else 300.0
        results.setdefault(n, []).append(
            CheckResult(
                check=CheckId.PEER_THROUGHPUT,
                subject=p,
                status=Status.PASS,
                message="",
                observed={"mbps": mbps},
            )
        )
    ew = east_west(results, dict(nodes), min_throughput_ratio=0.5)
    out = render_matrix({"spec": PEERS_ON, "status": {"eastWest": ew.to_status()}})
    assert "  domains 1-8 of 11 as columns" in out and "  domains 9-11 of 11 as columns" in out
    table_lines = [line for line in out.splitlines() if line.startswith("    cap ")]
    assert max(len(line) for line in table_lines) <= 4 + 7 + MATRIX_COLUMNS * 12
    assert "topol~e-00" in out and "topol~e-10" in out  # headings cut to the cell width...
    assert "  topology-zone-00\n" in out  # ...row headings are not
    assert "1.3:1" in out and "1.3:1 FLAG" not in out  # 0.75 is above 0.5


def test_matrix_and_html_name_a_suspect_link_and_its_observers() -> None:
    nodes = RACK_1 + RACK_2[:3]
    results: dict[str, list[CheckResult]] = {n: [] for n in nodes}
    for prober, peer in itertools.permutations(nodes, 2):
        bad = DOMAIN[prober] != DOMAIN[peer]  # the racks' uplink drops jumbo frames
        results[prober].append(
            CheckResult(
                check=CheckId.PEER_PATH_MTU,
                subject=peer,
                status=Status.FAIL if bad else Status.PASS,
                message="",
                observed={"pathMTU": 1500 if bad else 9000, "method": "blackhole"},
            )
        )
    ew = east_west(results, dict(DOMAIN), min_throughput_ratio=0.5)
    obj = {"spec": PEERS_ON, "status": {"eastWest": ew.to_status()}}
    out = render_matrix(obj)
    assert (
        "  suspect link: rack-1 <-> rack-2: 9 of 9 pair(s) through it fail, 0 of 6 around it, "
        "confidence 1: peer.path_mtu"
    ) in out
    assert "6 observer(s), not degraded for it" in out
    page = render_html({**obj, "metadata": {"name": "v"}})
    assert "Suspect link: rack-1 &lt;-&gt; rack-2: 9 of 9 node pairs" in page


def test_terminal_control_characters_are_not_printed() -> None:
    ew = fabric_east_west().to_status()
    ew["suspects"][0]["node"] = "evil\x1b]0;pwned\x07"
    out = render_matrix({"spec": PEERS_ON, "status": {"eastWest": ew}})
    assert "\x1b" not in out and "\x07" not in out and "evil?]0;pwned?" in out


# -- render_html --------------------------------------------------------------------------------


def test_html_is_well_formed_self_contained_and_has_both_heatmaps(api: KubeCluster) -> None:
    html_page = render_html(stored(api, "fabric"), now=NOW)
    page = Page(html_page)
    check_self_contained(page)
    assert {"latency-heatmap", "throughput-heatmap", "conditions", "failures"} <= page.ids
    text = page.text
    # the numbers are on the page, not only in the colours
    for number in ("50 µs", "400 µs", "8.0x intra median", "400 Mbit/s", "100 Mbit/s", "ratio 0.25 · capacity 4.0:1",
                   "FLAGGED", "path MTU 9000", "loss 10.0%"):  # fmt: skip
        assert number in text, number
    assert text.count("FLAGGED") == 2  # the symmetric cells of rack-1 x rack-2
    assert "rack-1 rack-2 100 Mbit/s 0.25 4.0:1" in text  # the flagged pairs table
    assert "Healthy False ChecksFailing" in text
    assert "targeted reporting passing warning failing stale 7 7 0 0 7 0" in text
    assert "peer.loss 0 0 7" in text


def test_html_escapes_names_and_messages_from_the_object(api: KubeCluster) -> None:
    html_page = render_html(stored(api, "fabric"), now=NOW)
    page = Page(html_page)
    check_self_contained(page)  # no <script> or <img> made it in as a tag
    assert HOSTILE not in html_page and HOSTILE_MESSAGE not in html_page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_page
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in html_page
    # ... and a reader sees them as text: the suspect, the failing node, the message
    text = page.text
    assert f"{HOSTILE} rack-2 6 of 6 peer.loss" in text
    assert f"{HOSTILE} : peer.loss" in text  # (text chunks are joined with spaces)
    assert f"lost (20.00%) {HOSTILE_MESSAGE}" in text
    assert "<title>netval: fabric</title>" in html_page


def test_html_without_east_west_or_status(api: KubeCluster) -> None:
    page = Page(render_html(stored(api, "calm"), now=NOW))
    check_self_contained(page)
    assert NOT_ENABLED in page.text and "heatmap" not in " ".join(page.ids)
    assert "mtu.interface 2 0 0" in page.text and "No failures." in page.text
    waiting = Page(render_html(stored(api, "waiting"), now=NOW))
    check_self_contained(waiting)
    assert "No status yet" in waiting.text and "no summary yet" in waiting.text


# -- the CLI (runs once `netval status --matrix` and `netval report` are wired) ------------------


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


_SUB = _subcommands()
HAS_MATRIX = "status" in _SUB and any(
    "--matrix" in a.option_strings for a in _SUB["status"]._actions
)
HAS_REPORT = "report" in _SUB
needs_matrix = pytest.mark.skipif(not HAS_MATRIX, reason="`netval status --matrix` not wired yet")
needs_report = pytest.mark.skipif(not HAS_REPORT, reason="`netval report` not wired yet")


@needs_matrix
def test_cli_status_matrix(api: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "fabric", "--matrix"]) == 1  # not Healthy
    out = capsys.readouterr().out
    assert out.startswith("NetworkValidation fabric (generation 1)\n")
    assert "Healthy  False   ChecksFailing" in out
    assert "4.0:1 FLAG" in out and "rack-1 <-> rack-2: ratio 0.25, capacity 4.0:1" in out
    assert main(["status", "calm", "--matrix"]) == 0
    assert NOT_ENABLED in capsys.readouterr().out


@needs_report
def test_cli_report_html(
    api: KubeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "fabric.html"
    assert main(["report", "fabric", "--html", str(target)]) == 1  # written; not Healthy
    page = Page(target.read_text(encoding="utf-8"))
    check_self_contained(page)
    assert {"latency-heatmap", "throughput-heatmap"} <= page.ids
    assert "4.0:1" in page.text and HOSTILE in page.text
    assert main(["report", "calm", "--html", str(tmp_path / "calm.html")]) == 0
    capsys.readouterr()
    missing = tmp_path / "nope.html"
    assert main(["report", "nope", "--html", str(missing)]) == 2
    assert capsys.readouterr().err == "netval: error: NetworkValidation 'nope' not found\n"
    assert not missing.exists()
    assert main(["report", "calm", "--html", str(tmp_path / "no-dir" / "x.html")]) == 2
