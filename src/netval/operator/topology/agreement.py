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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import TopologySpec, TopologyVerdict
from netval.model.topology import LEVEL_SCHEMES, TopologyReport


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
class Agreement:
    results: dict[str, list[CheckResult]]  # node -> its topology.agreement results
    disagreements: list[Disagreement]
    conflicts: list[DomainConflict]


def _expected(domain: str, counts: Counter[str]) -> str | None:
    ranked = counts.most_common()
    top = [s for s, n in ranked if n == ranked[0][1]]
    if len(top) == 1:
        return top[0]
    return domain if domain in top else None


def judge_agreement(
    labels: Mapping[str, Mapping[str, str]],
    seen: Mapping[str, TopologyReport],
    level: str | None,
    verdict: TopologyVerdict = TopologyVerdict.WARN,
) -> Agreement:
    """Per node (those with a `seen` section) and interface: pass, a disagreement at
    `verdict`, or skip (no label at `level`, no neighbour seen)."""
    bad = Status.FAIL if verdict is TopologyVerdict.FAIL else Status.WARN
    out: dict[str, list[CheckResult]] = {}
    groups: dict[tuple[str, str], Counter[str]] = {}
    for node in sorted(seen):
        domain = labels.get(node, {}).get(level) if level else None
        if domain is None:
            continue
        for iface in seen[node].interfaces:
            if iface.switch is not None:
                groups.setdefault((domain, iface.interface), Counter())[iface.switch] += 1
    expected = {key: _expected(key[0], counts) for key, counts in groups.items()}
    disagreements: list[Disagreement] = []
    for node in sorted(seen):
        domain = labels.get(node, {}).get(level) if level else None
        results = out.setdefault(node, [])
        for iface in seen[node].interfaces:
            subject = iface.interface
            if level is None or domain is None:
                why = (
                    "no topology level declared or detected"
                    if level is None
                    else (f"node has no label {level}")
                )
                results.append(_result(subject, Status.SKIP, f"not judged: {why}"))
                continue
            switch = iface.switch
            if switch is None:
                results.append(
                    _result(subject, Status.SKIP, f"no neighbour seen: {iface.none_reason}")
                )
                continue
            want = expected[(domain, subject)]
            observed: dict[str, JsonValue] = {"declared": domain, "seen": switch, "level": level}
            port = iface.neighbours[0].port_description or iface.neighbours[0].port_id
            if want == switch:
                results.append(
                    _result(
                        subject, Status.PASS, f"{level}={domain}: sees {switch} ({port})", observed
                    )
                )
                continue
            disagreements.append(Disagreement(node, subject, domain, switch, want))
            others = (
                f"the domain's other nodes see {want}"
                if want is not None
                else f"the domain's nodes see {len(groups[(domain, subject)])} switches"
            )
            results.append(
                _result(
                    subject,
                    bad,
                    f"declared {level}={domain}, but {subject} sees {switch} ({port}); {others}",
                    {**observed, "expected": want},
                )
            )
    conflicts = [
        DomainConflict(domain, iface, tuple(counts.most_common()))
        for (domain, iface), counts in sorted(groups.items())
        if len(counts) > 1
    ]
    return Agreement(out, disagreements, conflicts)


def _result(
    subject: str, status: Status, message: str, observed: dict[str, JsonValue] | None = None
) -> CheckResult:
    return CheckResult(
        check=CheckId.TOPOLOGY_AGREEMENT,
        subject=subject,
        status=status,
        message=message[:1024],
        observed=dict(observed or {}),
    )


__all__ = [
    "Agreement",
    "Disagreement",
    "DomainConflict",
    "detect_levels",
    "judge_agreement",
    "levels_in_use",
]
