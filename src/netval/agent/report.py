"""Turn a node snapshot plus expectations into the report agents publish."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from netval.agent.checks import run_node_checks
from netval.model.results import CheckResult, Report, node_status
from netval.model.snapshot import NodeSnapshot
from netval.model.spec import Checks


def build_report(
    snapshot: NodeSnapshot,
    checks: Checks,
    *,
    validation: str,
    generation: int,
    started_at: datetime,
    duration_ms: float,
    extra_results: Iterable[CheckResult] = (),
    traceparent: str | None = None,
) -> Report:
    results = [*run_node_checks(snapshot, checks), *extra_results]
    return Report(
        validation=validation,
        generation=generation,
        node=snapshot.node,
        started_at=started_at,
        duration_ms=round(duration_ms, 3),
        status=node_status(results),
        results=results,
        traceparent=traceparent,
    )
