"""The Node watch: labels select the targeted nodes, our label and taint feed gating."""

from __future__ import annotations

from typing import Any

import kopf

from netval.operator.identity.service import started_identity
from netval.operator.main import started_runtime


@kopf.on.event("", "v1", "nodes")
async def node_event(
    type: str | None, name: str, labels: kopf.Labels, spec: kopf.Spec, memo: kopf.Memo, **_: Any
) -> None:
    runtime = started_runtime(memo)
    if runtime is None:
        return  # the initial listing is replayed to handlers once the runtime exists
    if type == "DELETED":
        runtime.store.on_node(name, None)
    else:
        runtime.store.on_node(name, dict(labels), list(spec.get("taints") or []))


@kopf.on.event("", "v1", "nodes")
async def node_delete(type: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A deleted Node's MQTT identity is revoked: its clients are disconnected at once."""
    identity = started_identity(memo)
    if type == "DELETED" and identity is not None:
        await identity.revoke_node(name)
