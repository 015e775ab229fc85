"""The operator's retained messages: `assignment`s, what an agent cannot read from the API,
and the topics a deleted validation leaves behind.

One assignment per targeted node of a validation with peers enabled or a storage endpoint
that measures throughput: ``domain``, its topology domain, with ``epoch``, ``peers`` and
``throughput``, its peer set of the current epoch (`peer_sets`), and ``storage``, its
position in the storage schedule (`netval.model.storage_slots`): a change of the targeted
nodes republishes them all, since positions shift. The subscriber (`ReportIngest.set_retained`) keeps exactly these on the broker; it clears the
`leftover_topics` of a deleted validation (`ReportIngest.clear_retained`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from netval.model.storage_slots import fleet_positions
from netval.model.topics import TopicKind, check_topic_level, topic
from netval.operator.ingest.peer_sets import Endpoints, EndpointTable, epoch_of, peer_sets
from netval.operator.state.store import Store
from netval.operator.topology.agreement import peer_topology_key


def assignments(
    store: Store, endpoints: Endpoints | None = None, now: float | None = None
) -> dict[str, bytes]:
    """topic -> payload of every assignment the broker should hold (`now`: Unix seconds,
    which picks the peers' epoch)."""
    endpoints = endpoints or EndpointTable()
    now = time.time() if now is None else now
    out: dict[str, bytes] = {}
    for name, spec in store.specs.items():
        state = store.states.get(name)
        peers = spec.checks.peers.enabled
        storage = any(e.measures_throughput for e in spec.checks.storage.endpoints)
        if state is None or not (peers or storage):
            continue
        key = peer_topology_key(spec, (store.node_labels.get(n, {}) for n in state.targeted))
        positions = fleet_positions(state.targeted, name) if storage else {}
        domains = {n: store.node_labels.get(n, {}).get(key) for n in state.targeted}
        epoch = epoch_of(spec, now)
        sets = (
            peer_sets(
                state.targeted,
                domains,
                endpoints.of(name),
                samples=spec.checks.peers.samples_per_domain,
                epoch=epoch,
            )
            if peers
            else {}
        )
        for node in state.targeted:
            payload: dict[str, Any] = {}
            if peers:
                payload["domain"] = domains[node]
                payload.update(sets[node].payload(epoch))
            if storage:
                payload["storage"] = positions[node].model_dump()
            out[topic(name, node, TopicKind.ASSIGNMENT)] = json.dumps(
                payload, separators=(",", ":")
            ).encode()
    return out


def leftover_topics(validation: str, nodes: Iterable[str]) -> list[str]:
    """Every retained topic a validation's agents and the operator may have left for these
    nodes (report, state, endpoint, assignment); names that are no safe topic level are
    skipped (nothing can have been published there)."""
    out: list[str] = []
    for node in sorted(nodes):
        try:
            check_topic_level(validation)
            check_topic_level(node)
        except ValueError:
            continue
        out += [topic(validation, node, kind) for kind in TopicKind]
    return out
