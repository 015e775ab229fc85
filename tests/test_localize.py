"""Culprit localization (`netval.operator.state.localize`, through `east_west_matrix.analyse`):
a suspect link is named when the paths through it fail and the paths around it do not; the
nodes whose failing paths a suspect elsewhere explains are observers."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from netval.model.east_west import MAX_LINK_SUSPECTS, EastWest
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.operator.state.east_west_matrix import analyse
from netval.operator.state.localize import localize, observers


def loss(peer: str, bad: bool) -> CheckResult:
    return CheckResult(
        check=CheckId.PEER_LOSS,
        subject=peer,
        status=Status.FAIL if bad else Status.PASS,
        message="loss",
        observed={"lossPercent": 20.0 if bad else 0.0},
    )


def fabric(racks: int, per_rack: int) -> dict[str, str | None]:
    return {f"r{r}n{n}": f"rack-{r}" for r in range(racks) for n in range(per_rack)}


def mesh(domains: dict[str, str | None], bad: object) -> dict[str, list[CheckResult]]:
    """Every node probes every other; `bad(a, b)` says whether their path fails."""
    assert callable(bad)
    return {n: [loss(p, bool(bad(n, p))) for p in domains if p != n] for n in domains}


def run(domains: dict[str, str | None], bad: object) -> tuple[EastWest, frozenset[str]]:
    got = analyse(mesh(domains, bad), domains, min_throughput_ratio=0.5)
    return got.summary, got.observers


def test_a_lossy_uplink_of_one_of_three_racks_is_named_and_every_node_observes() -> None:
    domains = fabric(3, 3)

    def bad(a: str, b: str) -> bool:
        ra, rb = domains[a], domains[b]
        return ra != rb and "rack-1" in (ra, rb)

    ew, watching = run(domains, bad)
    (link,) = ew.link_suspects
    assert (link.kind, link.a, link.b) == ("uplink", "rack-1", None)
    assert (link.failing_paths, link.paths) == (18, 18)  # 3 x 3 to each of two racks
    assert (link.failing_around, link.paths_around) == (0, 18)  # 3 x 3 intra + rack-0/2
    assert link.confidence == 1.0 and link.checks == ["peer.loss"]
    assert ew.suspects == [] and ew.unexplained_failing_pairs == 0
    assert watching == frozenset(domains) and ew.observers == 9


def test_two_racks_name_the_pair_three_racks_with_one_bad_pair_name_that_pair() -> None:
    two = fabric(2, 3)
    ew, _ = run(two, lambda a, b: two[a] != two[b])
    assert [(s.kind, s.a, s.b) for s in ew.link_suspects] == [("domainPair", "rack-0", "rack-1")]
    three = fabric(3, 3)
    ew, _ = run(three, lambda a, b: {three[a], three[b]} == {"rack-0", "rack-2"})
    assert [(s.kind, s.a, s.b) for s in ew.link_suspects] == [("domainPair", "rack-0", "rack-2")]


def test_a_lossy_node_is_a_node_suspect_not_a_link_and_its_peers_observe() -> None:
    domains = fabric(2, 4)
    ew, watching = run(domains, lambda a, b: "r0n1" in (a, b))
    assert ew.link_suspects == []
    assert [s.node for s in ew.suspects] == ["r0n1"]
    assert 0 < ew.suspects[0].confidence <= 1
    assert "r0n1" not in watching and watching == frozenset(domains) - {"r0n1"}


def test_one_node_of_a_two_node_rack_is_not_taken_for_the_rack_pair() -> None:
    # the cross cell is half bad and the failing paths all touch one node: the node's fault
    domains = fabric(2, 2)
    ew, _ = run(domains, lambda a, b: "r0n0" in (a, b))
    assert ew.link_suspects == []


def test_a_fault_everywhere_names_nothing_and_nobody_observes() -> None:
    domains = fabric(3, 3)
    ew, watching = run(domains, lambda a, b: True)
    assert ew.link_suspects == [] and watching == frozenset()
    assert ew.unexplained_failing_pairs == ew.failing_pairs == 36


def test_a_node_with_a_failing_path_no_suspect_explains_is_no_observer() -> None:
    assert observers({("a", "b"): {"x"}}, set(), {("a", "b"): "b"}) == {"a"}
    # a-c fails and nothing explains it: neither a nor c observes; b is the suspect
    assert observers({("a", "b"): {"x"}, ("a", "c"): {"x"}}, set(), {("a", "b"): "b"}) == set()
    assert observers({("a", "b"): {"x"}}, {("a", "b")}, {}) == {"a", "b"}
    # a node that is itself a suspect never observes
    assert observers({("a", "b"): {"x"}, ("c", "d"): {"x"}}, {("c", "d")}, {("a", "b"): "a"}) == {
        "b",
        "c",
        "d",
    }


_NAMES = st.sampled_from([f"n{i}" for i in range(12)])


@settings(max_examples=200, deadline=None)
@given(
    assignment=st.dictionaries(_NAMES, st.sampled_from(["d0", "d1", "d2", "d3"]), min_size=2),
    bad_share=st.floats(0, 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_fabrics_keep_the_rules(
    assignment: dict[str, str], bad_share: float, seed: int
) -> None:
    """Whatever fails: bounded, every named link's cell fails as the rule says and the paths
    around it pass, the counts add up, and an explained pair lies under a named link."""
    import random

    rng = random.Random(seed)
    nodes = sorted(assignment)
    cells: dict[tuple[str, str], dict[tuple[str, str], bool]] = {}
    bad_checks: dict[tuple[str, str], set[str]] = {}
    for x, y in itertools.combinations(nodes, 2):
        if rng.random() < 0.2:
            continue  # not every pair is probed
        da, db = sorted((assignment[x], assignment[y]))
        failed = rng.random() < bad_share
        cells.setdefault((da, db), {})[(x, y)] = failed
        if failed:
            bad_checks[(x, y)] = {"peer.loss"}
    found, explained = localize(cells, bad_checks, assignment)
    assert len(found) <= MAX_LINK_SUSPECTS
    assert explained <= set(bad_checks)
    for s in found:
        assert 0 <= s.confidence <= 1
        assert s.failing_paths <= s.paths and s.failing_around <= s.paths_around
        assert s.paths_around > 0 and s.failing_around / s.paths_around <= 0.25
        assert s.failing_paths / s.paths >= 0.75 and s.failing_paths >= 2
        if s.kind == "domainPair":
            assert s.b is not None and (s.a, s.b) in cells
    for x, y in explained:
        da, db = sorted((assignment[x], assignment[y]))
        assert da != db
        assert any(
            (s.kind == "domainPair" and (s.a, s.b) == (da, db))
            or (s.kind == "uplink" and s.a in (da, db))
            for s in found
        )


def test_the_event_names_the_link_first_then_a_node() -> None:
    from netval.operator.status.culprits import culprit

    domains = fabric(3, 3)
    ew, _ = run(
        domains, lambda a, b: domains[a] != domains[b] and "rack-1" in (domains[a], domains[b])
    )
    key, message = culprit(ew) or ("", "")
    assert key == "link:uplink:rack-1:"
    assert message.startswith("the uplink of rack-1 is the suspect: 18 of 18 node pairs")
    assert "9 observing node(s)" in message
    ew, _ = run(domains, lambda a, b: "r0n1" in (a, b))
    assert (culprit(ew) or ("",))[0] == "node:r0n1"
    assert culprit(run(domains, lambda a, b: False)[0]) is None


def test_a_node_whose_home_paths_pass_and_cross_paths_fail_is_no_node_suspect() -> None:
    # the first failing cross paths of an uplink fault: r0n0's two paths to rack-1 fail,
    # its paths inside rack-0 pass, so its port is fine
    domains = fabric(2, 4)
    bad = {("r0n0", "r1n0"), ("r0n0", "r1n1")}
    ew, _ = run(domains, lambda a, b: (a, b) in bad or (b, a) in bad)
    assert ew.suspects == [] and ew.link_suspects == []
    # the same failures with a failing home path too: its port
    bad |= {("r0n0", "r0n1"), ("r0n0", "r0n2"), ("r0n0", "r0n3"), ("r0n0", "r1n2")}
    ew, _ = run(domains, lambda a, b: (a, b) in bad or (b, a) in bad)
    assert [s.node for s in ew.suspects] == ["r0n0"]
