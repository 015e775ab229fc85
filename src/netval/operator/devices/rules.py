"""DeviceTaintRules: the objects netval writes for failing NICs and the changes that reach
what the node verdict wants (pure).

One rule per (validation, device): its selector names driver, pool and device exactly, its
taint is `netval.io/fabric-unhealthy=true:NoSchedule` (never NoExecute: running pods are
not evicted, as for the node taint). The name is a hash of the validation and the device, so
a rule is found again by name after a restart; labels (`app.kubernetes.io/managed-by:
netval-operator`, `netval.io/validation`) select ours and nothing else, and an
ownerReference to the NetworkValidation lets the garbage collector delete them with it even
when no operator runs. A rule's target never changes: a device that moves is a delete and a
create. Rules of other owners, and other taints of the same devices, are never touched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from netval.model.keys import MANAGED_BY_OPERATOR, TAINT_EFFECT, AnnotationKey, LabelKey, TaintKey
from netval.operator.devices.slices import DeviceRef

GROUP: Final = "resource.k8s.io"
RULES: Final = "devicetaintrules"
SLICES: Final = "resourceslices"
KIND: Final = "DeviceTaintRule"
SELECTOR: Final = f"{LabelKey.MANAGED_BY.value}={MANAGED_BY_OPERATOR},{LabelKey.VALIDATION.value}"
TAINT_VALUE: Final = "true"


class RuleTarget(NamedTuple):
    """What one rule is: the validation whose verdict wants it, the device, and (for people
    and views) the node and NIC it stands for."""

    validation: str
    device: DeviceRef
    node: str
    nic: str


def rule_name(validation: str, device: DeviceRef) -> str:
    digest = hashlib.blake2b("\0".join((validation, *device)).encode(), digest_size=10).hexdigest()
    return f"netval-{digest}"


@dataclass(frozen=True, slots=True)
class RuleChange:
    """One DeviceTaintRule to create (`target`) or delete (`target` None); queued with the
    Node writes (`gating.write_queue`), a create with the writes that exclude."""

    name: str
    node: str  # the node its device is on (the queue's pending exclusions are by node)
    target: RuleTarget | None

    @property
    def key(self) -> str:
        return f"rule\0{self.name}"

    @property
    def excludes(self) -> bool:
        return self.target is not None


def rule_object(
    name: str, target: RuleTarget, version: str, owner: Mapping[str, Any] | None
) -> dict[str, Any]:
    driver, pool, device = target.device
    meta: dict[str, Any] = {
        "name": name,
        "labels": {
            LabelKey.MANAGED_BY.value: MANAGED_BY_OPERATOR,
            LabelKey.VALIDATION.value: target.validation[:63].rstrip("-_."),
        },
        "annotations": {
            AnnotationKey.NODE.value: target.node,
            AnnotationKey.NIC.value: target.nic,
            AnnotationKey.VALIDATION.value: target.validation,
        },
    }
    owner_meta = (owner or {}).get("metadata") or {}
    if owner is not None and owner_meta.get("uid"):
        meta["ownerReferences"] = [{
            "apiVersion": owner.get("apiVersion"), "kind": owner.get("kind"),
            "name": owner_meta.get("name"), "uid": owner_meta["uid"],
        }]  # fmt: skip
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": KIND,
        "metadata": meta,
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool, "device": device},
            "taint": {
                "key": TaintKey.FABRIC_UNHEALTHY.value,
                "value": TAINT_VALUE,
                "effect": TAINT_EFFECT,
            },
        },
    }


def ours(obj: Mapping[str, Any]) -> tuple[str, str, DeviceRef] | None:
    """(name, validation, device) of a listed rule that is netval's, else None."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    selector = (obj.get("spec") or {}).get("deviceSelector") or {}
    if labels.get(LabelKey.MANAGED_BY.value) != MANAGED_BY_OPERATOR:
        return None
    validation = annotations.get(AnnotationKey.VALIDATION.value)
    parts = (selector.get("driver"), selector.get("pool"), selector.get("device"))
    name = meta.get("name")
    if not isinstance(name, str) or not isinstance(validation, str):
        return None
    if not all(isinstance(p, str) for p in parts):
        return None
    return name, validation, DeviceRef(*parts)  # type: ignore[arg-type]


def plan_rules(
    wanted: Mapping[str, RuleTarget], existing: Mapping[str, RuleTarget | None]
) -> list[RuleChange]:
    """The creates and deletes from what exists (`existing`: name -> target, None when the
    listing did not say what a rule of ours is for) to `wanted`; creates first."""
    changes = [RuleChange(name, t.node, t) for name, t in sorted(wanted.items())
               if name not in existing]  # fmt: skip
    for name in sorted(set(existing) - set(wanted)):
        target = existing[name]
        changes.append(RuleChange(name, target.node if target is not None else "", None))
    return changes


def wanted_rules(
    devices: Iterable[tuple[str, str, str, Iterable[DeviceRef]]],
) -> dict[str, RuleTarget]:
    """name -> target, from (validation, node, NIC, its devices)."""
    out: dict[str, RuleTarget] = {}
    for validation, node, nic, refs in devices:
        for ref in refs:
            out[rule_name(validation, ref)] = RuleTarget(validation, ref, node, nic)
    return out


__all__ = [
    "GROUP",
    "KIND",
    "RULES",
    "SELECTOR",
    "SLICES",
    "RuleChange",
    "RuleTarget",
    "ours",
    "plan_rules",
    "rule_name",
    "rule_object",
    "wanted_rules",
]
