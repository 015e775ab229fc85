"""The human view of a report: grouped by device, status colours on a terminal."""

from __future__ import annotations

import os
from collections import Counter
from typing import Final, TextIO

from netval.model.ids import Status
from netval.model.results import CheckResult, Report

_COLOURS: Final = {
    Status.PASS: "\x1b[32m",
    Status.WARN: "\x1b[33m",
    Status.FAIL: "\x1b[31m",
    Status.ERROR: "\x1b[35m",
    Status.SKIP: "\x1b[2m",
}
_RESET: Final = "\x1b[0m"
_ORDER: Final = (Status.ERROR, Status.FAIL, Status.WARN, Status.PASS, Status.SKIP)


def use_colour(stream: TextIO) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _group(result: CheckResult, node: str) -> str:
    if result.subject == node:
        return "node"
    # ens1np0/prio3 -> ens1np0; mlx5_0/1 -> mlx5_0
    return result.subject.partition("/")[0]


def render_table(report: Report, *, colour: bool, verbose: bool = False) -> str:
    def paint(status: Status, text: str) -> str:
        return f"{_COLOURS[status]}{text}{_RESET}" if colour else text

    groups: dict[str, list[CheckResult]] = {}
    for r in report.results:
        groups.setdefault(_group(r, report.node), []).append(r)
    lines = [f"netval probe: node {report.node} (validation {report.validation})"]
    check_width = max((len(r.check) for r in report.results), default=10)
    for name, results in groups.items():
        lines.append("")
        lines.append(name)
        for r in results:
            if r.status is Status.PASS and not verbose:
                continue
            detail = r.subject.partition("/")[2]
            where = f" [port {detail}]" if detail.isdigit() else (f" [{detail}]" if detail else "")
            lines.append(
                f"  {paint(r.status, f'{r.status.value.upper():5}')}  "
                f"{r.check.value:{check_width}}  {r.message}{where}"
            )
        passed = sum(1 for r in results if r.status is Status.PASS)
        if passed and not verbose:
            lines.append(f"  {paint(Status.PASS, 'PASS ')}  {passed} check(s) passed")
    counts = Counter(r.status for r in report.results)
    summary = ", ".join(f"{counts[s]} {s.value}" for s in _ORDER if counts[s])
    lines.append("")
    lines.append(
        f"{paint(report.status, report.status.value.upper())}: {summary or 'nothing judged'} "
        f"({report.duration_ms:.1f} ms)"
    )
    return "\n".join(lines) + "\n"
