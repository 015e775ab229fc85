"""Which failure transitions a status write carries (pure: no I/O, no clock).

`observe` reads every targeted node of a validation at the status write's `now`: fresh and
failing (which checks), fresh and passing, or stale (offline, or no report within 3
intervals). `diff` compares that with what the Events said so far (`Known`: the failing
nodes, fresh or gone stale while failing) and yields the transitions:

- a fresh node fails a check it did not fail: CheckFailing (node, check);
- a fresh node no longer fails a check it failed, before or before it went stale:
  CheckRecovered (node, check);
- a node that was failing goes stale: one NodeStale naming the checks it was failing, and
  no CheckRecovered: nobody judged it passing. Its checks are kept while it is stale, so
  its return is judged against them.

A node that passes and goes stale, never reported, or leaves the targeted set gives no
transition (Ready says the first two). The full node set is diffed, not the status's
failures list (capped at MAX_FAILURES): a failure past the cap is a transition too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from netval.model.ids import Status
from netval.model.status import MAX_FAILURES, EventReason, NetworkValidationStatus
from netval.operator.gating.verdict import Heard
from netval.operator.state.validation import ValidationState, heard

# check ids of one node, at most this many named in a NodeStale message
MAX_CHECKS_IN_MESSAGE: Final = 5


@dataclass(frozen=True, slots=True)
class Seen:
    """A targeted node at one status write."""

    failing: tuple[tuple[str, str], ...] = ()  # (check, first failure's message), by check
    stale: str | None = None  # why it is stale ("offline", "no report for 95s"), or None

    @property
    def checks(self) -> frozenset[str]:
        return frozenset(check for check, _ in self.failing)


PASSING: Final = Seen()


@dataclass(frozen=True, slots=True)
class Known:
    """A node the Events last said was failing these checks."""

    checks: frozenset[str]
    stale: bool = False  # it went stale since (a NodeStale was said)


@dataclass(frozen=True, slots=True)
class Transition:
    reason: EventReason
    node: str
    checks: tuple[str, ...]  # one check; NodeStale: every check it was failing
    detail: str = ""  # CheckFailing: the failure's message; NodeStale: why it is stale

    @property
    def type(self) -> str:
        return "Normal" if self.reason is EventReason.CHECK_RECOVERED else "Warning"

    @property
    def message(self) -> str:
        if self.reason is EventReason.CHECK_FAILING:
            return f"node {self.node} fails {self.checks[0]}: {self.detail}"
        if self.reason is EventReason.CHECK_RECOVERED:
            return f"node {self.node} passes {self.checks[0]} again"
        shown = ", ".join(self.checks[:MAX_CHECKS_IN_MESSAGE])
        more = len(self.checks) - MAX_CHECKS_IN_MESSAGE
        if more > 0:
            shown += f" and {more} more"
        return (
            f"node {self.node} is stale ({self.detail}) while failing {shown}: not judged"
            " until it reports again"
        )


# Posted in this order when the rate cap leaves room for only some: warnings first.
_ORDER: Final = {
    EventReason.CHECK_FAILING: 0,
    EventReason.NODE_STALE: 1,
    EventReason.CHECK_RECOVERED: 2,
}


def observe(state: ValidationState, now: datetime) -> dict[str, Seen]:
    """Every targeted node that has reported or is offline, as the status at `now` judges
    it: failing means what the status's failures list means (a fresh node whose status is
    fail or error, with its fail/error results), so Events and status agree."""
    seen: dict[str, Seen] = {}
    for node in state.targeted:
        rec = state.nodes.get(node)
        if rec is None:
            continue  # awaiting or never reported: nothing was said about it
        how = heard(state, node, now)
        if how is Heard.OFFLINE:
            seen[node] = Seen(stale="offline")
        elif rec.unconfirmed:
            seen[node] = Seen(stale="a beat contradicts its last report")
        elif how is Heard.SILENT:
            age = now - rec.reported_at
            seen[node] = Seen(stale=f"no report for {int(age.total_seconds())}s")
        elif rec.status.severity >= Status.FAIL.severity and rec.failures:
            first: dict[str, str] = {}
            for _, _, check, _, message in rec.failures:
                first.setdefault(check, message)
            seen[node] = Seen(failing=tuple(sorted(first.items())))
        else:
            seen[node] = PASSING
    return seen


def seed(previous: NetworkValidationStatus | None, seen: Mapping[str, Seen]) -> dict[str, Known]:
    """What a new operator term takes as already said: the failures of the status written
    before (an earlier term posted their Events). When that list was full it may have left
    failures out, so every failure seen now counts as said too: re-posting a failing fleet
    after each failover would only flood the Events, and the status lists them."""
    if previous is None:
        return {}
    checks: dict[str, set[str]] = {}
    for f in previous.failures:
        checks.setdefault(f.node, set()).add(f.check)
    if len(previous.failures) >= MAX_FAILURES:
        for node, now in seen.items():
            if now.failing:
                checks.setdefault(node, set()).update(now.checks)
    return {node: Known(frozenset(c)) for node, c in checks.items()}


def diff(
    known: Mapping[str, Known], seen: Mapping[str, Seen]
) -> tuple[list[Transition], dict[str, Known]]:
    """The transitions from `known` to `seen`, and what is known after them."""
    out: list[Transition] = []
    after: dict[str, Known] = {}
    for node, now in seen.items():
        if not now.failing:
            continue
        before = known.get(node)
        checks = now.checks
        old = before.checks if before is not None else frozenset()
        out += [
            Transition(EventReason.CHECK_FAILING, node, (check,), message)
            for check, message in now.failing
            if check not in old
        ]
        out += [Transition(EventReason.CHECK_RECOVERED, node, (check,)) for check in old - checks]
        after[node] = Known(checks)
    for node, before in known.items():
        now_seen = seen.get(node)
        if now_seen is None or now_seen.failing:
            continue  # no longer targeted or forgotten: nothing to say; failing: done above
        if now_seen.stale is not None:
            if not before.stale:
                out.append(
                    Transition(
                        EventReason.NODE_STALE, node, tuple(sorted(before.checks)), now_seen.stale
                    )
                )
            after[node] = Known(before.checks, stale=True)
        else:
            out += [
                Transition(EventReason.CHECK_RECOVERED, node, (check,)) for check in before.checks
            ]
    out.sort(key=lambda t: (_ORDER[t.reason], t.node, t.checks))
    return out, after
