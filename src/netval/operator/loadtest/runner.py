"""The NetworkLoadTest run coordinator of a leadership term (the leader's runtime owns one).

Kopf's handlers (`netval.operator.handlers.loadtests`) tell it what exists (`upsert`,
`delete`); the MQTT ingest hands it every `loadresult` message (`on_result`); its loop
(`run`, a supervised task) does the rest once per `TICK_SECONDS`:

1. tests waiting for their validation (ValidationNotFound) are settled again;
2. each running run checks its participants again before each stage and every
   `RECHECK_SECONDS` (`recheck`): a node that turned busy (GPU pods, with skipBusyNodes),
   gated or stale gets a `LoadAbort` on its plan topic (its agent stops at once: agents have
   no API access, the operator is their eyes) and is left out of the later stages, named
   in `skippedNodes` with the stage; then it publishes the plans of the stages whose time
   has come
   (`Stage.issued_at`, `stage_lead_seconds` before it), retained QoS 1, through the ingest's
   retained sync (a group per run: written by the leader only, behind the write fence, and
   published again after a reconnect); a run whose results are all in, or whose last
   deadline and grace passed, is folded into `status.lastRun` and its plan topics cleared;
3. the tests due (`schedule.due_at`) start, at most one per validation (`pick_starts`),
   the others wait;
4. every status that changed is written (a merge patch of the status subresource, through
   the fenced pool like every write of the term; a failed write is retried at the next tick
   with what is known then).

Deleting a test or its validation aborts its run: each participant's retained plan is
replaced by a `LoadAbort` (kept until the last plan's deadline, then cleared) and the test
says Aborted. Every plan and abort carries this leadership term (`term`: the leader's clock
in ms when the term began; a new leader takes the Lease at least its duration after the old
one last renewed it, so its term is larger with clocks within seconds): agents drop a plan
of an older term than one they heard. With `spec.reserveNodes` the participants are
tainted NoSchedule for the run (`reserve`), always removed. The decisions are pure (`validate`, `plan`, `aggregate`, `status`,
`schedule`); this module only holds the state between them and does the I/O.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from netval.model.loadplan import LoadAbort, decode_result, encode
from netval.model.loadtest import (
    LoadConditionType,
    LoadReason,
    LoadRun,
    NetworkLoadTestSpec,
    NetworkLoadTestStatus,
    RunPhase,
    SkipReason,
)
from netval.model.topics import TopicKind, topic
from netval.operator.ingest.peer_sets import Address, AnnouncedRails
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.loadtest import status as render
from netval.operator.loadtest.aborts import RetainedAborts, RetainedSink
from netval.operator.loadtest.aggregate import Aggregator, Received
from netval.operator.loadtest.participants import candidates
from netval.operator.loadtest.plan import Candidate, RunPlan, make_run_id, plan_run
from netval.operator.loadtest.rails import rails_of
from netval.operator.loadtest.reserve import NodeReservations
from netval.operator.loadtest.schedule import Due, due_at, pick_starts, run_over
from netval.operator.loadtest.status_writer import LoadStatusWriter
from netval.operator.loadtest.tasks import build_plans
from netval.operator.loadtest.validate import RunSettings, SpecProblem, parse_spec, settle
from netval.operator.state.store import Store, utcnow

log = logging.getLogger("netval.operator.loadtest")

TICK_SECONDS: Final = 0.5
RECHECK_SECONDS: Final = 15.0  # participants checked again within a long stage
# Outcomes of loadresult messages (a bounded label set for the metrics).
RESULT_OUTCOMES: Final = ("counted", "invalid", "mismatch", "no_run", "not_counted")
# A finished run's reason (Complete) that means "it ran": a one-shot test runs no more.
_RAN: Final = frozenset(
    {
        LoadReason.RUN_FINISHED,
        LoadReason.NO_PARTICIPANTS,
        LoadReason.ABORTED,
        LoadReason.EXPECTATIONS_MET,
        LoadReason.EXPECTATIONS_BREACHED,
    }
)


@dataclass(slots=True)
class _Test:
    name: str
    generation: int
    spec: NetworkLoadTestSpec | None
    settled: RunSettings | SpecProblem
    status: NetworkLoadTestStatus | None  # the status to write (and last computed)
    seen_at: datetime
    ran: bool  # a one-shot test that ran (or could not) does not run again
    last_start: datetime | None = None


@dataclass(slots=True)
class _Run:
    test: str
    plan: RunPlan
    aggregator: Aggregator
    published: int = 0  # stages whose plans went out
    unanswered: dict[int, set[str]] = field(default_factory=dict)
    retained: dict[str, bytes] = field(default_factory=dict)  # plan topic -> latest plan
    checked_at: datetime | None = None  # participants last checked


class LoadTests:
    def __init__(
        self,
        kube: KubeApi,
        store: Store,
        set_retained: RetainedSink,
        *,
        max_rate_ceiling_mbps: float = 0.0,
        clock: Callable[[], datetime] = utcnow,
        endpoints: Callable[[str], Mapping[str, Address]] = lambda _validation: {},
        rails: Callable[[str], Mapping[str, AnnouncedRails]] = lambda _validation: {},
        term: int = 0,
    ) -> None:
        self.kube = kube
        # validation -> node -> its announced (address, port): plans carry their peers'
        self.endpoints = endpoints
        self.rails = rails  # validation -> node -> its announced rails
        self.term = term
        self.store = store
        self.set_retained = set_retained
        self.ceiling = max_rate_ceiling_mbps
        self.clock = clock
        self.tests: dict[str, _Test] = {}
        self.runs: dict[str, _Run] = {}  # validation -> its run under way
        self.last_runs: dict[str, LoadRun] = {}  # test -> its last finished run (metrics)
        self.results: Counter[str] = Counter()  # loadresult messages by outcome
        self.runs_finished: Counter[str] = Counter()  # by phase
        self.writer = LoadStatusWriter(kube)
        self.aborts = RetainedAborts(set_retained, term)
        self.reservations = NodeReservations(kube)

    # -- what Kopf tells ------------------------------------------------------------------

    def upsert(
        self,
        name: str,
        *,
        generation: int,
        raw: Mapping[str, Any],
        status: Mapping[str, Any] | None,
    ) -> RunSettings | SpecProblem:
        now = self.clock()
        known = self.tests.get(name)
        previous = known.status if known is not None else _read_status(status)
        if known is not None and known.generation == generation:
            return known.settled  # a resume or a repeat: nothing changed
        run = self._run_of(name)
        if run is not None:
            self._abort(run, f"spec changed (generation {generation}) during run {run.plan.run_id}")
            previous = self.tests[name].status
        spec = parse_spec(raw)
        settled: RunSettings | SpecProblem = (
            spec
            if isinstance(spec, SpecProblem)
            else settle(
                raw, self.store.specs.get(spec.validation), max_rate_ceiling_mbps=self.ceiling
            )
        )
        complete = previous.condition(LoadConditionType.COMPLETE) if previous else None
        test = _Test(
            name=name,
            generation=generation,
            spec=None if isinstance(spec, SpecProblem) else spec,
            settled=settled,
            status=previous,
            seen_at=now,
            ran=previous is not None
            and (
                previous.last_run is not None or (complete is not None and complete.reason in _RAN)
            ),
            last_start=previous.last_run.started_at if previous and previous.last_run else None,
        )
        self.tests[name] = test
        if test.spec is not None and previous is not None and previous.last_run is not None:
            # a run finished in an earlier term still describes the fabric (status.topology)
            self.store.note_load_run(test.spec.validation, name, previous.last_run)
        if previous is not None and previous.phase is RunPhase.RUNNING and run is None:
            # a run of an earlier term: nobody folds its results any more (its agents stop
            # at their plan's deadline); said once, and its plan topics cleared
            self._lost_run(test, now)
        if isinstance(settled, SpecProblem):
            self._could_not_run(test, settled, now)
        return settled

    async def delete(self, name: str) -> None:
        run = self._run_of(name)
        if run is not None:
            self._abort(run, f"NetworkLoadTest {name!r} deleted during run {run.plan.run_id}")
            await self._write(name)
        self.tests.pop(name, None)
        self.last_runs.pop(name, None)
        self.writer.forget(name)

    def validation_deleted(self, validation: str) -> None:
        run = self.runs.get(validation)
        if run is not None:
            self._abort(run, f"NetworkValidation {validation!r} deleted during the run")

    # -- MQTT ---------------------------------------------------------------------------

    def on_result(self, validation: str, node: str, payload: bytes) -> None:
        """One loadresult message (cheap; never raises for what the payload holds)."""
        received_at = self.clock()
        run = self.runs.get(validation)
        if run is None:
            self.results["no_run"] += 1
            return
        try:
            result = decode_result(payload)
        except ValueError:
            self.results["invalid"] += 1
            return
        if result.node != node or result.validation != validation:
            self.results["mismatch"] += 1  # a node speaks only for itself
            return
        if not run.aggregator.add(Received(result, received_at)):
            self.results["not_counted"] += 1
            return
        self.results["counted"] += 1
        run.unanswered.get(result.stage, set()).discard(node)

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        worker = asyncio.create_task(self.reservations.run(), name="netval-load-reservations")
        try:
            while True:
                await self.tick()
                await asyncio.sleep(TICK_SECONDS)
        finally:
            worker.cancel()

    async def tick(self) -> None:
        now = self.clock()
        self._resettle()
        busy: set[str] | None = None
        for run in list(self.runs.values()):
            if self._due_for_check(run, now):
                busy = await self._recheck(run, now, busy)
            self._advance(run, now)
        await self._start_due(now)
        self.aborts.refresh(self._targeted, now)
        for name in list(self.tests):
            await self._write(name)

    def _resettle(self) -> None:
        for test in self.tests.values():
            problem = test.settled
            if (
                isinstance(problem, SpecProblem)
                and problem.reason is LoadReason.VALIDATION_NOT_FOUND
                and test.spec is not None
                and test.spec.validation in self.store.specs
            ):
                test.settled = settle(
                    test.spec.model_dump(by_alias=True),
                    self.store.specs[test.spec.validation],
                    max_rate_ceiling_mbps=self.ceiling,
                )
                test.ran = False
                if isinstance(test.settled, SpecProblem):
                    self._could_not_run(test, test.settled, self.clock())

    def _advance(self, run: _Run, now: datetime) -> None:
        stages = run.plan.stages
        while run.published < len(stages) and stages[run.published].issued_at <= now:
            stage = stages[run.published]
            validation = run.plan.settings.validation
            plans = build_plans(
                run.plan, stage, term=self.term, endpoints=self.endpoints(validation),
                announced=self.rails(validation),
            )  # fmt: skip
            for node, plan in plans.items():
                run.retained[topic(run.plan.settings.validation, node, TopicKind.LOAD_PLAN)] = (
                    encode(plan)
                )
                run.unanswered.setdefault(stage.index, set()).add(node)
            run.published += 1
            self.set_retained(_group(run), run.retained)
        unanswered = sum(len(nodes) for nodes in run.unanswered.values())
        if run_over(
            now,
            run.plan.finished_by,
            all_published=run.published == len(stages),
            unanswered=unanswered,
        ):
            self._finish(run, now)

    def _finish(self, run: _Run, now: datetime) -> None:
        del self.runs[run.plan.settings.validation]
        self.set_retained(_group(run), {})  # the plan topics are cleared
        reserved = self.reservations.reserved(run.plan.run_id)
        self.reservations.release(run.plan.run_id)
        test = self.tests.get(run.test)
        if test is None or test.spec is None:
            return
        result = run.aggregator.finish(expect=test.spec.expect, finished_at=now)
        result = result.model_copy(update={"reserved_nodes": reserved})
        test.status = render.finished(
            result,
            generation=test.generation,
            now=now,
            previous=test.status,
            history_limit=test.spec.history_limit,
            next_run_at=self._next_at(test),
            min_coverage_percent=test.spec.min_coverage_percent,
        )
        self.last_runs[test.name] = result
        self.store.note_load_run(test.spec.validation, test.name, result)
        self.runs_finished[test.status.phase.value] += 1
        log.info("load test %s: run %s %s", test.name, result.id, test.status.phase.value)

    async def _start_due(self, now: datetime) -> None:
        due: list[Due] = []
        for test in self.tests.values():
            settings = test.settled
            if isinstance(settings, SpecProblem) or test.spec is None or self._run_of(test.name):
                continue
            at = self._next_at(test)
            if at is None:
                continue
            due.append(Due(test.name, settings.validation, at))
        busy = {v: r.test for v, r in self.runs.items()}
        starts, waiting = pick_starts(due, busy, now)
        for name, holder in waiting.items():
            self._wait(
                self.tests[name], f"waiting for NetworkLoadTest {holder!r} on its validation", now
            )
        for d in due:
            if d.at > now:
                self._wait(self.tests[d.test], f"next run at {d.at:%Y-%m-%dT%H:%M}Z", now, d.at)
        busy_nodes: set[str] | None = None
        for d in starts:
            test = self.tests[d.test]
            assert isinstance(test.settled, RunSettings) and test.spec is not None
            if test.settled.skip_busy_nodes and busy_nodes is None:
                try:
                    busy_nodes = await self.kube.gpu_pod_nodes()
                except Exception as exc:
                    log.warning(
                        "load test %s waits: cannot list GPU pods: %s", d.test, error_text(exc)
                    )
                    return  # the next tick tries again
            self._start(test, test.settled, busy_nodes or set(), now)

    def _start(self, test: _Test, settings: RunSettings, busy: set[str], now: datetime) -> None:
        assert test.spec is not None
        if settings.validation not in self.store.specs:  # deleted since it was settled
            test.settled = settle(test.spec.model_dump(by_alias=True), None)
            if isinstance(test.settled, SpecProblem):
                self._could_not_run(test, test.settled, now)
            return
        run_id = make_run_id(test.name, now)
        seed = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "big")
        found = candidates(self.store, settings.validation, busy, now)
        rails = rails_of(
            [c.node for c in found], settings.interfaces, self.rails(settings.validation),
            self.endpoints(settings.validation),
        )  # fmt: skip
        plan = plan_run(settings, found, run_id=run_id, now=now, seed=seed, rails=rails)
        test.ran = True
        test.last_start = now
        if isinstance(plan, SpecProblem):
            self._could_not_run(test, plan, now)
            return
        run = _Run(test=test.name, plan=plan, aggregator=Aggregator(plan), checked_at=now)
        self.runs[settings.validation] = run
        self.aborts.forget(_group(run))
        if settings.reserve_nodes:
            self.reservations.reserve(run_id, set(plan.domain_of))
        first = LoadRun(id=run_id, started_at=plan.stages[0].start, nodes=len(plan.domain_of),
                        skipped_count=len(plan.skipped))  # fmt: skip
        test.status = render.running(
            first,
            generation=test.generation,
            now=now,
            previous=test.status,
            history_limit=test.spec.history_limit,
        )
        log.info("load test %s: run %s on %d node(s), %d stage(s)", test.name, run_id,
                 len(plan.domain_of), len(plan.stages))  # fmt: skip
        self._advance(run, now)

    # -- participants, again ----------------------------------------------------------

    def _due_for_check(self, run: _Run, now: datetime) -> bool:
        stages = run.plan.stages
        publishing = run.published < len(stages) and stages[run.published].issued_at <= now
        last = run.checked_at
        return publishing or last is None or (now - last).total_seconds() >= RECHECK_SECONDS

    async def _recheck(self, run: _Run, now: datetime, busy: set[str] | None) -> set[str] | None:
        """Leave out the participants that turned busy, gated or stale (their agents get a
        LoadAbort now); the busy set is listed at most once per tick (`busy` when known)."""
        settings = run.plan.settings
        if settings.skip_busy_nodes and busy is None:
            try:
                busy = await self.kube.gpu_pod_nodes()
            except Exception as exc:
                log.warning("load test %s: cannot list GPU pods to check its participants "
                            "again: %s", run.test, error_text(exc))  # fmt: skip
                return busy
        run.checked_at = now
        found = {c.node: c for c in candidates(self.store, settings.validation, busy or set(), now)}
        plan = run.plan
        leaving: dict[str, SkipReason] = {}
        for node in plan.domain_of:
            if node in plan.excluded:
                continue
            why = _unsafe(found.get(node), skip_busy=settings.skip_busy_nodes)
            if why is not None:
                leaving[node] = why
        if not leaving:
            return busy
        running = run.published - 1  # the stage under way (its plans are out)
        abort_topics: dict[str, bytes] = {}
        for node, why in sorted(leaving.items()):
            plan.exclude(node, why, run.published)
            if running >= 0 and now < plan.stages[running].deadline:
                run.aggregator.withdraw(node, running)
                run.unanswered.get(running, set()).discard(node)
            name = topic(settings.validation, node, TopicKind.LOAD_PLAN)
            reason = f"{node} left the run from stage {run.published}: {why.value}"
            abort_topics[name] = encode(LoadAbort(term=self.term, run=plan.run_id, reason=reason))
            log.warning("load test %s: %s", run.test, reason)
        run.retained.update(abort_topics)
        self.set_retained(_group(run), run.retained)
        return busy

    # -- aborts ---------------------------------------------------------------------------

    def _abort(self, run: _Run, message: str) -> None:
        now = self.clock()
        del self.runs[run.plan.settings.validation]
        self.reservations.release(run.plan.run_id)
        published = run.plan.stages[max(0, run.published - 1)].deadline if run.published else now
        self.aborts.abort(_group(run), run.plan.run_id, run.retained, message,
                          last_deadline=published, now=now)  # fmt: skip
        self.runs_finished[RunPhase.FAILED.value] += 1
        test = self.tests.get(run.test)
        if test is not None and test.spec is not None:
            test.status = render.aborted(message, generation=test.generation, now=now,
                                         previous=test.status,
                                         history_limit=test.spec.history_limit)  # fmt: skip
        log.warning("load test %s: run %s aborted: %s", run.test, run.plan.run_id, message)

    def _lost_run(self, test: _Test, now: datetime) -> None:
        last = test.status.last_run if test.status is not None else None
        message = f"run {last.id if last else '?'} was lost: the operator restarted during it"
        if last is not None and test.spec is not None:
            self.aborts.lost(test.spec.validation, last.id, message, now)
        limit = test.spec.history_limit if test.spec is not None else 0
        test.status = render.aborted(message, generation=test.generation, now=now,
                                     previous=test.status, history_limit=limit)  # fmt: skip

    def _targeted(self, validation: str) -> set[str]:
        state = self.store.states.get(validation)
        return set(state.targeted) if state is not None else set()

    # -- status ---------------------------------------------------------------------------

    def _could_not_run(self, test: _Test, problem: SpecProblem, now: datetime) -> None:
        limit = test.spec.history_limit if test.spec is not None else 0
        test.status = render.could_not_run(problem, generation=test.generation, now=now,
                                           previous=test.status, history_limit=limit)  # fmt: skip

    def _wait(self, test: _Test, message: str, now: datetime, at: datetime | None = None) -> None:
        assert test.spec is not None
        test.status = render.waiting(message, generation=test.generation, now=now,
                                     previous=test.status, history_limit=test.spec.history_limit,
                                     next_run_at=at)  # fmt: skip

    async def write_now(self, name: str) -> None:
        await self._write(name)

    async def _write(self, name: str) -> None:
        test = self.tests.get(name)
        if test is not None and test.status is not None:
            await self.writer.write(name, test.status)

    # -- helpers --------------------------------------------------------------------------

    def _run_of(self, test: str) -> _Run | None:
        return next((r for r in self.runs.values() if r.test == test), None)

    def _next_at(self, test: _Test) -> datetime | None:
        if test.spec is None:
            return None
        return due_at(test.spec.schedule, has_run=test.ran, last_start=test.last_start,
                      seen_at=test.seen_at)  # fmt: skip


def _unsafe(found: Candidate | None, *, skip_busy: bool) -> SkipReason | None:
    """Why a participant may not go on (gated first, as at the start), or None."""
    if found is None or found.gated:
        return SkipReason.GATED if found is not None else SkipReason.STALE
    if not found.fresh:
        return SkipReason.STALE
    if skip_busy and found.busy:
        return SkipReason.BUSY
    return None


def _group(run: _Run) -> str:
    return f"loadtest:{run.plan.settings.validation}:{run.plan.run_id}"


def _read_status(raw: Mapping[str, Any] | None) -> NetworkLoadTestStatus | None:
    if not raw:
        return None
    try:
        return NetworkLoadTestStatus.model_validate(dict(raw))
    except ValidationError:
        return None  # an old or hand-edited status: rewritten from scratch
