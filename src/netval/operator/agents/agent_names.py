"""Names, labels and owner of the agent objects of one NetworkValidation (pure functions).

The ConfigMap and the DaemonSet share a name (`netval-agent-<validation>`, shortened with a
hash past 63 characters), their labels and their controller reference to the validation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from netval.model.keys import MANAGED_BY_OPERATOR, LabelKey

# Label and annotation keys: `netval.model.keys` (LabelKey, AnnotationKey).
AGENT_APP_NAME: Final = "netval-agent"  # value of app.kubernetes.io/name

AGENT_OBJECT_PREFIX: Final = "netval-agent-"
MAX_NAME_LENGTH: Final = 63  # DNS label: DaemonSet names end up in pod names and labels
MAX_LABEL_VALUE_LENGTH: Final = 63
_HASH_SUFFIX_LENGTH: Final = 8


def _shorten(text: str, limit: int) -> str:
    """`text` if it fits, else a prefix plus a hash of the whole (stable, still unique)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:_HASH_SUFFIX_LENGTH]
    head = text[: limit - _HASH_SUFFIX_LENGTH - 1].rstrip("-.")
    return f"{head}-{digest}"


def agent_object_name(validation: str) -> str:
    """Name of the ConfigMap and DaemonSet of `validation`: `netval-agent-<name>`, at most
    63 characters (a long name keeps a prefix and gets a hash of the full name)."""
    return _shorten(f"{AGENT_OBJECT_PREFIX}{validation}", MAX_NAME_LENGTH)


def validation_label_value(validation: str) -> str:
    """The `netval.io/validation` label value: the name, shortened like object names when it
    is longer than a label value may be (cluster-scoped names may have 253 characters)."""
    return _shorten(validation, MAX_LABEL_VALUE_LENGTH)


def selector_labels(validation: str) -> dict[str, str]:
    """The DaemonSet's selector (immutable once created: never add to it)."""
    return {
        LabelKey.NAME.value: AGENT_APP_NAME,
        LabelKey.VALIDATION.value: validation_label_value(validation),
    }


def agent_labels(validation: str) -> dict[str, str]:
    return {**selector_labels(validation), LabelKey.MANAGED_BY.value: MANAGED_BY_OPERATOR}


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference to the NetworkValidation `owner`: its object (Kopf's body,
    with `metadata.name/uid`) or a flat `{apiVersion, kind, name, uid}`.

    Cluster-scoped owners may own namespaced objects; deleting the validation garbage-collects
    its ConfigMap and DaemonSet. (blockOwnerDeletion needs `update` on
    networkvalidations/finalizers in the operator's RBAC.)
    """
    meta = owner.get("metadata") or {}
    ref = {
        "apiVersion": owner.get("apiVersion"),
        "kind": owner.get("kind"),
        "name": owner.get("name") or meta.get("name"),
        "uid": owner.get("uid") or meta.get("uid"),
    }
    missing = [k for k, v in ref.items() if not v]
    if missing:
        raise ValueError(f"owner lacks {', '.join(missing)} for an ownerReference")
    return {**ref, "controller": True, "blockOwnerDeletion": True}


def agent_object(
    api_version: str,
    kind: str,
    validation: str,
    namespace: str,
    owner: Mapping[str, Any],
    annotations: dict[str, str],
) -> dict[str, Any]:
    """apiVersion, kind and metadata of one of the agent objects of `validation`."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": agent_object_name(validation),
            "namespace": namespace,
            "labels": agent_labels(validation),
            "ownerReferences": [owner_reference(owner)],
            "annotations": annotations,
        },
    }
