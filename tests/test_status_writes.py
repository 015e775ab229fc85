"""Status writes only when something a reader uses changed, through the real operator (Kopf,
the kmock API, a real broker): agents reporting every interval with nothing new cost no
patch between resyncs; a verdict change costs one; check ids that are gone are removed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import CheckId, CheckResult, Report, Status
from netval.operator.status.writer import needs_write, status_patch
from netval.operator.term_runtime import OperatorRuntime
from operator_env import NODES, publish, report, report_msg, validation, wait_status
from test_operator import scrape


def _status_patches(cluster: KubeCluster) -> int:
    return sum(1 for m, p in cluster.requests() if m == "PATCH" and p.endswith("pool-a/status"))


def _reports_taken(runtime: OperatorRuntime, received: int) -> None:
    """Wait until the operator ingested `received` reports and a status round looked at them
    (it clears `dirty` when it computes the status)."""
    wait_for(lambda: runtime.ingest.stats.reports >= received, what=f"{received} reports")
    state = runtime.store.states["pool-a"]
    wait_for(
        lambda: not state.dirty and not runtime.status._inflight,
        what="a status round over them",
    )


def _writes_metric(runtime: OperatorRuntime) -> float:
    for line in scrape(runtime).splitlines():
        if line.startswith("netval_operator_status_writes_total "):
            return float(line.split()[1])
    raise AssertionError("netval_operator_status_writes_total is not exported")


def test_steady_reports_write_nothing_until_the_resync_and_a_verdict_writes_once(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, _ = operator
    cluster.create(validation())
    base = datetime.now(UTC)
    publish(mosquitto_broker, [report_msg(report(n, started=base)) for n in NODES])
    first = wait_status(cluster, lambda s: s.get("nodes", {}).get("passing") == 4, "4 passing")
    _reports_taken(runtime, 4)
    writes, patches = runtime.status.writes, _status_patches(cluster)
    assert _writes_metric(runtime) == writes

    # Three more intervals of the same verdicts: only lastReportTime moves, nothing is written.
    received = runtime.ingest.stats.reports
    for interval in range(1, 4):
        at = base + timedelta(seconds=60 * interval)
        publish(mosquitto_broker, [report_msg(report(n, started=at)) for n in NODES])
        received += len(NODES)
        _reports_taken(runtime, received)
    assert runtime.status.writes == writes
    assert _status_patches(cluster) == patches

    # A verdict change: one write, carrying the new lastReportTime too.
    at = base + timedelta(seconds=240)
    publish(mosquitto_broker, [report_msg(report("gpu-b", Status.FAIL, started=at))])
    status = wait_status(cluster, lambda s: s["nodes"]["failing"] == 1, "gpu-b failing")
    _reports_taken(runtime, received + 1)
    assert runtime.status.writes == writes + 1
    assert _status_patches(cluster) == patches + 1
    assert _writes_metric(runtime) == writes + 1
    assert status["lastReportTime"] != first["lastReportTime"]

    # The resync: lastReportTime alone is written once it is due.
    runtime.status.resync_seconds = 0.0
    publish(mosquitto_broker, [report_msg(report("gpu-a", started=at + timedelta(seconds=1)))])
    wait_for(lambda: runtime.status.writes > writes + 1, what="the resync write")
    runtime.status.resync_seconds = 3600.0


def _multi(node: str, checks: list[CheckId], started: datetime) -> Report:
    base = report(node, started=started)
    results = [
        CheckResult(check=c, subject="ens1np0", status=Status.PASS, message="ok") for c in checks
    ]
    return base.model_copy(update={"results": results})


def test_check_ids_that_no_longer_exist_leave_status_checks(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    cluster.create(validation())
    base = datetime.now(UTC)
    both = [CheckId.MTU_INTERFACE, CheckId.LINK_CARRIER]
    publish(mosquitto_broker, [report_msg(_multi(n, both, base)) for n in NODES])
    wait_status(
        cluster, lambda s: set(s.get("checks", {})) == {c.value for c in both}, "both checks"
    )
    # The link check is gone from every report (disabled in the spec, say).
    later = base + timedelta(seconds=60)
    publish(
        mosquitto_broker, [report_msg(_multi(n, [CheckId.MTU_INTERFACE], later)) for n in NODES]
    )
    wait_status(
        cluster,
        lambda s: set(s.get("checks", {})) == {CheckId.MTU_INTERFACE.value},
        "link.carrier removed from status.checks",
    )


def test_needs_write_and_patch_are_pure() -> None:
    from netval.model.status import CheckCounts, NetworkValidationStatus

    now = datetime.now(UTC)
    old = NetworkValidationStatus(
        checks={"a": CheckCounts(pass_=1), "b": CheckCounts(fail=1)}, last_report_time=now
    )
    moved = old.model_copy(update={"last_report_time": now + timedelta(seconds=30)})
    assert needs_write(moved, None, resync_due=False)
    assert not needs_write(old, old, resync_due=True)
    assert not needs_write(moved, old, resync_due=False)
    assert needs_write(moved, old, resync_due=True)
    fewer = moved.model_copy(update={"checks": {"a": CheckCounts(pass_=1)}})
    assert needs_write(fewer, old, resync_due=False)
    patch = status_patch(fewer, old)
    assert patch["checks"] == {"a": {"pass": 1, "warn": 0, "fail": 0}, "b": None}
    assert status_patch(fewer, None)["checks"] == {"a": {"pass": 1, "warn": 0, "fail": 0}}
