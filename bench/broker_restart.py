"""Broker restart: time from a restarted Mosquitto to the operator's converged state.

Run from the repository root (mosquitto must be installed):

    python bench/broker_restart.py                       # 1,000 and 10,000 nodes, 3 restarts each
    python bench/broker_restart.py --nodes 10000 --restarts 5

What runs, per N: a real Mosquitto configured as the chart's broker (its per-client limits,
tests/mosquitto.py CHART_LIMITS, and persistence on), N agents' retained healthy reports
(one paho connection publishes them), and the operator's real `OperatorRuntime` (ingest,
aggregation, status writer, node gating) in this process, with N targeted nodes and a
`KubeApi` stand-in that records status patches in memory (API-server latency excluded; an
unknown call raises). Once the first status says all N nodes report, the broker is stopped
(SIGTERM: it saves its retained store, as a pod does) and started again, --restarts times,
each after the session was up longer than the ingest's stable period (so the reconnect
backoff starts from its base, as after a quiet spell in production).

Per restart, from the moment the restarted broker accepts connections:
- reconnected: the ingest's new session has subscribed;
- replayed: the retained replay is over (synced) and all N nodes' reports came back;
- converged: the status computed then still says N of N reporting, and no status patch
  written since the restart said fewer (no flip).
Medians over the restarts, N side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import mosquitto  # type: ignore[import-not-found]  # tests/mosquitto.py: the tests' broker

VALIDATION: Final = "fabric"
LABELS: Final = {"netval.io/pool": "bench"}


class RecordingKube:
    """The `KubeApi` calls the runtime makes, recorded; any other raises (fails loudly)."""

    retries = 0

    def __init__(self) -> None:
        self.patches: list[tuple[float, dict[str, Any]]] = []
        self.nodes: list[str] = []  # the Nodes the API would list

    async def patch_status(self, name: str, status: dict[str, Any]) -> None:
        self.patches.append((time.monotonic(), status))

    async def post_event(self, ref: dict[str, Any], **_: Any) -> None:
        pass

    async def set_node_gating(self, node: str, label: str | None, taint: bool) -> bool:
        return True

    async def set_node_label(self, node: str, label: str | None) -> bool:
        return True

    async def list_validation_names(self) -> list[str]:
        return [VALIDATION]

    async def agent_pod_counts(self, *_: Any) -> dict[str, tuple[int, int]]:
        return {}

    async def list_node_labels(self, keys: frozenset[str]) -> dict[str, dict[str, str]]:
        # the Nodes' metadata listing that fills in the keys the validation references
        return {name: {k: v for k, v in LABELS.items() if k in keys} for name in self.nodes}

    async def list_loadtest_specs(self) -> dict[str, dict[str, Any]]:
        return {}  # no NetworkLoadTest: no agent gets RDMA privileges

    async def nodes_with_taint(self, key: str) -> dict[str, str]:
        return {}  # no load test reserved a node (each term sweeps once at its start)

    async def set_node_taint(self, node: str, key: str, value: str | None) -> bool:
        return True

    def close(self) -> None:
        pass  # nothing to release: the runtime calls it at the end of its term

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"RecordingKube has no {name!r}: add it to the bench's stand-in")


def node(i: int) -> str:
    return f"gpu-{i:05d}"


def publish_reports(broker: Any, n: int) -> None:
    import paho.mqtt.client as paho

    from netval.model import CheckId, CheckResult, Report, Status

    client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    client.username_pw_set(broker.username, broker.password)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect(broker.host, broker.port, keepalive=60)
    client.loop_start()
    result = CheckResult(
        check=CheckId.MTU_INTERFACE, subject="ens1", status=Status.PASS, message="MTU 9000"
    )
    infos = []
    for i in range(n):
        r = Report(
            validation=VALIDATION,
            generation=1,
            node=node(i),
            started_at=datetime.now(UTC),
            duration_ms=3.0,
            status=Status.PASS,
            results=[result],
        )
        topic = f"netval/v1/{VALIDATION}/{node(i)}/report"
        infos.append(client.publish(topic, r.to_json().encode(), qos=1, retain=True))
        if len(infos) >= 5000:  # in batches: paho refuses to queue without bound (100,000)
            for info in infos:
                info.wait_for_publish(30)
            infos = []
    for info in infos:
        info.wait_for_publish(30)
    client.disconnect()
    client.loop_stop()


async def until(check: Any, what: str, limit: float = 120.0) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > limit:
            raise RuntimeError(f"timed out: {what}")
        await asyncio.sleep(0.005)
    return time.monotonic()


async def run(n: int, restarts: int, workdir: Path) -> list[dict[str, float]]:
    from netval.infra.mqtt_settings import MqttSettings
    from netval.infra.telemetry import make_tracer_provider
    from netval.model.spec import NetworkValidationSpec
    from netval.operator.ingest import subscriber
    from netval.operator.settings import OperatorSettings
    from netval.operator.state.store import utcnow
    from netval.operator.term_runtime import OperatorRuntime

    broker = mosquitto.MosquittoBroker(
        workdir,
        extra_config=(
            *mosquitto.CHART_LIMITS,
            "persistence true",
            f"persistence_location {workdir}/",
        ),
    )
    broker.start()
    try:
        await asyncio.to_thread(publish_reports, broker, n)
        mqtt = MqttSettings(host=broker.host, port=broker.port, tls=False,
                            username=broker.username, password=broker.password,
                            ca_file=None, client_id="netval-operator-bench")  # fmt: skip
        settings = OperatorSettings(
            namespace="netval-system",
            agent_image="bench",
            mqtt=mqtt,
            agent_mqtt_url="mqtt://bench:1883",
            agent_mqtt_username="agent",
            agent_mqtt_secret="agent",
            agent_mqtt_ca_secret=None,
            status_window=1.0,
        )
        kube = RecordingKube()
        provider = make_tracer_provider({}, default_service="netval-operator")
        rt = OperatorRuntime(settings, kube, provider)  # type: ignore[arg-type]
        kube.nodes = [node(i) for i in range(n)]
        for i in range(n):
            rt.store.on_node(node(i), LABELS)
        spec = NetworkValidationSpec.model_validate({"nodeSelector": LABELS, "interval": "60s"})
        ref = {"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
               "metadata": {"name": VALIDATION, "uid": "1"}}  # fmt: skip
        rt.store.upsert_validation(VALIDATION, generation=1, spec=spec, body=ref, status=None)
        rt.store.agents_applied(VALIDATION)
        rt.start()

        def reporting(status: dict[str, Any]) -> int:
            return int(status.get("nodes", {}).get("reporting", 0))

        await until(lambda: kube.patches and reporting(kube.patches[-1][1]) == n, "first status")
        out = []
        for _ in range(restarts):
            # a stable session: the next reconnect starts from the base delay
            await asyncio.sleep(subscriber.STABLE_SESSION_SECONDS + 0.5)
            sessions, replays = rt.ingest.stats.sessions, rt.store.replays
            await asyncio.to_thread(broker.stop)
            await until(lambda: not rt.ingest.stats.connected, "disconnect")
            await asyncio.to_thread(broker.start)
            t0 = time.monotonic()
            t_conn = await until(
                lambda s=sessions: rt.ingest.stats.sessions > s,
                "reconnect",
            )
            t_replay = await until(
                lambda r=replays: rt.store.replays > r,
                "replay",
            )
            got = sum(1 for v, _ in rt.store.replayed if v == VALIDATION)
            status = rt.status.compute(VALIDATION, utcnow())
            flips = [p for t, p in kube.patches if t >= t0 and reporting(p) < n]
            if got != n or status.nodes.reporting != n or flips:
                raise RuntimeError(f"not converged: replayed {got}, status {status.nodes}")
            out.append({"reconnected": t_conn - t0, "replayed": t_replay - t0})
        await rt.stop()
        return out
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--restarts", type=int, default=3)
    args = parser.parse_args()
    if not mosquitto.available():
        sys.exit(mosquitto.MISSING_REASON)
    rows = []
    for n in args.nodes:
        with tempfile.TemporaryDirectory() as tmp:
            runs = asyncio.run(run(n, args.restarts, Path(tmp)))
        rows.append((n, runs))
        print(f"{n:,} nodes: {runs}", file=sys.stderr, flush=True)
    print(f"\ncommand: python bench/broker_restart.py {' '.join(sys.argv[1:])}".rstrip())
    print("broker: mosquitto with the chart's limits and persistence; operator in-process, "
          "status patches to an in-memory stand-in; times from the restarted broker "
          f"accepting connections (replay over includes the 0.5 s quiet wait that ends it), medians of {args.restarts} restarts")  # fmt: skip
    print()
    print("| nodes | reconnected | replay over, all nodes back | status |")
    print("|---:|---:|---:|---|")
    for n, runs in rows:
        conn = statistics.median(r["reconnected"] for r in runs)
        replay = statistics.median(r["replayed"] for r in runs)
        print(f"| {n:,} | {conn:.2f} s | {replay:.2f} s | {n:,} of {n:,} reporting, no flip |")


if __name__ == "__main__":
    main()
