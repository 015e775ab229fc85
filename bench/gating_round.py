"""What one node-gating round costs at fleet scale, before/after, side by side.

    python bench/gating_round.py [--rounds 15] [--nodes 1000 10000] [--before REV|SRC_DIR]

A gating round is what the node writer does every status window: read every targeted
node's state at `now` and decide its `netval.io/fabric` label and taint (the breaker, the
hysteresis), then plan the Node writes. *after* is this tree: the node verdict
(`gating.facts.node_facts` + `gating.verdict.decide`, one function for every consumer) and
`plan_changes`. *before* is the code at `--before` (default: the merge base with `main`,
extracted with `git archive`; or a `src/` directory): `gating_input` (`node_health` per
node) + `decide_taints` + `decide_labels` + `merge_labels` + `plan_changes`.

Each side runs in its own process with its `src/` first on the path, on the same fleet: a
`Store` with one NetworkValidation (taints on, maxUnhealthyPercent 10 %, recoveryReports 3)
and every node's report (one result; 1 %, 9 % or 30 % failing, spread over the fleet)
ingested as the MQTT ingest hands it over. It prints per fleet the median wall time of a
round on a previously healthy pool (Node labels `healthy`, no taint; the round's writes are
applied between rounds, so the first round plans the transition and the later ones find
nothing to do, the steady state), the writes the first round plans and those of the round
after (0: stable). Pure CPU: no broker, no Kubernetes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

# bench/ is on the path: a `git archive` of src/, a side in its own process
from node_watch_memory import extract, merge_base, run_child

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, statistics, sys, time
from datetime import UTC, datetime, timedelta
from netval.model import CheckId, CheckResult, NetworkValidationSpec, Report, Status
from netval.operator.gating import decisions as gating
from netval.operator.state.store import Store

size, percent, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
names = [f"node-{i:05d}" for i in range(size)]
count = size * percent // 100
bad = {names[i * size // count] for i in range(count)}
store = Store(label_keys={"fleet"})
for n in names:
    store.on_node(n, {"fleet": "a", "netval.io/fabric": "healthy"})
spec = NetworkValidationSpec.model_validate({"nodeSelector": {"fleet": "a"}, "interval": "60s",
    "gating": {"taint": True, "maxUnhealthyPercent": 10, "recoveryReports": 3}})
state = store.upsert_validation("pool", generation=1, spec=spec, body={}, status=None)
store.expected_validations = {"pool"}
started = datetime.now(UTC) - timedelta(seconds=1)
for n in names:
    failing = n in bad
    result = CheckResult(check=CheckId.MTU_INTERFACE, subject="ens1np0",
                         status=Status.FAIL if failing else Status.PASS,
                         message="MTU 1500, expected 9000" if failing else "MTU 9000",
                         observed={"mtu": 1500 if failing else 9000}, expected={"mtu": 9000})
    store.ingest_report(Report(validation="pool", generation=1, node=n, started_at=started,
                               duration_ms=2.0, status=result.status, results=[result]), False)

try:
    from netval.operator.gating.facts import node_facts, policy
    from netval.operator.gating.verdict import decide

    def one_round(now):
        decisions = decide([(policy("pool", spec), node_facts(state, store.node_fabric, now))])
        state.verdict = decisions.verdicts["pool"]
        return gating.plan_changes(store.node_fabric, decisions.labels, decisions.tainted)
    side = "verdict"
except ImportError:
    from netval.operator.gating.node_writer import gating_input

    def one_round(now):
        nodes = store.node_fabric
        v = gating_input("pool", state, spec, now)
        taints = gating.decide_taints(v, [n for n, (_, t) in nodes.items() if t])
        labels = gating.decide_labels(v, {n: label for n, (label, _) in nodes.items()},
                                      taints.tainted)
        return gating.plan_changes(nodes, gating.merge_labels([(v, labels)]), taints.tainted)
    side = "decisions"

times, first, then = [], None, None
for i in range(rounds):
    now = datetime.now(UTC)
    t = time.perf_counter()
    changes = one_round(now)
    times.append(time.perf_counter() - t)
    if first is None:
        first = len(changes)
    elif then is None:
        then = len(changes)
    for c in changes:  # the writes land: the Node watch reports them back
        store.node_fabric[c.node] = (c.label.value if c.label is not None else None, c.taint)
print(json.dumps({"side": side, "first_ms": times[0] * 1000,
                  "median_ms": statistics.median(times) * 1000, "writes": first, "then": then}))
"""


def run_side(src: Path, size: int, percent: int, rounds: int) -> dict[str, Any]:
    return run_child(CHILD, [src], size, percent, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument(
        "--before", default=None, help="git revision or src/ directory (default: merge-base main)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.before is not None and Path(args.before).is_dir():
            before_src, label = Path(args.before), args.before
        else:
            rev = args.before or merge_base()
            before_src, label = extract(rev, Path(tmp)), rev[:10]
        print(f"before: {label}; after: this tree; median of {args.rounds} rounds")
        print(f"{'nodes':>6} {'failing':>7} {'before ms':>9} {'after ms':>9} {'ratio':>6} "
              f"{'1st before':>10} {'1st after':>9} {'writes':>6} {'then':>4}")  # fmt: skip
        for size in args.nodes:
            for percent in (1, 9, 30):
                old = run_side(before_src, size, percent, args.rounds)
                new = run_side(ROOT / "src", size, percent, args.rounds)
                ratio = new["median_ms"] / old["median_ms"] if old["median_ms"] else float("nan")
                print(
                    f"{size:>6} {percent:>6}% {old['median_ms']:>9.1f} {new['median_ms']:>9.1f}"
                    f" {ratio:>6.2f} {old['first_ms']:>10.1f} {new['first_ms']:>9.1f}"
                    f" {new['writes']:>6} {new['then']:>4}"
                )


if __name__ == "__main__":
    main()
