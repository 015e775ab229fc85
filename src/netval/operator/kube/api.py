"""The operator's writes to the Kubernetes API, through the official client.

The client is synchronous; calls run in a worker thread so Kopf's event loop never blocks.
Applies are idempotent: create, or replace what differs; a 404 on delete is success.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import UTC, datetime
from typing import Any, Final, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from netval.model.keys import LabelKey
from netval.model.manifest import API_GROUP
from netval.operator.gating.decisions import with_fabric_taint

log = logging.getLogger("netval.operator.kube")

VERSION: Final = "v1alpha1"
PLURAL: Final = "networkvalidations"
EVENT_NAMESPACE: Final = "default"
MAX_EVENT_MESSAGE: Final = 1024
NODE_WRITE_ATTEMPTS: Final = 5


def load_kube_client() -> client.ApiClient:
    """In-cluster configuration inside a pod, else KUBECONFIG (development, tests)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    return client.ApiClient()


class KubeApi:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.api_client = api_client

    async def apply_configmap(self, body: dict[str, Any]) -> None:
        await asyncio.to_thread(self._apply_configmap, body)

    def _apply_configmap(self, body: dict[str, Any]) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            current = self.core.read_namespaced_config_map(name, ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.core.create_namespaced_config_map(ns, cast(Any, body))
            return
        labels = current.metadata.labels if current.metadata is not None else None
        if current.data != body.get("data") or (labels or {}) != body["metadata"].get("labels", {}):
            self.core.patch_namespaced_config_map(
                name,
                ns,
                {"metadata": {"labels": body["metadata"].get("labels", {})}, "data": body["data"]},
            )

    async def apply_daemonset(self, body: dict[str, Any]) -> None:
        await asyncio.to_thread(self._apply_daemonset, body)

    def _apply_daemonset(self, body: dict[str, Any]) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self.apps.read_namespaced_daemon_set(name, ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.apps.create_namespaced_daemon_set(ns, cast(Any, body))
            return
        # Replace the spec wholesale: a merge patch would keep list items (tolerations,
        # env) that the new rendering no longer has.
        self.apps.replace_namespaced_daemon_set(name, ns, cast(Any, body))

    async def delete_agent_objects(self, namespace: str, name: str) -> None:
        await asyncio.to_thread(self._delete_agent_objects, namespace, name)

    def _delete_agent_objects(self, namespace: str, name: str) -> None:
        for delete in (
            self.apps.delete_namespaced_daemon_set,
            self.core.delete_namespaced_config_map,
        ):
            try:
                delete(name, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    async def post_event(
        self, ref: dict[str, Any], *, type: str, reason: str, message: str
    ) -> None:
        """An Event about a cluster-scoped object; they live in `default`, as kubectl expects."""
        now = datetime.now(UTC).isoformat()
        body = {
            "metadata": {"generateName": "netval-", "namespace": EVENT_NAMESPACE},
            "involvedObject": {**ref, "namespace": ""},
            "type": type,
            "reason": reason,
            "message": message[:MAX_EVENT_MESSAGE],
            "source": {"component": "netval-operator"},
            "reportingComponent": "netval-operator",
            "reportingInstance": "netval-operator",
            "action": "Validate",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await asyncio.to_thread(self.core.create_namespaced_event, EVENT_NAMESPACE, cast(Any, body))

    async def set_node_gating(self, node: str, label: str | None, taint: bool) -> bool:
        """Set our label (None removes it) and our taint on a Node; False if the Node is gone.

        Read-modify-write with the resourceVersion: a JSON merge patch replaces the whole
        taint list, so the list written must be the one read, minus or plus ours; a 409 means
        another writer won and the round is retried on fresh data.
        """
        return await asyncio.to_thread(self._set_node_gating, node, label, taint)

    def _set_node_gating(self, node: str, label: str | None, taint: bool) -> bool:
        for _ in range(NODE_WRITE_ATTEMPTS):
            try:
                current = self.api_client.sanitize_for_serialization(self.core.read_node(node))  # type: ignore[no-untyped-call]
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            metadata = current.get("metadata") or {}
            taints = (current.get("spec") or {}).get("taints")
            patch = {
                "metadata": {
                    "resourceVersion": metadata.get("resourceVersion"),
                    "labels": {LabelKey.FABRIC.value: label},
                },
                "spec": {"taints": with_fabric_taint(taints, taint)},
            }
            try:
                self.core.patch_node(node, patch, _content_type="application/merge-patch+json")
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409:
                    raise
        raise RuntimeError(f"node {node}: still conflicting after {NODE_WRITE_ATTEMPTS} attempts")

    async def set_node_label(self, node: str, label: str | None) -> bool:
        """Only our label (None removes it): a merge patch of one key touches nothing else."""
        return await asyncio.to_thread(self._set_node_label, node, label)

    def _set_node_label(self, node: str, label: str | None) -> bool:
        try:
            self.core.patch_node(
                node,
                {"metadata": {"labels": {LabelKey.FABRIC.value: label}}},
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list_validation_names(self) -> list[str]:
        found = await asyncio.to_thread(
            self.custom.list_cluster_custom_object, API_GROUP, VERSION, PLURAL
        )
        items: list[dict[str, Any]] = cast(dict[str, Any], found).get("items", [])
        return [item["metadata"]["name"] for item in items]

    async def agent_pod_counts(
        self, namespace: str, label_selector: str, label: str
    ) -> dict[str, tuple[int, int]]:
        """Per value of the label `label`: (desiredNumberScheduled, numberReady) of the
        DaemonSets in `namespace` that `label_selector` selects; those without a status yet
        (no DaemonSet controller has looked at them) are left out."""
        found = await asyncio.to_thread(
            self.apps.list_namespaced_daemon_set, namespace, label_selector=label_selector
        )
        counts: dict[str, tuple[int, int]] = {}
        for ds in cast(Any, found).items:
            value = (ds.metadata.labels or {}).get(label)
            if value is None or ds.status is None:
                continue
            counts[value] = (ds.status.desired_number_scheduled, ds.status.number_ready)
        return counts

    async def patch_status(self, name: str, status: dict[str, Any]) -> None:
        await asyncio.to_thread(
            self.custom.patch_cluster_custom_object_status,
            API_GROUP,
            VERSION,
            PLURAL,
            name,
            {"status": status},
        )
