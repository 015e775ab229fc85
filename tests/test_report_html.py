"""The HTML report in a real browser (headless Chromium): it renders, logs no console error,
and the verdict banner says the right thing for a healthy and a failing validation.

Skips only when Chromium is not installed (CI installs Debian's `chromium`)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from netval.cli import main
from netval.cli.report_html import render_html
from netval.cli.report_html_format import (
    fmt_latency,
    fmt_rate,
    latency_position,
    relative,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "status" / "roce-pool.yaml"
CHROMIUM = next((p for n in ("chromium", "chromium-browser") if (p := shutil.which(n))), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)"
)
CONSOLE_PROBLEM = re.compile(
    r":CONSOLE[(:]\d+|CONSOLE\(\d+\)|Refused to|Uncaught|violates the following", re.I
)


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def healthy() -> dict[str, Any]:
    obj = copy.deepcopy(example())
    st = obj["status"]
    for c in st["conditions"]:
        if c["type"] == "Healthy":
            c.update(status="True", reason="AllChecksPassing", message="32 nodes passing")
    st["failures"] = []
    st["nodes"].update(passing=32, failing=0)
    for counts in st["checks"].values():
        counts.update({"pass": 32, "fail": 0})
    st.pop("eastWest")
    return obj


def browse(tmp_path: Path, page: str) -> tuple[str, str]:
    """(DOM after load, the browser's log) of `page` in headless Chromium."""
    assert CHROMIUM is not None
    html_file = tmp_path / "page.html"
    html_file.write_text(page, encoding="utf-8")
    profile = tmp_path / "profile"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", html_file.as_uri()],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def console_problems(log: str) -> list[str]:
    return [line for line in log.splitlines() if CONSOLE_PROBLEM.search(line)]


@needs_chromium
def test_the_console_check_sees_errors(tmp_path: Path) -> None:
    # the detector must catch what it is there for: a CSP refusal and a script error
    _, log = browse(tmp_path, "<!DOCTYPE html><html><head><meta http-equiv='Content-Security-"
                    "Policy' content=\"default-src 'none'\"></head><body><script>x()</script>"
                    "<p>hi</p></body></html>")  # fmt: skip
    assert console_problems(log), log[-2000:]


@needs_chromium
def test_failing_report_renders_with_the_failing_verdict(tmp_path: Path) -> None:
    obj = example()
    dom, log = browse(tmp_path, render_html(obj))
    assert console_problems(log) == [], log[-2000:]
    assert 'id="verdict" class="unhealthy"' in dom and 'data-verdict="unhealthy"' in dom
    banner = dom[dom.index('id="verdict"') : dom.index("</section>", dom.index('id="verdict"'))]
    assert "Not healthy" in banner and "gpu-r3-05" in banner
    assert "rack-2 ↔ rack-4" in banner and "4.1:1" in banner
    assert "netval status roce-pool --nodes --failing" in banner
    # the verdict comes first, then the failures, the detail last
    order = [dom.index(f'id="{i}"') for i in ("verdict", "failures", "conditions", "east-west")]
    assert order == sorted(order)
    assert "94.0 Gbit/s" in dom and "381 Gbit/s" in dom and "12 µs" in dom and "94 µs" in dom
    assert "Mbit/s" not in dom.split('id="throughput-heatmap"')[1].split("</table>")[0]


@needs_chromium
def test_healthy_report_renders_with_the_healthy_verdict(tmp_path: Path) -> None:
    dom, log = browse(tmp_path, render_html(healthy()))
    assert console_problems(log) == [], log[-2000:]
    assert 'data-verdict="healthy"' in dom and ">Healthy</h2>" in dom
    assert "What to do" not in dom and "No failures." in dom


@needs_chromium
def test_report_without_status_says_unknown(tmp_path: Path) -> None:
    obj = {"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
           "metadata": {"name": "new", "generation": 1}, "spec": {}}  # fmt: skip
    dom, log = browse(tmp_path, render_html(obj))
    assert console_problems(log) == []
    assert 'data-verdict="unknown"' in dom and "netval doctor" in dom


def test_latency_colours_separate_12_from_36_microseconds() -> None:
    # against the intra-domain median, on a log scale: 3x the median is well apart from 1x
    assert latency_position(0.012, 0.012) == 0.0
    assert latency_position(0.036, 0.012) == pytest.approx(0.396, abs=0.01)
    assert latency_position(0.012 * 16, 0.012) == 1.0


def test_human_units_and_relative_times() -> None:
    assert fmt_rate(377061) == "377 Gbit/s" and fmt_rate(94000) == "94.0 Gbit/s"
    assert fmt_rate(940) == "940 Mbit/s"
    assert fmt_latency(0.012) == "12 µs" and fmt_latency(0.0036) == "3.6 µs"
    assert fmt_latency(1.25) == "1.25 ms"
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert relative(now - timedelta(minutes=7, seconds=5), now) == "7 min ago"
    assert relative(now - timedelta(seconds=12), now) == "12 s ago"
    page = render_html(example(), now=now)
    assert '<time datetime="2025-06-12T07:43:00Z" title="2025-06-12T07:43:00Z">' in page


def test_report_from_file_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert main(["report", "--from", str(EXAMPLE), "--html", str(out)]) == 1  # not Healthy
    assert "Not healthy" in out.read_text(encoding="utf-8")
    good = tmp_path / "healthy.yaml"
    good.write_text(yaml.safe_dump(healthy()))
    assert main(["report", "--from", str(good), "--html", str(out)]) == 0
    capsys.readouterr()
    assert main(["report", "--from", str(EXAMPLE), "other", "--html", str(out)]) == 2
    assert "no NetworkValidation 'other'" in capsys.readouterr().err


def test_the_example_page_is_current(tmp_path: Path) -> None:
    # examples/status/roce-pool.html is what make_status.py renders today
    rendered = EXAMPLE.with_suffix(".html").read_text(encoding="utf-8")
    now = datetime(2025, 6, 12, 8, 30, 20, tzinfo=UTC)
    assert rendered == render_html(example(), now=now)
