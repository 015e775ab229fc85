"""Which peers a node probes, and when it samples throughput (pure: no I/O, no clock).

Latency/loss/path-MTU probes, per cycle (`select_peers`)
    Every domain's members are put in one fixed order that every agent computes alike (by a
    hash of the node name). In cycle ``c`` a node with rank ``r`` (its position in the
    hash order of all nodes) probes, in each domain, the ``k = samplesPerDomain`` members at
    positions ``(r + c*k + i) mod n`` for ``i < k`` (its own domain without itself). So:

    - per cycle a node probes at most ``k`` peers per domain: O(domains x k) probes, O(N)
      over the fabric, never O(N^2);
    - over any ``coverage_cycles = ceil(n_max / k)`` consecutive cycles (``n_max`` the
      largest member list, the own domain counted without the node) it has probed every
      other node: all pairs are covered in both directions (while membership is stable);
    - the rank offset spreads the probers of a cycle evenly over a domain's members, so a
      node is probed by about ``k x probers / n`` peers per cycle, not by everyone at once.

Throughput samples, per wall-clock slot (`throughput_schedule`)
    Throughput is sampled in slots of the agent interval aligned on the Unix epoch, the same
    slot on every agent (clocks are NTP-synced; a sample lasts ~1 s and starts just after
    the slot boundary, so neighbouring slots never overlap). Domains are paired by a round
    robin (the circle method): with ``M`` = the number of domains rounded up to odd, slot
    ``s`` pairs domain ``i`` with domain ``(s - i) mod M``; a domain paired with itself or
    with the padding slot samples inside itself. Each match is one sample, between one
    member of each side, chosen by rotating through the members. Hence:

    - in a slot every domain takes part in at most one sample, so no node is the target of
      more than one prober, and samples running at the same time never share a domain (nor
      its uplinks): overlapping samples cannot distort the cross/intra ratio;
    - every unordered domain pair is sampled once per rotation of ``M`` slots (the direction
      alternates between rotations), and every domain with two or more members samples
      itself at least once per rotation;
    - a given node sends a sample only every ~``n x M / 2`` slots: rare next to the echoes
      it sends every cycle.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

UNASSIGNED: Final = ""  # the domain of nodes whose topology label is not known (yet)


def _key(name: str, salt: str = "") -> bytes:
    return hashlib.blake2b(f"{salt}\0{name}".encode(), digest_size=8).digest()


def hash_order(names: Sequence[str] | set[str] | frozenset[str], salt: str = "") -> list[str]:
    """`names` in a pseudo-random order that every agent computes alike."""
    return sorted(names, key=lambda n: (_key(n, salt), n))


def group_by_domain(domains: Mapping[str, str | None]) -> dict[str, list[str]]:
    """node -> domain (None: unassigned) into domain -> members in hash order."""
    groups: dict[str, list[str]] = {}
    for node, domain in domains.items():
        groups.setdefault(domain or UNASSIGNED, []).append(node)
    return {d: hash_order(members, d) for d, members in sorted(groups.items())}


# -- latency probes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerPlan:
    """What `select_peers` computes once per endpoint-table version (cheap per cycle)."""

    me: str
    rank: int
    lists: tuple[tuple[str, tuple[str, ...]], ...]  # (domain, members to probe) per domain

    @property
    def largest(self) -> int:
        """Length of the longest member list (the own domain counted without `me`)."""
        return max((len(m) for _, m in self.lists), default=0)


def plan_peers(me: str, my_domain: str | None, domains: Mapping[str, str | None]) -> PeerPlan:
    """Precompute the per-domain member lists (without `me`) and my rank."""
    table = dict(domains)
    table[me] = my_domain
    groups = group_by_domain(table)
    everyone = hash_order(list(table))
    rank = everyone.index(me)
    lists = tuple(
        (domain, tuple(m for m in members if m != me)) for domain, members in groups.items()
    )
    return PeerPlan(me=me, rank=rank, lists=tuple((d, m) for d, m in lists if m))


def peers_for_cycle(plan: PeerPlan, samples: int, cycle: int) -> list[str]:
    """At most `samples` peers per domain for this cycle (see the module docstring)."""
    if samples < 1:
        raise ValueError("samples must be at least 1")
    chosen: list[str] = []
    for _domain, members in plan.lists:
        n = len(members)
        if n <= samples:
            chosen.extend(members)
            continue
        start = plan.rank + cycle * samples
        chosen.extend(members[(start + i) % n] for i in range(samples))
    return chosen


def select_peers(
    me: str,
    my_domain: str | None,
    domains: Mapping[str, str | None],
    samples: int,
    cycle: int,
) -> list[str]:
    """The peers `me` probes in `cycle`; `domains` maps every announced node to its domain
    (it may or may not contain `me`)."""
    return peers_for_cycle(plan_peers(me, my_domain, domains), samples, cycle)


def coverage_cycles(
    me: str, my_domain: str | None, domains: Mapping[str, str | None], samples: int
) -> int:
    """Consecutive cycles within which `me` probes every other node (stable membership)."""
    largest = plan_peers(me, my_domain, domains).largest
    return math.ceil(largest / samples) if largest else 0


# -- throughput slots ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputPair:
    prober: str
    target: str
    prober_domain: str
    target_domain: str

    @property
    def cross(self) -> bool:
        return self.prober_domain != self.target_domain


def slot_of(unix_seconds: float, slot_seconds: float) -> int:
    if slot_seconds <= 0:
        raise ValueError("slot_seconds must be positive")
    return math.floor(unix_seconds / slot_seconds)


def rotation_length(num_domains: int) -> int:
    """Slots in which every domain pair is sampled once (number of domains made odd)."""
    if num_domains <= 0:
        return 0
    return num_domains if num_domains % 2 else num_domains + 1


def _member(members: Sequence[str], turn: int, salt: str) -> str:
    offset = int.from_bytes(_key(salt), "big") % len(members)
    return members[(turn + offset) % len(members)]


def throughput_schedule(domains: Mapping[str, str | None], slot: int) -> list[ThroughputPair]:
    """Every throughput sample of `slot` across the fabric (see the module docstring)."""
    return schedule_from_groups(group_by_domain(domains), slot)


def schedule_from_groups(groups: Mapping[str, list[str]], slot: int) -> list[ThroughputPair]:
    """`throughput_schedule` from `group_by_domain`'s result (the operator runs many slots)."""
    names = list(groups)
    m = rotation_length(len(names))
    if m == 0:
        return []
    rotation, round_ = divmod(slot, m)
    pairs: list[ThroughputPair] = []
    for i, a in enumerate(names):
        j = (round_ - i) % m
        if j < i and j < len(names):
            continue  # the match was emitted from the other side
        members_a = groups[a]
        if j == i or j >= len(names):
            # bye (paired with itself or the padding slot): a sample inside the domain
            n = len(members_a)
            if n < 2:
                continue
            prober_index = rotation % n
            # the target walks through all other members over n - 1 rotations
            step = 1 + (rotation // n) % (n - 1)
            pairs.append(
                ThroughputPair(members_a[prober_index], members_a[(prober_index + step) % n], a, a)
            )
            continue
        b = names[j]
        # alternate the direction between rotations (and between pairs within one)
        src, dst = (a, b) if (rotation + i + j) % 2 == 0 else (b, a)
        pairs.append(
            ThroughputPair(
                _member(groups[src], rotation // 2, f"{src}>{dst}"),
                _member(groups[dst], rotation // 2, f"{dst}<{src}"),
                src,
                dst,
            )
        )
    return pairs


def my_throughput_target(
    me: str, my_domain: str | None, domains: Mapping[str, str | None], slot: int
) -> ThroughputPair | None:
    """The sample `me` sends in `slot`, if any."""
    table = dict(domains)
    table[me] = my_domain
    for pair in throughput_schedule(table, slot):
        if pair.prober == me:
            return pair
    return None
