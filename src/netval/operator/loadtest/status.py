"""The NetworkLoadTest status for each point of its life. Pure: the handlers write what
these return (`NetworkLoadTestStatus.to_patch()`).

- Pending: never run yet (waiting for its schedule, or for another run on its validation).
- Running: a run is under way; `lastRun` is that run (id, start, participants so far) and
  the run before it has moved to `history`.
- Succeeded / Failed: the last run finished; Failed when it breached an expectation
  (ExpectationsBreached), was aborted (Aborted), or could not run at all (InvalidSpec,
  ValidationNotFound, NoParticipants). A scheduled test keeps the last run's phase between
  runs and says when it runs next (`nextRunAt`).

Conditions follow metav1.Condition; a condition keeps its lastTransitionTime while its status
does not change. `history` is newest first and never longer than `historyLimit`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from netval.model.loadtest import (
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
    if (
        previous is not None
        and previous.last_run is not None
        and previous.phase
        in (
            RunPhase.SUCCEEDED,
            RunPhase.FAILED,
        )
    ):
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
        if previous.phase in (RunPhase.SUCCEEDED, RunPhase.FAILED) and verdict is not None:
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


def finished(
    run: LoadRun,
    *,
    generation: int,
    now: datetime,
    previous: NetworkLoadTestStatus | None,
    history_limit: int,
    next_run_at: datetime | None = None,
) -> NetworkLoadTestStatus:
    """A run ended: Succeeded (ExpectationsMet) or Failed (ExpectationsBreached)."""
    passed: tuple[_Truth, LoadReason, str]
    if run.breaches:
        worst = run.breaches[0]
        text = (
            f"{len(run.breaches)} breach(es); worst: {worst.expectation} {worst.subject} "
            f"observed {worst.observed:g}, expected {worst.expected:g}"
        )
        phase, passed = RunPhase.FAILED, ("False", LoadReason.EXPECTATIONS_BREACHED, text)
    else:
        text = f"run {run.id}: every expectation met ({run.nodes} node(s))"
        phase, passed = RunPhase.SUCCEEDED, ("True", LoadReason.EXPECTATIONS_MET, text)
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
