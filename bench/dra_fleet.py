"""A GPU fleet of 8-NIC nodes for bench/device_taints.py (its reports and dranet's slices
from tests/nic_fleet.py, the slices as the API serves them: JSON text) and a stand-in for
the Kubernetes client that counts each request the operator's writes make (and fails loudly
on a call it does not know)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from netval.model import Report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nic_fleet import rail_report, rail_slice  # tests/nic_fleet.py

RAILS = 8


def report(node: str, failing: frozenset[int] = frozenset(), validation: str = "pool") -> Report:
    return rail_report(node, failing=failing, rails=RAILS, validation=validation)


def slice_json(node: str, seq: int) -> str:
    """dranet's slice of `node` as the API serves it: its rails with every attribute dranet
    publishes, and a resourceVersion and owner reference."""
    obj = rail_slice(node, RAILS, full=True)
    obj["metadata"] = {"name": f"{node}-dra.net-{seq:05x}", "resourceVersion": str(seq),
                       "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                            "uid": f"uid-{seq}", "controller": True}]}  # fmt: skip
    return json.dumps(obj)


class Counting:
    """The Kubernetes calls gating's writes make, answered as an API server would (the Node
    read back with its labels, taints and conditions), each counted as (verb, resource)."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes
        self.requests: Counter[tuple[str, str]] = Counter()
        self.core = self
        self.custom = self
        self.api_client = self

    # -- KubeApi
    async def run_in(self, _concern: object, fn: Any, *args: Any, **_: Any) -> Any:
        return fn(*args)

    async def set_node_label(self, node: str, label: str | None) -> bool:
        self.requests["PATCH", "nodes"] += 1
        self.nodes[node]["metadata"]["labels"]["netval.io/fabric"] = label
        return True

    async def set_node_gating(self, node: str, label: str | None, taint: bool) -> bool:
        self.requests["GET", "nodes"] += 1
        self.requests["PATCH", "nodes"] += 1
        self.nodes[node]["metadata"]["labels"]["netval.io/fabric"] = label
        return True

    async def set_node_condition(self, node: str, wanted: tuple[str, str, str] | None) -> bool:
        from netval.operator.kube.node_status import set_condition

        return set_condition(self, node, wanted)  # type: ignore[arg-type]

    # -- CoreV1Api
    def read_node(self, node: str) -> dict[str, Any]:
        self.requests["GET", "nodes"] += 1
        return self.nodes[node]

    def sanitize_for_serialization(self, obj: dict[str, Any]) -> dict[str, Any]:
        return obj

    def patch_node_status(self, node: str, patch: dict[str, Any], **_: Any) -> None:
        self.requests["PATCH", "nodes/status"] += 1
        self.nodes[node].setdefault("status", {})["conditions"] = patch["status"]["conditions"]

    # -- CustomObjectsApi (resource.k8s.io)
    def create_cluster_custom_object(self, group: str, version: str, plural: str,
                                     obj: dict[str, Any]) -> None:  # fmt: skip
        assert (group, plural) == ("resource.k8s.io", "devicetaintrules"), (group, plural)
        self.requests["POST", plural] += 1

    def delete_cluster_custom_object(self, group: str, version: str, plural: str,
                                     name: str) -> None:  # fmt: skip
        assert (group, plural) == ("resource.k8s.io", "devicetaintrules"), (group, plural)
        self.requests["DELETE", plural] += 1

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the stand-in does not know {name}: a call it cannot count")
