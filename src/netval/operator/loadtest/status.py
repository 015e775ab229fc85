"""The NetworkLoadTest status for each point of its life. Pure: the handlers write what
these return (`NetworkLoadTestStatus.to_patch()`).

- Pending: never run yet (waiting for its schedule, or for another run on its validation).
- Running: a run is under way; `lastRun` is that run (id, start, participants so far) and
  the run before it has moved to `history`.
- Succeeded / Failed / Inconclusive: the last run finished (`verdict`); Failed when it
  counted too little (InsufficientData), breached an expectation or left a planned cell
  unmeasured (ExpectationsBreached), was aborted (Aborted), or could not run at all
  (InvalidSpec, ValidationNotFound, NoParticipants); Inconclusive when the hosts, not the
  fabric, limited the reference flows (SenderLimited cells). A scheduled test keeps the
  last run's phase between runs and says when it runs next (`nextRunAt`).

Conditions follow metav1.Condition; a condition keeps its lastTransitionTime while its status
does not change. `history` is newest first and never longer than `historyLimit`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from netval.model.loadtest import (
    CellReason,
    LoadCondition,
    LoadConditionType,
    LoadReason,
    LoadRun,
    NetworkLoadTestStatus,
    RunPhase,
    RunSummary,
)
from netval.operator.loadtest.validate import SpecProblem

_Truth = Literal["True", "False", "Unknown"]
_FINISHED = (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.INCONCLUSIVE)


def _condition(
    kind: LoadConditionType,
    status: _Truth,
    reason: LoadReason,
    message: str,
    *,
    generation: int,
    now: datetime,
    previous: NetworkLoadTestStatus | None,
) -> LoadCondition:
    before = previous.condition(kind) if previous is not None else None
    since = before.last_transition_time if before is not None and before.status == status else now
    return LoadCondition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def _status(
    phase: RunPhase,
    complete: tuple[_Truth, LoadReason, str],
    passed: tuple[_Truth, LoadReason, str],
    *,
    generation: int,
    now: datetime,
    previous: NetworkLoadTestStatus | None,
    last_run: LoadRun | None,
    history: list[RunSummary],
    next_run_at: datetime | None = None,
) -> NetworkLoadTestStatus:
    return NetworkLoadTestStatus(
        observed_generation=generation,
        phase=phase,
        conditions=[
            _condition(
                LoadConditionType.COMPLETE,
                *complete,
                generation=generation,
                now=now,
                previous=previous,
            ),
            _condition(
                LoadConditionType.PASSED,
                *passed,
                generation=generation,
                now=now,
                previous=previous,
            ),
        ],
        last_run=last_run,
        history=history,
        next_run_at=next_run_at,
    )


def summary(run: LoadRun, phase: RunPhase, reason: LoadReason) -> RunSummary:
    floors = [s.per_node_m_bps_min for s in run.storage if s.per_node_m_bps_min is not None]
    return RunSummary(
        id=run.id,
        started_at=run.started_at,
        finished_at=run.finished_at,
        phase=phase,
        reason=reason,
        nodes=run.nodes,
        max_oversubscription=run.max_oversubscription,
        min_storage_m_bps_per_node=min(floors) if floors else None,
        breaches=len(run.breaches),
    )


def _history(previous: NetworkLoadTestStatus | None, limit: int) -> list[RunSummary]:
    return list(previous.history[:limit]) if previous is not None else []


def could_not_run(
    problem: SpecProblem,
    *,
    generation: int,
    now: datetime,
    previous: NetworkLoadTestStatus | None,
    history_limit: int,
) -> NetworkLoadTestStatus:
    """InvalidSpec, ValidationNotFound, NoParticipants: Failed, saying which field."""
    verdict: tuple[_Truth, LoadReason, str] = ("False", problem.reason, problem.message)
    return _status(
        RunPhase.FAILED,
        ("True", problem.reason, problem.message),
        verdict,
        generation=generation,
        now=now,
        previous=previous,
        last_run=previous.last_run if previous is not None else None,
        history=_history(previous, history_limit),
    )


def waiting(
    message: str,
    *,
    generation: int,
    now: datetime,
    previous: NetworkLoadTestStatus | None,
    history_limit: int,
    next_run_at: datetime | None = None,
) -> NetworkLoadTestStatus:
    """Before the first run: Pending. Between scheduled runs: the last run's verdict stays."""
    if previous is not None and previous.last_run is not None and previous.phase in _FINISHED:
        return previous.model_copy(
            update={
                "observed_generation": generation,
                "next_run_at": next_run_at,
                "history": _history(previous, history_limit),
            }
        )
    state: tuple[_Truth, LoadReason, str] = ("False", LoadReason.WAITING, message)
    return _status(
        RunPhase.PENDING,
        state,
        ("Unknown", LoadReason.WAITING, message),
        generation=generation,
        now=now,
        previous=previous,
        last_run=None,
        history=_history(previous, history_limit),
        next_run_at=next_run_at,
    )


def running(
    run: LoadRun,
    *,
    generation: int,
    now: datetime,
    previous: NetworkLoadTestStatus | None,
    history_limit: int,
) -> NetworkLoadTestStatus:
    """A run started: the previous run (if it finished) moves into the history."""
    history = _history(previous, history_limit)
    if previous is not None and previous.last_run is not None and previous.last_run.id != run.id:
        # The verdict's reason (ExpectationsBreached, Aborted...) is what a history row
        # explains; Complete's is only RunFinished for every run that ran.
        verdict = previous.condition(LoadConditionType.PASSED) or previous.condition(
            LoadConditionType.COMPLETE
        )
        if previous.phase in _FINISHED and verdict is not None:
            history = [summary(previous.last_run, previous.phase, verdict.reason), *history]
    message = f"run {run.id}: {run.nodes} node(s)"
    return _status(
        RunPhase.RUNNING,
        ("False", LoadReason.RUNNING, message),
        ("Unknown", LoadReason.RUNNING, message),
        generation=generation,
        now=now,
        previous=previous,
        last_run=run,
        history=history[:history_limit],
    )


def verdict(run: LoadRun, min_coverage_percent: float) -> tuple[RunPhase, _Truth, LoadReason, str]:
    """A finished run's phase and Passed condition, in this order: too little counted
    (Failed, InsufficientData), a breach (Failed, ExpectationsBreached: a NotMeasured cell
    or endpoint is one), sender-limited cells (Inconclusive: the hosts, not the fabric,
    limited the reference), else Succeeded (ExpectationsMet)."""
    coverage = run.coverage_percent
    if not run.counted_flows or (coverage is not None and coverage < min_coverage_percent):
        text = (
            f"run {run.id} counted {run.counted_flows} of {run.planned_flows} planned flows "
            f"and reads ({coverage or 0:g} %, at least {min_coverage_percent:g} % needed; "
            f"{run.nodes} node(s) reported)"
        )
        return RunPhase.FAILED, "False", LoadReason.INSUFFICIENT_DATA, text
    if run.breaches:
        worst = run.breaches[0]
        text = (
            f"{len(run.breaches)} breach(es); worst: {worst.expectation} {worst.subject} "
            f"observed {worst.observed:g}, expected {worst.expected:g}"
        )
        return RunPhase.FAILED, "False", LoadReason.EXPECTATIONS_BREACHED, text
    limited = [
        c
        for c in (run.east_west.cells if run.east_west is not None else [])
        if c.reason is CellReason.SENDER_LIMITED
    ]
    if limited:
        first = limited[0]
        where = f"{first.a}/{first.b}" + (f" rail {first.rail}" if first.rail else "")
        text = (
            f"{len(limited)} cell(s) sender-limited: the hosts, not the fabric, limited the "
            f"flows; {where}: {first.note}"
        )
        return RunPhase.INCONCLUSIVE, "Unknown", LoadReason.INCONCLUSIVE, text
    text = f"run {run.id}: every expectation met ({run.nodes} node(s))"
    return RunPhase.SUCCEEDED, "True", LoadReason.EXPECTATIONS_MET, text


def finished(
    run: LoadRun,
    *,
    generation: int,
    now: datetime,
    previous: NetworkLoadTestStatus | None,
    history_limit: int,
    next_run_at: datetime | None = None,
    min_coverage_percent: float = 80.0,
) -> NetworkLoadTestStatus:
    """A run ended: its `verdict`."""
    phase, truth, reason, text = verdict(run, min_coverage_percent)
    passed: tuple[_Truth, LoadReason, str] = (truth, reason, text)
    return _status(
        phase,
        ("True", LoadReason.RUN_FINISHED, f"run {run.id} finished"),
        passed,
        generation=generation,
        now=now,
        previous=previous,
        last_run=run,
        history=_history(previous, history_limit),
        next_run_at=next_run_at,
    )


def aborted(
    message: str,
    *,
    generation: int,
    now: datetime,
    previous: NetworkLoadTestStatus | None,
    history_limit: int,
) -> NetworkLoadTestStatus:
    """The run was stopped (its validation deleted, the operator lost the lead, ...)."""
    last = previous.last_run if previous is not None else None
    if last is not None and last.finished_at is None:
        last = last.model_copy(update={"finished_at": now})
    return _status(
        RunPhase.FAILED,
        ("True", LoadReason.ABORTED, message),
        ("False", LoadReason.ABORTED, message),
        generation=generation,
        now=now,
        previous=previous,
        last_run=last,
        history=_history(previous, history_limit),
    )
