"""Detection quality as a measured contract: inject faults into a namespace fabric one at a
time and score what netval says (issue 33; method and figures: docs/detection.md).

Run as root from the repository root (mosquitto, iproute2, nftables, iperf3 installed):

    python bench/detection.py                          # every class twice, a 3-minute soak
    python bench/detection.py --soak 1800 --injections 0       # a 30-minute healthy soak
    python bench/detection.py --classes port_down,mtu_blackhole --injections 5 --seed 7
    python bench/detection.py --soak 300 --injections 0 --stall-every 2   # a busy soak
    python bench/detection.py --compare before.json after.json    # two runs side by side

What runs (tests/detection_*.py): 2 leaves x 4 nodes and a spine of network namespaces, the
real `netval operator` process against the test Kubernetes API, a real `netval agent` per
node (recorded RDMA /sys trees for configuration faults), Mosquitto over TLS. Each fault is
held `--hold-intervals` intervals, repaired, and scored from the validation's status and the
Nodes' labels and taints: detected (the right node or link named with the check the docs
give), time to detect, localized (link faults), wrong namings (anything else flagged).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from detection_campaign import Outcome, Plan, run
from detection_fabric import Layout
from detection_faults import CLASSES
from detection_score import GOALS, ClassRow, Scored, percentile, table, total

# the goal's "link and configuration faults": a fault of a port or an uplink, or of a node's
# configuration (the agent faults are liveness, latency and fail-slow performance)
LINK_AND_CONFIG = {"port_down", "flap", "port_loss", "uplink_loss", "mtu_blackhole",
                   "ecn_np_off", "pfc_off", "roce_v1", "mtu_1500"}  # fmt: skip


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def link_config_p99(scored: list[Scored]) -> float | None:
    return percentile(
        [s.ttd for s in scored if s.fault in LINK_AND_CONFIG and s.ttd is not None], 99
    )


def render(outcome: Outcome) -> str:
    plan, layout = outcome.plan, outcome.layout
    rows = table(outcome.scored)
    lines = [
        f"fabric {layout.leaves} leaves x {layout.per_leaf} nodes, interval {plan.interval} s, "
        f"seed {plan.seed}, hold {plan.hold_intervals:g} intervals",
        "",
        f"{'fault class':<14} {'inj':>3} {'det':>3} {'recall':>7} {'precision':>9} "
        f"{'wrong':>5} {'TTD p50':>8} {'TTD p99':>8} {'p99/int':>7} {'localized':>9} "
        f"{'clear p50':>9} {'never':>5}",
    ]

    def line(r: ClassRow) -> str:
        j = r.as_json(plan.interval)
        return (
            f"{r.fault:<14} {r.injections:>3} {r.detected:>3} {_pct(r.recall):>7} "
            f"{_pct(r.precision):>9} {r.wrong:>5} {_s(j['ttdP50Seconds']):>8} "
            f"{_s(j['ttdP99Seconds']):>8} {j['ttdP99Intervals'] or '-':>7} "
            f"{_pct(j['localized']):>9} {_s(j['clearP50Seconds']):>9} {j['neverClear']:>5}"
        )

    lines += [line(r) for r in rows]
    if rows:
        lines.append(line(total(rows)))
    lines.append(
        f"{'goal':<14} {'':>3} {'':>3} {_pct(GOALS['recall']):>7} "
        f">={_pct(GOALS['precision']):>7} {'':>5} {'':>8} {'':>8} "
        f"<={GOALS['ttd_p99_intervals']:g}{'':>3} >={_pct(GOALS['localized']):>7}"
        "   (TTD: link and configuration faults)"
    )
    if any(r.fault in LINK_AND_CONFIG for r in rows):
        p99 = link_config_p99(outcome.scored)
        lines.append(f"link and configuration faults: TTD p99 {_s(p99)} = "
                     f"{'-' if p99 is None else f'{p99 / plan.interval:.2f}'} intervals")  # fmt: skip
    if outcome.soak is not None:
        s = outcome.soak
        lines.append(
            f"healthy soak {s.seconds:.0f} s x {s.nodes} nodes: false positives "
            f"{sum(s.flag_events.values())} ({s.fp_per_node_hour:.2f} per node-hour, goal "
            f"{GOALS['soak_fp_per_node_hour']:g}); peer.path_mtu failures "
            f"{len(s.path_mtu_failures)}"
        )
    if outcome.reprobes:
        lines.append(
            f"a failing peer probed again next to witnesses (another of its domain, one of the "
            f"prober's own) after p50 {percentile(outcome.reprobes, 50):g} / max "
            f"{max(outcome.reprobes):g} cycles ({len(outcome.reprobes)} prober-peer pairs)"
        )
    lines += [f"note: {n}" for n in outcome.notes]
    return "\n".join(lines)


def as_json(outcome: Outcome) -> dict[str, object]:
    plan, rows = outcome.plan, table(outcome.scored)
    soak = outcome.soak
    return {
        "plan": {**vars(plan), "classes": list(plan.classes)},
        "fabric": {"leaves": outcome.layout.leaves, "perLeaf": outcome.layout.per_leaf},
        "classes": [r.as_json(plan.interval) for r in rows],
        "total": total(rows).as_json(plan.interval) if rows else None,
        "goals": GOALS,
        "soak": None if soak is None else {
            "seconds": round(soak.seconds, 1), "nodes": soak.nodes,
            "flagEvents": soak.flag_events, "fpPerNodeHour": round(soak.fp_per_node_hour, 3),
            "pathMtuFailures": [list(f) for f in soak.path_mtu_failures],
        },
        "linkConfigTtdP99Seconds": link_config_p99(outcome.scored),
        "reprobeCycles": outcome.reprobes,
        "injections": [s.as_json() for s in outcome.scored],
        "notes": outcome.notes,
    }  # fmt: skip


def _cell(row: dict[str, Any] | None, key: str, pct: bool = False) -> str:
    value = None if row is None else row.get(key)
    if value is None:
        return "-"
    return f"{100 * value:.0f} %" if pct else f"{value:g}"


def compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Two runs' JSON side by side, as a Markdown table (before / after in each cell)."""
    rows_b = {r["fault"]: r for r in before["classes"]}
    rows_a = {r["fault"]: r for r in after["classes"]}
    columns = [("injections", "injections", False), ("detected", "detected", False),
               ("recall", "recall", True), ("precision", "precision", True),
               ("wrong", "wrongNamings", False), ("TTD p50 s", "ttdP50Seconds", False),
               ("TTD p99 s", "ttdP99Seconds", False), ("localized", "localized", True),
               ("clear p50 s", "clearP50Seconds", False), ("never clear", "neverClear", False)]  # fmt: skip
    lines = ["| class | " + " | ".join(c for c, _, _ in columns) + " |",
             "| --- |" + " ---: |" * len(columns)]  # fmt: skip
    total = [("all classes", before.get("total"), after.get("total"))]
    for name, b, a in [(f, rows_b.get(f), rows_a.get(f)) for f in {**rows_b, **rows_a}] + total:
        cells = [f"{_cell(b, k, p)} / {_cell(a, k, p)}" for _, k, p in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    soaks = [run.get("soak") or {} for run in (before, after)]
    lines.append("")
    lines.append(
        "healthy soak: " + " / ".join(
            f"{s.get('seconds', 0):.0f} s, {sum((s.get('flagEvents') or {}).values())} false "
            f"positives ({s.get('fpPerNodeHour', '-')} per node-hour), "
            f"{len(s.get('pathMtuFailures') or [])} peer.path_mtu failures"
            for s in soaks
        )
    )  # fmt: skip
    p99s = [
        percentile([i["ttdSeconds"] for i in run["injections"]
                    if i["fault"] in LINK_AND_CONFIG and i["ttdSeconds"] is not None], 99)
        for run in (before, after)
    ]  # fmt: skip
    lines.append("link and configuration faults, TTD p99: " + " / ".join(_s(p) for p in p99s))
    re = [sorted(run.get("reprobeCycles") or []) for run in (before, after)]
    lines.append(
        "failing peer probed again next to witnesses after (cycles, p50 / max): " + " / ".join(
            f"{percentile(r, 50):g} / {max(r):g}" if r else "-" for r in re
        )
    )  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--classes", default=",".join(CLASSES),
                        help=f"comma-separated, of: {', '.join(CLASSES)}")  # fmt: skip
    parser.add_argument("--injections", type=int, default=2, help="per class")
    parser.add_argument("--soak", type=float, default=180.0, help="healthy soak, seconds")
    parser.add_argument("--interval", type=int, default=5, help="the agents' interval, s (>= 5)")
    parser.add_argument(
        "--stall-every",
        type=float,
        default=0.0,
        help="busy soak: stop one agent at random for --stall-seconds about "
        "this often (seconds; 0: no stalls)",
    )
    parser.add_argument("--stall-seconds", type=float, default=0.15)  # fmt: skip
    parser.add_argument("--hold-intervals", type=float, default=6.0)
    parser.add_argument("--settle", type=float, default=90.0)
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--per-leaf", type=int, default=4)
    # the emulated ports queue up to ~7 ms behind a throughput sample, and the agents share
    # two cores with everything else: the latency fault adds ~100 ms
    parser.add_argument("--max-latency-ms", type=float, default=50.0)
    parser.add_argument("--max-loss-percent", type=float, default=5.0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="print two runs' --json side by side and exit")  # fmt: skip
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        print(compare(before, after))
        return 0
    # stopped by a signal, the namespaces, agents, broker and operator are still torn down
    # (a background shell starts us with SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    plan = Plan(
        interval=args.interval, seed=args.seed,
        classes=tuple(c for c in args.classes.split(",") if c), injections=args.injections,
        soak=args.soak, hold_intervals=args.hold_intervals, settle=args.settle,
        max_latency_ms=args.max_latency_ms, max_loss_percent=args.max_loss_percent,
        stall_every=args.stall_every, stall_seconds=args.stall_seconds,
    )  # fmt: skip
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="netval-detection-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"logs in {workdir}", flush=True)
    started = time.monotonic()
    outcome = run(Layout(args.leaves, args.per_leaf), workdir, plan,
                  log=lambda line: print(line, flush=True))  # fmt: skip
    print(f"\n{render(outcome)}\n(campaign {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(as_json(outcome), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
