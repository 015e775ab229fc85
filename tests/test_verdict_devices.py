"""The node verdict's NIC input and outputs (netval.operator.gating.verdict): k of N rails,
device taints under their bound, the Node condition merged across validations. The table
rows are in tests/test_verdict.py (TABLE); here the properties over whole fleets and over a
NIC's life (hypothesis)."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from netval.model.ids import Status
from netval.model.keys import FabricHealth
from netval.operator.gating.verdict import (
    CONDITIONS,
    ConditionStatus,
    GatingPolicy,
    Heard,
    NicFacts,
    NodeFacts,
    ValidationVerdict,
    Why,
    decide,
    decide_validation,
)

H, D, U, K, S = (FabricHealth.HEALTHY, FabricHealth.DEGRADED, FabricHealth.UNHEALTHY,
                 FabricHealth.UNKNOWN, FabricHealth.SUSPECT)  # fmt: skip
NICS = [f"mlx5_{i}" for i in range(8)]


def fails(*nics: str, node_level: bool = False, heard: Heard = Heard.FRESH,
          was_devices: bool = False) -> NodeFacts:  # fmt: skip
    return NodeFacts(heard, Status.FAIL, 0, nics=NicFacts(tuple(nics), node_level),
                     was_label=D if was_devices else H, was_devices=was_devices)  # fmt: skip


def ok() -> NodeFacts:
    return NodeFacts(Heard.FRESH, Status.PASS, 10, was_label=H)


def verdict(nodes: Mapping[str, NodeFacts], **policy: object) -> ValidationVerdict:
    return decide_validation(GatingPolicy(name="v", **policy), nodes)  # type: ignore[arg-type]


def test_one_failing_nic_taints_that_nic_and_labels_the_node_degraded() -> None:
    v = verdict({"a": fails("mlx5_3"), "b": ok()}, max_failed_devices=1, taint=True)
    assert v.nodes["a"].label is D and not v.nodes["a"].excluded and not v.nodes["a"].tainted
    assert v.nodes["a"].why is Why.DEVICES_FAILING and v.nodes["a"].admissible
    assert v.devices == {"a": ("mlx5_3",)} and v.tainted_devices == 1
    assert not v.excluded and v.wanting == 0


def test_two_failing_nics_are_node_level_with_k_1() -> None:
    v = verdict({"a": fails("mlx5_2", "mlx5_3"), "b": ok()}, max_failed_devices=1, taint=True)
    assert v.nodes["a"].label is U and v.nodes["a"].tainted and not v.devices


def test_k_0_is_the_node_path() -> None:
    v = verdict({"a": fails("mlx5_3"), "b": ok()}, max_failed_devices=0, taint=True)
    assert v.nodes["a"].label is U and v.nodes["a"].tainted and not v.devices


def test_past_max_device_taints_the_node_path_takes_over() -> None:
    nodes = {f"n{i}": fails("mlx5_0") for i in range(5)}
    nodes["n4"] = fails("mlx5_0", was_devices=True)
    nodes.update({f"ok{i}": ok() for i in range(15)})
    v = verdict(nodes, max_failed_devices=1, max_device_taints=3, taint=True,
                max_unhealthy_percent=100)  # fmt: skip
    # n4 had its taint before and keeps it; then n0, n1 in name order; n2, n3 node-level
    assert set(v.devices) == {"n4", "n0", "n1"}
    assert v.beyond_devices == ("n2", "n3")
    assert v.nodes["n2"].label is U and v.nodes["n2"].why is Why.FAILING
    assert v.tainted_devices == 3


def test_the_condition_is_the_worst_validation_named() -> None:
    a = (GatingPolicy("a", max_failed_devices=1), {"x": fails("mlx5_1"), "y": ok()})
    b = (GatingPolicy("b"), {"x": ok(), "y": NodeFacts(Heard.SILENT, Status.PASS, 3,
                                                       was_label=H)})  # fmt: skip
    c = (GatingPolicy("c", node_condition=False), {"y": fails("mlx5_0")})
    out = decide([b, c, a])
    assert out.conditions["x"][:3] == (ConditionStatus.FALSE, "DevicesFailing", "a")
    assert out.conditions["y"][:3] == (ConditionStatus.UNKNOWN, "Silent", "b")  # c writes none
    assert set(out.conditions) == {"x", "y"}


def test_every_why_has_a_condition() -> None:
    assert set(CONDITIONS) == set(Why)
    assert CONDITIONS[Why.PASSING][0] is ConditionStatus.TRUE
    assert all(
        CONDITIONS[w][0] is ConditionStatus.FALSE
        for w in (Why.FAILING, Why.DEVICES_FAILING, Why.SILENT_AFTER_FAILING, Why.RECOVERING)
    )
    assert CONDITIONS[Why.SUSPECT][0] is ConditionStatus.UNKNOWN  # the breaker doubts it


# -- properties over fleets ------------------------------------------------------------------

nic_sets = st.lists(st.sampled_from(NICS), max_size=4, unique=True).map(lambda x: tuple(sorted(x)))


@st.composite
def nic_facts(draw: st.DrawFn) -> NicFacts:
    failing = draw(nic_sets)
    recovering = tuple((n, draw(st.integers(0, 5))) for n in draw(nic_sets) if n not in failing)
    untaintable = frozenset(draw(st.lists(st.sampled_from(NICS), max_size=2)))
    return NicFacts(failing, draw(st.booleans()), recovering, untaintable)


@st.composite
def node(draw: st.DrawFn) -> NodeFacts:
    heard = draw(st.sampled_from(list(Heard)))
    nics = draw(st.none() | nic_facts())
    if heard is Heard.NEVER:
        last = None
    elif nics is not None and (nics.failing or nics.node_level):
        last = draw(st.sampled_from([Status.FAIL, Status.ERROR]))
    else:
        last = draw(st.sampled_from([Status.PASS, Status.WARN, Status.SKIP, Status.FAIL]))
    label = draw(st.sampled_from([None, H, D, U, K, S]))
    return NodeFacts(heard, last, draw(st.integers(0, 6)), False, draw(st.booleans()),
                     label is U, label, nics, draw(st.booleans()))  # fmt: skip


policies = st.builds(
    GatingPolicy,
    name=st.just("v"),
    taint=st.booleans(),
    max_unhealthy_percent=st.sampled_from([10.0, 50.0, 100.0]),
    recovery_reports=st.integers(1, 4),
    max_failed_devices=st.integers(0, 3),
    max_device_taints=st.integers(1, 12),
)
fleets = st.dictionaries(st.from_regex(r"n[0-9]{2}", fullmatch=True), node(), max_size=30)


@given(policies, fleets)
@settings(max_examples=500)
def test_properties_of_device_taints(policy: GatingPolicy, nodes: dict[str, NodeFacts]) -> None:
    v = decide_validation(policy, nodes)
    k, r = policy.max_failed_devices, policy.recovery_reports
    assert v.tainted_devices <= policy.max_device_taints
    for name, f in nodes.items():
        d = v.nodes[name]
        tainted = v.devices.get(name, ())
        if tainted:
            # device taints only on a degraded node, never with a node exclusion
            assert (
                d.label is D
                and not d.excluded
                and d.why in (Why.DEVICES_FAILING, Why.DEVICES_RECOVERING, Why.SILENT_AFTER_DEVICES)
            )
            assert f.nics is not None and k >= 1
            for nic in tainted:  # each one failing or recovering, with a device to taint
                assert nic not in f.nics.untaintable
                recovering = dict(f.nics.recovering).get(nic)
                assert nic in f.nics.failing or (recovering is not None and recovering < r)
        if f.nics is not None and f.last in (Status.FAIL, Status.ERROR):
            over = f.nics.node_level or len(f.nics.failing) > k or not f.nics.failing
            if over or f.nics.untaintable & set(f.nics.failing):
                assert d.label in (U, S)  # more than k, or untaintable: node-level
            elif f.heard is Heard.FRESH and not (f.was_excluded and f.ok_streak < r):
                # within k: its failing NICs tainted, or the node path past the bound
                assert set(f.nics.failing) <= set(tainted) or name in v.beyond_devices
        if f.nics is None or k == 0:
            assert not tainted  # without NIC facts or k: no device taint, as before
        # warn-only NICs never get a device taint: tainted NICs fail or recover
    again = {n: f._replace(was_excluded=v.nodes[n].excluded, was_label=v.nodes[n].label,
                           was_devices=n in v.devices) for n, f in nodes.items()}  # fmt: skip
    second = decide_validation(policy, again)
    assert second.devices == v.devices and second.nodes == v.nodes


@given(st.lists(st.tuples(policies.map(lambda p: p), fleets, st.booleans()), max_size=4))
@settings(max_examples=200)
def test_the_condition_is_the_worst_of_the_validations_that_write_it(
    inputs: list[tuple[GatingPolicy, dict[str, NodeFacts], bool]],
) -> None:
    named = [(GatingPolicy(**{**{f: getattr(p, f) for f in p.__dataclass_fields__},
                              "name": f"v{i}", "node_condition": on}), facts)
             for i, (p, facts, on) in enumerate(inputs)]  # fmt: skip
    out = decide(named)
    rank = {ConditionStatus.TRUE: 0, ConditionStatus.UNKNOWN: 1, ConditionStatus.FALSE: 2}
    for n in {n for _, f in named for n in f}:
        mine = [(v.name, CONDITIONS[v.nodes[n].why]) for v in out.verdicts.values()
                if v.policy.node_condition and n in v.nodes]  # fmt: skip
        if not mine:
            assert n not in out.conditions
            continue
        wish = out.conditions[n]
        assert rank[wish.status] == max(rank[c[0]] for _, c in mine)
        first = min(name for name, c in mine if rank[c[0]] == rank[wish.status])
        assert wish.validation == first


# -- a NIC's life over rounds -------------------------------------------------------------------


@given(st.lists(st.sampled_from(["fail", "pass", "warn", "silent"]), min_size=1, max_size=25),
       st.integers(1, 4))  # fmt: skip
@settings(max_examples=400)
def test_a_tainted_nic_is_released_only_after_recovery_reports(
    events: list[str], recovery: int
) -> None:
    """One NIC of a node among healthy ones, k = 1: failing taints it at once; it is
    untainted only after `recovery` passing reports of it; silence keeps what it had."""
    policy = GatingPolicy("v", recovery_reports=recovery, max_failed_devices=1)
    others = {f"ok{i}": ok() for i in range(10)}
    heard, last, since = Heard.NEVER, None, None  # since: passing reports since it failed
    was_devices, label = False, None
    for event in events:
        if event == "silent":
            if last is None:
                continue
            heard = Heard.SILENT
        else:
            heard = Heard.FRESH
            last = {"fail": Status.FAIL, "pass": Status.PASS, "warn": Status.WARN}[event]
            since = 0 if event == "fail" else (since + 1 if since is not None else None)
        failing = ("mlx5_0",) if last is Status.FAIL else ()
        back = (("mlx5_0", since),) if since is not None and not failing else ()
        x = NodeFacts(heard, last, 10, nics=NicFacts(failing, False, back),
                      was_label=label, was_devices=was_devices)  # fmt: skip
        v = decide_validation(policy, {**others, "x": x})
        tainted = "mlx5_0" in v.devices.get("x", ())
        if last is Status.FAIL:
            assert tainted and v.nodes["x"].label is D
        if was_devices and not tainted:
            assert heard is Heard.FRESH and since is not None and since >= recovery
        was_devices, label = tainted, v.nodes["x"].label
