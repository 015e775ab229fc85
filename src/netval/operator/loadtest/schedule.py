"""When a NetworkLoadTest runs, and which run may start. Pure: the coordinator
(`netval.operator.loadtest.runner`) asks these with its clock and acts on the answers.

- `next_fire`: the next time a 5-field cron schedule (UTC) fires after a time.
- `due_at`: when a test should run next: a one-shot test (no schedule) once, as soon as
  possible, and never again once it has a run; a scheduled test at its next cron time after
  the last run started (or after it was first seen).
- `pick_starts`: at most one run per validation at a time; of the tests due on a free
  validation the one due longest ago starts, the others wait (reason `Waiting`).
- `run_over`: a run ends at its last stage's deadline plus a grace for the results in
  flight, or as soon as every node has answered for every stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

RESULT_GRACE_SECONDS: Final = 5.0  # after the last deadline: results still in flight
_SEARCH_DAYS: Final = 366 * 5  # 29 February on a given weekday can be years away


def _expand(text: str, lo: int, hi: int) -> frozenset[int]:
    out: set[int] = set()
    for item in text.split(","):
        body, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if body == "*":
            first, last = lo, hi
        else:
            first_text, _, last_text = body.partition("-")
            first = int(first_text)
            last = int(last_text) if last_text else (hi if step_text else first)
        out.update(range(first, last + 1, step))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday (7 folded into 0)
    any_day: bool  # day-of-month is `*`
    any_weekday: bool  # day-of-week is `*`

    @classmethod
    def parse(cls, schedule: str) -> Cron:
        """A schedule `check_cron` accepted (ValueError otherwise)."""
        fields = schedule.split()
        if len(fields) != 5:
            raise ValueError(f"schedule {schedule!r} must have 5 fields")
        minute, hour, dom, month, dow = fields
        weekdays = frozenset(d % 7 for d in _expand(dow, 0, 7))
        return cls(
            minutes=_expand(minute, 0, 59),
            hours=_expand(hour, 0, 23),
            days=_expand(dom, 1, 31),
            months=_expand(month, 1, 12),
            weekdays=weekdays,
            any_day=dom == "*",
            any_weekday=dow == "*",
        )

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            # cron: a restricted field alone decides (`*` in the other matches every day)
            return dom and dow
        return dom or dow  # both restricted: either matches (Vixie cron)


def next_fire(schedule: str, after: datetime) -> datetime | None:
    """The first minute strictly after `after` (UTC) at which `schedule` fires; None if it
    never does within five years (e.g. 31 February)."""
    cron = Cron.parse(schedule)
    start = after.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    day = start.replace(hour=0, minute=0)
    hours = sorted(cron.hours)
    minutes = sorted(cron.minutes)
    for _ in range(_SEARCH_DAYS):
        if cron._day_matches(day):
            for h in hours:
                for m in minutes:
                    at = day.replace(hour=h, minute=m)
                    if at >= start:
                        return at
        day += timedelta(days=1)
    return None


def due_at(
    schedule: str, *, has_run: bool, last_start: datetime | None, seen_at: datetime
) -> datetime | None:
    """When the test should run next; None: never again (a one-shot test that ran)."""
    if not schedule:
        return None if has_run else seen_at
    return next_fire(schedule, last_start or seen_at)


@dataclass(frozen=True, slots=True)
class Due:
    test: str
    validation: str
    at: datetime


def pick_starts(
    due: Iterable[Due], busy: Mapping[str, str], now: datetime
) -> tuple[list[Due], dict[str, str]]:
    """The runs to start now (at most one per validation, none on a validation whose run is
    under way: `busy` validation -> test) and the tests that wait (test -> the test that
    holds their validation)."""
    holder = dict(busy)
    starts: list[Due] = []
    waiting: dict[str, str] = {}
    for d in sorted(due, key=lambda d: (d.at, d.test)):
        if d.at > now:
            continue
        other = holder.get(d.validation)
        if other is not None and other != d.test:
            waiting[d.test] = other
        elif other is None:
            holder[d.validation] = d.test
            starts.append(d)
    return starts, waiting


def run_over(now: datetime, finished_by: datetime, *, all_published: bool, unanswered: int) -> bool:
    """Every stage's results are in, or the last deadline and the grace have passed."""
    if all_published and unanswered == 0:
        return True
    return now >= finished_by + timedelta(seconds=RESULT_GRACE_SECONDS)
