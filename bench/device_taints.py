"""Gate the NIC, not the node, at fleet scale: operator memory with 10,000 nodes x 8 NICs
and their ResourceSlices, and the API writes when 1 % of the NICs fail at once.

    python bench/device_taints.py [--nodes 10000] [--rails 8]

Three sides, each in its own process, on the same fleet (one NetworkValidation: taint on,
maxUnhealthyPercent 10, recoveryReports 3; every Node labelled `healthy` and carrying
NetworkFabricReady True, as a settled fleet does):

- *no nics*: the agents' reports without the `nics` section (an older agent): node-level
  gating as before;
- *node path*: reports with `nics` (8 NICs, 16 results each), `deviceTaints` off;
- *device taints*: the same with `deviceTaints: true`, `maxFailedDevicesPerNode: 1`, and
  dranet's ResourceSlice of every node (8 devices, the 15 attributes dranet publishes for a
  ConnectX rail) parsed from JSON and indexed as the watch does.

Each prints the RSS the state holds above the process's baseline (after the reports, after
the slices; full collection and malloc_trim first), the slices' JSON size and what the
index keeps. Then 1 % of the NICs fail at once (800 of 80,000), spread one per node, and,
in a second run, drawn at random (some nodes get two: node-level with k = 1): one gating
round plans the changes (timed), every change is written through the operator's own write
code against a stand-in that counts the requests (bench/dra_fleet.py), and the next rounds
must plan nothing (`steady ms`: the median of five such rounds, what every status window
costs). `drain` is how long the paced queue takes at the default 20 writes/s.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from node_watch_memory import run_child

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, ctypes, gc, json, random, sys, time
from collections import Counter
from datetime import UTC, datetime
from dra_fleet import RAILS, Counting, report, slice_json
import dra_fleet
from netval.model.spec import NetworkValidationSpec
from netval.operator.devices.slice_watch import SliceWatch
from netval.operator.devices.slices import SliceIndex
from netval.operator.gating.node_writer import NodeGating
from netval.operator.settings import operator_settings_from_env
from netval.operator.state.store import Store
from netval.operator.status.events import Events
import dataclasses

size, side, spread = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "spread"
dra_fleet.RAILS = RAILS = int(sys.argv[4])

def rss_kib():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")

devices = side == "devices"
names = [f"gpu-{i:05d}" for i in range(size)]
store = Store(label_keys={"fleet"})
passing = {"type": "NetworkFabricReady", "status": "True", "reason": "ChecksPassing",
           "message": "pool: fabric checks passing"}
for n in names:
    store.on_node(n, {"fleet": "a", "netval.io/fabric": "healthy"}, [], [dict(passing)])
gating_spec = {"taint": True, "maxUnhealthyPercent": 10, "recoveryReports": 3}
if devices:
    gating_spec.update(deviceTaints=True, maxFailedDevicesPerNode=1)
spec = NetworkValidationSpec.model_validate({"nodeSelector": {"fleet": "a"}, "interval": "60s",
                                             "gating": gating_spec})
store.upsert_validation("pool", generation=1, spec=spec,
                        body={"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
                              "metadata": {"name": "pool", "uid": "u"}}, status=None)
store.expected_validations = {"pool"}
base = rss_kib()
def strip(r):
    return r.model_copy(update={"nics": None}) if side == "nonics" else r
for n in names:
    store.ingest_report(strip(report(n)), False)
after_reports = rss_kib()
index = None
slice_bytes = 0
index_mib = 0.0
if devices:
    import tracemalloc
    from netval.operator.devices.drivers import DRANET
    index = SliceIndex({"dra.net": DRANET})
    texts = [slice_json(n, seq) for seq, n in enumerate(names)]
    slice_bytes = sum(map(len, texts))
    gc.collect()
    tracemalloc.start()
    held = tracemalloc.get_traced_memory()[0]
    for text in texts:  # as the watch hands them over: parsed, trimmed, the object dropped
        index.upsert(json.loads(text))
    gc.collect()
    index_mib = (tracemalloc.get_traced_memory()[0] - held) / 2**20
    tracemalloc.stop()
    del texts
after_slices = rss_kib()

nodes = {n: {"metadata": {"name": n, "resourceVersion": "1",
                           "labels": {"fleet": "a", "netval.io/fabric": "healthy"}},
             "spec": {}, "status": {"conditions": [dict(passing)]}} for n in names}
kube = Counting(nodes)
settings = dataclasses.replace(operator_settings_from_env({"NETVAL_MQTT_URL": "mqtt://x:1883"}),
                               device_taints=devices)
gating = NodeGating(settings, kube, store, Events(kube, store))
if devices:
    stage = gating.devices
    stage.index = index
    stage.version = stage.slices_version = "v1"
    stage.watch = SliceWatch(kube, index, "v1")
    stage.watch.synced.set()
    stage.known, stage.listed_at = {}, time.monotonic()

async def settle():
    await gating.apply(datetime.now(UTC))
    return len(gating.queue.pending)

async def fail_and_write():
    rng = random.Random(1)
    count = size * RAILS // 100
    if spread:
        chosen = {(names[i * size // count], 3) for i in range(count)}
    else:
        chosen = set()
        while len(chosen) < count:
            chosen.add((rng.choice(names), rng.randrange(RAILS)))
    by_node = {}
    for n, nic in chosen:
        by_node.setdefault(n, set()).add(nic)
    for n, nics in by_node.items():
        store.ingest_report(strip(report(n, frozenset(nics))), False)
    t0 = time.perf_counter()
    await gating.apply(datetime.now(UTC))
    round_ms = (time.perf_counter() - t0) * 1000
    planned = list(gating.queue.pending.values())
    kinds = Counter(type(c).__name__ for c, _ in planned)
    kinds.update(f"{type(c).__name__}:{'excludes' if c.excludes else 'includes'}"
                 for c, _ in planned)
    for change, _ in planned:
        assert await gating._write(change)
    gating.queue.reconcile({})
    steady = []
    for _ in range(5):  # the rounds after: nothing to write, what each costs
        t0 = time.perf_counter()
        await gating.apply(datetime.now(UTC))
        steady.append((time.perf_counter() - t0) * 1000)
    after = len(gating.queue.pending)
    verdict = store.states["pool"].verdict
    return {"nics_failing": count, "nodes_hit": len(by_node),
            "two_or_more": sum(1 for v in by_node.values() if len(v) > 1),
            "round_ms": round(round_ms, 1), "steady_ms": round(sorted(steady)[2], 1),
            "changes": dict(kinds),
            "requests": {f"{v} {r}": c for (v, r), c in sorted(kube.requests.items())},
            "writes": sum(c for (v, _), c in kube.requests.items() if v != "GET"),
            "drain_s": round(len(planned) / settings.node_writes_per_second, 1),
            "next_round": after, "excluded": len(verdict.excluded),
            "tainted_nics": verdict.tainted_devices}

settled = asyncio.run(settle())
result = asyncio.run(fail_and_write())
print(json.dumps({"side": side, "state_mib": round((after_reports - base) / 1024, 1),
                  "slices_mib": round((after_slices - after_reports) / 1024, 1),
                  "slice_json_mib": round(slice_bytes / 2**20, 1),
                  "index_mib": round(index_mib, 2),
                  "index_devices": index.devices if index is not None else 0,
                  "settled_changes": settled, **result}))
"""


def side(nodes: int, name: str, spread: bool, rails: int) -> dict[str, Any]:
    return run_child(CHILD, [ROOT / "src", ROOT / "bench"], nodes, name,
                     "spread" if spread else "random", rails)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rails", type=int, default=8)
    args = parser.parse_args()
    print(f"{args.nodes} nodes x {args.rails} NICs; 1 % of the NICs fail at once")
    head = (f"{'side':14} {'spread':7} {'state MiB':>9} {'slices MiB':>10} {'round ms':>8} "
            f"{'steady ms':>9} "
            f"{'changes':>7} {'writes':>6} {'drain s':>7} {'excluded':>8} {'NIC rules':>9} "
            "next  requests")  # fmt: skip
    print(head)
    for spread in (True, False):
        for name in ("nonics", "nodepath", "devices"):
            r = side(args.nodes, name, spread, args.rails)
            changes = sum(v for k, v in r["changes"].items() if ":" not in k)
            label = {"nonics": "no nics", "nodepath": "node path", "devices": "device taints"}
            print(f"{label[name]:14} {'spread' if spread else 'random':7} {r['state_mib']:9} "
                  f"{r['slices_mib']:10} {r['round_ms']:8} {r['steady_ms']:9} {changes:7} "
                  f"{r['writes']:6} "
                  f"{r['drain_s']:7} {r['excluded']:8} {r['tainted_nics']:9} "
                  f"{r['next_round']:4}  {r['requests']}")  # fmt: skip
            if name == "devices":
                print(
                    f"{'':14} slices: {r['slice_json_mib']} MiB of JSON, "
                    f"{r['index_devices']} devices kept in {r['index_mib']} MiB (traced); "
                    f"{r['nodes_hit']} nodes hit, "
                    f"{r['two_or_more']} with 2+ failing NICs; changes {r['changes']}"
                )


if __name__ == "__main__":
    main()
