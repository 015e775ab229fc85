"""What finding the Events of a status write costs at fleet scale, and how many it posts.

    python bench/event_transitions.py [--nodes 10000] [--rounds 20]

For NODES targeted nodes, each with a stored report (1% failing one check), it prints the
median wall time of `observe` + `diff` + `admit` (what the status writer runs after each
write, on the operator's event loop) in the steady state (nothing changed), and for the
worst batch: every node failing, then every node stale at once (a broker outage), with
the number of Events that batch posts (the rate cap's 10 plus one summary). Pure CPU: no
broker, no Kubernetes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult, Report
from netval.operator.state.validation import (
    ValidationState,
    ingest_report,
    node_offline,
    set_spec,
    set_targeted,
)
from netval.operator.status.event_budget import Budget, admit
from netval.operator.status.transitions import Known, diff, observe

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def report(node: str, fail: bool) -> Report:
    status = Status.FAIL if fail else Status.PASS
    return Report(
        validation="fabric",
        generation=1,
        node=node,
        started_at=T0,
        duration_ms=800,
        status=status,
        results=[
            CheckResult(check=CheckId.MTU_INTERFACE, subject="ens1np0", status=status, message="m")
        ],
    )


def fleet(n: int, failing_every: int) -> ValidationState:
    state = ValidationState(name="fabric")
    set_spec(state, generation=1, interval_seconds=30.0)
    nodes = [f"gpu-{i:05d}" for i in range(n)]
    set_targeted(state, nodes, T0)
    for i, node in enumerate(nodes):
        ingest_report(state, report(node, i % failing_every == 0), T0 + timedelta(seconds=1))
    return state


def one_write(state: ValidationState, known: dict[str, Known], budget: Budget, at: float) -> int:
    transitions, known_after = diff(known, observe(state, T0 + timedelta(seconds=2)))
    known.clear()
    known.update(known_after)
    admitted = admit(budget, transitions, at)
    return len(admitted.post) + (admitted.summary is not None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    n = args.nodes

    state = fleet(n, 100)
    known: dict[str, Known] = {}
    one_write(state, known, Budget(), 0.0)
    steady = []
    for r in range(args.rounds):
        start = time.perf_counter()
        one_write(state, known, Budget(), float(r))
        steady.append(time.perf_counter() - start)
    print(f"{n} nodes, 1% failing, nothing changed: {statistics.median(steady) * 1e3:.1f} ms")

    outage, posted = [], []
    for _ in range(max(args.rounds // 4, 3)):
        state = fleet(n, 1)
        known, budget = {}, Budget()
        first = one_write(state, known, budget, 0.0)
        for node in state.targeted:
            node_offline(state, node, T0 + timedelta(seconds=2))
        start = time.perf_counter()
        posted.append((first, one_write(state, known, budget, 100.0)))
        outage.append(time.perf_counter() - start)
    failing, stale = posted[0]
    print(
        f"{n} nodes failing at once: {failing} Events; then all stale at once:"
        f" {statistics.median(outage) * 1e3:.1f} ms, {stale} Events"
    )


if __name__ == "__main__":
    main()
