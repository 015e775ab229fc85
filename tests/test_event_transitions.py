"""Which Events a status write calls for (pure): the transition diff over every targeted
node, and the rate cap with its one summary per window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult, Report
from netval.model.status import MAX_FAILURES, EventReason, Failure, NetworkValidationStatus
from netval.operator.state.validation import (
    ValidationState,
    ingest_report,
    node_offline,
    set_spec,
    set_targeted,
)
from netval.operator.status.event_budget import Budget, admit, due
from netval.operator.status.transitions import (
    PASSING,
    Known,
    Seen,
    Transition,
    diff,
    observe,
    seed,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
INTERVAL = 10.0
F, R, S = EventReason.CHECK_FAILING, EventReason.CHECK_RECOVERED, EventReason.NODE_STALE


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def report(node: str, started: float, *failing: CheckId) -> Report:
    results = [
        CheckResult(check=c, subject="ens1np0", status=Status.FAIL, message=f"{c} broken")
        for c in failing
    ] or [
        CheckResult(check=CheckId.LINK_CARRIER, subject="ens1np0", status=Status.PASS, message="up")
    ]
    return Report(
        validation="fabric",
        generation=1,
        node=node,
        started_at=at(started),
        duration_ms=500,
        status=Status.FAIL if failing else Status.PASS,
        results=results,
    )


def state(nodes: list[str]) -> ValidationState:
    s = ValidationState(name="fabric")
    set_spec(s, generation=1, interval_seconds=INTERVAL)
    set_targeted(s, nodes, at(0))
    return s


def failing(*checks: str) -> Seen:
    return Seen(failing=tuple((c, f"{c} broken") for c in sorted(checks)))


def said(transitions: list[Transition]) -> list[tuple[EventReason, str, tuple[str, ...]]]:
    return [(t.reason, t.node, t.checks) for t in transitions]


# -- observe: what the status at `now` says about each node ------------------------------


def test_observe_judges_nodes_as_the_status_does() -> None:
    s = state(["a", "b", "c", "d", "e"])
    ingest_report(s, report("a", 0, CheckId.MTU_INTERFACE, CheckId.LINK_CARRIER), at(1))
    ingest_report(s, report("b", 0), at(1))
    ingest_report(s, report("c", 0, CheckId.MTU_INTERFACE), at(1))
    node_offline(s, "c", at(2))  # its agent's last will
    ingest_report(s, report("d", 0, CheckId.MTU_INTERFACE), at(1))
    seen = observe(s, at(1 + 3 * INTERVAL + 1))  # d: no report within 3 intervals
    assert seen["c"] == Seen(stale="offline")
    assert seen["d"] == Seen(stale="no report for 31s")
    assert "e" not in seen  # never reported: nothing to say
    fresh = observe(s, at(5))
    assert fresh["a"].checks == {"mtu.interface", "link.carrier"}
    assert dict(fresh["a"].failing)["mtu.interface"] == "mtu.interface broken"
    assert fresh["b"] is PASSING


# -- diff --------------------------------------------------------------------------------


def test_a_failing_node_that_goes_stale_is_node_stale_not_recovered() -> None:
    known = {"a": Known(frozenset({"mtu.interface", "link.carrier"}))}
    out, after = diff(known, {"a": Seen(stale="offline")})
    assert said(out) == [(S, "a", ("link.carrier", "mtu.interface"))]
    assert out[0].type == "Warning"
    assert out[0].message == (
        "node a is stale (offline) while failing link.carrier, mtu.interface: not judged"
        " until it reports again"
    )
    # still stale: nothing more; back and passing one of them: that one recovered
    out, after = diff(after, {"a": Seen(stale="no report for 40s")})
    assert out == [] and after["a"].stale
    out, after = diff(after, {"a": failing("link.carrier")})
    assert said(out) == [(R, "a", ("mtu.interface",))]
    assert out[0].type == "Normal" and out[0].message == "node a passes mtu.interface again"
    out, after = diff(after, {"a": PASSING})
    assert said(out) == [(R, "a", ("link.carrier",))] and after == {}


def test_a_stale_node_back_with_a_new_failure_says_only_the_new_one() -> None:
    known = {"a": Known(frozenset({"mtu.interface"}), stale=True)}
    out, _ = diff(known, {"a": failing("mtu.interface", "link.carrier")})
    assert said(out) == [(F, "a", ("link.carrier",))]
    assert out[0].message == "node a fails link.carrier: link.carrier broken"


def test_passing_nodes_going_stale_or_leaving_say_nothing() -> None:
    out, after = diff({}, {"a": Seen(stale="offline"), "b": PASSING})
    assert out == [] and after == {}
    # a failing node no longer targeted (or deleted): neither recovered nor stale
    out, after = diff({"a": Known(frozenset({"mtu.interface"}))}, {})
    assert out == [] and after == {}


def test_failures_far_past_the_status_cap_are_all_transitions() -> None:
    nodes = [f"n{i:04d}" for i in range(MAX_FAILURES * 20)]
    out, known = diff({}, {n: failing("mtu.interface") for n in nodes})
    assert said(out) == [(F, n, ("mtu.interface",)) for n in nodes]
    out, _ = diff(known, {n: PASSING for n in nodes})
    assert len(out) == len(nodes) and {t.reason for t in out} == {R}


def test_order_puts_warnings_first() -> None:
    known = {"a": Known(frozenset({"x"})), "b": Known(frozenset({"y"}))}
    out, _ = diff(known, {"a": PASSING, "b": Seen(stale="offline"), "c": failing("z")})
    assert [t.reason for t in out] == [F, S, R]


checks = st.frozensets(st.sampled_from(["a.x", "b.y", "c.z"]), max_size=3)
seen_node = st.one_of(
    st.just(PASSING),
    st.just(Seen(stale="offline")),
    checks.filter(bool).map(lambda c: failing(*c)),
)
views = st.dictionaries(st.sampled_from(["n1", "n2", "n3"]), seen_node, max_size=3)


@given(st.lists(views, min_size=1, max_size=8))
def test_every_failure_is_said_started_before_it_is_said_ended(
    history: list[dict[str, Seen]],
) -> None:
    """Over any sequence of observations, per (node, check): CheckFailing and the end of
    it (CheckRecovered, or NodeStale naming it) alternate, starting with CheckFailing, and
    what is known is exactly the failures said and not ended (a stale node's included)."""
    known: dict[str, Known] = {}
    open_: set[tuple[str, str]] = set()
    for seen in history:
        out, known = diff(known, seen)
        for t in out:
            for check in t.checks:
                key = (t.node, check)
                if t.reason is F:
                    assert key not in open_
                    open_.add(key)
                elif t.reason is R:
                    assert key in open_
                    open_.discard(key)
                else:
                    assert key in open_  # NodeStale: still open, judged when it returns
        # a node gone from the view (untargeted) is forgotten with its open failures
        open_ = {(n, c) for n, c in open_ if n in seen}
        assert {(n, c) for n, k in known.items() for c in k.checks} == open_
        for node, view in seen.items():
            if view.failing:
                assert known[node] == Known(view.checks)


def test_seed_from_the_status_written_before_a_restart() -> None:
    def status(nodes: list[str]) -> NetworkValidationStatus:
        return NetworkValidationStatus(
            failures=[
                Failure(node=n, check="mtu.interface", subject="e", message="m", since=T0)
                for n in nodes
            ]
        )

    now = {"a": failing("mtu.interface"), "b": failing("mtu.interface"), "c": PASSING}
    # a short list is complete: b started failing while no operator led
    out, _ = diff(seed(status(["a"]), now), now)
    assert said(out) == [(F, "b", ("mtu.interface",))]
    assert seed(None, now) == {}
    # a full list may have left failures out: those seen now were said by the last term
    full = [f"n{i:03d}" for i in range(MAX_FAILURES)]
    now |= {n: PASSING for n in full}
    out, _ = diff(seed(status(full), now), now)
    assert said(out) == [(R, n, ("mtu.interface",)) for n in full]  # no CheckFailing of a, b


# -- the rate cap ------------------------------------------------------------------------


def stale(n: int) -> list[Transition]:
    return [Transition(S, f"n{i:05d}", ("mtu.interface",), "offline") for i in range(n)]


def test_a_fleet_going_stale_at_once_is_cap_events_and_one_summary() -> None:
    budget = Budget()
    admitted = admit(budget, stale(10_000), 100.0, cap=10, window=60.0)
    assert len(admitted.post) == 10 and admitted.post[0].node == "n00000"
    assert admitted.summary is not None
    assert admitted.summary.message == (
        "9990 more transitions not posted as events (at most 10 per 60 s): 9990 NodeStale;"
        " the status and `netval status --failing` have every node"
    )
    assert admitted.suppressed == {S: 9990}
    # more within the window: counted, said once the window is over
    more = admit(budget, [Transition(R, "x", ("c",)), Transition(F, "y", ("c",), "m")], 130.0)
    assert more.post == [] and more.summary is None and more.suppressed == {R: 1, F: 1}
    assert due(budget, 159.9) is None
    late = due(budget, 160.0)
    assert late is not None and late.counts == ((F, 1), (R, 1))
    assert due(budget, 500.0) is None  # said once


def test_a_new_window_posts_again_and_merges_what_waited_into_its_summary() -> None:
    budget = Budget()
    admit(budget, stale(11), 0.0, cap=10, window=60.0)  # 10 posted, 1 summarised
    admit(budget, stale(3), 10.0, cap=10, window=60.0)  # waits
    admitted = admit(budget, stale(12), 61.0, cap=10, window=60.0)
    assert len(admitted.post) == 10
    assert admitted.summary is not None and admitted.summary.total == 3 + 2


@given(st.lists(st.tuples(st.integers(0, 30), st.floats(0, 50)), max_size=30))
def test_every_transition_is_posted_or_counted_and_windows_stay_bounded(
    batches: list[tuple[int, float]],
) -> None:
    budget, now = Budget(), 0.0
    posted = summarised = suppressed = 0
    events_at: list[float] = []
    for size, step in batches:
        now += step
        admitted = admit(budget, stale(size), now, cap=10, window=60.0)
        posted += len(admitted.post)
        suppressed += sum(admitted.suppressed.values())
        events_at += [now] * (len(admitted.post) + (admitted.summary is not None))
        if admitted.summary is not None:
            summarised += admitted.summary.total
    final = due(budget, now + 61.0)
    if final is not None:
        summarised += final.total
        events_at.append(now + 61.0)
    assert posted + suppressed == sum(size for size, _ in batches)
    assert summarised == suppressed
    # windows open at the first Event after the last closed: never more than cap + 1 in one
    for start in events_at:
        assert sum(1 for t in events_at if start <= t < start + 60.0) <= 2 * 11
