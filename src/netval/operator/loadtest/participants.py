"""The candidates of a run, from what the operator's store knows when it starts.

Targeted: the nodes the validation's selector picks now. Fresh: a report within the
validation's stale limit (`state.validation.is_fresh`). Gated: the validation's node verdict
excludes it (`gating.verdict`) or it carries netval's fabric taint (the gating writer put it
there): such a node is never loaded. Busy: it runs a pod requesting GPUs (the caller's set,
from a paged Pod list; see `KubeApi.gpu_pod_nodes`). Domain: the label the east-west
checks use (`peer_topology_key`: `checks.peers.topologyKey`, else the lowest topology level
in use), the same domains as `status.eastWest`.
"""

from __future__ import annotations

from datetime import datetime

from netval.operator.loadtest.plan import Candidate
from netval.operator.state.store import Store
from netval.operator.state.validation import is_fresh
from netval.operator.topology.agreement import peer_topology_key


def candidates(store: Store, validation: str, busy: set[str], now: datetime) -> list[Candidate]:
    state = store.states.get(validation)
    spec = store.specs.get(validation)
    if state is None or spec is None:
        return []
    labels = store.node_labels
    key = peer_topology_key(spec, (labels.get(n, {}) for n in state.targeted))
    excluded = state.verdict.excluded if state.verdict is not None else frozenset()
    out: list[Candidate] = []
    for node in sorted(state.targeted):
        tainted = store.node_fabric.get(node, (None, False))[1]
        out.append(
            Candidate(
                node=node,
                domain=labels.get(node, {}).get(key),
                fresh=is_fresh(state, node, now),
                busy=node in busy,
                gated=tainted or node in excluded,
            )
        )
    return out
