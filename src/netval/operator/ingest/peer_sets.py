"""Which peers each node probes in an epoch, and with which endpoints (pure, but for the
endpoint table the subscriber fills).

Issue 24: every agent used to subscribe to every endpoint of its validation, so a broker
restart delivered N endpoints to each of N agents (N^2 messages; 10^8 at 10,000 nodes).
Now only the operator reads the endpoints (N), and each node's retained ``assignment``
carries the endpoints of its bounded peer set for the current epoch, so a broker restart
delivers one assignment per node: O(N x peers), peers at most ``SET_DOMAINS x w`` plus
its throughput targets.

The peer set (docs/checks.md, "Peer sets per epoch"):

- An epoch is `EPOCH_CYCLES` agent intervals (slots), aligned on the Unix epoch like the
  throughput slots (`netval.model.peer_selection.slot_of`).
- Domains: its own and ``m = SET_DOMAINS - 1`` others (all others if fewer). The node at
  position ``p`` of its domain (hash order of the domain's targeted nodes) takes the other
  domains at positions ``(p + e) x m + j``, ``j < m``, of the others' list (sorted): the
  members of one domain tile the list, so together they reach ``n x m`` other domains per
  epoch, and each node reaches every other domain once per ``L = ceil(others / m)``
  epochs (a "round": sweep index ``p + e`` divided by ``L``).
- Members: in each of its domains a window of ``w = WINDOW_CYCLES x samplesPerDomain``
  (all of them if fewer), at positions ``(rank + t x w + i) mod n`` of the domain's hash
  order, itself skipped, ``rank`` its position in the hash order of all targeted nodes and
  ``t`` the epoch in its own domain, the round in the others. Hence every node has probed
  every other node of its domain after ``ceil(n / w)`` epochs and every node of the fleet
  after ``L x (ceil(n_max / w) + 1)`` epochs (stable membership).
- Throughput: the operator runs the fleet's slot schedule (`selection.throughput_schedule`,
  over the nodes that announced an endpoint; unchanged) for this epoch and the next (an
  agent keeps its slots across the epoch boundary until the new assignment arrives) and
  tells each prober its slots and targets; the targets' endpoints join its peer set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pydantic import ValidationError

from netval.model.peer_assignment import MAX_ASSIGNED_PEERS, MIN_SLOT_SECONDS, EndpointPayload
from netval.model.peer_selection import (
    UNASSIGNED,
    group_by_domain,
    hash_order,
    schedule_from_groups,
    slot_of,
)
from netval.model.spec import NetworkValidationSpec

EPOCH_CYCLES: Final = 40  # agent intervals per epoch (20 minutes at the default 30 s)
WINDOW_CYCLES: Final = 4  # window per domain = WINDOW_CYCLES x samplesPerDomain
SET_DOMAINS: Final = 8  # domains in a peer set: the node's own and 7 others

Address = tuple[str, int]


def slot_seconds(spec: NetworkValidationSpec) -> float:
    return max(spec.interval_seconds, MIN_SLOT_SECONDS)


def epoch_of(spec: NetworkValidationSpec, unix_seconds: float) -> int:
    return slot_of(unix_seconds, slot_seconds(spec)) // EPOCH_CYCLES


def window_size(samples: int, domains: int) -> int:
    w = samples * WINDOW_CYCLES
    if domains and domains * w > MAX_ASSIGNED_PEERS // 2:
        w = max(1, (MAX_ASSIGNED_PEERS // 2) // domains)
    return w


# A node's load-test rails as announced: ((name, address, rdma), ...) for its rails in
# order, and the other interfaces a load test may name (netval.agent.loadtest.rails).
AnnouncedRail = tuple[str, str, bool]
AnnouncedRails = tuple[tuple[AnnouncedRail, ...], tuple[AnnouncedRail, ...]]


class Endpoints(Protocol):
    """What the peer sets read: validation -> node -> (address, port)."""

    def of(self, validation: str) -> Mapping[str, Address]: ...


class EndpointTable:
    """validation -> node -> (address, port), from the agents' retained announcements, and
    each node's announced rails (`rails_of`; a change of rails alone is not a change of the
    peer sets)."""

    def __init__(self) -> None:
        self._table: dict[str, dict[str, Address]] = {}
        self._rails: dict[str, dict[str, AnnouncedRails]] = {}

    def update(self, validation: str, node: str, payload: bytes) -> bool:
        """Take one announcement (empty: cleared; invalid: removed); True if it changed."""
        entry: Address | None = None
        rails: AnnouncedRails | None = None
        if payload:
            try:
                parsed = EndpointPayload.model_validate_json(payload)
                entry = (str(parsed.address), parsed.port)
                rails = (
                    tuple((n, str(a), r) for n, a, r in parsed.rails),
                    tuple((n, str(a), r) for n, a, r in parsed.interfaces),
                )
            except ValidationError:
                entry = None
        known = self._rails.setdefault(validation, {})
        if rails and (rails[0] or rails[1]):
            known[node] = rails
        else:
            known.pop(node, None)
        nodes = self._table.setdefault(validation, {})
        if nodes.get(node) == entry:
            return False
        if entry is None:
            del nodes[node]
        else:
            nodes[node] = entry
        return True

    def of(self, validation: str) -> Mapping[str, Address]:
        return self._table.get(validation, {})

    def rails_of(self, validation: str) -> Mapping[str, AnnouncedRails]:
        return self._rails.get(validation, {})

    def forget(self, validation: str) -> None:
        self._table.pop(validation, None)
        self._rails.pop(validation, None)


@dataclass(frozen=True, slots=True)
class PeerSet:
    peers: dict[str, list[tuple[str, str, int]]]  # domain key -> [node, address, port]
    throughput: list[tuple[int, str]]  # [slot, target]
    domains: int  # the fleet's (announced) domains

    def payload(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "domains": self.domains,
            "peers": {d: [list(p) for p in ps] for d, ps in self.peers.items()},
            "throughput": [list(t) for t in self.throughput],
        }


def _window(members: list[str], me: str, start: int, w: int) -> list[str]:
    """`w` members from `start` on (cyclically), `me` skipped; all but `me` if too few."""
    n = len(members)
    others = n - (1 if me in members else 0)
    if others <= w:
        return [m for m in members if m != me]
    out: list[str] = []
    i = 0
    while len(out) < w:
        m = members[(start + i) % n]
        if m != me:
            out.append(m)
        i += 1
    return out


def _others(others: list[str], position: int, epoch: int) -> tuple[list[str], int]:
    """The other domains of this epoch (see the module docstring) and the round."""
    m = SET_DOMAINS - 1
    if len(others) <= m:
        return others, epoch
    sweep = position + epoch
    rounds = math.ceil(len(others) / m)
    return [others[(sweep * m + j) % len(others)] for j in range(m)], sweep // rounds


def peer_sets(
    targeted: list[str] | set[str] | frozenset[str] | tuple[str, ...],
    domains: Mapping[str, str | None],
    endpoints: Mapping[str, Address],
    *,
    samples: int,
    epoch: int,
) -> dict[str, PeerSet]:
    """node -> its peer set for `epoch` (see the module docstring). Only nodes that announced
    an endpoint are probed; every targeted node gets a set (it probes once it is ready)."""
    announced = {n: domains.get(n) for n in targeted if n in endpoints}
    groups = group_by_domain(announced)
    names = list(groups)
    everyone = group_by_domain({n: domains.get(n) for n in targeted})
    position = {n: i for members in everyone.values() for i, n in enumerate(members)}
    rank = {n: i for i, n in enumerate(hash_order(list(targeted)))}
    w = window_size(samples, min(len(groups), SET_DOMAINS))
    entry = {n: (n, *endpoints[n]) for n in announced}
    first_slot = epoch * EPOCH_CYCLES
    sampling: dict[str, list[tuple[int, str]]] = {}
    for slot in range(first_slot, first_slot + 2 * EPOCH_CYCLES):
        for pair in schedule_from_groups(groups, slot):
            sampling.setdefault(pair.prober, []).append((slot, pair.target))
    out: dict[str, PeerSet] = {}
    others_of: dict[str, list[str]] = {}  # one list per domain, not per node
    for node in targeted:
        mine = domains.get(node) or UNASSIGNED
        if mine not in others_of:
            others_of[mine] = [d for d in names if d != mine]
        others, round_ = _others(others_of[mine], position[node], epoch)
        chosen: dict[str, list[str]] = {}
        if mine in groups:
            chosen[mine] = _window(groups[mine], node, rank[node] + epoch * w, w)
        for d in others:
            chosen[d] = _window(groups[d], node, rank[node] + round_ * w, w)
        slots = sampling.get(node, [])
        for _slot, target in slots:
            d = domains.get(target) or UNASSIGNED
            if target not in chosen.setdefault(d, []):
                chosen[d].append(target)
        peers = {d: [entry[m] for m in members] for d, members in chosen.items() if members}
        out[node] = PeerSet(peers, slots, len(groups))
    return out


def coverage_epochs(largest_domain: int, samples: int, domains: int) -> int:
    """A bound on the epochs within which every node has probed every other node (stable
    membership): ``L x (ceil(n_max / w) + 1)``, the + 1 for a start mid-round."""
    w = window_size(samples, min(domains, SET_DOMAINS))
    rounds = max(1, math.ceil((domains - 1) / (SET_DOMAINS - 1)))
    return rounds * (math.ceil(largest_domain / w) + 1)
