"""The Node watch: labels select the targeted nodes, our label and taint feed gating."""

from __future__ import annotations

from typing import Any

import kopf

from netval.operator.identity.service import started_identity
from netval.operator.ingest.endpoint_check import node_addresses
from netval.operator.term_startup import started_runtime


@kopf.on.event("", "v1", "nodes")
async def node_event(
    type: str | None,
    name: str,
    labels: kopf.Labels,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    runtime = started_runtime(memo)
    if type == "DELETED":
        if runtime is not None:
            runtime.store.on_node(name, None)
            runtime.on_node_addresses(name, None)
        # A deleted Node's pods enroll again only through a TokenReview of their own (its
        # certificates expire; what they publish for a node no validation targets counts
        # for nothing).
        identity = started_identity(memo)
        if identity is not None:
            identity.forget_node(name)
    elif runtime is not None:  # else: the initial listing is replayed once the runtime exists
        runtime.store.on_node(
            name, dict(labels), list(spec.get("taints") or []), status.get("conditions")
        )
        # the addresses an announced east-west endpoint must be one of
        runtime.on_node_addresses(name, node_addresses(status))
