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

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from netval.cli.status_view import MATRIX_COLUMNS, parse_east_west, printable
from netval.model.loadtest import (
    LoadCell,
    LoadConditionType,
    LoadRun,
    NetworkLoadTestStatus,
    RunPhase,
)

MAX_CELL_ROWS: Final = 40  # latency rows in the text view; the HTML report has all
MAX_BESIDE_ROWS: Final = 20
_CELL_WIDTH: Final = 10
_ROW_WIDTH: Final = 24
_NAME_WIDTH: Final = 40
_REF: Final = "ref"


def figure(value: float | None, fmt: Callable[[float], str] = lambda v: f"{v:.1f}") -> str:
    """`value` by `fmt` while it is an ordinary size, else in at most 9 characters."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "?"
    if not -1e6 < value < 1e9:
        return f"{value:.2e}".replace("e+", "e")
    return fmt(value)


def ratio(value: float | None) -> str:
    """An oversubscription as people say it: 3.0 -> "3.0:1"."""
    if value is None:
        return "-"
    if not math.isfinite(value) or value >= 1000:
        return ">999:1" if value > 0 else "?"
    if value < 0:
        return "?"
    return f"{value:.0f}:1" if value >= 10 else f"{value:.1f}:1"


def rate(value: float | None) -> str:
    return figure(value, lambda v: f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}")


def millis(value: float | None) -> str:
    return figure(value, lambda v: f"{v:.3f}" if abs(v) < 1 else f"{v:.2f}")


def inflation(cell: LoadCell) -> float | None:
    """Loaded p99 / idle p99 of a cell (None when either is missing or idle is not positive)."""
    idle, loaded = cell.idle_latency_p99_ms, cell.loaded_latency_p99_ms
    if idle is None or loaded is None or not idle > 0:
        return None
    try:
        return loaded / idle
    except OverflowError:
        return math.inf


def name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else "?"


def validation_of(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec")
    name = spec.get("validation") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else "?"


def parse_loadtest(obj: Mapping[str, Any]) -> tuple[NetworkLoadTestStatus | None, str | None]:
    """`status` as the model, or None and why not (None, None: no status yet)."""
    raw = obj.get("status")
    if not raw:
        return None, None
    try:
        return NetworkLoadTestStatus.model_validate(raw), None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(value)"
        return None, f"status is not readable by this netval version ({where}: {err['msg']})"


def passed(status: NetworkLoadTestStatus | None) -> str:
    c = status.condition(LoadConditionType.PASSED) if status else None
    return c.status if c is not None else "-"


def is_failed(obj: Mapping[str, Any]) -> bool:
    status, problem = parse_loadtest(obj)
    return problem is not None or (status is not None and status.phase == RunPhase.FAILED)


def aware(moment: datetime) -> datetime:
    """`moment` with a zone: a status time without one is read as UTC (Kubernetes writes UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def when(moment: datetime | None, now: datetime) -> str:
    """ "4m ago", "in 2h", "never"."""
    if moment is None:
        return "never"
    try:
        seconds = int((now - aware(moment)).total_seconds())
    except OverflowError:
        return "?"
    future, seconds = seconds < 0, abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            text = f"{seconds // size}{unit}"
            break
    else:
        text = f"{seconds}s"
    return f"in {text}" if future else f"{text} ago"


def latest_run_time(status: NetworkLoadTestStatus | None) -> datetime | None:
    run = status.last_run if status else None
    return (run.finished_at or run.started_at) if run else None


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


def domains_of(cells: Iterable[LoadCell]) -> list[str]:
    return sorted({c.a for c in cells} | {c.b for c in cells})


def cell_map(cells: Iterable[LoadCell]) -> dict[tuple[str, str], LoadCell]:
    """Both orders of each unordered pair; the first cell of a pair wins (worst first)."""
    out: dict[tuple[str, str], LoadCell] = {}
    for c in cells:
        out.setdefault((c.a, c.b), c)
        out.setdefault((c.b, c.a), c)
    return out


def breached_subjects(run: LoadRun) -> set[str]:
    return {b.subject for b in run.breaches}


def _matrix(run: LoadRun) -> list[str]:
    cells = run.east_west.cells if run.east_west else []
    domains = domains_of(cells)
    if not domains:
        return ["  east-west: no domain pair measured"]
    by_pair = cell_map(cells)
    breached = breached_subjects(run)
    lines = [
        "  oversubscription per domain pair: median per-node intra rate / per-node rate across,",
        "  every node sending at once (ref: the intra-domain reference, !: breached, .: not measured)",
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
                    texts.append(_REF)
                else:
                    mark = " !" if f"{c.a}/{c.b}" in breached else ""
                    texts.append(ratio(c.oversubscription) + mark)
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
            str(c.flows),
            rate(c.per_node_mbps),
            rate(c.aggregate_mbps),
            _REF if c.a == c.b else ratio(c.oversubscription),
            millis(c.idle_latency_p99_ms),
            millis(c.loaded_latency_p99_ms),
            figure(inflation(c), lambda v: f"{v:.1f}x"),
            figure(c.loss_percent, lambda v: f"{v:.2f}"),
        )
        for c in cells[:MAX_CELL_ROWS]
    ]
    header = ("PAIR", "FLOWS", "PER-NODE Mbit/s", "AGGREGATE", "OVERSUB", "IDLE p99 ms",
              "LOADED p99 ms", "INFLATION", "LOSS %")  # fmt: skip
    lines = [
        "  latency idle vs loaded (p99 round trip of the pairs' echoes before and during the load):"
    ]
    lines += _table(header, rows, indent="    ")
    more = len(cells) - MAX_CELL_ROWS
    if more > 0:
        lines.append(f"    ... {more} more pair(s) (netval report shows every one)")
    return lines


def _storage(run: LoadRun) -> list[str]:
    if not run.storage:
        return []
    rows = [
        (
            printable(s.endpoint, _NAME_WIDTH),
            str(s.nodes),
            rate(s.aggregate_m_bps),
            rate(s.per_node_m_bps_min),
            rate(s.per_node_m_bps_median),
            rate(s.single_node_m_bps),
            figure(s.fairness, lambda v: f"{v:.2f}"),
        )
        for s in run.storage
    ]
    header = ("ENDPOINT", "NODES", "AGGREGATE", "PER-NODE MIN", "MEDIAN", "SINGLE NODE",
              "FAIRNESS")  # fmt: skip
    lines = ["  storage, MB/s (every node reading at once; single node: one node alone):"]
    return lines + _table(header, rows, indent="    ")


def breach_line(expectation: str, subject: str, observed: float, expected: float) -> str:
    sign = ">=" if expectation.startswith("min") else "<="
    return (
        f"{printable(expectation, 32)} {printable(subject, 2 * _ROW_WIDTH + 1)}: "
        f"{figure(observed, lambda v: f'{v:g}')} (expected {sign} "
        f"{figure(expected, lambda v: f'{v:g}')})"
    )


def _run_lines(run: LoadRun, now: datetime) -> list[str]:
    finished = f", finished {when(run.finished_at, now)}" if run.finished_at else ", running"
    lines = [
        f"  last run {printable(run.id, _NAME_WIDTH)}: started {when(run.started_at, now)}"
        f"{finished}, {run.nodes} node(s), {run.skipped_count} skipped, "
        f"{run.refused_flows} flow(s) refused, max oversubscription "
        f"{ratio(run.max_oversubscription)}"
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


def loadtests_of(validation: str, objs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [o for o in objs if validation_of(o) == validation]


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
