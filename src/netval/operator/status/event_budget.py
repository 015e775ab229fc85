"""The rate cap on transition Events of one validation, and the summary when it bites (pure:
the caller passes the monotonic time).

A window opens with the first transition after the last one closed and lasts `window`
seconds. Within it at most `cap` transitions are posted; the rest are counted by reason and
said in ONE `EventsSuppressed` Event per window: at once, for the batch that first went past
the cap, and for anything suppressed after that, when the window has ended (it opens the
next window and is that one's summary). So a validation posts at most `cap + 1` Events per
window however many nodes change at once (a broker outage turns a whole fleet stale), and
every transition is either posted or counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from netval.model.status import EventReason
from netval.operator.status.transitions import Transition

EVENTS_PER_WINDOW: Final = 10
WINDOW_SECONDS: Final = 60.0

# the reasons a summary counts, in the order it names them
SUMMARISED_REASONS: Final = (
    EventReason.CHECK_FAILING,
    EventReason.CHECK_RECOVERED,
    EventReason.NODE_STALE,
)


@dataclass(slots=True)
class Budget:
    """One validation's window."""

    opened: float | None = None  # when the current window opened (monotonic seconds)
    posted: int = 0
    summarised: bool = False  # this window's summary is out
    pending: Counter[EventReason] = field(default_factory=Counter)  # suppressed, not yet said


@dataclass(frozen=True, slots=True)
class Summary:
    counts: tuple[tuple[EventReason, int], ...]
    cap: int
    window: float

    @property
    def total(self) -> int:
        return sum(n for _, n in self.counts)

    @property
    def message(self) -> str:
        parts = ", ".join(f"{n} {reason}" for reason, n in self.counts)
        return (
            f"{self.total} more transitions not posted as events (at most {self.cap} per"
            f" {self.window:g} s): {parts}; the status and `netval status --failing` have"
            " every node"
        )


@dataclass(frozen=True, slots=True)
class Admitted:
    post: list[Transition]
    summary: Summary | None
    suppressed: Counter[EventReason]  # counted in this call (for the metric)


def admit(
    budget: Budget,
    transitions: Iterable[Transition],
    now: float,
    *,
    cap: int = EVENTS_PER_WINDOW,
    window: float = WINDOW_SECONDS,
) -> Admitted:
    """Which of `transitions` to post now, in their order, and the summary to post after
    them, if this is the first time the window's cap bites."""
    batch = list(transitions)
    if not batch:
        return Admitted([], due(budget, now, cap=cap, window=window), Counter())
    _roll(budget, now, window)
    room = max(cap - budget.posted, 0)
    post, over = batch[:room], batch[room:]
    budget.posted += len(post)
    suppressed = Counter(t.reason for t in over)
    budget.pending.update(suppressed)
    summary = None
    if budget.pending and not budget.summarised:
        summary = _summarise(budget, cap, window)
    return Admitted(post, summary, suppressed)


def due(
    budget: Budget, now: float, *, cap: int = EVENTS_PER_WINDOW, window: float = WINDOW_SECONDS
) -> Summary | None:
    """The summary of transitions suppressed after the window's first summary, once that
    window has ended (called every status window, so it is said without a new transition)."""
    if not budget.pending or budget.opened is None or now - budget.opened < window:
        return None
    _roll(budget, now, window)
    return _summarise(budget, cap, window)


def _roll(budget: Budget, now: float, window: float) -> None:
    if budget.opened is None or now - budget.opened >= window:
        budget.opened = now
        budget.posted = 0
        budget.summarised = False  # `pending` stays: the new window's summary says it


def _summarise(budget: Budget, cap: int, window: float) -> Summary:
    counts = tuple((r, budget.pending[r]) for r in SUMMARISED_REASONS if budget.pending[r])
    budget.pending.clear()
    budget.summarised = True
    return Summary(counts, cap, window)
