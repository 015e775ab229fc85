"""The detection campaign's scores (tests/detection_score.py), on hand-made looks: what counts
as flagged, gated and named, and how injections become the per-class figures."""

from __future__ import annotations

import pytest

from detection_score import (
    Expect,
    Injection,
    Look,
    flagged,
    gated,
    named,
    percentile,
    score,
    soak,
    table,
    total,
)

NODES = ["a1", "a2", "b1", "b2"]


def look(at: float, **kw: object) -> Look:
    labels = {n: "healthy" for n in NODES}
    labels.update(kw.pop("labels", {}))  # type: ignore[arg-type]
    return Look(at=at, labels=labels, **kw)  # type: ignore[arg-type]


def test_flagged_means_a_label_other_than_healthy_a_taint_or_a_suspect() -> None:
    k = look(
        0,
        labels={"a1": "degraded", "a2": "unknown", "b1": None},
        tainted=frozenset({"b2"}),
        suspects=(("a1", ("peer.loss",)),),
    )
    assert flagged(k) == {
        "a1": frozenset({"label=degraded", "suspect(peer.loss)"}),
        "a2": frozenset({"label=unknown"}),
        "b2": frozenset({"taint"}),
    }  # an unlabelled node (not judged yet) is not flagged
    assert gated(k) == {"b2"}
    assert gated(look(0, labels={"a1": "suspect", "a2": "unhealthy"})) == {"a1", "a2"}


def test_named_needs_the_subject_and_one_of_the_expected_checks() -> None:
    node = Expect("node", "a1", frozenset({"link.carrier"}))
    assert named(look(0, failures=(("a1", "link.carrier", "f0"),)), node)
    assert not named(look(0, failures=(("a1", "peer.loss", "b1"),)), node)  # wrong check
    assert not named(look(0, failures=(("a2", "link.carrier", "f0"),)), node)  # wrong node
    loss = Expect("node", "b2", frozenset({"peer.loss"}))
    assert named(look(0, suspects=(("b2", ("peer.latency", "peer.loss")),)), loss)
    assert not named(look(0, labels={"b2": "unhealthy"}), loss)  # a label names no check
    silent = Expect("silent", "a2")
    assert named(look(0, labels={"a2": "unknown"}), silent)
    assert not named(look(0), silent)
    link = Expect("link", "leaf-a", frozenset({"peer.loss"}))
    assert named(look(0, cells=(("leaf-a", "leaf-b", 3),)), link)
    assert not named(look(0, cells=(("leaf-a", "leaf-a", 3), ("leaf-a", "leaf-b", 0))), link)


def test_an_injection_is_scored_from_the_looks_of_its_window() -> None:
    inj = Injection(
        "port_down", Expect("node", "a1", frozenset({"link.carrier"})),
        injected=10, repaired=40, ended=60, interval=5, preflagged=frozenset({"b2"}),
    )  # fmt: skip
    looks = [
        look(5, labels={"a2": "degraded"}),  # before the injection: not counted
        look(11, labels={"a1": "unhealthy", "b2": "degraded"}),  # b2: left from before
        look(
            12.5,
            labels={"a1": "unhealthy", "b1": "degraded"},
            failures=(("a1", "link.carrier", "f0"),),
        ),
        look(45, labels={"a1": "unhealthy"}),  # after the repair, not yet clear
        look(50),
        look(55, labels={"a2": "degraded"}),  # flagged during the settle: counted
        look(70, labels={"a1": "degraded"}),  # after the end: not counted
    ]
    s = score(inj, looks)
    assert s.detected and s.ttd == pytest.approx(2.5)
    assert set(s.wrong) == {"b1", "a2"}
    assert s.wrong["a2"] == (45.0, frozenset({"label=degraded"}))
    assert s.localized is None and s.clear_after == pytest.approx(10)


def test_a_link_fault_is_localized_only_without_a_gated_node_and_every_flag_is_wrong() -> None:
    inj = Injection("uplink_loss", Expect("link", "leaf-b", frozenset({"peer.loss"})),
                    injected=0, repaired=30, ended=40, interval=5)  # fmt: skip
    cell = (("leaf-a", "leaf-b", 4),)
    link = (("domainPair", "leaf-a", "leaf-b"),)
    ok = score(inj, [look(3, cells=cell, links=link, labels={"b1": "degraded"})])
    assert ok.detected and ok.localized and set(ok.wrong) == {"b1"}
    # a failing cell detects it; localized takes the product naming the link
    unnamed = score(inj, [look(3, cells=cell)])
    assert unnamed.detected and not unnamed.localized
    blamed = score(inj, [look(3, cells=cell, links=link), look(6, tainted=frozenset({"b1"}))])
    assert blamed.detected and not blamed.localized
    assert blamed.clear_after is None  # no look after the repair
    missed = score(inj, [look(3), look(35, cells=cell)])  # named only after the repair
    assert not missed.detected and missed.ttd is None and missed.localized is False


def test_the_table_counts_precision_recall_and_time_to_detect_per_class() -> None:
    node = Expect("node", "a1", frozenset({"link.carrier"}))
    named_at = (("a1", "link.carrier", "f0"),)
    scored = [
        score(Injection("port_down", node, 0, 20, 30, 5), [look(2, failures=named_at)]),
        score(
            Injection("port_down", node, 100, 120, 130, 5),
            [look(104, failures=named_at, labels={"b1": "degraded", "b2": "degraded"})],
        ),
        score(Injection("fail_slow", node, 200, 220, 230, 5), [look(201)]),
    ]
    rows = {r.fault: r for r in table(scored)}
    down = rows["port_down"].as_json(5)
    assert (down["injections"], down["detected"], down["wrongNamings"]) == (2, 2, 2)
    assert down["precision"] == 0.5 and down["recall"] == 1.0
    assert (down["ttdP50Seconds"], down["ttdP99Seconds"], down["ttdP99Intervals"]) == (
        2.0,
        4.0,
        0.8,
    )
    slow = rows["fail_slow"].as_json(5)
    assert slow["recall"] == 0.0 and slow["precision"] is None and slow["ttdP50Seconds"] is None
    all_ = total(list(rows.values()))
    assert (all_.injections, all_.detected, all_.wrong) == (3, 2, 2)


def test_the_soak_counts_each_time_a_node_becomes_flagged() -> None:
    looks = [
        look(0),
        look(1, labels={"a1": "degraded"}, failures=(("a1", "peer.path_mtu", "b1"),)),
        look(2, labels={"a1": "degraded"}),  # still: the same event
        look(3),
        look(4, labels={"a1": "degraded"}),  # again
        look(5, labels={"b2": "unknown"}),
        look(99, labels={"a2": "degraded"}),  # after the end
    ]
    s = soak(looks, 0, 5, nodes=4)
    assert s.flag_events == {"a1": 2, "b2": 1}
    assert s.reasons["a1"][0] == "label=degraded peer.path_mtu b1"
    assert s.fp_per_node_hour == pytest.approx(3 / (4 * 5 / 3600))


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
