"""What the operator's in-memory aggregation costs per report and per status computation.

    python bench/aggregate_cost.py [--results 40] [--rounds 30]

For 100 and 1,000 targeted nodes, each reporting RESULTS results spread over the check ids
(about 1% failing, so the failures list and the Healthy message have work to do), it prints
the median wall time of `ingest_report` (one live report from a node that already has a
stored one: the steady state) and of `compute_status` (the whole status, once per write
window), plus the status size as JSON; and the start-up cost of the runtime taking in one
Node event per node for a peers-enabled validation (what Kopf delivers when the operator
starts), up to the agent assignments being built. Pure CPU: no broker, no Kubernetes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

from opentelemetry.sdk.trace import TracerProvider

from netval.infra.mqtt_settings import MqttSettings
from netval.model.ids import CheckGroup, CheckId, Status
from netval.model.results import CheckResult, Report
from netval.model.spec import NetworkValidationSpec
from netval.operator.settings import OperatorSettings
from netval.operator.state.aggregation import compute_status
from netval.operator.state.validation import (
    IngestResult,
    ValidationState,
    ingest_report,
    set_agents_ready,
    set_spec,
    set_targeted,
)
from netval.operator.term_runtime import OperatorRuntime

T0 = datetime(2025, 3, 1, tzinfo=UTC)
CHECKS = [c for c in CheckId if c.group is not CheckGroup.FLEET]  # fleet.*: the operator's


def make_report(node: str, index: int, cycle: int, n_results: int) -> Report:
    results = [
        CheckResult(
            check=CHECKS[i % len(CHECKS)],
            subject=f"ens{i}np0",
            status=Status.FAIL if (index + i + cycle) % 97 == 0 else Status.PASS,
            message="observed differs from expected",
        )
        for i in range(n_results)
    ]
    return Report(
        validation="fabric",
        generation=1,
        node=node,
        started_at=T0 + timedelta(seconds=10 * cycle),
        duration_ms=800,
        status=max((r.status for r in results), key=lambda s: s.severity),
        results=results,
    )


def run(n_nodes: int, n_results: int, rounds: int) -> dict[str, float]:
    nodes = [f"gpu-{i:05d}" for i in range(n_nodes)]
    state = ValidationState(name="fabric")
    set_spec(state, generation=1, interval_seconds=10)
    set_targeted(state, nodes, T0)
    set_agents_ready(state, True, T0)
    for i, node in enumerate(nodes):
        ingest_report(state, make_report(node, i, 0, n_results), T0 + timedelta(seconds=1))

    # pre-build the reports so only ingest is timed (pydantic parsing is the ingest layer's)
    reports = [make_report(nodes[r % n_nodes], r, r + 1, n_results) for r in range(rounds * 20)]
    ingest_times = []
    for r, rep in enumerate(reports):
        now = T0 + timedelta(seconds=10 * (r + 1) + 1)
        t = time.perf_counter()
        result = ingest_report(state, rep, now)
        ingest_times.append(time.perf_counter() - t)
        assert result is IngestResult.ACCEPTED, result

    now = T0 + timedelta(seconds=12)
    status_times = []
    status = None
    for _ in range(rounds):
        t = time.perf_counter()
        status = compute_status(state, now, previous=status)
        status_times.append(time.perf_counter() - t)
    assert status is not None
    return {
        "ingest_us": statistics.median(ingest_times) * 1e6,
        "status_ms": statistics.median(status_times) * 1e3,
        "status_bytes": float(len(status.model_dump_json(by_alias=True, exclude_none=True))),
        "failures": float(len(status.failures)),
    }


def node_events_at_startup(n_nodes: int) -> float:
    """Seconds for `n_nodes` Node events plus one status window's refresh of the targets."""
    mqtt = MqttSettings(host="127.0.0.1", port=1883, tls=False, username=None, password=None,
                        ca_file=None, client_id="bench")  # fmt: skip
    settings = OperatorSettings(
        namespace="netval-system", agent_image="netval:bench", mqtt=mqtt,
        agent_mqtt_url="mqtt://broker:1883", agent_mqtt_username=None,
        agent_mqtt_secret="netval-mqtt-agent", agent_mqtt_ca_secret=None, status_window=2.0,
    )  # fmt: skip
    runtime = OperatorRuntime(settings, None, TracerProvider())  # type: ignore[arg-type]
    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": {"gpu": "true"}, "checks": {"peers": {"enabled": True}}}
    )
    body = {"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
            "metadata": {"name": "fabric"}}  # fmt: skip
    runtime.store.upsert_validation("fabric", generation=1, spec=spec, body=body, status=None)
    t = time.perf_counter()
    for i in range(n_nodes):
        runtime.store.on_node(
            f"gpu-{i:05d}", {"gpu": "true", "topology.kubernetes.io/zone": f"r{i % 16}"}
        )
    runtime.refresh_targets()  # what the next status window does
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=40, help="results per report")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--nodes", type=int, nargs="*", default=[100, 1000])
    args = parser.parse_args()
    print(
        f"{'nodes':>6} {'results':>7} {'ingest_report p50':>18} {'compute_status p50':>19} "
        f"{'status JSON':>12}"
    )
    for n in args.nodes:
        r = run(n, args.results, args.rounds)
        print(
            f"{n:>6} {args.results:>7} {r['ingest_us']:>15.1f} us {r['status_ms']:>16.2f} ms "
            f"{int(r['status_bytes']):>8} B"
        )
    print("\nstart-up: Node events folded in, agent assignments built (peers enabled)")
    for n in (*args.nodes, 10 * max(args.nodes)):
        print(f"{n:>6} nodes: {node_events_at_startup(n) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
