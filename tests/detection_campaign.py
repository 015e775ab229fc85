"""The detection campaign's loop (bench/detection.py runs it, tests/test_detection_campaign.py
a short one): a healthy soak, then faults one at a time, in a seeded random order, each
injected at a seeded random moment of the agents' interval, held, repaired, and scored from
what the product said meanwhile (tests/detection_score.py).

Per injection: wait until nothing is flagged for `quiet_intervals` (bounded; nodes still
flagged then are left out of the injection's wrong namings and noted), wait a random part
of an interval, inject, hold `hold_intervals` (at least the class's own hold), repair, then
settle: until nothing is flagged for `quiet_intervals` again, at most `settle` seconds. What
the product flags up to the end of the settle counts against the injection.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from detection_env import Env, running
from detection_fabric import Layout, build
from detection_faults import CLASSES
from detection_observe import Observer
from detection_score import Injection, Look, Scored, Soak, flagged, quiet, score, soak

QUIET_TIMEOUT: Final = 120.0


@dataclass(frozen=True)
class Plan:
    interval: int = 5
    seed: int = 33
    classes: tuple[str, ...] = tuple(CLASSES)
    injections: int = 2
    soak: float = 180.0
    hold_intervals: float = 6.0
    quiet_intervals: float = 1.0
    settle: float = 90.0
    max_latency_ms: float = 50.0
    max_loss_percent: float = 5.0
    # a busy soak: every `stall_every` seconds one agent, at random, is stopped for
    # `stall_seconds` (SIGSTOP/SIGCONT): a node whose CPU is taken for a moment, no fault
    stall_every: float = 0.0
    stall_seconds: float = 0.15

    def __post_init__(self) -> None:
        unknown = set(self.classes) - set(CLASSES)
        if unknown:
            raise ValueError(f"unknown fault classes {sorted(unknown)}; known: {list(CLASSES)}")


@dataclass
class Outcome:
    plan: Plan
    layout: Layout
    soak: Soak | None = None
    scored: list[Scored] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reprobes: list[float] = field(default_factory=list)  # see `reprobe_cycles`


Log = Callable[[str], None]


def _wait_quiet(observer: Observer, seconds: float, timeout: float) -> Look | None:
    """The first look after `seconds` of nothing flagged; None on timeout."""
    deadline = time.monotonic() + timeout
    since: float | None = None
    while time.monotonic() < deadline:
        last = observer.latest()
        if last is not None:
            if quiet(last):
                since = last.at if since is None else since
                if last.at - since >= seconds:
                    return last
            else:
                since = None
        time.sleep(observer.every)
    return None


@contextlib.contextmanager
def stalls(env: Env, plan: Plan) -> Iterator[list[str]]:
    """While inside: the busy soak's stalls (see `Plan.stall_every`); yields the stalled."""
    stalled: list[str] = []
    stop = threading.Event()
    rng = random.Random(plan.seed + 1)

    def run() -> None:
        while not stop.wait(rng.uniform(0.5, 1.5) * plan.stall_every):
            node = rng.choice(env.fabric.layout.nodes)
            env.signal_agent(node, signal.SIGSTOP)
            time.sleep(plan.stall_seconds)
            env.signal_agent(node, signal.SIGCONT)
            stalled.append(node)

    thread = threading.Thread(target=run, name="stalls", daemon=True)
    if plan.stall_every > 0:
        thread.start()
    try:
        yield stalled
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(10)


def run_soak(env: Env, observer: Observer, plan: Plan, log: Log) -> Soak:
    start = time.monotonic()
    with stalls(env, plan) as stalled:
        time.sleep(plan.soak)
    end = time.monotonic()
    if stalled:
        log(f"busy soak: {len(stalled)} stalls of {plan.stall_seconds:g} s")
    failing = [
        (s.node, check, subject, message, s.started)
        for s in env.tap.since(start)
        for check, subject, status, message in s.bad
        if check.startswith("peer.") and status in ("fail", "error")
    ]
    path_mtu = [(n, sub, msg) for n, check, sub, msg, _ in failing if check == "peer.path_mtu"]
    result = soak(observer.since(start), start, end, len(env.fabric.layout.nodes), path_mtu)
    by_check: dict[str, int] = {}
    for _n, check, *_rest in failing:
        by_check[check] = by_check.get(check, 0) + 1
    log(f"soak {plan.soak:.0f} s: flag events {result.flag_events or 'none'}, "
        f"failing peer results {by_check or 'none'}")  # fmt: skip
    for node, why in result.reasons.items():
        log(f"  {node} flagged: {why}")
    for prober, check, peer, message, started in failing[:20]:
        log(f"  {prober} -> {peer} {check} (cycle at {started % plan.interval:.2f} s of the "
            f"interval): {message}")  # fmt: skip
    return result


def run_injections(env: Env, observer: Observer, plan: Plan, outcome: Outcome, log: Log) -> None:
    rng = random.Random(plan.seed)
    interval = float(plan.interval)
    order = [c for _ in range(plan.injections) for c in rng.sample(plan.classes, len(plan.classes))]
    for i, name in enumerate(order, 1):
        fault = CLASSES[name]
        before = _wait_quiet(observer, plan.quiet_intervals * interval, QUIET_TIMEOUT)
        preflagged = frozenset(flagged(observer.latest() or Look(0, {})))
        if before is None:
            outcome.notes.append(
                f"{name} #{i}: not quiet before it; left out: {sorted(preflagged)}"
            )
        time.sleep(rng.uniform(0, interval))
        target = fault.target(env, rng)
        injected = time.monotonic()
        detail = fault.inject(env, target)
        time.sleep(max(plan.hold_intervals * interval, fault.hold))
        repaired = time.monotonic()
        fault.repair(env, target)
        _wait_quiet(observer, plan.quiet_intervals * interval, plan.settle)
        ended = time.monotonic()
        injection = Injection(name, fault.expect(target), injected, repaired, ended, interval,
                              detail, preflagged)  # fmt: skip
        scored = score(injection, observer.since(injected))
        outcome.scored.append(scored)
        outcome.reprobes += reprobe_cycles(env, injected, repaired, interval)
        log(f"[{i}/{len(order)}] {name} on {target} ({detail}): {describe(scored)}")
        dead = {
            n: rc
            for n, rc in env.dead_agents().items()
            if not (name == "agent_kill" and n == target)
        }
        if dead:
            outcome.notes.append(f"after {name} #{i}: agents exited {dead}")
            for node in dead:
                env.start_agent(node)


def describe(scored: Scored) -> str:
    found = "NOT detected" if scored.ttd is None else f"detected in {scored.ttd:.1f} s"
    if scored.localized is not None:
        found += ", localized" if scored.localized else ", not localized"
    wrong = ", ".join(f"{n} {sorted(w)} +{t:.0f}s" for n, (t, w) in scored.wrong.items())
    clear = "never" if scored.clear_after is None else f"{scored.clear_after:.0f} s"
    return f"{found}; wrong: {wrong or 'none'}; clear after {clear}"


def reprobe_cycles(env: Env, start: float, end: float, interval: float) -> list[float]:
    """For each prober that reported a failing peer between `start` and `end`: the cycles
    from that report to the first later one that probed the peer again next to another
    member of its domain and, across domains, a member of the prober's own (the evidence
    that tells the peer's side, the fabric between and the prober's side apart). Probers
    that never had it: nothing."""
    domain_of = env.fabric.layout.leaf_of
    firsts: dict[tuple[str, str], float] = {}
    found: list[float] = []
    for s in env.tap.since(start):
        if s.at > end:
            break
        probed = {sub for _check, sub, _status, _ in s.peers}
        for (prober, peer), first in list(firsts.items()):
            if prober != s.node or peer not in probed or s.started <= first:
                continue
            same = {p for p in probed if p != peer and domain_of(p) == domain_of(peer)}
            own = {p for p in probed if domain_of(p) == domain_of(s.node)}
            if same and (own or domain_of(peer) == domain_of(s.node)):
                found.append(round((s.started - first) / interval))
                firsts[(prober, peer)] = float("inf")  # counted once
        for check, sub, status, _ in s.peers:
            if status in ("fail", "error") and check != "peer.throughput":
                firsts.setdefault((s.node, sub), s.started)
    return found


@contextlib.contextmanager
def campaign_env(layout: Layout, workdir: Path, plan: Plan) -> Iterator[tuple[Env, Observer]]:
    with contextlib.ExitStack() as stack:
        fabric = build(stack, layout, workdir)
        env = stack.enter_context(
            running(
                fabric,
                interval=plan.interval,
                max_latency_ms=plan.max_latency_ms,
                max_loss_percent=plan.max_loss_percent,
            )
        )
        observer = stack.enter_context(Observer(env.kube, layout.nodes))
        yield env, observer


def run(layout: Layout, workdir: Path, plan: Plan, log: Log = print) -> Outcome:
    outcome = Outcome(plan, layout)
    with campaign_env(layout, workdir, plan) as (env, observer):
        if _wait_quiet(observer, 2 * plan.interval, QUIET_TIMEOUT) is None:
            outcome.notes.append("the fabric was not quiet before the soak")
        if plan.soak > 0:
            outcome.soak = run_soak(env, observer, plan, log)
        run_injections(env, observer, plan, outcome, log)
        env.tap.dump(workdir / "reports.jsonl")
        if observer.errors:
            outcome.notes.append(f"{observer.errors} looks failed")
    return outcome
