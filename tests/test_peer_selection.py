"""Peer selection and throughput slots (pure): coverage, per-cycle bounds, one prober per
target per slot. Property tests over seeded random fabrics (reproducible, no extra deps)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from netval.model.peer_selection import (
    UNASSIGNED,
    coverage_cycles,
    group_by_domain,
    my_throughput_target,
    plan_peers,
    rotation_length,
    select_peers,
    slot_of,
    throughput_schedule,
)

SEEDS = range(40)


def random_fabric(rng: random.Random) -> dict[str, str | None]:
    domains = rng.randint(1, 8)
    table: dict[str, str | None] = {}
    for d in range(domains):
        for i in range(rng.randint(1, 15)):
            table[f"gpu-{d}-{i:02d}"] = f"rack-{d}"
    if rng.random() < 0.2:
        table["gpu-nolabel"] = None  # unassigned nodes form their own group
    return table


def fabric(racks: int, per_rack: int) -> dict[str, str | None]:
    return {f"n{r:03d}-{i:03d}": f"rack-{r:03d}" for r in range(racks) for i in range(per_rack)}


@pytest.mark.parametrize("seed", SEEDS)
def test_every_pair_is_covered_within_the_documented_cycles(seed: int) -> None:
    rng = random.Random(seed)
    table = random_fabric(rng)
    samples = rng.randint(1, 4)
    groups = group_by_domain(table)
    for me in rng.sample(sorted(table), min(5, len(table))):
        k_cycles = coverage_cycles(me, table[me], table, samples)
        own = table[me] or UNASSIGNED
        largest = max(len(m) - (d == own) for d, m in groups.items())
        assert k_cycles == math.ceil(largest / samples)
        start = rng.randint(0, 10_000)  # any K consecutive cycles, not only from 0
        seen: set[str] = set()
        for cycle in range(start, start + k_cycles):
            seen |= set(select_peers(me, table[me], table, samples, cycle))
        assert seen == set(table) - {me}, (me, samples, k_cycles)


@pytest.mark.parametrize("seed", SEEDS)
def test_per_cycle_work_is_bounded_by_domains_times_samples(seed: int) -> None:
    rng = random.Random(seed)
    table = random_fabric(rng)
    samples = rng.randint(1, 4)
    groups = group_by_domain(table)
    for me in sorted(table):
        for cycle in rng.sample(range(1000), 5):
            chosen = select_peers(me, table[me], table, samples, cycle)
            assert me not in chosen
            assert len(chosen) == len(set(chosen))
            per_domain = Counter(table[p] or UNASSIGNED for p in chosen)
            assert all(n <= samples for n in per_domain.values()), per_domain
            assert len(chosen) <= samples * len(groups)


def test_probers_of_a_cycle_are_spread_over_a_domain() -> None:
    """No target is hit by everyone at once: per cycle a node is probed by about
    samples x probers / members peers (the rank offsets spread them evenly)."""
    table = fabric(racks=10, per_rack=20)
    samples = 2
    for cycle in (0, 1, 7):
        load: Counter[str] = Counter()
        for me in table:
            load.update(select_peers(me, table[me], table, samples, cycle))
        mean = sum(load.values()) / len(table)
        assert mean == samples * 10  # every node probes 2 peers in each of the 10 racks
        # even spread: nobody gets more than twice the mean
        assert max(load.values()) <= 2 * mean, load.most_common(3)
        assert min(load.values()) >= mean / 2


def test_scale_1000_nodes_50_domains() -> None:
    table = fabric(racks=50, per_rack=20)
    me = "n007-003"
    plan = plan_peers(me, table[me], table)
    assert plan.largest == 20
    assert coverage_cycles(me, table[me], table, 2) == 10
    for cycle in range(10):
        assert len(select_peers(me, table[me], table, 2, cycle)) == 100  # 50 domains x 2


def test_selection_is_independent_of_table_order() -> None:
    table = fabric(racks=4, per_rack=7)
    shuffled = dict(sorted(table.items(), key=lambda kv: random.Random(3).random()))
    for me in ("n000-000", "n003-006"):
        for cycle in range(5):
            assert select_peers(me, table[me], table, 2, cycle) == select_peers(
                me, table[me], shuffled, 2, cycle
            )


def test_a_domain_smaller_than_samples_is_probed_whole_every_cycle() -> None:
    table = {"a1": "a", "a2": "a", "b1": "b"}
    assert sorted(select_peers("a1", "a", table, 4, 0)) == ["a2", "b1"]
    assert select_peers("solo", "z", {}, 2, 0) == []
    assert coverage_cycles("solo", "z", {}, 2) == 0


# -- throughput slots -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_one_sample_per_domain_and_per_target_in_every_slot(seed: int) -> None:
    rng = random.Random(seed)
    table = random_fabric(rng)
    start = rng.randint(0, 10**6)
    for slot in range(start, start + 60):
        pairs = throughput_schedule(table, slot)
        targets = Counter(p.target for p in pairs)
        assert all(n == 1 for n in targets.values()), (slot, targets)
        # every node takes part in at most one sample, every domain too: concurrent samples
        # never share a node or a domain
        nodes = Counter([p.prober for p in pairs] + [p.target for p in pairs])
        assert all(n == 1 for n in nodes.values()), (slot, pairs)
        domains = Counter(d for p in pairs for d in {p.prober_domain, p.target_domain})
        assert all(n == 1 for n in domains.values()), (slot, pairs)
        for p in pairs:
            assert p.prober != p.target
            assert (table[p.prober] or UNASSIGNED) == p.prober_domain
            assert (table[p.target] or UNASSIGNED) == p.target_domain


@pytest.mark.parametrize("seed", SEEDS)
def test_a_rotation_samples_every_domain_pair_once(seed: int) -> None:
    rng = random.Random(seed)
    table = random_fabric(rng)
    groups = group_by_domain(table)
    names = sorted(groups)
    m = rotation_length(len(names))
    start = rng.randint(0, 10**5) * m  # rotations start at multiples of m
    cross: Counter[frozenset[str]] = Counter()
    directed: set[tuple[str, str]] = set()
    intra: Counter[str] = Counter()
    for slot in range(start, start + 2 * m):
        for p in throughput_schedule(table, slot):
            if p.cross:
                if slot < start + m:
                    cross[frozenset((p.prober_domain, p.target_domain))] += 1
                directed.add((p.prober_domain, p.target_domain))
            elif slot < start + m:
                intra[p.prober_domain] += 1
    expected = {frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1 :]}
    assert set(cross) == expected
    assert all(n == 1 for n in cross.values())
    # two rotations: both directions
    assert directed == {(a, b) for a in names for b in names if a != b}
    for d, members in groups.items():
        assert (intra[d] >= 1) == (len(members) >= 2), (d, members, intra)


def test_intra_samples_walk_through_all_ordered_pairs_of_a_domain() -> None:
    table = {f"a{i}": "a" for i in range(4)}
    seen = {(p.prober, p.target) for s in range(200) for p in throughput_schedule(table, s)}
    assert seen == {(x, y) for x in table for y in table if x != y}


def test_throughput_is_rare_per_node() -> None:
    table = fabric(racks=10, per_rack=8)
    m = rotation_length(10)
    slots = 40 * m
    sent: Counter[str] = Counter()
    for slot in range(slots):
        sent.update(p.prober for p in throughput_schedule(table, slot))
    # ~ one sample per domain per slot at most, spread over the members
    assert max(sent.values()) <= slots / 8 * 1.5
    assert sum(sent.values()) <= 10 * slots


def test_my_target_agrees_with_the_schedule_and_the_slot_clock() -> None:
    table = fabric(racks=3, per_rack=4)
    for slot in range(12):
        pairs = throughput_schedule(table, slot)
        for node, domain in table.items():
            mine = my_throughput_target(node, domain, table, slot)
            expected = next((p for p in pairs if p.prober == node), None)
            assert mine == expected
    assert (slot_of(59.9, 30), slot_of(60.0, 30), slot_of(1_700_000_000, 30)) == (1, 2, 56_666_666)
    with pytest.raises(ValueError):
        slot_of(1.0, 0)
    assert throughput_schedule({}, 5) == []
    assert throughput_schedule({"solo": "a"}, 5) == []
