"""Dynamic Resource Allocation in the test API (tests/kube.py): `resource.k8s.io` served in the
versions a test names (a cluster without it is the default: kmock's bundle has no such
group), ResourceSlices as dranet publishes them (built by tests/nic_fleet.py), and every
DeviceTaintRule netval writes checked against the upstream schema vendored in tests/data/dra
(its README says where each comes from) plus the rules the API server's validation adds to
it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kmock
import yaml
from jsonschema import Draft4Validator

from kube import KubeCluster
from netval.model.keys import NodeConditionType
from nic_fleet import DRANET, GROUP, dranet_slice, rail, rail_report, rail_slice

DATA = Path(__file__).resolve().parent / "data" / "dra"
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
