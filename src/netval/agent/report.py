"""The one report builder: a node snapshot plus expectations -> the report agents publish.

Both producers of reports use it: the agent's runner (every cycle, with its storage and peer
results after the node checks, and a span per check group) and `netval probe` (one snapshot,
node checks only). So `netval probe --output json` is exactly what agents publish: the same
node checks in the same order, the same fields, the same status rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from netval.agent.checks import run_node_checks
from netval.agent.facts import node_facts
from netval.agent.nics import node_nics
from netval.model.facts import Facts
from netval.model.nics import Nic
from netval.model.results import CheckResult, Report, node_status
from netval.model.snapshot import NodeSnapshot
from netval.model.spec import Checks
from netval.model.topology import TopologyReport


def make_report(
    *,
    validation: str,
    generation: int,
    node: str,
    started_at: datetime,
    duration_ms: float,
    results: list[CheckResult],
    traceparent: str | None = None,
    facts: Facts | None = None,
    topology: TopologyReport | None = None,
    nics: list[Nic] | None = None,
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
        facts=facts,
        topology=topology,
        nics=nics,
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
    kernel_release: str | None = None,
) -> Report:
    """The node checks then `extra_results`, as one report (what `netval probe` prints)."""
    return make_report(
        validation=validation,
        generation=generation,
        node=snapshot.node,
        started_at=started_at,
        duration_ms=duration_ms,
        results=[*run_node_checks(snapshot, checks), *extra_results],
        traceparent=traceparent,
        facts=node_facts(snapshot.last, kernel_release=kernel_release),
        nics=node_nics(snapshot.last),
    )


__all__ = ["build_report", "make_report"]
