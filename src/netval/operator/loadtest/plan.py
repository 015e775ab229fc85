"""Who takes part in a load-test run and what each node does when. Pure and deterministic:
the same candidates, settings, start time and seed give the same plan.

A run is a sequence of *stages*, each a few seconds to a few minutes long; the operator
publishes a stage's plans `stage_lead_seconds` before it starts (5 s; more above 5,000
nodes), so a plan's deadline is never more than one stage away: an agent that loses the
operator stops by itself. Stages, in
order:

- `r0`, intra: in every domain of two or more nodes, every node sends to the next one of
  the domain (a seeded cyclic shift), all at once: the reference rate.
- `r1`.., cross: for every domain pair (A, B), every node of the larger side sends to a node
  of the smaller side and receives from one (the smaller side's nodes take several flows
  each, at most `max_fanout`: beyond that the cell is partial), all at once. `crossDomain`
  runs disjoint domain pairs together (a round-robin: D-1 rounds for even D, D for odd),
  `all` gives each pair a round of its own (D(D-1)/2 rounds).
  Each east-west round is an idle window (the echo probe alone between the round's pairs),
  then the load window: the flows, with the echo probe again during the measured part.
- `s<i>`, storage, one per endpoint: every participant reads it at once (warm-up, then
  `duration`), then up to `MAX_SINGLE_READS` seeded nodes read it alone, one at a time, for
  `SINGLE_SECONDS`.

Every east-west flow runs on each rail both ends have (rail i to rail i; `rails`), with the
engine the rail calls for (`rails.rail_engine`); its server runs on the receiver, started by
the receiver's own plan (`tasks`).

A `RunPlan` holds participants, their rails as bit masks and each stage's timing only; a
stage's windows (who sends to whom, the measured interval in the operator's clock: what
aggregation needs to accept a result) are made from the run's seed when the stage is
published or folded, so a run of 10,000 nodes and 300 stages holds no per-flow state
(bench/loadtest_plan.py). Participants are checked again before every stage: a node that
turned busy, gated or stale is left out of the later stages (`exclude`, from the next
unpublished stage on, so a stage's windows never change once its plans went out).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from netval.model.east_west import UNASSIGNED
from netval.model.loadplan import MAX_TASKS
from netval.model.loadtest import MAX_FANOUT, LoadPhase, LoadReason, PairScope, SkipReason
from netval.operator.loadtest.rails import NodeRails
from netval.operator.loadtest.validate import RunSettings, SpecProblem

LEAD_SECONDS: Final = 5.0  # a stage's plans go out this long before it starts (at least)
# Building and publishing a stage's plans takes ~0.25 ms per node, ~0.45 ms on a busy
# machine (bench/loadtest_publish.py: 10,000 nodes in 2.2-2.6 s, 4.3 s beside other work);
# the lead grows with about three times that beyond 5,000 nodes, up to a minute (the
# longest stage, a 300 s storage read with 8 single reads, plus a minute stays within
# MAX_PLAN_SECONDS from issue to deadline).
LEAD_SECONDS_PER_NODE: Final = 0.001
MAX_LEAD_SECONDS: Final = 60.0
IDLE_SECONDS: Final = 3.0  # the echo probe alone, before a round's load
WARMUP_SECONDS: Final = 2.0  # flows ramp up (TCP slow start) before they are measured
GAP_SECONDS: Final = 1.0  # between windows: the previous window's flows drain
# a stage's deadline after its last window ends: an engine's closing exchange, perftest's
# trailing margin (its warm-up) and its server's tail fit in it
DEADLINE_SLACK_SECONDS: Final = 9.0
SINGLE_SECONDS: Final = 5.0  # each single-node storage read (at most `duration`)
SINGLE_WARMUP_SECONDS: Final = 1.0
MAX_SINGLE_READS: Final = 8  # single-node reads per endpoint (seeded sample of nodes)
ECHO_INTERVAL_MS: Final = 100


class WindowKind(StrEnum):
    IDLE = "idle"  # echo only: the idle latency of the round's pairs
    INTRA = "intra"
    CROSS = "cross"
    STORAGE = "storage"  # every participant reads at once
    STORAGE_SINGLE = "storage-single"  # one node reads alone


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node targeted by the validation, as the operator sees it when the run starts."""

    node: str
    domain: str | None  # its topology label (None: unassigned)
    fresh: bool  # reporting, not stale
    busy: bool  # runs pods that request GPUs
    gated: bool  # failing: being gated


@dataclass(frozen=True, slots=True)
class Window:
    id: str
    kind: WindowKind
    stage: int
    start: datetime  # flows (or reads) start: the warm-up begins
    measure_start: datetime  # the measured part begins
    end: datetime
    # east-west: (sender, receiver); storage: (reader, endpoint)
    flows: tuple[tuple[str, str], ...]
    endpoint: str | None = None

    @property
    def measured_seconds(self) -> float:
        return (self.end - self.measure_start).total_seconds()


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage's timing and what it measures; its windows (who sends to whom) are made
    from the run's seed when asked (`RunPlan.windows_of`), so a plan for 10,000 nodes holds
    no per-flow state between stages."""

    index: int
    kind: WindowKind  # INTRA, CROSS or STORAGE
    issued_at: datetime  # when its plans go out
    start: datetime
    deadline: datetime
    pairs: tuple[tuple[str, str], ...] = ()  # CROSS: the domain pairs of this round
    endpoint: str | None = None  # STORAGE


ONE_RAIL: Final = NodeRails(mask=1, rdma=0)


@dataclass(frozen=True, slots=True)
class Fanout:
    """How a cross cell loads unequal domains: every node of `big` sends one flow to a node
    of the other side (`fan` flows per receiver there, and back), `loaded` of its `size`
    nodes (all but beyond `max_fanout` flows per receiver)."""

    big: str
    size: int
    loaded: int
    fan: int

    @property
    def partial(self) -> bool:
        return self.loaded < self.size


@dataclass(frozen=True, slots=True)
class RunPlan:
    run_id: str
    settings: RunSettings
    seed: int
    domain_of: dict[str, str]  # participants only
    members: dict[str, tuple[str, ...]]  # domain -> its participants, sorted
    skipped: tuple[tuple[str, SkipReason], ...]
    stages: tuple[Stage, ...]
    rails: dict[str, NodeRails] = field(default_factory=dict)  # participant -> its rails
    # a receiver's flows per window and rail: bounded so a node's plan stays within
    # MAX_TASKS (two tasks per flow and rail, a few more for latency)
    max_fanout: int = MAX_FANOUT
    # node -> (the first stage it is left out of, why): filled as the run goes on
    excluded: dict[str, tuple[int, SkipReason]] = field(default_factory=dict)

    def rails_of(self, node: str) -> NodeRails:
        return self.rails.get(node, ONE_RAIL)

    def exclude(self, node: str, reason: SkipReason, from_stage: int) -> bool:
        """Leave `node` out from stage `from_stage` on; False if it already is."""
        if node not in self.domain_of or node in self.excluded:
            return False
        self.excluded[node] = (from_stage, reason)
        return True

    def members_at(self, stage: int) -> dict[str, tuple[str, ...]]:
        """The participants of stage `stage` by domain (those not left out by then)."""
        if not self.excluded:
            return self.members
        gone = {n for n, (first, _why) in self.excluded.items() if first <= stage}
        kept = {d: tuple(n for n in nodes if n not in gone) for d, nodes in self.members.items()}
        return {d: nodes for d, nodes in kept.items() if nodes}

    def fanout(self, a: str, b: str, stage: int) -> Fanout | None:
        members = self.members_at(stage)
        if a not in members or b not in members:
            return None
        return fanout_of(a, len(members[a]), b, len(members[b]), self.max_fanout)

    @property
    def windows(self) -> Iterator[Window]:
        for stage in self.stages:
            yield from self.windows_of(stage)

    @property
    def finished_by(self) -> datetime:
        return self.stages[-1].deadline

    def windows_of(self, stage: Stage) -> tuple[Window, ...]:
        """The stage's windows: the same for the same plan, whenever asked."""
        rng = random.Random(f"{self.seed}:{stage.index}")  # noqa: S311 - reproducible order
        duration = self.settings.duration_seconds
        members = self.members_at(stage.index)
        if stage.kind is WindowKind.INTRA:
            flows = [f for d in sorted(members) for f in _cycle(rng, members[d])]
            return _east_west_windows(stage, WindowKind.INTRA, flows, duration)
        if stage.kind is WindowKind.CROSS:
            flows = [
                f
                for a, b in stage.pairs
                if a in members and b in members
                for f in _across(rng, members[a], members[b], self.max_fanout)
            ]
            return _east_west_windows(stage, WindowKind.CROSS, flows, duration)
        assert stage.endpoint is not None
        readers = sorted(n for nodes in members.values() for n in nodes)
        return _storage_windows(stage, stage.endpoint, readers, rng, duration)


def select_participants(
    candidates: Iterable[Candidate], *, skip_busy: bool
) -> tuple[dict[str, str], list[tuple[str, SkipReason]]]:
    """node -> domain of the participants, and the skipped nodes with why (gated first: a
    node being gated for failing is never loaded, whatever else is true of it)."""
    taking: dict[str, str] = {}
    skipped: list[tuple[str, SkipReason]] = []
    for c in sorted(candidates, key=lambda c: c.node):
        if c.gated:
            skipped.append((c.node, SkipReason.GATED))
        elif not c.fresh:
            skipped.append((c.node, SkipReason.STALE))
        elif skip_busy and c.busy:
            skipped.append((c.node, SkipReason.BUSY))
        else:
            taking[c.node] = c.domain or UNASSIGNED
    return taking, skipped


def make_run_id(test_name: str, at: datetime) -> str:
    """A run id that is a safe topic-free token (lowercase, digits, '-'), <= 63 characters."""
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:44] or "run"
    return f"{base}-{at:%Y%m%d-%H%M%S}"


def round_robin(domains: list[str], scope: PairScope) -> list[list[tuple[str, str]]]:
    """Rounds of domain pairs: disjoint pairs per round (circle method) or one pair each."""
    if scope is PairScope.ALL:
        return [[(a, b)] for i, a in enumerate(domains) for b in domains[i + 1 :]]
    ring: list[str | None] = [*domains, None] if len(domains) % 2 else list(domains)
    n = len(ring)
    rounds: list[list[tuple[str, str]]] = []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return [r for r in rounds if r]


def stage_lead_seconds(participants: int) -> float:
    """How long before a stage starts its plans go out: `LEAD_SECONDS`, longer for a run
    whose plans take longer than a third of it to publish."""
    return min(MAX_LEAD_SECONDS, max(LEAD_SECONDS, participants * LEAD_SECONDS_PER_NODE))


def plan_run(
    settings: RunSettings,
    candidates: Iterable[Candidate],
    *,
    run_id: str,
    now: datetime,
    seed: int,
    rails: Mapping[str, NodeRails] | None = None,
) -> RunPlan | SpecProblem:
    """The whole run, or NoParticipants. `now` is timezone-aware (the operator's clock);
    `rails`: each node's rails (absent: one rail, its responder's address)."""
    domain_of, skipped = select_participants(candidates, skip_busy=settings.skip_busy_nodes)
    east_west = LoadPhase.EAST_WEST in settings.phases
    if not domain_of or (east_west and len(domain_of) < 2 and not settings.endpoints):
        return SpecProblem(
            LoadReason.NO_PARTICIPANTS,
            "spec.validation",
            f"{len(domain_of)} node(s) of NetworkValidation {settings.validation!r} can take "
            f"part ({len(skipped)} skipped: gated, stale or busy); east-west needs two",
        )
    grouped: dict[str, list[str]] = {}
    for node, domain in domain_of.items():
        grouped.setdefault(domain, []).append(node)
    members = {d: tuple(sorted(nodes)) for d, nodes in sorted(grouped.items())}
    duration = settings.duration_seconds
    stages: list[Stage] = []
    lead = stage_lead_seconds(len(domain_of))
    t = now + timedelta(seconds=lead)
    if east_west and len(domain_of) >= 2:
        rounds: list[tuple[WindowKind, tuple[tuple[str, str], ...]]] = []
        if any(len(nodes) > 1 for nodes in members.values()):
            rounds.append((WindowKind.INTRA, ()))
        rounds += [(WindowKind.CROSS, tuple(r)) for r in round_robin(list(members), settings.pairs)]
        for kind, pairs in rounds:
            end = t + timedelta(seconds=IDLE_SECONDS + GAP_SECONDS + WARMUP_SECONDS + duration)
            stages.append(_stage(len(stages), kind, t, end, lead, pairs=pairs))
            t = stages[-1].deadline
    single = min(SINGLE_SECONDS, duration) + SINGLE_WARMUP_SECONDS + GAP_SECONDS
    singles = min(MAX_SINGLE_READS, len(domain_of))
    for endpoint in settings.endpoints:
        end = t + timedelta(seconds=WARMUP_SECONDS + duration + singles * single)
        stages.append(_stage(len(stages), WindowKind.STORAGE, t, end, lead, endpoint=endpoint))
        t = stages[-1].deadline
    if not stages:
        return SpecProblem(LoadReason.NO_PARTICIPANTS, "spec.validation", "nothing to run")
    node_rails = {n: (rails or {}).get(n, ONE_RAIL) for n in domain_of}
    most = max((r.count for r in node_rails.values()), default=1)
    return RunPlan(
        run_id=run_id,
        settings=settings,
        seed=seed,
        domain_of=domain_of,
        members=members,
        skipped=tuple(skipped),
        stages=tuple(stages),
        rails=node_rails,
        max_fanout=max_fanout(most),
    )


def max_fanout(rails: int) -> int:
    """Flows into one node per window and rail such that its plan holds at most MAX_TASKS
    tasks: the busiest node sends as many flows as it receives, a client or a server per
    flow and rail, and per pair an idle and a loaded latency probe or their servers."""
    return max(1, min(MAX_FANOUT, (MAX_TASKS - 16) // (2 * max(rails, 1) + 4)))


def fanout_of(a: str, size_a: int, b: str, size_b: int, most: int) -> Fanout:
    """How the cross cell of domains a and b is loaded (see `Fanout`)."""
    big, size, small = (a, size_a, size_b) if size_a >= size_b else (b, size_b, size_a)
    fan = min(math.ceil(size / max(small, 1)), most)
    return Fanout(big=big, size=size, loaded=min(size, fan * small), fan=fan)


def _stage(
    index: int,
    kind: WindowKind,
    start: datetime,
    end: datetime,
    lead: float,
    *,
    pairs: tuple[tuple[str, str], ...] = (),
    endpoint: str | None = None,
) -> Stage:
    return Stage(
        index=index,
        kind=kind,
        issued_at=start - timedelta(seconds=lead),
        start=start,
        deadline=end + timedelta(seconds=DEADLINE_SLACK_SECONDS),
        pairs=pairs,
        endpoint=endpoint,
    )


def _cycle(rng: random.Random, nodes: tuple[str, ...]) -> list[tuple[str, str]]:
    if len(nodes) < 2:
        return []
    order = list(nodes)
    rng.shuffle(order)
    return [(a, order[(i + 1) % len(order)]) for i, a in enumerate(order)]


def _across(
    rng: random.Random, side_a: tuple[str, ...], side_b: tuple[str, ...], most: int
) -> list[tuple[str, str]]:
    """Every node of the larger side to a node of the smaller one and back (the smaller
    side's nodes in turn: `fan` flows each way per node), at most `most` per node."""
    big, small = (side_a, side_b) if len(side_a) >= len(side_b) else (side_b, side_a)
    order_big = rng.sample(big, len(big))
    order_small = rng.sample(small, len(small))
    loaded = order_big[: most * len(small)]
    pairs = [(x, order_small[i % len(small)]) for i, x in enumerate(loaded)]
    return [*pairs, *((y, x) for x, y in pairs)]


def _at(t: datetime, seconds: float) -> datetime:
    return t + timedelta(seconds=seconds)


def _east_west_windows(
    stage: Stage, kind: WindowKind, flows: list[tuple[str, str]], duration: float
) -> tuple[Window, ...]:
    t = stage.start
    pairs = tuple(flows)
    idle = Window(
        id=f"r{stage.index}:idle",
        kind=WindowKind.IDLE,
        stage=stage.index,
        start=t,
        measure_start=t,
        end=_at(t, IDLE_SECONDS),
        flows=pairs,
    )
    start = _at(idle.end, GAP_SECONDS)
    load = Window(
        id=f"r{stage.index}:{kind.value}",
        kind=kind,
        stage=stage.index,
        start=start,
        measure_start=_at(start, WARMUP_SECONDS),
        end=_at(start, WARMUP_SECONDS + duration),
        flows=pairs,
    )
    return idle, load


def _storage_windows(
    stage: Stage, endpoint: str, participants: list[str], rng: random.Random, duration: float
) -> tuple[Window, ...]:
    t = stage.start
    every = Window(
        id=f"s{stage.index}:{endpoint}:all",
        kind=WindowKind.STORAGE,
        stage=stage.index,
        start=t,
        measure_start=_at(t, WARMUP_SECONDS),
        end=_at(t, WARMUP_SECONDS + duration),
        flows=tuple((n, endpoint) for n in participants),
        endpoint=endpoint,
    )
    windows = [every]
    single = min(SINGLE_SECONDS, duration)
    s = _at(every.end, GAP_SECONDS)
    for i, node in enumerate(rng.sample(participants, min(MAX_SINGLE_READS, len(participants)))):
        windows.append(
            Window(
                id=f"s{stage.index}:{endpoint}:single{i}",
                kind=WindowKind.STORAGE_SINGLE,
                stage=stage.index,
                start=s,
                measure_start=_at(s, SINGLE_WARMUP_SECONDS),
                end=_at(s, SINGLE_WARMUP_SECONDS + single),
                flows=((node, endpoint),),
                endpoint=endpoint,
            )
        )
        s = _at(windows[-1].end, GAP_SECONDS)
    return tuple(windows)
