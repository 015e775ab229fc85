"""Reading a NetworkLoadTest for people, shared by the text views (`loadtest_view`) and the
HTML report (`report_html_loadtest`): the status parsed, figures formatted to a bounded width
whatever their size (`figure`), times relative to now, domain pairs looked up both ways.

The status comes from the API: a value may be huge, negative or (from a hand-written object)
not finite; none of these functions raises on one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from netval.cli.status_view import printable
from netval.model.loadtest import (
    CellReason,
    LoadCell,
    LoadConditionType,
    LoadRun,
    NetworkLoadTestStatus,
    RunPhase,
)

_ROW_WIDTH: Final = 24  # a domain name in a breach subject


def figure(value: float | None, fmt: Callable[[float], str] = lambda v: f"{v:.1f}") -> str:
    """`value` by `fmt` while it is an ordinary size, else in at most 9 characters."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "?"
    if not -1e6 < value < 1e9:
        return f"{value:.2e}".replace("e+", "e")
    return fmt(value)


def count(value: int) -> str:
    """A count of flows or readers in at most 7 characters."""
    return str(value) if 0 <= value < 10**6 else f"{value:.1e}".replace("e+", "e")


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
    """Failed, or Inconclusive (not passed either: the hosts limited what it measured)."""
    status, problem = parse_loadtest(obj)
    return problem is not None or (
        status is not None and status.phase in (RunPhase.FAILED, RunPhase.INCONCLUSIVE)
    )


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


def domains_of(cells: Iterable[LoadCell]) -> list[str]:
    return sorted({c.a for c in cells} | {c.b for c in cells})


def _notable(c: LoadCell) -> tuple[int, float]:
    """How much a cell says about its pair: nothing measured, then host-limited, then the
    most oversubscribed (a partial figure after a full one)."""
    order = {CellReason.NOT_MEASURED: 0, CellReason.SENDER_LIMITED: 1, None: 2,
             CellReason.PARTIAL: 3}  # fmt: skip
    over = c.oversubscription if c.oversubscription is not None else 0.0
    return order[c.reason], -over if math.isfinite(over) else 0.0


def cell_map(cells: Iterable[LoadCell]) -> dict[tuple[str, str], LoadCell]:
    """Both orders of each unordered pair; of its rail planes the most notable (`_notable`)."""
    out: dict[tuple[str, str], LoadCell] = {}
    for c in cells:
        for key in ((c.a, c.b), (c.b, c.a)):
            have = out.get(key)
            if have is None or _notable(c) < _notable(have):
                out[key] = c
    return out


REASON_MARK: Final = {
    CellReason.SENDER_LIMITED: "sender-lim",
    CellReason.NOT_MEASURED: "not-meas",
    CellReason.PARTIAL: "~",
}


def cell_text(c: LoadCell) -> str:
    """A cross cell's oversubscription as a matrix shows it: its reason when it has no ratio,
    "~" before a partial one (a lower bound, kept out of the maximum)."""
    if c.reason is CellReason.PARTIAL:
        return "~" + ratio(c.oversubscription)
    if c.reason is not None:
        return REASON_MARK[c.reason]
    return ratio(c.oversubscription)


def pair_name(c: LoadCell) -> str:
    base = f"{c.a}/{c.b}"
    return base if c.rail == 0 else f"{base} rail {c.rail}"


def breached_subjects(run: LoadRun) -> set[str]:
    return {b.subject for b in run.breaches}


def breach_line(expectation: str, subject: str, observed: float, expected: float) -> str:
    sign = ">=" if expectation.startswith("min") else "<="
    return (
        f"{printable(expectation, 32)} {printable(subject, 2 * _ROW_WIDTH + 1)}: "
        f"{figure(observed, lambda v: f'{v:g}')} (expected {sign} "
        f"{figure(expected, lambda v: f'{v:g}')})"
    )


def loadtests_of(validation: str, objs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [o for o in objs if validation_of(o) == validation]
