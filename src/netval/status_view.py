"""`netval status`: validations as people want to read them (conditions, counts, failures).

Pure rendering from NetworkValidation objects (as the API returns them) and Nodes; the
command fetches them with the official client.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from netval.model.status import Condition, ConditionType, NetworkValidationStatus

FABRIC_LABEL: Final = "netval.io/fabric"
_MAX_FAILURES_SHOWN: Final = 20
_STATUS_KEYS: Final = frozenset(
    {"observedGeneration", "conditions", "nodes", "checks", "failures", "lastReportTime"}
)


def parse_status(obj: Mapping[str, Any]) -> NetworkValidationStatus | None:
    raw = obj.get("status") or {}
    if not raw:
        return None
    try:
        return NetworkValidationStatus.model_validate(
            {k: v for k, v in raw.items() if k in _STATUS_KEYS}
        )
    except ValidationError:
        return None


def _age(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "never"
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _condition_line(c: Condition | None, kind: ConditionType) -> str:
    if c is None:
        return f"  {kind.value:8} -"
    return f"  {kind.value:8} {c.status:7} {c.reason}: {c.message}"


def render_validation(obj: Mapping[str, Any], *, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    name = obj.get("metadata", {}).get("name", "?")
    generation = obj.get("metadata", {}).get("generation")
    status = parse_status(obj)
    lines = [f"NetworkValidation {name} (generation {generation})"]
    if status is None:
        lines.append("  no status yet (is the operator running?)")
        return "\n".join(lines) + "\n"
    if status.observed_generation != generation:
        lines.append(
            f"  status is for generation {status.observed_generation}: the operator has not caught up"
        )
    for kind in (ConditionType.READY, ConditionType.HEALTHY, ConditionType.GATING):
        c = status.condition(kind)
        if c is not None or kind is not ConditionType.GATING:
            lines.append(_condition_line(c, kind))
    n = status.nodes
    lines.append(
        f"  nodes    {n.targeted} targeted, {n.reporting} reporting, {n.passing} passing, "
        f"{n.warning} warning, {n.failing} failing, {n.stale} stale"
    )
    lines.append(f"  last report {_age(status.last_report_time, now)}")
    failing_checks = sorted(
        ((check, counts.fail) for check, counts in status.checks.items() if counts.fail),
        key=lambda item: (-item[1], item[0]),
    )
    if failing_checks:
        lines.append(
            "  failing checks: "
            + ", ".join(f"{check} ({count} node(s))" for check, count in failing_checks)
        )
    if status.failures:
        lines.append("  failures (longest-standing first):")
        for f in status.failures[:_MAX_FAILURES_SHOWN]:
            lines.append(
                f"    {f.node:20} {f.check:18} {f.subject:16} since {_age(f.since, now)}: {f.message}"
            )
        if len(status.failures) > _MAX_FAILURES_SHOWN:
            lines.append(f"    ... and {len(status.failures) - _MAX_FAILURES_SHOWN} more")
    return "\n".join(lines) + "\n"


def render_nodes(validation: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> str:
    """Per-node view of the nodes a validation targets: fabric label, taint, failing checks."""
    selector: Mapping[str, str] = validation.get("spec", {}).get("nodeSelector") or {}
    status = parse_status(validation)
    failing: dict[str, list[str]] = defaultdict(list)
    for f in status.failures if status else []:
        failing[f.node].append(f"{f.check} {f.subject}")
    rows = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        name = node["metadata"]["name"]
        taints = node.get("spec", {}).get("taints") or []
        tainted = any(t.get("key") == "netval.io/fabric-unhealthy" for t in taints)
        rows.append(
            f"  {name:24} {labels.get(FABRIC_LABEL, '-'):10} {'tainted' if tainted else '-':8} "
            + ("; ".join(failing.get(name, [])) or "-")
        )
    header = f"  {'NODE':24} {'FABRIC':10} {'TAINT':8} FAILING"
    return "\n".join([header, *rows]) + "\n" if rows else "  no node matches the nodeSelector\n"


def is_healthy(obj: Mapping[str, Any]) -> bool:
    status = parse_status(obj)
    healthy = status.condition(ConditionType.HEALTHY) if status else None
    return healthy is not None and healthy.status == "True"
