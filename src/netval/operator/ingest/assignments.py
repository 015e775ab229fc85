"""The operator's retained messages: `assignment`s, what an agent cannot read from the API,
and the topics a deleted validation leaves behind.

One assignment per targeted node of a peers-enabled validation: its topology domain. The
subscriber (`ReportIngest.set_retained`) keeps exactly these on the broker; it clears the
`leftover_topics` of a deleted validation (`ReportIngest.clear_retained`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from netval.model.topics import TopicKind, check_topic_level, topic
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
