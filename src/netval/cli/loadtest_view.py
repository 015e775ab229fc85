"""`netval status --loadtests` and `netval status --loadtest NAME`: NetworkLoadTests as people
read them, from the status object only (docs/loadtest.md).

The list shows each test's phase, Passed, participants, worst oversubscription, when it last
ran and when it runs next. The detail view of one test shows the domain x domain matrix of
the measured oversubscription, the latency of each domain pair idle and under load, storage
per endpoint (what all nodes got at once and what one node gets alone), the breaches, the
skipped nodes and the history. `render_beside_matrix` is what `--matrix` adds under a
validation's capacity ratios: the load-test figure of the same domain pairs.

Pure rendering. The status comes from the API: every string goes through `printable` (no
terminal control characters, cut to a width) and every number through `figure` (bounded
width whatever its size), so hostile but valid values cannot break the layout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from netval.cli.loadtest_format import (
    breach_line,
    breached_subjects,
    cell_map,
    cell_text,
    count,
    domains_of,
    figure,
    inflation,
    latest_run_time,
    millis,
    name_of,
    pair_name,
    parse_loadtest,
    passed,
    rate,
    ratio,
    validation_of,
    when,
)
from netval.cli.status_view import MATRIX_COLUMNS, parse_east_west, printable
from netval.model.loadtest import LoadConditionType, LoadRun, NetworkLoadTestStatus

MAX_CELL_ROWS: Final = 40  # latency rows in the text view; the HTML report has all
MAX_BESIDE_ROWS: Final = 20
_CELL_WIDTH: Final = 10
_ROW_WIDTH: Final = 24
_NAME_WIDTH: Final = 40
_REF: Final = "ref"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ") -> list[str]:
    body = [list(r) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(header), *body]
    ]


# -- the list -------------------------------------------------------------------------------


def render_loadtest_list(objs: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """One line per NetworkLoadTest: PHASE, PASSED, NODES, MAX-OVERSUB, LAST-RUN, NEXT-RUN."""
    rows = []
    for obj in objs:
        status, problem = parse_loadtest(obj)
        run = status.last_run if status else None
        phase = "unreadable" if problem else (status.phase.value if status else "no status")
        rows.append(
            (
                printable(name_of(obj), _NAME_WIDTH),
                printable(validation_of(obj), _NAME_WIDTH),
                phase,
                passed(status),
                str(run.nodes) if run else "-",
                ratio(run.max_oversubscription) if run else "-",
                when(latest_run_time(status), now) if run else "never",
                when(status.next_run_at, now) if status and status.next_run_at else "-",
            )
        )
    header = ("NAME", "VALIDATION", "PHASE", "PASSED", "NODES", "MAX-OVERSUB", "LAST-RUN")
    return "\n".join(_table((*header, "NEXT-RUN"), rows, indent="")) + "\n"


# -- one test ---------------------------------------------------------------------------------


def _matrix(run: LoadRun) -> list[str]:
    cells = run.east_west.cells if run.east_west else []
    domains = domains_of(cells)
    if not domains:
        return ["  east-west: no domain pair measured"]
    by_pair = cell_map(cells)
    breached = breached_subjects(run)
    lines = [
        "  oversubscription per domain pair: median per-node intra rate / per-node rate across,",
        "  every node sending at once, the worst rail plane (ref: the intra-domain reference,",
        "  !: breached, .: not planned, not-meas: planned but nothing counted, sender-lim: the",
        "  hosts limited the flows, ~: partial, a lower bound kept out of the maximum)",
    ]
    chunks = [domains[i : i + MATRIX_COLUMNS] for i in range(0, len(domains), MATRIX_COLUMNS)]
    for k, columns in enumerate(chunks):
        if len(chunks) > 1:
            first = k * MATRIX_COLUMNS + 1
            lines.append(f"  domains {first}-{first + len(columns) - 1} of {len(domains)}:")
        heads = "".join(f"  {printable(d, _CELL_WIDTH):>{_CELL_WIDTH}}" for d in columns)
        lines.append(f"  {'':{_ROW_WIDTH}}{heads}")
        for row in domains:
            texts = []
            for col in columns:
                c = by_pair.get((row, col))
                if c is None:
                    texts.append(".")
                elif c.a == c.b:
                    texts.append(_REF if c.reason is None else cell_text(c))
                else:
                    mark = " !" if pair_name(c) in breached else ""
                    texts.append(cell_text(c) + mark)
            if all(t == "." for t in texts):
                continue
            cells_text = "".join(f"  {t:>{_CELL_WIDTH}}" for t in texts)
            lines.append(f"  {printable(row, _ROW_WIDTH):{_ROW_WIDTH}}{cells_text}")
    return lines


def _cells(run: LoadRun) -> list[str]:
    cells = run.east_west.cells if run.east_west else []
    if not cells:
        return []
    rows = [
        (
            printable(c.a, _ROW_WIDTH)
            + (" (intra)" if c.a == c.b else f" <-> {printable(c.b, _ROW_WIDTH)}"),
            str(c.rail),
            f"{count(c.flows)}/{count(c.planned)}",
            rate(c.per_node_mbps),
            rate(c.aggregate_mbps),
            (_REF if c.reason is None else cell_text(c)) if c.a == c.b else cell_text(c),
            millis(c.idle_latency_p99_ms),
            millis(c.loaded_latency_p99_ms),
            figure(inflation(c), lambda v: f"{v:.1f}x"),
            figure(c.loss_percent, lambda v: f"{v:.2f}"),
        )
        for c in cells[:MAX_CELL_ROWS]
    ]
    header = ("PAIR", "RAIL", "FLOWS", "PER-NODE Mbit/s", "AGGREGATE", "OVERSUB", "IDLE p99 ms",
              "LOADED p99 ms", "INFLATION", "LOSS %")  # fmt: skip
    lines = [
        "  per domain pair and rail (flows counted/planned; latency: p99 round trip of every "
        "echo before and during the load):"
    ]
    lines += _table(header, rows, indent="    ")
    more = len(cells) - MAX_CELL_ROWS
    if more > 0:
        lines.append(f"    ... {more} more pair(s) (netval report shows every one)")
    notes = [c for c in cells[:MAX_CELL_ROWS] if c.note]
    for c in notes:
        lines.append(
            f"    {printable(pair_name(c), 2 * _ROW_WIDTH)}: {c.reason.value if c.reason else ''}"
            f" - {printable(c.note, 200)}"
        )
    return lines


def _storage(run: LoadRun) -> list[str]:
    if not run.storage:
        return []
    rows = [
        (
            printable(s.endpoint, _NAME_WIDTH),
            f"{count(s.nodes)}/{count(s.readers)}",
            rate(s.aggregate_m_bps),
            rate(s.per_node_m_bps_min),
            rate(s.per_node_m_bps_median),
            rate(s.single_node_m_bps),
            figure(s.fairness, lambda v: f"{v:.2f}"),
        )
        for s in run.storage
    ]
    header = ("ENDPOINT", "READ/READERS", "AGGREGATE", "PER-NODE MIN", "MEDIAN", "SINGLE NODE",
              "FAIRNESS")  # fmt: skip
    lines = [
        "  storage, MB/s (every node reading at once, a reader that read nothing counts as 0;",
        "  single node: one node alone):",
    ]
    return lines + _table(header, rows, indent="    ")


def _run_lines(run: LoadRun, now: datetime) -> list[str]:
    finished = f", finished {when(run.finished_at, now)}" if run.finished_at else ", running"
    lines = [
        f"  last run {printable(run.id, _NAME_WIDTH)}: started {when(run.started_at, now)}"
        f"{finished}, {run.nodes} node(s), {run.skipped_count} skipped, "
        f"{run.refused_flows} flow(s) refused, max oversubscription "
        f"{ratio(run.max_oversubscription)}",
        f"  counted {run.counted_flows} of {run.planned_flows} planned flows and reads "
        f"({figure(run.coverage_percent, lambda v: f'{v:.0f}')} %); engines: "
        f"{printable(', '.join(run.engines) or 'none reported', 120)}"
        + (f"; {run.reserved_nodes} node(s) reserved" if run.reserved_nodes else ""),
    ]
    if run.skipped_nodes:
        reasons = Counter(s.reason.value for s in run.skipped_nodes)
        lines.append(
            "  skipped: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
            + (f" (of the first {len(run.skipped_nodes)})"
               if run.skipped_count > len(run.skipped_nodes) else "")
        )  # fmt: skip
    lines += _matrix(run)
    if run.east_west and run.east_west.omitted_cells:
        lines.append(
            f"  {run.east_west.omitted_cells} more domain pair(s) not in the status "
            f"(it keeps {len(run.east_west.cells)}: breached and most oversubscribed first)"
        )
    lines += _cells(run)
    lines += _storage(run)
    if run.breaches:
        lines.append(f"  breaches ({len(run.breaches)}, worst first):")
        lines += [
            "    " + breach_line(b.expectation, b.subject, b.observed, b.expected)
            for b in run.breaches
        ]
    else:
        lines.append("  breaches: none")
    return lines


def _history(status: NetworkLoadTestStatus, now: datetime) -> list[str]:
    if not status.history:
        return ["  history: none"]
    rows = [
        (
            printable(h.id, _NAME_WIDTH),
            when(h.started_at, now),
            h.phase.value,
            h.reason.value,
            str(h.nodes),
            ratio(h.max_oversubscription),
            rate(h.min_storage_m_bps_per_node),
            str(h.breaches),
        )
        for h in status.history
    ]
    header = ("RUN", "STARTED", "PHASE", "REASON", "NODES", "MAX-OVERSUB", "MIN MB/s/NODE",
              "BREACHES")  # fmt: skip
    return ["  history (newest first):", *_table(header, rows, indent="    ")]


def render_loadtest(obj: Mapping[str, Any], now: datetime) -> str:
    """The detail view of one NetworkLoadTest."""
    meta = obj.get("metadata")
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    lines = [
        f"NetworkLoadTest {printable(name_of(obj), _NAME_WIDTH)} (validation "
        f"{printable(validation_of(obj), _NAME_WIDTH)}, generation {generation})"
    ]
    status, problem = parse_loadtest(obj)
    if status is None:
        lines.append(f"  {problem or 'no status yet (is the operator running?)'}")
        return "\n".join(lines) + "\n"
    if status.observed_generation != generation:
        lines.append(
            f"  status is for generation {status.observed_generation}: "
            "the operator has not caught up"
        )
    next_run = f", next run {when(status.next_run_at, now)}" if status.next_run_at else ""
    lines.append(f"  phase    {status.phase.value}{next_run}")
    for kind in LoadConditionType:
        c = status.condition(kind)
        lines.append(
            f"  {kind.value:8} "
            + (f"{c.status:7} {c.reason.value}: {printable(c.message, 200)}" if c else "-")
        )
    if status.last_run is None:
        lines.append("  no run yet")
    else:
        lines += _run_lines(status.last_run, now)
    lines += _history(status, now)
    return "\n".join(lines) + "\n"


# -- beside the capacity ratio of `netval status NAME --matrix` -------------------------------


def capacity_ratios(validation: Mapping[str, Any]) -> dict[tuple[str, str], float | None]:
    """The single-flow capacity ratio of each domain pair of `status.eastWest` (both orders)."""
    ew, _ = parse_east_west(validation)
    out: dict[tuple[str, str], float | None] = {}
    for c in ew.cells if ew else []:
        out[c.a, c.b] = out[c.b, c.a] = c.capacity_ratio
    return out


def render_beside_matrix(
    capacity: Mapping[tuple[str, str], float | None],
    loadtests: Iterable[Mapping[str, Any]],
    now: datetime,
) -> str:
    """For each load test of the validation that has run: its oversubscription of each domain
    pair next to the pair's single-flow capacity ratio (`capacity`, both orders of a pair)."""
    lines = []
    for obj in loadtests:
        status, _ = parse_loadtest(obj)
        run = status.last_run if status else None
        if status is None or run is None:
            continue
        lines.append(
            f"  under load: NetworkLoadTest {printable(name_of(obj), _NAME_WIDTH)}, run "
            f"{printable(run.id, _NAME_WIDTH)} {when(latest_run_time(status), now)} "
            f"({status.phase.value}, {run.nodes} node(s)): max oversubscription "
            f"{ratio(run.max_oversubscription)}"
        )
        cross = [c for c in (run.east_west.cells if run.east_west else []) if c.a != c.b]
        rows = [
            (
                f"{printable(c.a, _ROW_WIDTH)} <-> {printable(c.b, _ROW_WIDTH)}",
                ratio(capacity.get((c.a, c.b))),
                ratio(c.oversubscription),
            )
            for c in cross[:MAX_BESIDE_ROWS]
        ]
        if rows:
            header = ("PAIR", "CAPACITY RATIO (lone flows)", "OVERSUBSCRIPTION (under load)")
            lines += _table(header, rows, indent="    ")
        if len(cross) > MAX_BESIDE_ROWS:
            lines.append(
                f"    ... {len(cross) - MAX_BESIDE_ROWS} more pair(s): netval status "
                f"--loadtest {printable(name_of(obj), _NAME_WIDTH)}"
            )
    return "\n".join(lines) + "\n" if lines else ""
