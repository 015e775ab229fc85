"""This node's load plans off MQTT: decode, validate, dedupe. Pure (the clock is passed in).

Every payload is untrusted. A plan is run only if it decodes (`netval.model.loadplan`:
bounded, extra fields refused), speaks for this validation and node, its deadline has not
passed, its (run, stage) was not taken before (the plan is retained, so a reconnect
delivers it again and it must not run twice), and its leader's term is not older than the
newest term seen in a plan or abort: a paused old leader's plan that lands after the new
leader's abort is dropped. The newest term is forgotten after `TERM_MEMORY_SECONDS`
without a message of it (an operator clock set back, or a recreated Lease, must not lock
this agent out for longer than a plan can live). A `LoadAbort` (of any term: stopping is
always safe) or an empty payload (the operator cleared the retained plan) stops what runs.
Everything refused is counted by reason, never raised.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Final

from netval.model.loadplan import MAX_PLAN_SECONDS, LoadAbort, LoadPlan, decode_plan

MAX_REMEMBERED: Final = 1024  # (run, stage) pairs taken; a run has at most a few hundred
TERM_MEMORY_SECONDS: Final = MAX_PLAN_SECONDS


class Refusal(StrEnum):
    INVALID = "invalid"  # does not decode or validate
    NOT_MINE = "not_mine"  # another validation or node
    EXPIRED = "expired"  # its deadline has passed
    REPEATED = "repeated"  # (run, stage) already taken
    OLD_TERM = "old_term"  # issued by an older leader than one already heard


@dataclass(frozen=True, slots=True)
class Run:
    plan: LoadPlan


@dataclass(frozen=True, slots=True)
class Stop:
    run: str | None  # None: everything (the retained plan was cleared)
    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    reason: Refusal
    detail: str


Decision = Run | Stop | Refused


class PlanIntake:
    def __init__(self, validation: str, node: str) -> None:
        self.validation = validation
        self.node = node
        self.refused: Counter[Refusal] = Counter()
        self._taken: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.term = 0  # the newest leader term seen
        self._term_at: datetime | None = None  # when a message of it last came

    def decide(self, payload: bytes, now: datetime) -> Decision:
        """What to do with one message on this node's loadplan topic; never raises."""
        if not payload:
            return Stop(None, "the retained plan was cleared")
        try:
            message = decode_plan(payload)
        except ValueError as exc:
            return self._refuse(Refusal.INVALID, str(exc)[:300])
        if isinstance(message, LoadAbort):
            self._heard(message.term, now)
            return Stop(message.run, message.reason or "aborted by the operator")
        if message.validation != self.validation or message.node != self.node:
            return self._refuse(
                Refusal.NOT_MINE, f"plan for {message.validation}/{message.node}"[:300]
            )
        if message.term < self.term and not self._forgotten(now):
            return self._refuse(
                Refusal.OLD_TERM,
                f"{message.run} stage {message.stage} of term {message.term} (seen {self.term})",
            )
        self._heard(message.term, now)
        key = (message.run, message.stage)
        if key in self._taken:
            return self._refuse(Refusal.REPEATED, f"{message.run} stage {message.stage}")
        if message.deadline <= now:
            self._remember(key)
            return self._refuse(Refusal.EXPIRED, f"{message.run} stage {message.stage}")
        self._remember(key)
        return Run(message)

    def _forgotten(self, now: datetime) -> bool:
        at = self._term_at
        return at is None or (now - at).total_seconds() > TERM_MEMORY_SECONDS

    def _heard(self, term: int, now: datetime) -> None:
        if term >= self.term or self._forgotten(now):
            self.term = term
            self._term_at = now

    def _remember(self, key: tuple[str, int]) -> None:
        self._taken[key] = None
        while len(self._taken) > MAX_REMEMBERED:
            self._taken.popitem(last=False)

    def _refuse(self, reason: Refusal, detail: str) -> Refused:
        self.refused[reason] += 1
        return Refused(reason, detail)
