"""Fleet consistency views of `status.consistency`: `netval status NAME --consistency` (text)
and the "Fleet consistency" section of `netval report` (HTML). Both show the keys as a table:
cohort, key, majority value, its share, the outliers (or the split's groups)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

from netval.cli.report_html_format import escape
from netval.cli.status_view import printable
from netval.model.consistency import ConsistencyStatus, KeySummary

NO_SUMMARY: Final = (
    "fleet consistency: no summary yet (spec.consistency.enabled false, or no agent has"
    " reported facts; is the operator running?)"
)
MAX_ROWS_TEXT: Final = 60


def parse_consistency(obj: Mapping[str, Any]) -> tuple[ConsistencyStatus | None, str | None]:
    """`status.consistency` as the model, or None and why not (None, None: there is none)."""
    status = obj.get("status")
    raw = status.get("consistency") if isinstance(status, Mapping) else None
    if raw is None:
        return None, None
    try:
        return ConsistencyStatus.model_validate(raw), None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        return None, (
            f"status.consistency is not readable by this netval version ({where}: {err['msg']})"
        )


def _outliers_text(row: KeySummary) -> str:
    if row.split:
        return "split: " + ", ".join(f"{g.value} x{g.nodes}" for g in row.split)
    named = [f"{o.node}={o.value}" for o in row.outliers]
    if row.more_outliers:
        named.append(f"+{row.more_outliers} more")
    text = ", ".join(named) or "-"
    if row.transitioning:
        text += f" ({row.transitioning} transitioning)"
    return text


def _majority(row: KeySummary) -> str:
    return row.majority if row.majority is not None else "-"


def render_consistency(obj: Mapping[str, Any]) -> str:
    summary, problem = parse_consistency(obj)
    if summary is None:
        return f"  {problem or NO_SUMMARY}\n"
    lines = [
        f"  fleet consistency: {summary.nodes} node(s) in {summary.cohorts} cohort(s),"
        f" {len(summary.violations) + summary.more_violations} violation(s)"
    ]
    rows = [
        (
            printable(r.cohort, 32),
            printable(r.key, 24),
            printable(_majority(r), 32),
            f"{r.share * 100:.0f}%",
            printable(_outliers_text(r), 80),
        )
        for r in summary.keys[:MAX_ROWS_TEXT]
    ]
    header = ("COHORT", "KEY", "MAJORITY", "SHARE", "OUTLIERS")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for row in [header, *rows]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    more = len(summary.keys) - MAX_ROWS_TEXT + summary.more_keys
    if more > 0:
        lines.append(f"  ... {more} more key row(s) (kubectl get -o yaml shows the status)")
    for v in summary.violations:
        lines.append(
            f"  violation: {printable(v.node, 63)} {printable(v.key, 24)}={printable(v.value, 64)}"
        )
    if summary.more_violations:
        lines.append(f"  ... {summary.more_violations} more violation(s)")
    return "\n".join(lines) + "\n"


def consistency_section(obj: Mapping[str, Any]) -> str:
    summary, problem = parse_consistency(obj)
    head = '<section id="consistency"><h2>Fleet consistency</h2>'
    if summary is None:
        return f"{head}<p>{escape(problem or NO_SUMMARY)}</p></section>"
    rows = "".join(
        f"<tr><td>{escape(r.cohort)}</td><td><code>{escape(r.key)}</code></td>"
        f"<td>{escape(_majority(r))}</td><td>{r.share * 100:.0f}%</td>"
        f"<td>{escape(_outliers_text(r))}</td></tr>"
        for r in summary.keys
    )
    violations = "".join(
        f"<li>{escape(v.node)}: <code>{escape(v.key)}</code> = {escape(v.value)}</li>"
        for v in summary.violations
    )
    return (
        f"{head}<p>{summary.nodes} node(s) in {summary.cohorts} cohort(s).</p>"
        "<table><thead><tr><th>Cohort</th><th>Key</th><th>Majority</th><th>Share</th>"
        f"<th>Outliers</th></tr></thead><tbody>{rows}</tbody></table>"
        + (f"<h3>Violations</h3><ul>{violations}</ul>" if violations else "")
        + "</section>"
    )
