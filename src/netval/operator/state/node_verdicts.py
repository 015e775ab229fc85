"""Verdicts the operator judges across nodes (fleet.consistency, topology.agreement, the
east-west blame of requester-side retries), folded into a node's record on top of what its
own report said.

A record keeps its report's values (`own`) and one entry per operator check (`folded`);
`fold_verdict` recomputes the record from both, so each check's fold is idempotent and never
undoes another's. Pure functions of the record (and, for the fleet, of the validation state).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Final

from netval.model.ids import CheckId, Status, worst
from netval.operator.consistency.fold import NodeVerdict
from netval.operator.consistency.fold import refresh as fleet_refresh

if TYPE_CHECKING:
    from netval.operator.state.validation import FailureKey, NodeRecord, ValidationState

MAX_FAILURE_MESSAGE: Final = 256

# Index of a status in a node's per-check bucket: pass, warn, fail (error counts as fail).
CHECK_BUCKET: Final[dict[Status, int]] = {
    Status.PASS: 0,
    Status.WARN: 1,
    Status.FAIL: 2,
    Status.ERROR: 2,
}

# A node's (check id, bucket) tuple is the same on nearly every node of a fleet (the same
# checks, passing): one shared copy instead of ~20 small tuples a node (130 MiB at 100,000
# nodes, bench/state_memory.py). Bounded: past the cap a tuple is kept as it came.
MAX_SHARED_BUCKETS: Final = 4096
_SHARED_BUCKETS: dict[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]] = {}


def shared_buckets(buckets: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """An equal tuple, the one other nodes hold if any (tuples are immutable: sharing is
    invisible to every reader)."""
    known = _SHARED_BUCKETS.get(buckets)
    if known is not None:
        return known
    if len(_SHARED_BUCKETS) < MAX_SHARED_BUCKETS:
        _SHARED_BUCKETS[buckets] = buckets
    return buckets


def truncate_failure(message: str) -> str:
    if len(message) <= MAX_FAILURE_MESSAGE:
        return message
    return message[: MAX_FAILURE_MESSAGE - 1] + "\u2026"


def fold_verdict(
    rec: NodeRecord, check: str, status: Status | None, failures: tuple[FailureKey, ...]
) -> bool:
    """Set the operator's verdict `check` on `rec` (None and no failures: remove it) and
    recompute the record from its own values plus every folded verdict; True on a change."""
    if rec.own is None:
        rec.own = (rec.status, rec.check_buckets, rec.failures, rec.failing_checks)
    if status is None and not failures:
        if rec.folded.pop(check, None) is None:
            return False
    elif rec.folded.get(check) == (status, failures):
        return False
    else:
        rec.folded[check] = (status, failures)
    own_status, buckets, own_failures, failing = rec.own
    # one bucket per check id: a verdict about a check the report has too (the east-west
    # blame of rdma.errors) takes the worse of the two
    all_buckets = dict(buckets)
    all_failures = list(own_failures)
    failing_checks = set(failing)
    for folded_check, (folded_status, folded_failures) in rec.folded.items():
        bucket = CHECK_BUCKET.get(folded_status) if folded_status is not None else None
        if bucket is not None and folded_status is not None:
            own_status = worst((own_status, folded_status))
            all_buckets[folded_check] = max(bucket, all_buckets.get(folded_check, -1))
        if folded_failures:
            all_failures.extend(folded_failures)
            failing_checks.add(folded_check)
    rec.status = own_status
    rec.check_buckets = shared_buckets(tuple(all_buckets.items()))
    rec.failures = tuple(sorted(all_failures))
    rec.failing_checks = tuple(sorted(failing_checks))
    return True


def apply_fleet_verdict(
    rec: NodeRecord,
    node: str,
    verdict: NodeVerdict | None,
    old_since: dict[tuple[str, str], datetime],
    now: datetime,
) -> None:
    """Fold a fleet.consistency verdict into the record as if the report had carried it."""
    check = CheckId.FLEET_CONSISTENCY.value
    since = {k: v for k, v in rec.failing_since.items() if k[0] != check}
    failures: list[FailureKey] = []
    status: Status | None = None
    if verdict is not None:
        status = verdict.status
        for key, message in verdict.failing:
            first = since[(check, key)] = old_since.get((check, key), now)
            failures.append((first, node, check, key, truncate_failure(message)))
    fold_verdict(rec, check, status, tuple(sorted(failures)))
    if rec.status.is_bad:
        rec.ok_streak = 0  # taint recovery counts reports without this failing verdict too
    rec.failing_since = since


def settle_fleet(state: ValidationState, now: datetime) -> None:
    """Re-judge the cohorts whose fingerprints or members changed since the last read (all
    of them once a rollout's `until` passed). Every reader of node health calls it first, so
    a burst of changes (10,000 first reports) costs one judgement per cohort, not one each."""
    for node, verdict in fleet_refresh(state.fleet, state.targeted, now).items():
        set_fleet_verdict(state, node, verdict, now)


def set_fleet_verdict(
    state: ValidationState, node: str, verdict: NodeVerdict | None, now: datetime
) -> None:
    """The node's fleet.consistency verdict changed (its cohort was re-judged); None: no
    verdict (the node left its cohort or the validation)."""
    if verdict is None:
        if state.fleet_verdicts.pop(node, None) is None:
            return
    elif state.fleet_verdicts.get(node) == verdict:
        return
    else:
        state.fleet_verdicts[node] = verdict
    rec = state.nodes.get(node)
    if rec is not None:
        apply_fleet_verdict(rec, node, verdict, rec.failing_since, now)
        if node in state.targeted:
            state.dirty = True


# The east-west blame: a node's warning of requester-side retries (`state.retries`) counts as
# a failure of rdma.errors when the east-west results point at the node too (it is a suspect
# of `status.eastWest`): its own requests time out and its peers' requests to it fail.
BLAME: Final = CheckId.RDMA_ERRORS.value


def _blame_failure(rec: NodeRecord, node: str, detail: str) -> tuple[FailureKey, ...]:
    retries = rec.retries
    assert retries is not None
    counters = ", ".join(retries.counters) or "retry counters"
    message = (
        f"requester-side retries ({counters}) and the east-west results point at this node"
        f" ({detail}): counted as a failure"
    )
    return ((retries.since, node, BLAME, retries.subject, truncate_failure(message)),)


def set_blame(rec: NodeRecord, node: str, detail: str | None) -> bool:
    """Blame the node (`detail`: what the east-west results say) or lift the blame (None);
    True on a change. A blamed node's recovery streak starts over, as for any failure."""
    if detail is None or rec.retries is None:
        return fold_verdict(rec, BLAME, None, ())
    changed = fold_verdict(rec, BLAME, Status.FAIL, _blame_failure(rec, node, detail))
    rec.ok_streak = 0
    return changed


def is_blamed(rec: NodeRecord) -> bool:
    return BLAME in rec.folded


def carry_blame(rec: NodeRecord, previous: NodeRecord | None) -> None:
    """A new report of a blamed node that still warns of retries stays blamed until the next
    judgement (the status window), so its health does not flicker in between."""
    if previous is None or rec.retries is None:
        return
    folded = previous.folded.get(BLAME)
    if folded is not None and folded[1]:
        fold_verdict(rec, BLAME, Status.FAIL, folded[1])


def apply_blame(state: ValidationState, suspects: Mapping[str, str], now: datetime) -> None:
    """Fold the blame into the fresh targeted nodes that warn of retries and that the
    east-west results name as suspects (`suspects`: node -> what they say); lift it from
    every other node."""
    from netval.operator.state.validation import is_fresh  # it imports this module

    for node, rec in state.nodes.items():
        detail = suspects.get(node)
        if detail is not None and not (node in state.targeted and is_fresh(state, node, now)):
            detail = None
        if detail is None and not is_blamed(rec):
            continue
        if set_blame(rec, node, detail) and node in state.targeted:
            state.dirty = True
