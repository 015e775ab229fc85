"""Publishing a load-test stage's plans through the operator's real path, to a real broker.

Run from the repository root (mosquitto must be installed):

    python bench/loadtest_publish.py [--runs 3] [--nodes 1000 10000]

The operator publishes a stage's plans (one retained QoS 1 message per node) when the
stage's `issuedAt` comes, `stage_lead_seconds` (5 s up to 5,000 nodes, 1 ms per node above) before the stage
starts: they must all be on the broker by then. What runs, per N: a real Mosquitto with the chart's limits
(tests/mosquitto.py CHART_LIMITS), the operator's `ReportIngest` (its aiomqtt connection,
subscribed as in production) holding N agents' assignments (retained, published first),
and, per run, what the coordinator does at a stage's issue time (`runner._advance`):
`build_plans(plan, stage, ...)`, each plan encoded, `set_retained(..., group=run)`; then
the ingest's connection task publishes them. Timed per run (medians over --runs, a cross
round of leaves of 32, every node announced an endpoint):

- build: the plans and their JSON (the coordinator's tick, in the event loop);
- publish: from the start of the build until the broker acknowledged every plan (PUBACK).

Both must fit in the stage's lead (the `lead` column). `--window 1` publishes one at a time
(awaiting each acknowledgement: the operator's path before `publish_window`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mosquitto  # type: ignore[import-not-found]  # tests/mosquitto.py: the tests' broker
from loadtest_plan import candidates, settings  # type: ignore[import-not-found]

VALIDATION = "pool"  # loadtest_plan.settings()' validation


async def until(check: Callable[[], bool], what: str, limit: float = 300.0) -> float:
    started = time.perf_counter()
    while not check():
        if time.perf_counter() - started > limit:
            raise TimeoutError(what)
        await asyncio.sleep(0.002)
    return time.perf_counter() - started


async def bench(n: int, runs: int, window: int, workdir: Path) -> dict[str, Any]:
    from netval.infra.mqtt_settings import MqttSettings
    from netval.model.loadplan import encode
    from netval.model.topics import TopicKind, topic
    from netval.operator.ingest import publish_window
    from netval.operator.ingest.subscriber import ReportIngest

    publish_window.publish_all.__defaults__ = (window,)  # what the ingest's passes use
    from netval.operator.loadtest.plan import RunPlan, WindowKind, plan_run, stage_lead_seconds
    from netval.operator.loadtest.tasks import build_plans

    broker = mosquitto.MosquittoBroker(workdir, extra_config=mosquitto.CHART_LIMITS)
    broker.start()
    try:
        mqtt = MqttSettings(host=broker.host, port=broker.port, username=broker.username,
                            password=broker.password, client_id="netval-operator-bench")  # fmt: skip
        ingest = ReportIngest(
            mqtt, on_report=lambda r, retained: None, on_state=lambda s: None,
            on_load_result=lambda v, node, payload: None,
        )  # fmt: skip
        task = asyncio.create_task(ingest.run())
        await asyncio.wait_for(ingest.synced.wait(), 30)
        cands = candidates(n, 32)
        names = [c.node for c in cands]
        assignments = {
            topic(VALIDATION, name, TopicKind.ASSIGNMENT): b'{"domain": "x", "peers": []}'
            for name in names
        }
        ingest.set_retained(assignments)
        await until(lambda: len(ingest._published) >= n, "assignments")
        endpoints = {name: (f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", 7471)
                     for i, name in enumerate(names)}  # fmt: skip
        figures: dict[str, list[float]] = {"build": [], "publish": []}
        for r in range(runs):
            plan = plan_run(settings(), cands, run_id=f"bench-{r}", now=datetime.now(UTC), seed=r)
            assert isinstance(plan, RunPlan)
            stage = next(s for s in plan.stages if s.kind is WindowKind.CROSS)
            started = time.perf_counter()
            retained = {
                topic(VALIDATION, node, TopicKind.LOAD_PLAN): encode(p)
                for node, p in build_plans(plan, stage, term=1, endpoints=endpoints).items()
            }
            ingest.set_retained(retained, group=f"loadtest/{plan.run_id}")
            figures["build"].append(time.perf_counter() - started)

            def acknowledged(want: dict[str, bytes] = retained) -> bool:
                return all(ingest._published.get(t) == p for t, p in want.items())

            await until(acknowledged, "plans")
            figures["publish"].append(time.perf_counter() - started)
            ingest.set_retained({}, group=f"loadtest/{plan.run_id}")  # cleared, as a run ends

            def cleared(want: dict[str, bytes] = retained) -> bool:
                return not any(t in ingest._published for t in want)

            await until(cleared, "cleared")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        plans = len(retained)
        return {
            "nodes": n,
            "plans": plans,
            "lead": stage_lead_seconds(len(plan.domain_of)),
            **{k: statistics.median(v) for k, v in figures.items()},
        }
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--window", type=int, default=None, help="publishes in flight")
    args = parser.parse_args()
    if not mosquitto.available():
        sys.exit(mosquitto.MISSING_REASON)
    print("broker: mosquitto with the chart's limits; the operator's ReportIngest in-process")
    from netval.operator.ingest.publish_window import PUBLISH_WINDOW

    window = args.window or PUBLISH_WINDOW
    print(f"publish window {window}")
    print(f"{'nodes':>7} {'plans':>6} {'build':>9} {'published':>10} {'lead':>6}")
    for n in args.nodes:
        with tempfile.TemporaryDirectory() as tmp:
            f = asyncio.run(bench(n, args.runs, window, Path(tmp)))
        print(f"{f['nodes']:>7} {f['plans']:>6} {f['build'] * 1e3:>7.0f}ms "
              f"{f['publish']:>9.2f}s {f['lead']:>5.1f}s")  # fmt: skip


if __name__ == "__main__":
    main()
