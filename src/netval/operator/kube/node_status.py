"""The Node condition `NetworkFabricReady`, written through the `nodes/status` subresource.

Read-modify-write with the resourceVersion, like the taint list (`kube.read_modify_write`):
a JSON merge patch replaces the whole `status.conditions` list, so the list written is the
one read with ours set or removed, and a kubelet status update in between is a 409 and a
fresh read, never lost. RBAC: `nodes/status` patch (and `nodes` get, which gating has).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from netval.operator.gating.node_condition import Carried, with_condition
from netval.operator.kube.api import NODE_WRITE_ATTEMPTS, KubeApi
from netval.operator.kube.read_modify_write import Unwritten, read_modify_write


def set_condition(kube: KubeApi, node: str, wanted: Carried | None) -> bool:
    """Synchronous (a worker thread): ours set (or removed: None); False if the Node is
    gone."""

    def read() -> dict[str, Any]:
        found = kube.core.read_node(node)
        return kube.api_client.sanitize_for_serialization(found)  # type: ignore[no-untyped-call, no-any-return]

    def change(current: dict[str, Any]) -> dict[str, Any] | None:
        conditions = (current.get("status") or {}).get("conditions")
        new = with_condition(conditions, wanted, datetime.now(UTC))
        if new is None:
            return None
        version = (current.get("metadata") or {}).get("resourceVersion")
        return {"metadata": {"resourceVersion": version}, "status": {"conditions": new}}

    def write(patch: dict[str, Any]) -> None:
        kube.core.patch_node_status(node, patch, _content_type="application/merge-patch+json")

    done = read_modify_write(f"node {node} status", read, change, write,
                             attempts=NODE_WRITE_ATTEMPTS)  # fmt: skip
    return done is not Unwritten.GONE


__all__ = ["set_condition"]
