"""`topology.agreement`: does what each node's fabric netdevs see match the domain its labels
declare? Pure: node labels and report `topology` sections in, results out.

Nodes declaring the same lowest-level domain must see the same neighbour switch on the same
netdev (rail-optimised nodes see one switch per rail, so netdevs are compared by name across
the domain). The switch most of the domain's nodes see is the domain's; with a tie, the one
named like the domain wins, else every node of the tie is named. A node seeing another
switch gets `topology.agreement` at spec.topology.agreement (warn by default) naming both
values; a domain whose nodes see more than one switch is named in `status.topology`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import (
    DEFAULT_PEER_TOPOLOGY_KEY,
    NetworkValidationSpec,
    TopologySpec,
    TopologyVerdict,
)
from netval.model.topology import LEVEL_SCHEMES, InterfaceTopology, TopologyReport


def detect_levels(label_sets: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """The first scheme of LEVEL_SCHEMES any node carries a key of: its keys present on some
    node, top level first; () when no node carries any."""
    present: set[str] = set()
    wanted = {key for _, keys in LEVEL_SCHEMES for key in keys}
    for labels in label_sets:
        present.update(k for k in labels if k in wanted)
    for _, keys in LEVEL_SCHEMES:
        found = tuple(k for k in keys if k in present)
        if found:
            return found
    return ()


def levels_in_use(spec: TopologySpec, label_sets: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """The declared levels, else the auto-detected ones."""
    return tuple(spec.levels) or detect_levels(label_sets)


def peer_topology_key(spec: NetworkValidationSpec, label_sets: Iterable[Mapping[str, str]]) -> str:
    """The label whose value is a node's east-west domain: peers.topologyKey when set, else
    the lowest level in use (so sampling works on a cluster labelled by a known scheme with
    no netval configuration), else topology.kubernetes.io/zone."""
    if spec.checks.peers.topology_key:
        return spec.checks.peers.topology_key
    levels = levels_in_use(spec.topology, label_sets)
    return levels[-1] if levels else DEFAULT_PEER_TOPOLOGY_KEY


@dataclass(frozen=True, slots=True)
class Disagreement:
    node: str
    interface: str
    declared: str  # the node's lowest-level label value
    seen: str  # the switch its netdev sees
    expected: str | None  # the switch the domain's other nodes see (None: a tie)


@dataclass(frozen=True, slots=True)
class DomainConflict:
    domain: str
    interface: str
    switches: tuple[tuple[str, int], ...]  # (switch, nodes seeing it), most first


@dataclass(frozen=True, slots=True)
class Verdict:
    """One `topology.agreement` judgement; `to_result` makes the CheckResult (kept lazy: the
    status fold of 10,000 nodes needs only the statuses)."""

    subject: str
    status: Status
    message: str
    observed: dict[str, JsonValue]

    def to_result(self) -> CheckResult:
        return CheckResult(
            check=CheckId.TOPOLOGY_AGREEMENT,
            subject=self.subject,
            status=self.status,
            message=self.message[:1024],
            observed=self.observed,
        )


@dataclass(frozen=True, slots=True)
class Agreement:
    results: dict[str, list[Verdict]]  # node -> its topology.agreement verdicts
    disagreements: list[Disagreement]
    conflicts: list[DomainConflict]


# (netdev, the switch it sees or None, that switch's port, why none): what the judgement
# reads of a report's section. Plain tuples of strings: the operator holds one per netdev of
# the fleet, and the garbage collector stops tracking such tuples (pydantic models it walks
# at every collection: 10,000 nodes x 8 rails of them doubled the fold's time).
NetdevView = tuple[str, str | None, str, str | None]


def netdev_views(report: TopologyReport) -> tuple[NetdevView, ...]:
    return tuple(_view(i) for i in report.interfaces)


def _view(iface: InterfaceTopology) -> NetdevView:
    if not iface.neighbours:
        return iface.interface, None, "", iface.none_reason
    first = iface.neighbours[0]
    return iface.interface, first.switch, first.port_description or first.port_id, None


def _expected(domain: str, counts: Counter[str]) -> str | None:
    ranked = counts.most_common()
    top = [s for s, n in ranked if n == ranked[0][1]]
    if len(top) == 1:
        return top[0]
    return domain if domain in top else None


def judge_agreement(
    labels: Mapping[str, Mapping[str, str]],
    seen: Mapping[str, Sequence[NetdevView]],
    level: str | None,
    verdict: TopologyVerdict = TopologyVerdict.WARN,
) -> Agreement:
    """Per node (those in `seen`: `netdev_views` of their report) and interface: pass, a disagreement at
    `verdict`, or skip (no label at `level`, no neighbour seen)."""
    bad = Status.FAIL if verdict is TopologyVerdict.FAIL else Status.WARN
    views = {node: seen[node] for node in sorted(seen)}
    domains = {node: labels.get(node, {}).get(level) if level else None for node in views}
    groups: dict[tuple[str, str], Counter[str]] = {}
    for node, view in views.items():
        domain = domains[node]
        if domain is not None:
            for subject, switch, _, _ in view:
                if switch is not None:
                    groups.setdefault((domain, subject), Counter())[switch] += 1
    expected = {key: _expected(key[0], counts) for key, counts in groups.items()}
    out: dict[str, list[Verdict]] = {}
    disagreements: list[Disagreement] = []
    for node, view in views.items():
        domain = domains[node]
        results = out.setdefault(node, [])
        for subject, switch, port, none_reason in view:
            if level is None or domain is None:
                why = (
                    "no topology level declared or detected"
                    if level is None
                    else (f"node has no label {level}")
                )
                results.append(_result(subject, Status.SKIP, f"not judged: {why}"))
                continue
            if switch is None:
                results.append(_result(subject, Status.SKIP, f"no neighbour seen: {none_reason}"))
                continue
            want = expected[(domain, subject)]
            observed: dict[str, JsonValue] = {"declared": domain, "seen": switch, "level": level}
            if want == switch:
                message = f"{level}={domain}: sees {switch} ({port})"
                results.append(_result(subject, Status.PASS, message, observed))
                continue
            disagreements.append(Disagreement(node, subject, domain, switch, want))
            others = (
                f"the domain's other nodes see {want}"
                if want is not None
                else f"the domain's nodes see {len(groups[(domain, subject)])} switches"
            )
            message = f"declared {level}={domain}, but {subject} sees {switch} ({port}); {others}"
            results.append(_result(subject, bad, message, {**observed, "expected": want}))
    conflicts = [
        DomainConflict(domain, iface, tuple(counts.most_common()))
        for (domain, iface), counts in sorted(groups.items())
        if len(counts) > 1
    ]
    return Agreement(out, disagreements, conflicts)


def _result(
    subject: str, status: Status, message: str, observed: dict[str, JsonValue] | None = None
) -> Verdict:
    return Verdict(subject, status, message, dict(observed or {}))


__all__ = [
    "Agreement",
    "Disagreement",
    "DomainConflict",
    "NetdevView",
    "Verdict",
    "detect_levels",
    "judge_agreement",
    "levels_in_use",
    "netdev_views",
    "peer_topology_key",
]
