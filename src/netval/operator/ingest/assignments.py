"""The operator's retained `assignment` messages: what an agent cannot read from the API.

One per targeted node of a peers-enabled validation: its topology domain. The subscriber
(`ReportIngest.set_retained`) keeps exactly these on the broker.
"""

from __future__ import annotations

import json

from netval.model.topics import TopicKind, topic
from netval.operator.state.store import Store


def assignments(store: Store) -> dict[str, bytes]:
    """topic -> payload of every assignment the broker should hold."""
    out: dict[str, bytes] = {}
    for name, spec in store.specs.items():
        state = store.states.get(name)
        if state is None or not spec.checks.peers.enabled:
            continue
        key = spec.checks.peers.topology_key
        for node in state.targeted:
            domain = store.node_labels.get(node, {}).get(key)
            out[topic(name, node, TopicKind.ASSIGNMENT)] = json.dumps({"domain": domain}).encode()
    return out
