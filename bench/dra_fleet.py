"""A GPU fleet of 8-NIC nodes for bench/device_taints.py: the agents' reports (each NIC's
port state and netdev MTU, the `nics` section), dranet's ResourceSlice of each node as the
API serves it (JSON text, with the attributes dranet publishes for a ConnectX rail: the
OKE GB200 and AWS examples of kubernetes-sigs/dranet), and a stand-in for the Kubernetes
client that counts each request the operator's writes make (and fails loudly on a call it
does not know)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from netval.model import CheckId, CheckResult, Report, Status
from netval.model.nics import Nic

RAILS = 8


def rail(i: int) -> tuple[str, str, str]:
    return (f"0000:{0x18 + i:02x}:00.0", f"mlx5_{i}", f"ens{i}np0")


def report(node: str, failing: frozenset[int] = frozenset(), validation: str = "pool") -> Report:
    results = []
    for i in range(RAILS):
        down = i in failing
        results.append(
            CheckResult(
                check=CheckId.RDMA_PORT_STATE,
                subject=f"mlx5_{i}/1",
                status=Status.FAIL if down else Status.PASS,
                message="port state 1: DOWN" if down else "ACTIVE",
            )
        )
        results.append(
            CheckResult(
                check=CheckId.MTU_INTERFACE,
                subject=f"ens{i}np0",
                status=Status.PASS,
                message="MTU 9000",
                observed={"mtu": 9000},
                expected={"mtu": 9000},
            )
        )
    nics = [Nic(rdma_device=r, pci_address=p, netdevs=(n,)) for p, r, n in map(rail, range(RAILS))]
    worst = Status.FAIL if failing else Status.PASS
    return Report(validation=validation, generation=1, node=node,
                  started_at=datetime.now(UTC) - timedelta(seconds=1), duration_ms=2.0,
                  status=worst, results=results, nics=nics)  # fmt: skip


def slice_json(node: str, seq: int) -> str:
    """dranet's slice of `node`: its 8 rails with the attributes dranet publishes."""
    devices = []
    for i in range(RAILS):
        pci, rdma, netdev = rail(i)
        devices.append({
            "name": "pci-" + pci.replace(":", "-").replace(".", "-"),
            "attributes": {
                "dra.net/ifName": {"string": netdev},
                "dra.net/mac": {"string": f"60:5e:65:14:{seq % 256:02x}:{i:02x}"},
                "dra.net/mtu": {"int": 9000},
                "dra.net/numaNode": {"int": i // 4},
                "dra.net/pciAddress": {"string": pci},
                "dra.net/pciDevice": {"string": "CX8 Family [ConnectX-8]"},
                "dra.net/pciVendor": {"string": "Mellanox Technologies"},
                "dra.net/rdma": {"bool": True},
                "dra.net/rdmaDevice": {"string": rdma},
                "dra.net/sriov": {"bool": True},
                "dra.net/sriovVfs": {"int": 0},
                "dra.net/state": {"string": "up"},
                "dra.net/type": {"string": "device"},
                "dra.net/virtual": {"bool": False},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 + i:02x}"},
            },
        })  # fmt: skip
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-dra.net-{seq:05x}", "resourceVersion": str(seq),
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                          "uid": f"uid-{seq}", "controller": True}]},
        "spec": {"driver": "dra.net", "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    })  # fmt: skip


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
