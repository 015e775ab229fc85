"""`netval status`: validations as people want to read them (conditions, counts, failures).

Pure rendering from NetworkValidation objects (as the API returns them) and Nodes; the
command fetches them with the official client. `render_matrix` is the east-west view
(`netval status NAME --matrix`): the domain x domain matrix of `status.eastWest`, its
flagged pairs (a low cross/intra capacity ratio) and its suspect nodes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from netval.cli.nic_view import (
    failing_nics,
    nic_line,
    nics_by_node,
    node_condition,
    node_nic_text,
)
from netval.model.east_west import Cell, EastWest, LinkKind
from netval.model.keys import FabricHealth, LabelKey, TaintKey
from netval.model.status import Condition, ConditionType, NetworkValidationStatus, Reason

_MAX_FAILURES_SHOWN: Final = 20


def parse_status(obj: Mapping[str, Any]) -> NetworkValidationStatus | None:
    # eastWest, consistency and topology are read on their own (render_matrix,
    # render_consistency, render_topology), so a bad summary hides nothing else
    return NetworkValidationStatus.from_api(
        obj.get("status"), exclude=frozenset({"eastWest", "consistency", "topology"})
    )


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
    for kind in (
        ConditionType.READY,
        ConditionType.HEALTHY,
        ConditionType.USABLE,
        ConditionType.GATING,
    ):
        c = status.condition(kind)
        # Usable and Gating are absent from a status an older operator wrote
        if c is not None or kind in (ConditionType.READY, ConditionType.HEALTHY):
            lines.append(_condition_line(c, kind))
    n = status.nodes
    lines.append(
        f"  nodes    {n.targeted} targeted, {n.reporting} reporting, {n.passing} passing, "
        f"{n.warning} warning, {n.failing} failing, {n.stale} stale"
    )
    nics = nic_line(status)
    if nics is not None:
        lines.append(nics)
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


_STALE_ENTRY: Final = re.compile(r"([^\s,;()]+) \(([^()]*)\)")


def stale_reasons(status: NetworkValidationStatus | None) -> dict[str, str]:
    """node -> why it is stale ("offline", "last report 4m ago", "never reported"), from the
    Ready condition's NodesStale message (the operator lists at most a few names there)."""
    ready = status.condition(ConditionType.READY) if status else None
    if ready is None or ready.reason != Reason.NODES_STALE:
        return {}
    _, _, names = ready.message.partition("stale: ")
    names = names.split(";")[0]
    return {m.group(1): m.group(2) for m in _STALE_ENTRY.finditer(names)}


def selector_of(validation: Mapping[str, Any]) -> dict[str, str]:
    spec = validation.get("spec")
    selector = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
    return {str(k): str(v) for k, v in selector.items()} if isinstance(selector, Mapping) else {}


def label_selector(validation: Mapping[str, Any]) -> str:
    """The validation's nodeSelector as a labelSelector query (empty: every node)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_of(validation).items()))


def _node_state(
    name: str,
    fabric: str,
    failing: Mapping[str, list[str]],
    stale: Mapping[str, str],
    nic_failing: bool = False,
) -> str:
    if name in stale:
        return f"stale ({stale[name]})"
    if fabric == FabricHealth.SUSPECT:
        return "failing (breaker)"  # its unhealthy label held back: see Gating
    if nic_failing and fabric == FabricHealth.DEGRADED:
        return "failing NIC(s), degraded"  # its NICs tainted, not the node (k of N)
    if name in failing or fabric == FabricHealth.UNHEALTHY:
        return "failing"
    if fabric == FabricHealth.DEGRADED:
        return "warning"
    if fabric == FabricHealth.HEALTHY:
        return "passing"
    return "no report yet"


def render_nodes(
    validation: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    *,
    failing_only: bool = False,
) -> str:
    """Per-node view of the nodes a validation targets (its nodeSelector; other Nodes are left
    out): state (passing, warning, failing, stale and why), fabric label, taint, its
    NetworkFabricReady condition, its named NICs (`status.nics`), failures. `failing_only`:
    only the nodes failing or stale."""
    selector = selector_of(validation)
    status = parse_status(validation)
    nics = nics_by_node(status)
    failing: dict[str, list[str]] = defaultdict(list)
    for f in status.failures if status else []:
        failing[f.node].append(f"{f.check} {f.subject}")
    stale = stale_reasons(status)
    rows = []
    targeted = 0
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        targeted += 1
        name = node["metadata"]["name"]
        fabric = labels.get(LabelKey.FABRIC, "-")
        state = _node_state(name, fabric, failing, stale, failing_nics(nics.get(name, [])))
        if failing_only and not state.startswith(("failing", "stale")):
            continue
        taints = (node.get("spec") or {}).get("taints") or []
        tainted = any(t.get("key") == TaintKey.FABRIC_UNHEALTHY for t in taints)
        rows.append(
            f"  {printable(name, 24):24} {printable(fabric, 10):10} "
            f"{'tainted' if tainted else '-':8} {printable(state, 26):26} "
            f"{printable(node_condition(node), 28):28} "
            f"{printable(node_nic_text(nics.get(name, [])), 60):60} "
            + printable("; ".join(failing.get(name, [])) or "-")
        )
    if targeted == 0:
        return "  no node matches the nodeSelector\n"
    if not rows:
        return f"  none of the {targeted} targeted node(s) is failing or stale\n"
    header = (
        f"  {'NODE':24} {'FABRIC':10} {'TAINT':8} {'STATE':26} {'CONDITION':28} {'NICS':60} FAILING"
    )
    return "\n".join([header, *rows]) + "\n"


def is_healthy(obj: Mapping[str, Any]) -> bool:
    status = parse_status(obj)
    healthy = status.condition(ConditionType.HEALTHY) if status else None
    return healthy is not None and healthy.status == "True"


# -- east-west: `netval status NAME --matrix` ---------------------------------------------------

NOT_ENABLED: Final = "east-west probing is not enabled (spec.checks.peers.enabled)"
NO_SUMMARY_YET: Final = (
    "east-west probing is enabled but there is no summary yet\n"
    "  (the operator writes status.eastWest once agents report; is the operator running?)"
)
NO_MEASUREMENTS: Final = (
    "no peer measurements yet (agents probe their peers every interval once peers have "
    "announced themselves)"
)
MATRIX_COLUMNS: Final = 8  # domains per table; more wrap into further tables
_CELL_WIDTH: Final = 10
_SEP: Final = "  "
_METRIC_WIDTH: Final = 9
_DOMAIN_WIDTH: Final = 60  # a row's domain heading (label values are at most 63 characters)
_FLAG: Final = "FLAG"


def printable(text: str, limit: int | None = None) -> str:
    """`text` without control characters (status strings are not trusted to be terminal-safe),
    cut in the middle to `limit` characters (prefix and suffix are where names differ)."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in text)
    if limit is None or len(clean) <= limit:
        return clean
    if limit < 4:
        return clean[:limit]
    head = limit // 2
    tail = limit - 1 - head
    return f"{clean[:head]}~{clean[len(clean) - tail :]}"


def peers_enabled(obj: Mapping[str, Any]) -> bool:
    spec = obj.get("spec")
    checks = spec.get("checks") if isinstance(spec, Mapping) else None
    peers = checks.get("peers") if isinstance(checks, Mapping) else None
    return isinstance(peers, Mapping) and peers.get("enabled") is True


def parse_east_west(obj: Mapping[str, Any]) -> tuple[EastWest | None, str | None]:
    """`status.eastWest` as the model, or None and why not (None, None: there is none)."""
    status = obj.get("status")
    raw = status.get("eastWest") if isinstance(status, Mapping) else None
    if not raw:
        return None, None
    try:
        return EastWest.model_validate(raw), None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(value)"
        return (
            None,
            f"status.eastWest is not readable by this netval version ({where}: {err['msg']})",
        )


def east_west_domains(ew: EastWest) -> list[str]:
    """The domains that have at least one cell, sorted."""
    return sorted({c.a for c in ew.cells} | {c.b for c in ew.cells})


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def fmt_percent(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def fmt_mbps(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def fmt_ratio(ratio: float | None) -> str:
    """A capacity ratio (or an oversubscription) as people say it: 4.0 -> "4.0:1"."""
    if ratio is None:
        return "-"
    if ratio >= 1000:
        return ">999:1"
    return f"{ratio:.0f}:1" if ratio >= 10 else f"{ratio:.1f}:1"


def _capacity_text(cell: Cell) -> str:
    if cell.intra:
        return "intra"
    text = fmt_ratio(cell.capacity_ratio)
    return f"{text} {_FLAG}" if cell.flagged else text


_METRICS: Final[tuple[tuple[str, Callable[[Cell], str]], ...]] = (
    ("p50 ms", lambda c: fmt_ms(c.latency_p50_ms)),
    ("loss %", lambda c: fmt_percent(c.loss_percent)),
    ("Mbit/s", lambda c: fmt_mbps(c.throughput_mbps)),
    ("cap", _capacity_text),
    ("failing", lambda c: str(c.failing)),
)


def _matrix_table(ew: EastWest, domains: list[str], columns: list[str]) -> list[str]:
    short = [printable(d, _CELL_WIDTH) for d in columns]
    lines = [f"  {'':{_METRIC_WIDTH}}" + "".join(f"{_SEP}{s:>{_CELL_WIDTH}}" for s in short)]
    for row in domains:
        cells = [ew.cell(row, col) for col in columns]
        if all(c is None for c in cells):
            continue  # nothing measured between this domain and these columns
        lines.append(f"  {printable(row, _DOMAIN_WIDTH)}")
        for metric, text in _METRICS:
            values = [text(c) if c is not None else "." for c in cells]
            lines.append(
                f"    {metric:{_METRIC_WIDTH - 2}}"
                + "".join(f"{_SEP}{v:>{_CELL_WIDTH}}" for v in values)
            )
    return lines


def render_matrix(obj: Mapping[str, Any]) -> str:
    """The east-west view of one validation: the domain x domain matrix of `status.eastWest`
    (each cell: median p50 latency, loss and throughput of the node pairs between the two
    domains, the capacity ratio of cross-domain cells, FLAG when below minThroughputRatio,
    failing latency/loss/path-MTU results), then the flagged pairs and the suspects.
    Tables are at most `MATRIX_COLUMNS` domains wide (at most 107 characters); more domains
    wrap into further tables."""
    ew, problem = parse_east_west(obj)
    if ew is None:
        if problem is not None:
            return f"  {problem}\n"
        return f"  {NO_SUMMARY_YET if peers_enabled(obj) else NOT_ENABLED}\n"
    lines = [
        f"  east-west: {ew.domains} domain(s), {ew.nodes} node(s), "
        f"minThroughputRatio {ew.min_throughput_ratio:g}"
    ]
    if not peers_enabled(obj):
        lines.append(
            "  (spec.checks.peers.enabled is not true: this summary may be left from before)"
        )
    domains = east_west_domains(ew)
    if not domains:
        lines.append(f"  {NO_MEASUREMENTS}")
        return "\n".join(lines) + "\n"
    lines += [
        "  each cell: medians over the node pairs between the two domains",
        "    p50 ms   round trip (50th percentile)   loss %  echoes lost   Mbit/s  TCP throughput",
        "    cap      capacity ratio: median intra / median cross-domain single-flow throughput",
        f"             ({_FLAG}: ratio below {ew.min_throughput_ratio:g}; lone flows, not "
        "oversubscription: see NetworkLoadTest)",
        "    failing  failing peer.latency, peer.loss and peer.path_mtu results",
        "    .        not measured (or left out of the status)",
    ]
    if any(printable(d, _CELL_WIDTH) != d for d in domains):
        lines.append("  (long domain names are cut in the middle with ~ in the column headings)")
    chunks = [domains[i : i + MATRIX_COLUMNS] for i in range(0, len(domains), MATRIX_COLUMNS)]
    for i, columns in enumerate(chunks):
        lines.append("")
        if len(chunks) > 1:
            first = i * MATRIX_COLUMNS + 1
            lines.append(
                f"  domains {first}-{first + len(columns) - 1} of {len(domains)} as columns"
            )
        lines.extend(_matrix_table(ew, domains, columns))
    lines.append("")
    if ew.omitted_cells:
        lines.append(
            f"  {ew.omitted_cells} more domain pair(s) not in the status (it keeps "
            f"{len(ew.cells)}: flagged and failing pairs first)"
        )
    if ew.flagged:
        lines.append(
            f"  flagged pairs (cross/intra throughput ratio below {ew.min_throughput_ratio:g}):"
        )
        for f in ew.flagged:
            lines.append(
                f"    {printable(f.a)} <-> {printable(f.b)}: ratio {f.throughput_ratio:g}, "
                f"capacity {fmt_ratio(f.capacity_ratio)}"
            )
    else:
        lines.append("  flagged pairs: none")
    for link in ew.link_suspects:
        where = (
            f"uplink of {printable(link.a)}"
            if link.kind is LinkKind.UPLINK
            else f"{printable(link.a)} <-> {printable(link.b or '')}"
        )
        lines.append(
            f"  suspect link: {where}: {link.failing_paths} of {link.paths} pair(s) through it "
            f"fail, {link.failing_around} of {link.paths_around} around it, confidence "
            f"{link.confidence:g}: {', '.join(printable(c) for c in link.checks) or '-'}"
        )
    if ew.suspects:
        lines.append("  suspects (failing with many peers that pass with others):")
        for s in ew.suspects:
            lines.append(
                f"    {printable(s.node)} ({printable(s.domain)}): failing with {s.failing_peers} "
                f"of {s.peers} peer(s): {', '.join(printable(c) for c in s.checks) or '-'}"
            )
    else:
        lines.append("  suspects: none")
    if ew.failing_pairs:
        lines.append(
            f"  failing node pairs: {ew.failing_pairs}, {ew.unexplained_failing_pairs} not "
            "explained by a suspect"
            + (f"; {ew.observers} observer(s), not degraded for it" if ew.observers else "")
        )
    return "\n".join(lines) + "\n"
