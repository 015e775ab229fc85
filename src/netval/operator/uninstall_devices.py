"""What `netval uninstall-cleanup` removes of issue 30's objects: the Node condition
`NetworkFabricReady` (a merge patch of the status with the conditions read minus ours, on the
resourceVersion read) and the DeviceTaintRules netval wrote, in every `resource.k8s.io`
version served (the rules of other owners, selected by label, are never listed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netval.operator.devices.api import RULE_VERSIONS
from netval.operator.devices.rules import GROUP, RULES, SELECTOR
from netval.operator.gating.node_condition import TYPE

Pages = Callable[..., Iterator[dict[str, Any]]]


def condition_cleanup_patch(node: dict[str, Any]) -> dict[str, Any] | None:
    """The status merge patch that removes our condition (None: the Node has none)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    kept = [c for c in conditions if c.get("type") != TYPE]
    if len(kept) == len(conditions):
        return None
    version = (node.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": version}, "status": {"conditions": kept}}


def delete_rules(
    custom: client.CustomObjectsApi, pages: Pages, timeout: dict[str, Any], failures: list[str]
) -> str:
    deleted, served = 0, []
    for version in RULE_VERSIONS:
        try:
            found = list(pages(custom.list_cluster_custom_object, GROUP, version, RULES,
                               label_selector=SELECTOR))  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                continue  # that version (or the DRA API) is not served
            raise
        served.append(version)
        for obj in found:  # one object, served in each version: gone once deleted
            name = obj["metadata"]["name"]
            try:
                custom.delete_cluster_custom_object(GROUP, version, RULES, name, **timeout)
                deleted += 1
            except ApiException as exc:
                if exc.status != 404:
                    failures.append(f"device taint rules: {name}: {exc.status} {exc.reason}")
    if not served:
        return "no DeviceTaintRule API"
    return f"deleted {deleted} DeviceTaintRules"


__all__ = ["condition_cleanup_patch", "delete_rules"]
