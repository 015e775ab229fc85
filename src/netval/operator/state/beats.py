"""A node's beat folded into its validation's state (pure, in memory, like `validation`).

A beat says "the report whose digest is this is still what I measure" (`netval.model.beat`).
Matching the stored report's digest it counts as that report received again: freshness
(`reported_at`) and taint recovery (`ok_streak`, once per beat sequence number) move, nothing
is judged again, and the status is dirtied only when the node's freshness turns (it was stale
or offline). Not matching, it makes the stored report *unconfirmed*: the node is stale until its
next report, which the agent sends at least every `spec.report.fullEvery` cycles (the operator
asks for nothing: the broker connection is the agent's, and a reconnect already makes its next
cycle a full report). A beat older than the stored report (reordered) is ignored; a beat with no
stored report to match is kept (one per node, bounded) in case its report comes next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Final

from netval.model.beat import Beat
from netval.operator.state import nic_health
from netval.operator.state.validation import (
    NodeRecord,
    ValidationState,
    is_fresh,
    require_aware,
)

# beats remembered per validation for reports not held (yet); beyond, new ones are not kept
MAX_BEATS_AHEAD: Final = 100_000
# beyond any real streak (gating.recoveryReports is at most 100): the counter stays bounded
MAX_OK_STREAK: Final = 1 << 30


@dataclass(frozen=True, slots=True)
class BeatAhead:
    """A beat that vouched for a report the operator does not hold (yet): applied if that
    report arrives (a beat and its report reordered, or the replay gave the beat first)."""

    digest: str
    cycle_at: datetime
    at: datetime  # what it would set `reported_at` to
    seq: int


class BeatOutcome(StrEnum):
    MATCHED = "matched"  # the stored report holds: freshness refreshed
    MISMATCHED = "mismatched"  # the stored report is unconfirmed until the next one
    NO_REPORT = "no_report"  # no report stored for the node (yet)
    OUT_OF_ORDER = "out_of_order"  # older than the stored report: ignored
    PARKED = "parked"  # for a validation not known yet (netval.operator.state.store)


def ingest_beat(
    state: ValidationState, node: str, beat: Beat, now: datetime, *, retained: bool = False
) -> BeatOutcome:
    """Fold one validated beat of `node` in. ``retained``: replayed by the broker on
    subscribe; its time is then its own cycleAt (capped at now), as for a retained report."""
    require_aware(now)
    at = min(now, beat.cycle_at) if retained else now
    rec = state.nodes.get(node)
    ahead = rec is None or (beat.digest != rec.digest and beat.cycle_at > rec.started_at)
    if ahead and (node in state.beats_ahead or len(state.beats_ahead) < MAX_BEATS_AHEAD):
        state.beats_ahead[node] = BeatAhead(beat.digest, beat.cycle_at, at, beat.seq)
    if rec is None:
        return BeatOutcome.NO_REPORT
    if beat.cycle_at < rec.started_at:
        return BeatOutcome.OUT_OF_ORDER
    targeted = node in state.targeted
    was_fresh = is_fresh(state, node, now)
    if not retained and state.offline.pop(node, None) is not None and targeted:
        state.dirty = True  # a live beat: the agent is evidently running
    if beat.digest != rec.digest:
        if not rec.unconfirmed:
            rec.unconfirmed = True
            if was_fresh and targeted:
                state.dirty = True
        return BeatOutcome.MISMATCHED
    rec.unconfirmed = False
    if at > rec.reported_at:
        rec.reported_at = at
    if beat.seq > rec.beat_seq:
        rec.beat_seq = beat.seq
        if not rec.status.is_bad and rec.ok_streak < MAX_OK_STREAK:
            rec.ok_streak += 1
        if rec.tally < MAX_OK_STREAK:
            nic_health.count(rec)
    if targeted and not was_fresh and is_fresh(state, node, now):
        state.dirty = True
    return BeatOutcome.MATCHED


def apply_beat_ahead(state: ValidationState, rec: NodeRecord) -> None:
    """`rec` was just stored from a report: the beat that came before it for its node, if it
    vouches for this report, counts from its own time."""
    ahead = state.beats_ahead.pop(rec.node_name, None)
    if ahead is not None and ahead.digest == rec.digest and ahead.cycle_at >= rec.started_at:
        rec.reported_at = max(rec.reported_at, ahead.at)
        rec.beat_seq = ahead.seq


__all__ = ["MAX_BEATS_AHEAD", "BeatAhead", "BeatOutcome", "apply_beat_ahead", "ingest_beat"]
