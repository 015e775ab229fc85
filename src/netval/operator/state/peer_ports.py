"""Peer responders of two validations that would share a port on a node.

Each validation with `peers.enabled` runs a responder on `peers.port` on its fabric interface
on every node it targets. Two validations with the same port and interface on a shared node
cannot both listen there: the second agent reports `peer.*` errors ("cannot listen"). The
operator sees the overlap before any agent starts and says so with an Event on both
validations, naming the other one and the shared nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from itertools import combinations
from typing import Final

from netval.operator.state.store import Store

log = logging.getLogger("netval.operator")

MAX_NODES_NAMED: Final = 5


@dataclass(frozen=True, slots=True)
class PeerListener:
    """Where a validation's responders listen: `interface` None means the default (the first
    RDMA netdev), the same on every node for every validation that leaves it unset."""

    port: int
    interface: str | None
    nodes: Set[str]


def peer_port_conflicts(
    listeners: Mapping[str, PeerListener],
) -> dict[tuple[str, str], list[str]]:
    """(a, b) with a < b -> their shared nodes (sorted), for every pair of validations whose
    responders would listen on the same port and interface on at least one node."""
    conflicts: dict[tuple[str, str], list[str]] = {}
    for a, b in combinations(sorted(listeners), 2):
        la, lb = listeners[a], listeners[b]
        if la.port != lb.port or la.interface != lb.interface:
            continue
        shared = la.nodes & lb.nodes
        if shared:
            conflicts[(a, b)] = sorted(shared)
    return conflicts


def conflict_message(other: str, port: int, nodes: list[str]) -> str:
    shown = ", ".join(nodes[:MAX_NODES_NAMED])
    if len(nodes) > MAX_NODES_NAMED:
        shown += f" and {len(nodes) - MAX_NODES_NAMED} more"
    return (
        f"peers.port {port} is also used by NetworkValidation {other!r} on {len(nodes)} shared"
        f" node(s) ({shown}): only one of their agents can listen there; give one of them"
        " another peers.port"
    )


@dataclass(slots=True)
class PeerPortCheck:
    """The conflicts seen last time, so each one is announced once (again after the overlap
    went away and came back)."""

    conflicts: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def update(self, store: Store) -> list[tuple[str, str]]:
        """(validation, message) for both validations of every new conflict."""
        listeners = {
            name: PeerListener(
                spec.checks.peers.port, spec.checks.peers.interface, frozenset(state.targeted)
            )
            for name, spec in store.specs.items()
            if spec.checks.peers.enabled and (state := store.states.get(name)) is not None
        }
        conflicts = peer_port_conflicts(listeners)
        new: list[tuple[str, str]] = []
        for (a, b), nodes in conflicts.items():
            if (a, b) in self.conflicts:
                continue
            port = listeners[a].port
            for name, other in ((a, b), (b, a)):
                message = conflict_message(other, port, nodes)
                new.append((name, message))
                log.warning("NetworkValidation %s: %s", name, message)
        self.conflicts = conflicts
        return new
