"""Retained `LoadAbort`s and how long they stay (the load-test coordinator's).

An aborted run's plan topics carry a `LoadAbort` instead of a plan: an agent that is
running the plan stops, and one that (re)connects reads the abort rather than the plan. Kept
until the last plan published could still run (its deadline; at least `ABORT_HOLD_SECONDS`),
then cleared. A run lost to a restart or failover (the new term knows its id, not its
participants) gets an abort on every node its validation targets, as the new term learns
them (at start-up the nodes come after the tests), kept for `MAX_PLAN_SECONDS`: no plan of
it can run longer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Final

from netval.model.loadplan import MAX_PLAN_SECONDS, LoadAbort, encode
from netval.model.topics import TopicKind, check_topic_level, topic

ABORT_HOLD_SECONDS: Final = 5.0  # a LoadAbort stays retained at least this long

RetainedSink = Callable[[str, Mapping[str, bytes]], None]  # (group, topic -> payload)


class RetainedAborts:
    def __init__(self, set_retained: RetainedSink, term: int = 0) -> None:
        self.set_retained = set_retained
        self.term = term  # the leader's term, on every abort (agents fence plans by it)
        self._until: dict[str, datetime] = {}  # retained group -> when it is cleared
        # runs of an earlier term: group -> (validation, the LoadAbort, nodes it went to)
        self._lost: dict[str, tuple[str, bytes, set[str]]] = {}

    def abort(
        self, group: str, run_id: str, topics: Iterable[str], message: str, *,
        last_deadline: datetime, now: datetime,
    ) -> None:  # fmt: skip
        """Replace a run's plans (`topics`) with a LoadAbort."""
        payload = encode(LoadAbort(term=self.term, run=run_id, reason=message[:256]))
        self.set_retained(group, {name: payload for name in topics})
        self._until[group] = max(last_deadline, now + timedelta(seconds=ABORT_HOLD_SECONDS))

    def lost(self, validation: str, run_id: str, message: str, now: datetime) -> None:
        """A run of an earlier term: aborted on the validation's nodes (`refresh`)."""
        try:
            check_topic_level(validation)
            payload = encode(LoadAbort(term=self.term, run=run_id, reason=message[:256]))
        except ValueError:
            return  # no such topic can carry a plan (a hand-edited status)
        group = f"abort:{validation}:{run_id}"
        self._lost[group] = (validation, payload, set())
        self._until[group] = now + timedelta(seconds=MAX_PLAN_SECONDS)

    def refresh(self, targeted: Callable[[str], set[str]], now: datetime) -> None:
        """Lost runs' aborts to the nodes learnt since; expired groups cleared."""
        for group, (validation, payload, sent) in self._lost.items():
            nodes = targeted(validation)
            if nodes - sent:
                sent |= nodes
                self.set_retained(group, {
                    topic(validation, n, TopicKind.LOAD_PLAN): payload for n in sorted(sent)
                })  # fmt: skip
        for group, until in list(self._until.items()):
            if now >= until:
                del self._until[group]
                self._lost.pop(group, None)
                self.set_retained(group, {})

    def forget(self, group: str) -> None:
        """A new run took the group: its retained messages are the run's now."""
        self._until.pop(group, None)
