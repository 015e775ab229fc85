"""The operator's in-memory state for 10,000 / 30,000 / 100,000 nodes (issue 23: under 1 GiB).

    python bench/state_memory.py                      # 10,000 / 30,000 / 100,000 nodes
    python bench/state_memory.py --nodes 100000 --top 15
    python bench/state_memory.py --no-trace --src /tmp/before/src   # another revision's src/

Each size runs twice, each time in a fresh process: once for the RSS (no tracing), once
under tracemalloc (what Python allocated, and the biggest holders by source line). The process
builds what the operator holds for a fleet, as the operator builds it: a `Store` with one
NetworkValidation (default spec, one nodeSelector label) targeting every node, every Node
through `Store.on_node` (its labels, the fabric label), and every node's report as the MQTT
ingest hands it over: the JSON bytes of a realistic report (bench/ingest.py's: 40 results of a
2-NIC RoCE node with one storage endpoint and one peer; 1 % of nodes failing a check, 1 %
warning) decoded by `decode_message` and given to `Store.ingest_report` (judgement, the
consistency fingerprints, the node record). Then one status computation (what the writer
keeps as `previous`), one node verdict (what a gating round keeps) and one beat per node
(`Store.ingest_beat`),
so the per-node bookkeeping of all three is in. Not included: Kopf's own caches (the
NetworkValidation bodies, O(validations)), the Node watch's transient objects
(bench/node_watch_memory.py measures those), the interpreter and imports (the baseline).

Printed per size: RSS of the process after a full collection and `malloc_trim`, above the
baseline taken before the first node (imports, the report template), per node, the whole
process's RSS (baseline included: what a pod limit must hold, Kopf and the MQTT client aside),
the peak above the baseline, and with tracing the traced bytes and the top holders.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_NODES: Final = (10_000, 30_000, 100_000)
TARGET_BYTES: Final = 1 << 30  # 1 GiB at 100,000 nodes
MIB: Final = 1 << 20

CHILD = r"""
import ctypes, gc, json, resource, sys, tracemalloc
from datetime import UTC, datetime, timedelta
from ingest import build_report, node_name, split_template, stamp, POOL_LABEL
from netval.model.beat import Beat, report_digest
from netval.model.spec import NetworkValidationSpec
from netval.operator.gating.facts import verdict_of
from netval.operator.ingest.decode import BeatMessage, decode_message
from netval.operator.state.store import Store
from netval.operator.status.compute import validation_status

nodes, trace, top = int(sys.argv[1]), sys.argv[2] == "trace", int(sys.argv[3])
VALIDATION = build_report(0, 1, 1.0).validation

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")

def settle():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)

# one template per kind of node (build_report: 1 in 100 fails, 1 in 100 warns), the node name
# swapped in: the bytes differ per node as on the wire, so decoding gives each node its own
# strings, as the real ingest does
templates = {}
for i, kind in ((0, "fail"), (50, "warn"), (1, "pass")):
    r = build_report(i, nodes, 1.0)
    templates[kind] = (split_template(r), r.node.encode())
pool_key, pool_value = POOL_LABEL
store = Store(label_keys={pool_key: pool_value})
spec = NetworkValidationSpec.model_validate({"nodeSelector": {pool_key: pool_value}})
state = store.upsert_validation(VALIDATION, generation=1, spec=spec, body={}, status=None)
settle()
base = rss_kib()
if trace:
    tracemalloc.start(1)
now = datetime.now(UTC)
started = (now - timedelta(seconds=5)).timestamp()
for i in range(nodes):
    name = node_name(i)
    store.on_node(name, {pool_key: pool_value, "netval.io/fabric": "healthy",
                         "kubernetes.io/hostname": name})
for i in range(nodes):
    name = node_name(i)
    kind = "fail" if i % 100 == 0 else "warn" if i % 100 == 50 else "pass"
    (prefix, suffix), template_node = templates[kind]
    payload = stamp(prefix, suffix, started).replace(template_node, name.encode())
    report = decode_message(f"netval/v1/{VALIDATION}/{name}/report", payload, now=now)
    if type(report).__name__ != "Report":
        raise SystemExit(f"report of {name} not decoded: {report}")
    store.ingest_report(report, False)
    digest = report_digest(report)
    beat = Beat(seq=2, cycle_at=now, digest=digest, worst=report.status)
    store.ingest_beat(BeatMessage(VALIDATION, name, beat), False)
status = validation_status(state, spec, node_labels=store.node_labels, previous=None,
                           now=datetime.now(UTC))
store.previous[VALIDATION] = status
state.verdict = verdict_of(VALIDATION, state, spec, store.node_fabric, datetime.now(UTC))
assert len(state.targeted) == nodes and len(state.nodes) == nodes, (len(state.targeted), len(state.nodes))
settle()
out = {"nodes": nodes, "rss_kib": rss_kib() - base, "peak_kib": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss - base, "base_kib": base,
    "status_bytes": len(status.model_dump_json(by_alias=True, exclude_none=True)),
    "failing": status.nodes.failing}
if trace:
    snap = tracemalloc.take_snapshot()
    out["traced"] = tracemalloc.get_traced_memory()[0]
    out["top"] = [(str(s.traceback[0]), s.size, s.count)
                  for s in snap.statistics("lineno")[:top]]
print(json.dumps(out))
"""


def run(nodes: int, trace: bool, top: int, src: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT / "bench")])}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(nodes), "trace" if trace else "rss", str(top)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"child for {nodes} nodes failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=list(DEFAULT_NODES))
    parser.add_argument("--top", type=int, default=10, help="holders listed under tracing")
    parser.add_argument("--no-trace", action="store_true", help="RSS only (faster)")
    parser.add_argument(
        "--src",
        type=Path,
        default=ROOT / "src",
        help="the netval sources to measure (before/after)",
    )
    args = parser.parse_args()
    print(
        "| nodes | state RSS (MiB) | per node (KiB) | process RSS (MiB) | peak above baseline"
        " (MiB) | traced (MiB) | status (KiB) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst_at_target = 0
    tops: list[tuple[int, list[Any]]] = []
    for n in args.nodes:
        rss = run(n, False, 0, args.src)
        traced = run(n, True, args.top, args.src) if not args.no_trace else None
        if traced is not None:
            tops.append((n, traced["top"]))
        print(
            f"| {n:,} | {rss['rss_kib'] / 1024:,.0f} | {rss['rss_kib'] / n:,.2f} |"
            f" {(rss['rss_kib'] + rss['base_kib']) / 1024:,.0f} |"
            f" {rss['peak_kib'] / 1024:,.0f} |"
            f" {traced['traced'] / MIB if traced else float('nan'):,.0f} |"
            f" {rss['status_bytes'] / 1024:,.1f} |",
            flush=True,
        )
        if n >= 100_000:
            worst_at_target = max(worst_at_target, rss["rss_kib"] * 1024)
    for n, top in tops:
        print(f"\nbiggest holders at {n:,} nodes (tracemalloc, by line):")
        for where, size, count in top:
            print(f"  {size / MIB:8.1f} MiB {count:>9,} blocks  {where}")
    if worst_at_target > TARGET_BYTES:
        print(f"\nover the target: {worst_at_target / MIB:,.0f} MiB > 1 GiB", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
