"""The Pod and Job mutations (pure, in place) and the JSON-patch diff the review answers with.

`detached` copies just the paths a mutation may touch, the mutation changes that copy, and
`json_patch` turns the difference at those paths into RFC 6902 operations."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Final

from netval.model.keys import AnnotationKey, FabricHealth, LabelKey, SchedulingGate

# What a mutation may change: a review's patch covers these paths only.
POD_PATHS: Final = (("metadata", "labels"), ("spec", "affinity"), ("spec", "schedulingGates"))
JOB_PATHS: Final = tuple(
    ("spec", "template", *p)
    for p in (
        ("metadata", "labels"),
        ("metadata", "annotations"),
        ("spec", "affinity"),
        ("spec", "schedulingGates"),
    )
)
_MISSING: Final = object()


# -- mutations ------------------------------------------------------------------------------------


def fabric_requirement() -> dict[str, Any]:
    return {
        "key": LabelKey.FABRIC.value,
        "operator": "NotIn",
        "values": [FabricHealth.UNHEALTHY.value],
    }


def add_fabric_affinity(pod_spec: dict[str, Any]) -> None:
    """Require nodes not labelled `netval.io/fabric=unhealthy` (nodes without the label
    qualify). Required terms are ORed, so the requirement joins every existing term."""
    affinity = _mapping(pod_spec, "affinity")
    node_affinity = _mapping(affinity, "nodeAffinity")
    required = _mapping(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms") or []
    required["nodeSelectorTerms"] = terms
    if not terms:
        terms.append({})
    for term in terms:
        expressions = term.get("matchExpressions") or []
        if not any(_is_fabric_requirement(e) for e in expressions):
            expressions.append(fabric_requirement())
        term["matchExpressions"] = expressions


def set_fabric_gate(pod_spec: dict[str, Any], present: bool) -> None:
    """Add or remove our scheduling gate; other gates stay as they are."""
    gates = [
        g for g in pod_spec.get("schedulingGates") or [] if g.get("name") != SchedulingGate.FABRIC
    ]
    if present:
        gates.append({"name": SchedulingGate.FABRIC.value})
    if gates:
        pod_spec["schedulingGates"] = gates
    else:
        pod_spec.pop("schedulingGates", None)


def has_fabric_gate(pod_spec: Mapping[str, Any] | None) -> bool:
    return any(
        g.get("name") == SchedulingGate.FABRIC
        for g in (pod_spec or {}).get("schedulingGates") or []
    )


def validation_label(name: str) -> str:
    """`name` as a label value (at most 63 characters): itself when it fits, else a prefix
    and a hash. NetworkValidation names are DNS subdomains, valid label values up to 63."""
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[:46].rstrip('.-_')}-{digest}"


def orphan_message(validation: str) -> str:
    return (
        f"NetworkValidation {validation!r} does not exist: this pod stays gated until it exists"
        f" and admits it; to run the pod without it, remove the {SchedulingGate.FABRIC.value!r} scheduling gate"
    )


def mutate_pod(body: dict[str, Any], *, gate: bool, validation: str) -> None:
    spec = _mapping(body, "spec")
    add_fabric_affinity(spec)
    set_fabric_gate(spec, gate)
    _set_gated_label(_mapping(body, "metadata"), validation if gate else None)


def mutate_job(body: dict[str, Any], *, gate: bool, validation: str) -> None:
    template = _mapping(_mapping(body, "spec"), "template")
    meta = _mapping(template, "metadata")
    # The Job's Pods carry the annotations too: each one is judged when it is created.
    annotations = _mapping(meta, "annotations")
    annotations.setdefault(AnnotationKey.REQUIRE_HEALTHY.value, validation)
    needed = ((body.get("metadata") or {}).get("annotations") or {}).get(
        AnnotationKey.MIN_HEALTHY_NODES
    )
    if needed is not None:
        annotations.setdefault(AnnotationKey.MIN_HEALTHY_NODES.value, needed)
    pod_spec = _mapping(template, "spec")
    add_fabric_affinity(pod_spec)
    set_fabric_gate(pod_spec, gate)
    _set_gated_label(meta, validation if gate else None)


def _mapping(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """obj[key] as a dict, created (or replacing an explicit null) when absent."""
    value = obj.get(key)
    if not isinstance(value, dict):
        value = {}
        obj[key] = value
    return value


def _is_fabric_requirement(expr: Mapping[str, Any]) -> bool:
    return (
        expr.get("key") == LabelKey.FABRIC
        and expr.get("operator") == "NotIn"
        and FabricHealth.UNHEALTHY in (expr.get("values") or [])
    )


def _set_gated_label(meta: dict[str, Any], validation: str | None) -> None:
    labels = _mapping(meta, "labels")
    if validation is not None:
        labels[LabelKey.GATED_BY.value] = validation_label(validation)
    else:
        labels.pop(LabelKey.GATED_BY, None)
        if not labels:
            meta.pop("labels", None)


# -- the JSON-patch diff ----------------------------------------------------------------------------


def json_patch(old: Mapping[str, Any], new: Mapping[str, Any], paths: Iterable[tuple[str, ...]]
               ) -> list[dict[str, Any]]:  # fmt: skip
    """RFC 6902 operations turning `old` into `new` where they differ at `paths`: whole subtrees
    replaced; where `old` lacks a parent (or has null there), that parent is set whole, with
    what it holds in `new`."""
    ops: list[dict[str, Any]] = []
    done: list[tuple[str, ...]] = []
    for path in paths:
        if any(path[: len(d)] == d for d in done):
            continue  # inside a subtree already set whole
        before, after = _at(old, path), _at(new, path)
        if before == after:
            continue
        if after is _MISSING:
            ops.append({"op": "remove", "path": _pointer(path)})
            continue
        op, depth = "replace", len(path)
        for i in range(1, len(path) + 1):
            value = _at(old, path[:i])
            if value is _MISSING:
                op, depth = "add", i
                break
            if i < len(path) and not isinstance(value, Mapping):
                depth = i  # e.g. `metadata: null`: replace it whole
                break
        done.append(path[:depth])
        ops.append({"op": op, "path": _pointer(path[:depth]), "value": _at(new, path[:depth])})
    return ops


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _pointer(path: tuple[str, ...]) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path)


def detached(obj: Mapping[str, Any], paths: Iterable[tuple[str, ...]]) -> dict[str, Any]:
    """A copy of `obj` sharing everything but the dicts along `paths` and their leaves (copied),
    so that mutating those leaves leaves `obj` intact -- without copying the whole object."""
    root = dict(obj)
    for path in paths:
        node = root
        for key in path[:-1]:
            child = node.get(key)
            node[key] = child = dict(child) if isinstance(child, dict) else {}
            node = child
        leaf = node.get(path[-1])
        if leaf is not None:
            node[path[-1]] = copy.deepcopy(leaf)
    return root
