"""Run this node's load plans: the async orchestration of `netval.agent.loadtest`.

- `handle(payload)` takes a message of this node's ``loadplan`` topic (`plan_intake`): a new
  plan starts at once (its tasks wait for their absolute start times), an abort (whatever
  its run: one run per validation at a time, and silence is the safe answer) or a cleared
  plan stops everything that runs within `STOP_SECONDS`; a stage's plan may arrive while
  the previous stage's last seconds run, so several plans may run at once.
- Each task is an engine run or a probe (`flows`, `latency`, `storage`): flows and their
  servers on this node's rails (`rails`: the plan's interfaces, else the node's own), the
  engines as bounded child processes killed with the plan.
- Every plan stops by itself at its `deadline` (an agent that lost the operator stops on its
  own), then its `LoadResult` goes out (QoS 1, not retained), one per plan, within
  `RESULT_BUDGET_BYTES` (latency histograms are coarsened to fit), naming the engines and
  their versions, and what an engine lacked on this node.
- `busy()` is True while a plan runs: the continuous peer samples and storage slot reads
  pause (docs/loadtest.md, "The agent's side").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

import aiomqtt

from netval.agent.loadtest.engines import Versions
from netval.agent.loadtest.flows import Context, Ran, run_flow, run_serve
from netval.agent.loadtest.latency import echo_histogram, perftest_histogram
from netval.agent.loadtest.plan_intake import PlanIntake, Refusal, Refused, Run, Stop
from netval.agent.loadtest.rails import Rail, default_rail_names, describe
from netval.agent.loadtest.storage import read_endpoint
from netval.agent.peers.endpoints import Endpoint, interface_address
from netval.agent.peers.target import PeerTarget
from netval.model.loadplan import (
    MAX_BUCKET,
    MAX_RESULT_BYTES,
    MIN_BUCKET,
    FlowResult,
    FlowTask,
    LatencyEngine,
    LatencyResult,
    LatencyTask,
    LoadPlan,
    LoadResult,
    ServeResult,
    ServeTask,
    StorageResult,
    encode,
)
from netval.model.snapshot import Sample
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import TopicKind, topic

log = logging.getLogger("netval.agent.loadtest")

STOP_SECONDS: Final = 2.0  # abort to silence (docs/loadtest.md)
# The model's limit: under the chart broker's packet limit with room for the topic.
RESULT_BUDGET_BYTES: Final = MAX_RESULT_BYTES
_LOG_EVERY: Final = 60.0


@dataclass
class LoadStats:
    plans_run: int = 0
    plans_aborted: int = 0
    engine_runs: int = 0  # engine processes started (flows, servers, latency probes)
    engines_unavailable: int = 0
    results_published: int = 0


@dataclass
class _Running:
    plan: LoadPlan
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False
    task: asyncio.Task[None] | None = None

    def stop(self, aborted: bool) -> None:
        self.aborted = self.aborted or aborted
        self.halt.set()


@dataclass
class _Outcome:
    flows: list[FlowResult] = field(default_factory=list)
    serves: list[ServeResult] = field(default_factory=list)
    latency: list[LatencyResult] = field(default_factory=list)
    storage: list[StorageResult] = field(default_factory=list)
    engines: dict[str, str] = field(default_factory=dict)
    unavailable: str | None = None

    def add(self, ran: Ran) -> None:
        if ran.engine is not None:
            self.engines[ran.engine[0]] = ran.engine[1]
        if ran.unavailable is not None and self.unavailable is None:
            self.unavailable = ran.unavailable[:256]
        result = ran.result
        if isinstance(result, FlowResult):
            self.flows.append(result)
        elif isinstance(result, ServeResult):
            self.serves.append(result)
        else:
            self.latency.append(result)

    def failures(self) -> list[str]:
        """What failed, one line per flow, server or read ("window peer: error")."""
        tasks: list[FlowResult | ServeResult | StorageResult] = [
            *self.flows,
            *self.serves,
            *self.storage,
        ]
        return [
            f"{r.window} {r.endpoint if isinstance(r, StorageResult) else r.peer}: {r.error}"
            for r in tasks
            if r.error
        ]


class LoadExecutor:
    def __init__(
        self,
        *,
        validation: str,
        node: str,
        endpoints: Callable[[], dict[str, Endpoint]],
        source: Callable[[], str | None],
        spec: Callable[[], NetworkValidationSpec],
        sample: Callable[[], Sample | None] = lambda: None,
        resolve: Callable[[str], str | None] = interface_address,
        which: Callable[[str], str | None] | None = None,
    ) -> None:
        self.validation = validation
        self.node = node
        self.topic = topic(validation, node, TopicKind.LOAD_PLAN)
        self.intake = PlanIntake(validation, node)
        self.stats = LoadStats()
        # set by the agent once its publisher exists; results before that are dropped
        self.publish: Callable[[bytes], None] = lambda _payload: None
        self.spec = spec  # the spec in force (the agent points it at its runner's)
        self.sample = sample  # the newest sample (the agent points it at its sampler's)
        self._endpoints = endpoints
        self._source = source
        self._resolve = resolve
        self._which = which
        self._versions = Versions()
        self._runs: dict[tuple[str, int], _Running] = {}
        self._last_log: dict[str, float] = {}

    # -- MQTT in -------------------------------------------------------------------------

    def on_message(self, message: aiomqtt.Message) -> None:
        if message.topic.value != self.topic:
            return
        payload = message.payload
        self.handle(payload if isinstance(payload, bytes) else str(payload or "").encode())

    def handle(self, payload: bytes) -> None:
        """One message of this node's loadplan topic; never raises for bad input."""
        decision = self.intake.decide(payload, datetime.now(UTC))
        if isinstance(decision, Refused) and decision.reason is Refusal.REPEATED:
            # the retained plan again after a reconnect: expected, not worth a warning
            log.debug("load plan already taken: %s", decision.detail)
        elif isinstance(decision, Refused):
            self._log(decision.reason.value, f"load plan ignored ({decision.reason.value}): "
                      f"{decision.detail}")  # fmt: skip
        elif isinstance(decision, Stop):
            self.stop(decision.run, decision.reason)
        elif isinstance(decision, Run):
            self._start(decision.plan)

    def _log(self, key: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last_log.get(key, float("-inf")) >= _LOG_EVERY:
            self._last_log[key] = now
            log.warning("%s", message)

    # -- what runs -----------------------------------------------------------------------

    def busy(self) -> bool:
        return bool(self._runs)

    def stop(self, run: str | None, reason: str) -> None:
        """Stop every plan (an abort names its run: logged)."""
        for (run_id, stage), running in self._runs.items():
            log.info("load plan %s stage %d stopped (abort of %s): %s", run_id, stage,
                     run or "everything", reason[:200])  # fmt: skip
            running.stop(aborted=True)

    async def close(self) -> None:
        self.stop(None, "agent stopping")
        tasks = [r.task for r in self._runs.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_SECONDS + 1)

    def _start(self, plan: LoadPlan) -> None:
        running = _Running(plan)
        key = (plan.run, plan.stage)
        self._runs[key] = running
        self.stats.plans_run += 1
        log.info("load plan %s stage %d (term %d): %d task(s) until %s", plan.run, plan.stage,
                 plan.term, len(plan.tasks), plan.deadline.isoformat())  # fmt: skip
        running.task = asyncio.create_task(self._run(key, running), name=f"netval-load {key}")

    async def _run(self, key: tuple[str, int], running: _Running) -> None:
        loop = asyncio.get_running_loop()
        plan = running.plan
        # safety: whatever still runs stops at the deadline, operator or not
        watchdog = loop.call_later(
            max(0.0, plan.deadline.timestamp() - time.time()), running.stop, False
        )
        try:
            outcome = await self._execute(running)
            if running.aborted:
                self.stats.plans_aborted += 1
            if outcome.unavailable is not None:
                self.stats.engines_unavailable += 1
                self._log("unavailable", f"load plan {plan.run}: engine unavailable: "
                          f"{outcome.unavailable}")  # fmt: skip
            failed = outcome.failures()
            if failed and not running.aborted:  # what the operator will count as not measured
                log.info("load plan %s stage %d: %d task(s) failed, the first: %s", plan.run,
                         plan.stage, len(failed), failed[0][:300])  # fmt: skip
            self._send(plan, outcome)
        except Exception:
            log.exception("load plan %s stage %d failed", *key)
            self._send(plan, _Outcome(), error="the agent failed running the plan")
        finally:
            watchdog.cancel()
            running.stop(aborted=False)
            self._runs.pop(key, None)

    def rails(self, plan: LoadPlan) -> list[Rail]:
        """This node's rails for `plan`: the interfaces it names, else the node's own."""
        spec = self.spec()
        sample = self.sample()
        names = plan.interfaces or default_rail_names(sample, spec.checks)
        return describe(names, sample, spec.checks, self._resolve)

    async def _execute(self, running: _Running) -> _Outcome:
        plan = running.plan
        spec = self.spec()
        rails = self.rails(plan) if any(
            isinstance(t, FlowTask | ServeTask | LatencyTask) for t in plan.tasks
        ) else []  # fmt: skip
        endpoints = {e.name: e for e in spec.checks.storage.endpoints}
        halt = running.halt

        def context(peer: str, rail: int) -> Context:
            given = plan.peers.get(peer)
            address = given.rails[rail] if given is not None and rail < len(given.rails) else None
            return Context(
                rail=rails[rail] if rail < len(rails) else None,
                peer_address=str(address) if address is not None else None,
                checks=spec.checks,
                cap_mbps=plan.max_rate_mbps,
                versions=self._versions,
                which=self._which,
            )

        jobs: list[asyncio.Future[Ran]] = []
        reads: list[asyncio.Future[StorageResult]] = []
        for t in plan.tasks:
            if isinstance(t, FlowTask):
                job = guarded(t, run_flow(t, context(t.peer, t.rail), halt))
            elif isinstance(t, ServeTask):
                job = guarded(t, run_serve(t, context(t.peer, t.rail), halt))
            elif isinstance(t, LatencyTask):
                job = guarded(t, self._latency(plan, t, context, halt))
            else:
                read = read_endpoint(
                    t, endpoints.get(t.endpoint), t.start.timestamp(), halt, self.node
                )
                reads.append(asyncio.ensure_future(read))
                continue
            jobs.append(asyncio.ensure_future(job))
        self.stats.engine_runs += sum(
            isinstance(t, FlowTask | ServeTask)
            or (isinstance(t, LatencyTask) and t.engine is LatencyEngine.PERFTEST)
            for t in plan.tasks
        )
        outcome = _Outcome()
        for ran in await asyncio.gather(*jobs):
            outcome.add(ran)
        outcome.storage = list(await asyncio.gather(*reads))
        return outcome

    async def _latency(
        self,
        plan: LoadPlan,
        task: LatencyTask,
        context: Callable[[str, int], Context],
        halt: asyncio.Event,
    ) -> Ran:
        if task.engine is LatencyEngine.PERFTEST:
            return await perftest_histogram(task, context(task.peer, task.rail), halt)
        target = self._target(plan, task.peer)
        if target is None:
            return Ran(LatencyResult(window=task.window, peer=task.peer, loaded=task.loaded,
                                     sent=0, received=0,
                                     error=f"{task.peer} has announced no endpoint"))  # fmt: skip
        result = await echo_histogram(task, target, self._source(), task.start.timestamp(), halt)
        return Ran(result)

    def _target(self, plan: LoadPlan, peer: str) -> PeerTarget | None:
        given = plan.peers.get(peer)
        if given is not None:  # the operator's view of the peer's endpoint, for this stage
            return PeerTarget(peer, str(given.address), given.port, None)
        endpoint = self._endpoints().get(peer)
        if endpoint is None:
            return None
        return PeerTarget(peer, endpoint.address, endpoint.port, endpoint.domain)

    # -- MQTT out ------------------------------------------------------------------------

    def _send(self, plan: LoadPlan, outcome: _Outcome, *, error: str | None = None) -> None:
        result = fit(
            LoadResult(
                run=plan.run, stage=plan.stage, validation=self.validation, node=self.node,
                sent_at=datetime.now(UTC), engines=outcome.engines, flows=outcome.flows,
                serves=outcome.serves, latency=outcome.latency, storage=outcome.storage,
                unavailable=outcome.unavailable, error=error,
            )
        )  # fmt: skip
        self.publish(encode(result))
        self.stats.results_published += 1


async def guarded(task: FlowTask | ServeTask | LatencyTask, job: Awaitable[Ran]) -> Ran:
    """The task's outcome; a failure of the agent's own (a bug, a figure the model refuses)
    costs that task only, said in its result, never the plan's other results."""
    try:
        return await job
    except Exception:
        log.exception("load task %s of %s failed", task.kind, task.window)
        why = "the agent failed running this task"
        if isinstance(task, FlowTask):
            begin = task.start + timedelta(seconds=task.warmup_seconds)
            return Ran(FlowResult(window=task.window, peer=task.peer, rail=task.rail, bytes=0,
                                  start=begin, end=task.end, error=why))  # fmt: skip
        if isinstance(task, ServeTask):
            return Ran(ServeResult(window=task.window, peer=task.peer, rail=task.rail, error=why))
        return Ran(LatencyResult(window=task.window, peer=task.peer, loaded=task.loaded,
                                 engine=task.engine, sent=0, received=0, error=why))  # fmt: skip


def coarsen(histogram: list[tuple[int, int]], level: int) -> list[tuple[int, int]]:
    """Buckets merged 2^level at a time, each merged bucket keyed by its middle one (a p99
    read from them is then within 2^(level-1) % of the exact one)."""
    merged: dict[int, int] = {}
    for bucket, count in histogram:
        key = ((bucket >> level) << level) + ((1 << level) >> 1)
        key = min(max(key, MIN_BUCKET), MAX_BUCKET)
        merged[key] = merged.get(key, 0) + count
    return sorted(merged.items())


def fit(result: LoadResult, budget: int = RESULT_BUDGET_BYTES) -> LoadResult:
    """`result` with its latency histograms coarsened (buckets merged in pairs, again and
    again) until it encodes within `budget` bytes; at 2^12-wide merges they are dropped."""
    level = 0
    while len(encode(result)) > budget and any(r.histogram for r in result.latency):
        level += 1
        latency = [
            r.model_copy(update={"histogram": coarsen(r.histogram, level) if level < 12 else []})
            for r in result.latency
        ]
        result = result.model_copy(update={"latency": latency})
    return result
