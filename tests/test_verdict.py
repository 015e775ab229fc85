"""The node verdict (netval.operator.gating.verdict): its table row by row, as docs/gating.md
states it, and properties over every combination of facts and over sequences of rounds
(hypothesis): a node last seen failing is never admissible until recoveryReports passing
reports, the breaker never excludes past its cap, label and taint agree, deciding twice
changes nothing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netval.model.ids import Status
from netval.model.keys import FabricHealth
from netval.model.spec import BreakerAction
from netval.operator.gating.conditions import gating_condition
from netval.operator.gating.verdict import (
    RANK,
    GatingPolicy,
    Heard,
    NicFacts,
    NodeFacts,
    ValidationVerdict,
    Why,
    breaker_cap,
    decide,
    decide_validation,
    judge,
)

H, D, U, K, S = (
    FabricHealth.HEALTHY,
    FabricHealth.DEGRADED,
    FabricHealth.UNHEALTHY,
    FabricHealth.UNKNOWN,
    FabricHealth.SUSPECT,
)
FRESH, SILENT, OFFLINE, NEVER = Heard.FRESH, Heard.SILENT, Heard.OFFLINE, Heard.NEVER
R = 3  # recoveryReports in the table rows
K1 = 1  # maxFailedDevicesPerNode in the table rows (rows without NIC facts: device taints off)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "gating.md"


def facts(
    heard: Heard = FRESH,
    last: Status | None = Status.PASS,
    streak: int = 10,
    *,
    blamed: bool = False,
    retries: bool = False,
    excluded: bool = False,
    label: FabricHealth | None = None,
    nics: NicFacts | None = None,
    was_devices: bool = False,
    observer: bool = False,
) -> NodeFacts:
    return NodeFacts(
        heard, last, streak, blamed, retries, excluded, label, nics, was_devices, observer
    )


ONE = NicFacts(failing=("mlx5_3",), node_level=False)
TWO = NicFacts(failing=("mlx5_2", "mlx5_3"), node_level=False)
WITH_NODE = NicFacts(failing=("mlx5_3",), node_level=True)  # and a failure tied to no NIC
NO_DEVICE = NicFacts(failing=("mlx5_3",), node_level=False, untaintable=frozenset({"mlx5_3"}))
BACK_1 = NicFacts(failing=(), node_level=False, recovering=(("mlx5_3", 1),))
BACK_3 = NicFacts(failing=(), node_level=False, recovering=(("mlx5_3", 3),))


# (name, facts, wants, why): the table of docs/gating.md, row by row
TABLE = [
    ("fresh, fails", facts(last=Status.FAIL, streak=0), U, Why.FAILING),
    ("fresh, errors", facts(last=Status.ERROR, streak=0), U, Why.FAILING),
    ("fresh, blamed retries", facts(last=Status.FAIL, streak=0, blamed=True, retries=True),
     U, Why.BLAMED),
    ("fresh, passes, excluded before, 2 of 3", facts(streak=2, excluded=True, label=U),
     U, Why.RECOVERING),
    ("fresh, warns, excluded before, 0 of 3", facts(last=Status.WARN, streak=0, excluded=True),
     U, Why.RECOVERING),
    ("fresh, passes, excluded before, 3 of 3", facts(streak=3, excluded=True, label=U),
     H, Why.PASSING),
    ("silent, last failed", facts(SILENT, Status.FAIL, 0), U, Why.SILENT_AFTER_FAILING),
    ("offline, last failed", facts(OFFLINE, Status.FAIL, 0), U, Why.SILENT_AFTER_FAILING),
    ("offline, last passed, excluded before", facts(OFFLINE, excluded=True, label=U),
     U, Why.SILENT_AFTER_FAILING),
    ("never reported, excluded before (the Node's label)", facts(NEVER, None, 0, excluded=True),
     U, Why.SILENT_AFTER_FAILING),
    ("silent, suspect before", facts(SILENT, label=S), U, Why.SILENT_AFTER_FAILING),
    ("fresh, warns of paths a suspect elsewhere explains", facts(last=Status.WARN, observer=True),
     H, Why.OBSERVER),
    ("fresh, fails, an observer too", facts(last=Status.FAIL, streak=0, observer=True),
     U, Why.FAILING),
    ("fresh, warns, observer, excluded before, 0 of 3",
     facts(last=Status.WARN, streak=0, excluded=True, observer=True), U, Why.RECOVERING),
    ("fresh, warns", facts(last=Status.WARN), D, Why.WARNING),
    ("fresh, warns of requester retries", facts(last=Status.WARN, retries=True),
     D, Why.RETRIES_FROM_PEERS),
    ("fresh, passes", facts(), H, Why.PASSING),
    ("fresh, skips only", facts(last=Status.SKIP), H, Why.PASSING),
    ("fresh, passes, suspect before", facts(streak=1, label=S), H, Why.PASSING),
    ("silent, last passed", facts(SILENT, label=H), K, Why.SILENT),
    ("offline, last warned", facts(OFFLINE, Status.WARN, label=D), K, Why.OFFLINE),
    ("never reported", facts(NEVER, None, 0), K, Why.NEVER_REPORTED),
    # device taints on, maxFailedDevicesPerNode 1 (K1)
    ("fresh, one NIC fails", facts(last=Status.FAIL, streak=5, nics=ONE), D, Why.DEVICES_FAILING),
    ("fresh, two NICs fail", facts(last=Status.FAIL, streak=0, nics=TWO), U, Why.FAILING),
    ("fresh, a NIC and something else fail", facts(last=Status.FAIL, streak=0, nics=WITH_NODE),
     U, Why.FAILING),
    ("fresh, a NIC without a DRA device fails", facts(last=Status.FAIL, streak=0, nics=NO_DEVICE),
     U, Why.FAILING),
    ("fresh, one NIC fails, excluded before, 1 of 3 within k",
     facts(last=Status.FAIL, streak=1, excluded=True, label=U, nics=ONE), U, Why.FAILING),
    ("fresh, one NIC fails, excluded before, 3 of 3 within k",
     facts(last=Status.FAIL, streak=3, excluded=True, label=U, nics=ONE), D, Why.DEVICES_FAILING),
    ("fresh, passes, a NIC 1 of 3 back", facts(nics=BACK_1), D, Why.DEVICES_RECOVERING),
    ("fresh, passes, a NIC 3 of 3 back", facts(nics=BACK_3), H, Why.PASSING),
    ("fresh, warns, a NIC 1 of 3 back", facts(last=Status.WARN, nics=BACK_1),
     D, Why.DEVICES_RECOVERING),
    ("silent, one NIC failed", facts(SILENT, Status.FAIL, 0, label=D, nics=ONE),
     D, Why.SILENT_AFTER_DEVICES),
    ("offline, a NIC 1 of 3 back", facts(OFFLINE, label=D, nics=BACK_1),
     D, Why.SILENT_AFTER_DEVICES),
    ("silent, two NICs failed", facts(SILENT, Status.FAIL, 0, nics=TWO),
     U, Why.SILENT_AFTER_FAILING),
]  # fmt: skip


@pytest.mark.parametrize(("name", "given_facts", "wants", "why"), TABLE, ids=[t[0] for t in TABLE])
def test_the_table(name: str, given_facts: NodeFacts, wants: FabricHealth, why: Why) -> None:
    assert judge(given_facts, R, K1) == (wants, why)
    if given_facts.nics is None:  # without device taints the same row holds
        assert judge(given_facts, R) == (wants, why)
    elif why not in (Why.FAILING, Why.RECOVERING, Why.SILENT_AFTER_FAILING, Why.PASSING):
        # with maxFailedDevicesPerNode 0 a failing NIC is the node's, as without device taints
        assert judge(given_facts, R, 0)[0] is not D or given_facts.last is Status.WARN


def test_docs_list_every_reason() -> None:
    text = DOCS.read_text()
    missing = [w.value for w in Why if f"`{w.value}`" not in text]
    assert not missing, f"docs/gating.md does not explain {missing}"


def pool(n: int, **node_facts: NodeFacts) -> dict[str, NodeFacts]:
    out = {f"n{i:02d}": facts(label=H) for i in range(n)}
    out.update(node_facts)
    return out


def verdict(nodes: Mapping[str, NodeFacts], **policy: object) -> ValidationVerdict:
    return decide_validation(GatingPolicy(name="v", **policy), nodes)  # type: ignore[arg-type]


def test_breaker_keeps_exclusions_and_labels_the_rest_suspect() -> None:
    fail = facts(last=Status.FAIL, streak=0)
    nodes = pool(4, n00=fail, n01=fail, n02=facts(last=Status.FAIL, streak=0, excluded=True,
                                                  label=U))  # fmt: skip
    v = verdict(nodes, taint=True, max_unhealthy_percent=50)
    assert v.cap == 2 and v.wanting == 3 and v.tripped
    assert v.excluded == {"n02", "n00"}  # kept, then one new (in name order)
    assert v.suspect == ("n01",) and v.nodes["n01"].label is S and not v.nodes["n01"].tainted
    assert v.tainted == v.excluded and v.admissible == 1
    ok, reason, message = gating_condition(v)
    assert (ok, reason) == (False, "BreakerTripped")
    assert "3 of 4 targeted nodes failing, more than maxUnhealthyPercent 50% allows 2" in message
    assert "not tainting 1 node(s) (n01)" in message
    assert "admission goes on (onBreakerTripped: admit)" in message
    held = verdict(nodes, taint=True, max_unhealthy_percent=50,
                   on_breaker_tripped=BreakerAction.HOLD)  # fmt: skip
    assert (
        held.holds_admission
        and "admission waits (onBreakerTripped: hold)" in (gating_condition(held)[2])
    )


def test_correlated_staleness_holds_labels_silent_failures_stay_out() -> None:
    gone = facts(SILENT, label=H)
    nodes = pool(10, n07=gone, n08=gone, n09=facts(SILENT, Status.FAIL, 0, excluded=True,
                                                    label=U))  # fmt: skip
    v = verdict(nodes)  # cap 1: two healthy nodes going stale at once are held
    assert v.held == ("n07", "n08") and v.nodes["n07"] == v.nodes["n08"]
    assert v.nodes["n07"].label is H and v.nodes["n07"].why is Why.HELD
    assert not v.nodes["n07"].admissible  # held, not fresh: not counted healthy
    assert v.nodes["n09"].label is U and v.nodes["n09"].why is Why.SILENT_AFTER_FAILING
    assert "2 of 10 targeted nodes went stale at once" in gating_condition(v)[2]
    one = verdict(pool(10, n07=gone))
    assert one.nodes["n07"].label is K and not one.held  # one node is no storm


def test_merge_takes_the_worst_label_and_any_taint() -> None:
    a = (GatingPolicy("a", taint=True, max_unhealthy_percent=100),
         {"x": facts(last=Status.FAIL, streak=0), "y": facts()})  # fmt: skip
    b = (GatingPolicy("b"), {"x": facts(), "y": facts(last=Status.WARN), "z": facts(NEVER, None)})
    c = (GatingPolicy("c", node_label=False), {"z": facts(last=Status.FAIL, streak=0)})
    out = decide([a, b, c])
    assert out.labels == {"x": U, "y": D, "z": K}
    assert out.tainted == {"x"}
    assert out.verdicts["c"].excluded == {"z"}  # no label, still excluded from admission


@pytest.mark.parametrize(
    ("pct", "targeted", "cap"),
    [(10, 9, 1), (10, 10, 1), (10, 29, 2), (100, 3, 3), (0, 50, 1), (10, 0, 0)],
)
def test_cap(pct: float, targeted: int, cap: int) -> None:
    assert breaker_cap(targeted, pct) == cap


# -- properties over the table -----------------------------------------------------------------

statuses = st.sampled_from([None, Status.PASS, Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP])
labels = st.sampled_from([None, H, D, U, K, S])


@st.composite
def node_facts(draw: st.DrawFn) -> NodeFacts:
    heard = draw(st.sampled_from(list(Heard)))
    last = None if heard is NEVER else draw(statuses.filter(lambda s: s is not None))
    was_label = draw(labels)
    return NodeFacts(
        heard=heard,
        last=last,
        ok_streak=draw(st.integers(0, 6)),
        blamed=draw(st.booleans()),
        retries=draw(st.booleans()),
        observer=draw(st.booleans()),
        was_excluded=was_label is U or (draw(st.booleans()) and was_label is None),
        was_label=was_label,
    )


policies = st.builds(
    GatingPolicy,
    name=st.just("v"),
    node_label=st.booleans(),
    taint=st.booleans(),
    max_unhealthy_percent=st.sampled_from([0.0, 5.0, 10.0, 25.0, 50.0, 100.0]),
    recovery_reports=st.integers(1, 5),
    on_breaker_tripped=st.sampled_from(list(BreakerAction)),
)
fleets = st.dictionaries(st.from_regex(r"n[0-9]{2}", fullmatch=True), node_facts(), max_size=40)


def again(v: ValidationVerdict, nodes: Mapping[str, NodeFacts]) -> dict[str, NodeFacts]:
    """The same facts with this verdict as the decision before."""
    return {
        n: f._replace(was_excluded=v.nodes[n].excluded, was_label=v.nodes[n].label)
        for n, f in nodes.items()
    }


@given(policies, fleets)
@settings(max_examples=400)
def test_properties_of_one_round(policy: GatingPolicy, nodes: dict[str, NodeFacts]) -> None:
    v = decide_validation(policy, nodes)
    assert set(v.nodes) == set(nodes)
    before = {n for n, f in nodes.items() if f.was_excluded}
    for node, f in nodes.items():
        d = v.nodes[node]
        # label and taint agree; excluded is the label unhealthy
        assert d.excluded == (d.label is U)
        assert d.tainted == (d.excluded and policy.taint)
        # a node excluded before stays out until recoveryReports passing reports
        if f.was_excluded and f.ok_streak < policy.recovery_reports:
            assert d.excluded and not d.admissible
        # a fresh failing report is never admissible
        if f.heard is FRESH and f.last in (Status.FAIL, Status.ERROR):
            assert d.label in (U, S) and not d.admissible
        # silent after failing stays out (or suspect, when the cap is full)
        if f.heard is not FRESH and (f.last in (Status.FAIL, Status.ERROR) or f.was_excluded):
            assert d.label in (U, S)
        # healthy then stale is unknown (or its label held), never unhealthy
        if (
            f.heard is not FRESH
            and f.last in (Status.PASS, Status.SKIP, Status.WARN)
            and (not f.was_excluded and f.was_label in (H, D))
        ):
            assert d.label in (K, f.was_label) and not d.excluded
        # requester retries alone never exclude a node; an observer's failing paths, all
        # towards a suspect elsewhere, do not even degrade it
        if (f.heard is FRESH and f.last is Status.WARN and not f.blamed
                and not f.was_excluded):  # fmt: skip
            assert d.label is (H if f.observer else D) and not d.excluded and not d.tainted
        # admissible: a fresh passing or warning report, nothing holding it
        if d.admissible:
            assert f.heard is FRESH and f.last not in (Status.FAIL, Status.ERROR)
            assert d.label in (H, D)
    # the breaker never excludes past the cap (exclusions made before may stay)
    assert len(v.excluded) <= max(v.cap, len(before))
    assert len(v.excluded - before) <= max(0, v.cap - len(before & v.excluded))
    assert v.tripped == (v.wanting > v.cap)
    assert v.admissible == sum(1 for d in v.nodes.values() if d.admissible)
    # deciding again on the same facts changes nothing
    assert decide_validation(policy, again(v, nodes)).nodes == v.nodes


@given(st.lists(st.tuples(policies, fleets), max_size=4))
@settings(max_examples=200)
def test_merge_is_the_worst_label_and_any_taint(
    inputs: list[tuple[GatingPolicy, dict[str, NodeFacts]]],
) -> None:
    named = [(GatingPolicy(**{**_fields(p), "name": f"v{i}"}), f) for i, (p, f) in
             enumerate(inputs)]  # fmt: skip
    out = decide(named)
    for node in {n for _, f in named for n in f}:
        mine = [(v.policy, v.nodes[node]) for v in out.verdicts.values() if node in v.nodes]
        shown = [d.label for p, d in mine if p.node_label]
        if shown:
            assert out.labels[node] == max(shown, key=RANK.__getitem__)
        else:
            assert node not in out.labels
        assert (node in out.tainted) == any(d.tainted for _, d in mine)
        # label and taint agree across validations: a tainted node that a labelling
        # validation taints is labelled unhealthy
        if any(d.tainted and p.node_label for p, d in mine):
            assert out.labels[node] is U


def _fields(p: GatingPolicy) -> dict[str, object]:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}


# -- properties over rounds: a node's life ------------------------------------------------------

EVENTS = ("pass", "warn", "fail", "silent", "offline", "back")


@given(
    st.lists(st.sampled_from(EVENTS), min_size=1, max_size=30),
    st.integers(1, 4),
    st.booleans(),
)
@settings(max_examples=400)
def test_a_node_last_seen_failing_needs_recovery_reports(
    events: list[str], recovery: int, taint: bool
) -> None:
    """One failing node among 20 healthy ones (cap 2: never full), round after round, as the
    operator's state would count: a passing or warning report adds to the streak, a failing
    one resets it, silence keeps the last report. Whatever the order, once excluded it is
    not admissible again before `recovery` passing reports in a row, and it is never
    unknown while its last report failed."""
    policy = GatingPolicy("v", taint=taint, recovery_reports=recovery)
    others = {f"ok{i:02d}": facts(label=H) for i in range(20)}
    heard, last, streak = NEVER, None, 0
    excluded, label = False, None
    for event in events:
        if event in ("pass", "warn", "fail"):
            heard = FRESH
            last = {"pass": Status.PASS, "warn": Status.WARN, "fail": Status.FAIL}[event]
            streak = 0 if event == "fail" else streak + 1  # passing reports in a row
        elif event in ("silent", "offline") and last is not None:
            heard = SILENT if event == "silent" else OFFLINE
        elif event == "back" and last is not None:
            heard = FRESH
        x = NodeFacts(heard, last, streak, False, False, excluded, label)
        d = decide_validation(policy, {**others, "x": x}).nodes["x"]
        if excluded and not d.excluded:
            assert streak >= recovery and heard is FRESH  # released by passing reports only
        if last is Status.FAIL:
            assert d.label is U and not d.admissible  # failing, silent or not: out
        assert d.tainted == (taint and d.excluded)
        excluded, label = d.excluded, d.label


# -- the docs table is this table --------------------------------------------------------------


def test_docs_table_matches_the_code() -> None:
    """Every row of docs/gating.md's state table names a reason the table above gives."""
    text = DOCS.read_text()
    section = text[text.index("## The node verdict") :]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    found = {m for line in rows for m in re.findall(r"`([A-Za-z]+)`", line)}
    assert {why.value for _, _, _, why in TABLE} <= found
