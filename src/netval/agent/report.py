"""The one report builder: a node snapshot plus expectations -> the report agents publish.

Both producers of reports use it: the agent's runner (every cycle, with its storage and peer
results after the node checks, and a span per check group) and `netval probe` (one snapshot,
node checks only). So `netval probe --output json` is exactly what agents publish: the same
node checks in the same order, the same fields, the same status rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from functools import partial

from netval.agent.checks import CheckContext, CheckFn, make_context, node_check_groups
from netval.model.results import CheckResult, Report, node_status
from netval.model.snapshot import NodeSnapshot
from netval.model.spec import Checks

# Runs one check group: (group name, the group's checks) -> its results. The agent wraps
# each group in a span; `netval probe` just runs it.
GroupRunner = Callable[[str, Callable[[], list[CheckResult]]], list[CheckResult]]


def _run(_group: str, judge: Callable[[], list[CheckResult]]) -> list[CheckResult]:
    return judge()


def node_results(
    snapshot: NodeSnapshot, checks: Checks, run_group: GroupRunner = _run
) -> list[CheckResult]:
    """The node checks' results in report order, one check group at a time."""
    ctx = make_context(snapshot, checks)
    results: list[CheckResult] = []
    for group, fns in node_check_groups().items():
        results.extend(run_group(group.value, partial(_judge, fns, ctx)))
    return results


def _judge(fns: list[CheckFn], ctx: CheckContext) -> list[CheckResult]:
    return [r for fn in fns for r in fn(ctx)]


def make_report(
    *,
    validation: str,
    generation: int,
    node: str,
    started_at: datetime,
    duration_ms: float,
    results: list[CheckResult],
    traceparent: str | None = None,
) -> Report:
    """The report of one probe: `results` as given, the node's status the worst of them."""
    return Report(
        validation=validation,
        generation=generation,
        node=node,
        started_at=started_at,
        duration_ms=round(duration_ms, 3),
        status=node_status(results),
        results=results,
        traceparent=traceparent,
    )


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
    """`node_results` then `extra_results`, as one report (what `netval probe` prints)."""
    return make_report(
        validation=validation,
        generation=generation,
        node=snapshot.node,
        started_at=started_at,
        duration_ms=duration_ms,
        results=[*node_results(snapshot, checks), *extra_results],
        traceparent=traceparent,
    )


__all__ = ["GroupRunner", "build_report", "make_report", "node_results"]
