"""Dynamic Resource Allocation in the test API (tests/kube.py): `resource.k8s.io` served in the
versions a test names (a cluster without it is the default: kmock's bundle has no such
group), ResourceSlices as dranet publishes them, and every DeviceTaintRule netval writes
checked against the upstream schema vendored in tests/data/dra (its README says where each
comes from) plus the rules the API server's validation adds to it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kmock
import yaml
from jsonschema import Draft4Validator

import kube as kube_module
from kube import KubeCluster
from netval.model import CheckId, CheckResult, Report, Status
from netval.model.keys import NodeConditionType
from netval.model.nics import Nic

DATA = Path(__file__).resolve().parent / "data" / "dra"
GROUP = "resource.k8s.io"
DRANET = "dra.net"
_QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _resource(plural: str, kind: str, status: bool) -> kmock.ResourceInfo:
    return kmock.ResourceInfo(
        namespaced=False, kind=kind, singular=kind.lower(),
        verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
        shortnames=set(), subresources={"status"} if status else set(), categories=set(),
    )  # fmt: skip


def serve_dra(cluster: KubeCluster, versions: tuple[str, ...] = ("v1",)) -> None:
    """The cluster serves ResourceSlices and DeviceTaintRules in `versions` (discovery
    included): `v1` is Kubernetes 1.37, `v1beta2` 1.36."""

    async def add() -> None:
        for version in versions:
            cluster.api.add_resource(f"{GROUP}/{version}/resourceslices",
                                     _resource("resourceslices", "ResourceSlice", False),
                                     custom=False)  # fmt: skip
            cluster.api.add_resource(f"{GROUP}/{version}/devicetaintrules",
                                     _resource("devicetaintrules", "DeviceTaintRule", True),
                                     custom=False)  # fmt: skip

    cluster.call(add)


def dranet_slice(
    node: str,
    nics: list[tuple[str, str | None, str | None]],
    *,
    version: str = "v1",
    generation: int = 1,
    driver: str = DRANET,
) -> dict[str, Any]:
    """A slice as dranet publishes a node's NICs: (PCI address, RDMA device, netdev) each,
    device `pci-<address>`, pool and nodeName the node's name."""
    devices = []
    for pci, rdma, netdev in nics:
        attrs: dict[str, Any] = {
            f"{driver}/pciAddress": {"string": pci},
            f"{driver}/rdma": {"bool": rdma is not None},
            f"{driver}/numaNode": {"int": 0},
        }
        if rdma is not None:
            attrs[f"{driver}/rdmaDevice"] = {"string": rdma}
        if netdev is not None:
            attrs[f"{driver}/ifName"] = {"string": netdev}
        devices.append({"name": "pci-" + re.sub(r"[:.]", "-", pci), "attributes": attrs})
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-x1"},
        "spec": {"driver": driver, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}},
    }  # fmt: skip


def rail_slice(node: str, rails: int = 8, version: str = "v1") -> dict[str, Any]:
    """A GPU node's `rails` ConnectX NICs: mlx5_<i> on 0000:<18+i>:00.0, netdev ens<i>np0."""
    return dranet_slice(node, [rail(i) for i in range(rails)], version=version)


def rail(i: int) -> tuple[str, str, str]:
    return (f"0000:{0x18 + i:02x}:00.0", f"mlx5_{i}", f"ens{i}np0")


def rail_report(
    node: str,
    *,
    failing: tuple[int, ...] = (),
    warning: tuple[int, ...] = (),
    rails: int = 8,
    validation: str = "pool-a",
) -> Report:
    """What an agent on a GPU node with `rails` NICs reports: each NIC's port state and its
    netdev's MTU; the `failing` rails' ports are down, the `warning` rails' netdevs see a
    pause storm (a warning of pfc.pause_storm)."""
    from datetime import UTC, datetime

    results = []
    for i in range(rails):
        down = i in failing
        results.append(
            CheckResult(
                check=CheckId.RDMA_PORT_STATE,
                subject=f"mlx5_{i}/1",
                status=Status.FAIL if down else Status.PASS,
                message="port state 1: DOWN, expected ACTIVE" if down else "ACTIVE",
            )
        )
        results.append(
            CheckResult(
                check=CheckId.MTU_INTERFACE,
                subject=f"ens{i}np0",
                status=Status.PASS,
                message="MTU 9000",
            )
        )
        if i in warning:
            results.append(
                CheckResult(
                    check=CheckId.PFC_PAUSE_STORM,
                    subject=f"ens{i}np0/prio3",
                    status=Status.WARN,
                    message="pause frames 40% of the time on priority 3",
                )
            )
    nics = [
        Nic(rdma_device=rdma, pci_address=pci, netdevs=(netdev,))
        for pci, rdma, netdev in (rail(i) for i in range(rails))
    ]
    worst = max((r.status for r in results), key=lambda s: s.severity)
    return Report(validation=validation, generation=1, node=node, started_at=datetime.now(UTC),
                  duration_ms=2.0, status=worst, results=results, nics=nics)  # fmt: skip


def add_slices(cluster: KubeCluster, slices: list[dict[str, Any]], version: str = "v1") -> None:
    """Stored as the API server would, and told to the watchers (fast for thousands)."""
    api = cluster.api
    resource = kmock.resource(GROUP, version, "resourceslices")

    async def add() -> None:
        async with api._lock:
            for body in slices:
                stored = api._store_new(resource, None, body)
                await api._emit(resource, "ADDED", stored, None)

    cluster.call(add, timeout=120)


def fixture_slices(name: str) -> list[dict[str, Any]]:
    doc = yaml.safe_load((DATA / name).read_text())
    return list(doc["items"]) if doc.get("kind") == "List" else [doc]


def rules(cluster: KubeCluster, version: str = "v1") -> list[dict[str, Any]]:
    return cluster.list(f"{GROUP}/{version}", "DeviceTaintRule")


def validate_rule(obj: dict[str, Any], version: str = "v1") -> None:
    """The upstream schema, then what the API server's validation adds to it."""
    schema = yaml.safe_load((DATA / f"devicetaintrule.{version}.schema.json").read_text())
    Draft4Validator(schema).validate(obj)
    meta, spec = obj["metadata"], obj["spec"]
    assert _DNS_SUBDOMAIN.match(meta["name"]), meta["name"]
    for key, value in (meta.get("labels") or {}).items():
        assert _QUALIFIED.match(key) and _LABEL_VALUE.match(value), (key, value)
    taint = spec["taint"]
    assert _QUALIFIED.match(taint["key"]) and _LABEL_VALUE.match(taint.get("value", ""))
    assert taint["effect"] in ("None", "NoSchedule", "NoExecute")
    selector = spec["deviceSelector"]
    assert _DNS_SUBDOMAIN.match(selector["driver"]) and len(selector["pool"]) <= 253
    assert _DNS_LABEL.match(selector["device"])


def validate_slice(obj: dict[str, Any]) -> None:
    schema = yaml.safe_load((DATA / "resourceslice-spec.v1.schema.json").read_text())
    Draft4Validator(schema).validate(obj["spec"])


def node_condition(cluster: KubeCluster, node: str) -> dict[str, Any] | None:
    found = cluster.get("v1", "Node", node)
    for c in (found.get("status") or {}).get("conditions") or []:
        if c.get("type") == NodeConditionType.NETWORK_FABRIC_READY.value:
            return dict(c)
    return None


def node_status_writes(cluster: KubeCluster) -> int:
    """PATCHes of nodes/status the API served so far."""

    async def read() -> int:
        return sum(1 for _, method, path in cluster.api.stamps
                   if method == "PATCH" and path.split("?")[0].endswith("/status")
                   and path.startswith("/api/v1/nodes/"))  # fmt: skip

    return cluster.call(read)


def requests_to(cluster: KubeCluster, fragment: str) -> int:
    async def read() -> int:
        return sum(1 for _, _, path in cluster.api.stamps if fragment in path)

    return cluster.call(read)


__all__ = [
    "DRANET",
    "GROUP",
    "add_slices",
    "dranet_slice",
    "fixture_slices",
    "kube_module",
    "node_condition",
    "node_status_writes",
    "rail",
    "rail_report",
    "rail_slice",
    "requests_to",
    "rules",
    "serve_dra",
    "validate_rule",
    "validate_slice",
]
