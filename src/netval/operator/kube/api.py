"""The operator's writes to the Kubernetes API, through the official client.

The client is synchronous; calls run in worker threads so Kopf's event loop never blocks.
Applies are idempotent: create, or replace what differs; a 404 on delete is success.

Every request is bounded: a (connect, read) timeout on every call made through a client from
`load_kube_client` or given to `KubeApi` (the gate releaser's and Kueue's direct calls
included), and `KubeApi`'s calls retry 5xx, 429, 409 and transport errors (timeouts, reset
connections) with jittered exponential backoff (status patches excepted: the status writer
retries them at its next window, with fresh content). Status writes, Node writes, the rest, and
the gate releaser's and Kueue's calls run in separate thread pools (`operator.thread_pools`),
so hung Node PATCHes never delay a status write.

Every write through such a client asks the write fence right before it is sent, in the
sending thread (`kube.fenced_pool`): only the leader writes, each write bounded to land
before another replica could lead.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeVar, cast

import urllib3.exceptions
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from netval.model.keys import LabelKey
from netval.model.manifest import API_GROUP
from netval.model.topology import TOPOLOGY_LABEL_PREFIX
from netval.operator.gating.decisions import with_fabric_taint
from netval.operator.kube.fenced_pool import FencedPool
from netval.operator.kube.paging import METADATA_LIST, paged_items
from netval.operator.kube.read_modify_write import Unwritten, Written, read_modify_write
from netval.operator.leadership.fence import WRITE_FENCE, NotLeading
from netval.operator.thread_pools import TERM_CONCERNS, Concern, ThreadPools

log = logging.getLogger("netval.operator.kube")

VERSION: Final = "v1alpha1"
PLURAL: Final = "networkvalidations"
LOADTEST_PLURAL: Final = "networkloadtests"
EVENT_NAMESPACE: Final = "default"
MAX_EVENT_MESSAGE: Final = 1024
NODE_WRITE_ATTEMPTS: Final = 5
# (connect, read) seconds for every request: a half-open connection or a hung apiserver
# ends in a timeout error, never in a writer stuck for good.
API_TIMEOUT: Final = (5.0, 15.0)
# Attempts per call for retryable failures, and the backoff between them (full jitter).
API_ATTEMPTS: Final = 3
BACKOFF_BASE: Final = 0.2
BACKOFF_CAP: Final = 2.0
RETRY_STATUSES: Final = frozenset({409, 429, 500, 502, 503, 504})
NODE_PAGE: Final = 500

T = TypeVar("T")


class ClosedError(RuntimeError):
    """A call made or retried through a closed `KubeApi` (after its leadership term)."""


def load_kube_client(timeout: tuple[float, float] | None = None) -> client.ApiClient:
    """In-cluster configuration inside a pod, else KUBECONFIG (development, tests); every
    request through it is bounded by `timeout` (default API_TIMEOUT)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    return bound_requests(client.ApiClient(), timeout or API_TIMEOUT)


def bound_requests(api_client: client.ApiClient, timeout: tuple[float, float]) -> client.ApiClient:
    """Give every request of `api_client` that names no timeout of its own this one (the
    official client has no default: without it a call can wait forever)."""
    rest = cast(Any, api_client.rest_client)
    original: Callable[..., Any] = getattr(rest, "_netval_unbounded", rest.request)

    @functools.wraps(original)
    def request(*args: Any, **kwargs: Any) -> Any:
        kwargs["_request_timeout"] = kwargs.get("_request_timeout") or timeout
        return original(*args, **kwargs)

    rest._netval_unbounded = original
    rest.request = request
    if not isinstance(rest.pool_manager, FencedPool):
        rest.pool_manager = FencedPool(rest.pool_manager, WRITE_FENCE, API_TIMEOUT[1])
    return api_client


def error_text(exc: BaseException) -> str:
    """One line for a log: `str()` of an ApiException is its status, every response header
    and the whole body, over several lines."""
    if isinstance(exc, ApiException):
        message = ""
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = str(json.loads(exc.body or "{}").get("message") or "")
        return f"HTTP {exc.status} {exc.reason}" + (f": {message}" if message else "")
    return str(exc) or type(exc).__name__


def retryable(exc: BaseException) -> bool:
    """A failure worth another attempt: the server said try again (5xx, 429), another
    writer won (409), or the transport failed (timeout, refused or reset connection); never
    a write the fence refused."""
    if isinstance(exc, NotLeading):
        return False
    if isinstance(exc, ApiException):
        return exc.status in RETRY_STATUSES
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


class KubeApi:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        timeout: tuple[float, float] | None = None,
        attempts: int = API_ATTEMPTS,
        backoff: tuple[float, float] = (BACKOFF_BASE, BACKOFF_CAP),
    ) -> None:
        bound_requests(api_client, timeout or API_TIMEOUT)
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.api_client = api_client
        self.attempts = attempts
        self.backoff = backoff
        self.retries = 0  # attempts after a retryable failure, for the metrics
        self._closed = False
        self._rng = random.Random()  # noqa: S311 - jitter
        # this term's worker threads (sizes and why: thread_pools.SIZES); the gate releaser
        # and Kueue run their calls of this client in theirs (`pools.run`)
        self.pools = ThreadPools(TERM_CONCERNS)

    def close(self) -> None:
        """End of a leadership term: queued calls are dropped and no running one starts
        another attempt (one already on the wire ends within its timeout)."""
        self._closed = True
        self.pools.close()

    def _retrying(
        self,
        fn: Callable[..., T],
        *args: Any,
        _idempotent: bool = True,
        _attempts: int | None = None,
        **kwargs: Any,
    ) -> T:
        """`fn(*args, **kwargs)` with up to `attempts` tries for retryable failures (run in a
        worker thread: the backoff sleeps there). Not `_idempotent`: only failures the
        server answered (5xx, 429) are retried, not timeouts or 409."""
        base, cap = self.backoff
        attempts = _attempts or self.attempts
        for attempt in range(1, attempts + 1):
            if self._closed:  # the term ended: a later attempt could race the next leader
                raise ClosedError(f"kube call {fn.__name__}: the client was closed")
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                again = retryable(exc) and (
                    _idempotent or (isinstance(exc, ApiException) and exc.status != 409)
                )
                if attempt == attempts or not again:
                    raise
                self.retries += 1
                delay = self._rng.uniform(0, min(cap, base * 2 ** (attempt - 1)))
                log.debug("kube call %s failed (%s); retry in %.2fs", fn.__name__, exc, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    async def _run(self, concern: Concern, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.pools.run(concern, self._retrying, fn, *args, **kwargs)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` (a call of this client's APIs) in the pool of other calls,
        retried like the rest (`_idempotent=False` for a create)."""
        return await self._run(Concern.OTHER, fn, *args, **kwargs)

    async def apply_configmap(self, body: dict[str, Any]) -> None:
        await self._run(Concern.OTHER, self._apply_configmap, body)

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
        await self._run(Concern.OTHER, self._apply_daemonset, body)

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
        await self._run(Concern.OTHER, self._delete_agent_objects, namespace, name)

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
        # A create is not idempotent: retried only when the server answered that it failed,
        # not after a timeout (the Event may exist).
        await self._run(
            Concern.OTHER,
            self.core.create_namespaced_event,
            EVENT_NAMESPACE,
            cast(Any, body),
            _idempotent=False,
        )

    async def set_node_gating(self, node: str, label: str | None, taint: bool) -> bool:
        """Set our label (None removes it) and our taint on a Node; False if the Node is gone.

        Read-modify-write with the resourceVersion: a JSON merge patch replaces the whole
        taint list, so the list written must be the one read, minus or plus ours; a 409 means
        another writer won and the round is retried on fresh data.
        """
        return await self._run(Concern.NODES, self._set_node_gating, node, label, taint)

    def _set_node_gating(self, node: str, label: str | None, taint: bool) -> bool:
        def read() -> dict[str, Any]:
            node_obj = self.core.read_node(node)
            return self.api_client.sanitize_for_serialization(node_obj)  # type: ignore[no-untyped-call, no-any-return]

        def change(current: dict[str, Any]) -> dict[str, Any]:
            metadata = current.get("metadata") or {}
            taints = (current.get("spec") or {}).get("taints")
            return {
                "metadata": {
                    "resourceVersion": metadata.get("resourceVersion"),
                    "labels": {LabelKey.FABRIC.value: label},
                },
                "spec": {"taints": with_fabric_taint(taints, taint)},
            }

        def write(patch: dict[str, Any]) -> None:
            self.core.patch_node(node, patch, _content_type="application/merge-patch+json")

        done = read_modify_write(f"node {node}", read, change, write, attempts=NODE_WRITE_ATTEMPTS)
        return isinstance(done, Written)

    async def set_node_taint(self, node: str, key: str, value: str | None) -> bool:
        """Our NoSchedule taint `key` with `value` on a Node (None removes it); False if the
        Node is gone. Read-modify-write like `set_node_gating`: other taints untouched."""
        return await self._run(Concern.NODES, self._set_node_taint, node, key, value)

    def _set_node_taint(self, node: str, key: str, value: str | None) -> bool:
        def read() -> dict[str, Any]:
            node_obj = self.core.read_node(node)
            return self.api_client.sanitize_for_serialization(node_obj)  # type: ignore[no-untyped-call, no-any-return]

        def change(current: dict[str, Any]) -> dict[str, Any] | None:
            metadata = current.get("metadata") or {}
            taints = list((current.get("spec") or {}).get("taints") or [])
            others = [t for t in taints if t.get("key") != key]
            wanted = others + ([{"key": key, "value": value, "effect": "NoSchedule"}]
                               if value is not None else [])  # fmt: skip
            if wanted == taints:
                return None  # already so: no write
            return {
                "metadata": {"resourceVersion": metadata.get("resourceVersion")},
                "spec": {"taints": wanted},
            }

        def write(patch: dict[str, Any]) -> None:
            self.core.patch_node(node, patch, _content_type="application/merge-patch+json")

        done = read_modify_write(f"node {node}", read, change, write, attempts=NODE_WRITE_ATTEMPTS)
        return done is not Unwritten.GONE

    async def nodes_with_taint(self, key: str, page: int = NODE_PAGE) -> dict[str, str]:
        """Node -> the value of its taint `key`, from paged lists of the Nodes."""

        def listed() -> dict[str, str]:
            out: dict[str, str] = {}
            for item in paged_items(self.core.list_node, page=page):
                for taint in (item.get("spec") or {}).get("taints") or []:
                    if taint.get("key") == key:
                        out[str(item["metadata"]["name"])] = str(taint.get("value") or "")
            return out

        return await self._run(Concern.OTHER, listed)

    async def set_node_label(self, node: str, label: str | None) -> bool:
        """Only our label (None removes it): a merge patch of one key touches nothing else."""
        return await self._run(Concern.NODES, self._set_node_label, node, label)

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

    async def set_node_labels(self, node: str, labels: Mapping[str, str | None]) -> bool:
        """netval's topology labels only (None removes one): one merge patch of those keys;
        False if the Node is gone."""
        if not all(k.startswith(TOPOLOGY_LABEL_PREFIX) for k in labels):
            raise ValueError(f"not netval's topology labels: {sorted(labels)}")
        return await self._run(Concern.NODES, self._patch_node_labels, node, dict(labels))

    def _patch_node_labels(self, node: str, labels: dict[str, str | None]) -> bool:
        try:
            self.core.patch_node(
                node,
                {"metadata": {"labels": labels}},
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list_loadtest_specs(self) -> dict[str, dict[str, Any]]:
        """Every NetworkLoadTest's spec, by name (one list: they are few)."""
        found = await self._run(
            Concern.OTHER, self.custom.list_cluster_custom_object, API_GROUP, VERSION,
            LOADTEST_PLURAL,
        )  # fmt: skip
        items: list[dict[str, Any]] = cast(dict[str, Any], found).get("items", [])
        return {item["metadata"]["name"]: dict(item.get("spec") or {}) for item in items}

    async def list_validation_names(self) -> list[str]:
        found = await self._run(
            Concern.OTHER, self.custom.list_cluster_custom_object, API_GROUP, VERSION, PLURAL
        )
        items: list[dict[str, Any]] = cast(dict[str, Any], found).get("items", [])
        return [item["metadata"]["name"] for item in items]

    async def list_node_names(self, page: int = NODE_PAGE) -> set[str]:
        """Every Node's name, in pages of metadata only: a whole Node is ~10 KiB, so a full
        list of 10,000 would be 100 MiB where names are a few hundred KiB."""
        return await self._list_names(self.core.list_node, page)

    async def list_node_labels(
        self, keys: frozenset[str], page: int = NODE_PAGE
    ) -> dict[str, dict[str, str]]:
        """Every Node's labels among `keys`, from paged metadata-only lists (filtered page by
        page: the other labels of 10,000 Nodes are never held at once)."""

        def listed() -> dict[str, dict[str, str]]:
            out: dict[str, dict[str, str]] = {}
            for item in paged_items(self.core.list_node, page=page, metadata_only=True):
                meta = item.get("metadata") or {}
                labels = meta.get("labels") or {}
                out[str(meta["name"])] = {k: str(labels[k]) for k in keys if k in labels}
            return out

        return await self._run(Concern.OTHER, listed)

    async def list_pod_names(
        self, namespace: str, label_selector: str, page: int = NODE_PAGE
    ) -> set[str]:
        """The names of the Pods in `namespace` that `label_selector` selects (metadata only,
        in pages)."""
        return await self._list_names(
            functools.partial(
                self.core.list_namespaced_pod, namespace, label_selector=label_selector
            ),
            page,
        )

    async def _list_names(self, lister: Callable[..., Any], page: int) -> set[str]:
        names: set[str] = set()
        after: str | None = None
        while True:
            found = await self._run(Concern.OTHER, self._metadata_page, lister, page, after)
            names.update(str(item["metadata"]["name"]) for item in found.get("items") or [])
            after = (found.get("metadata") or {}).get("continue") or None
            if after is None:
                return names

    @staticmethod
    def _metadata_page(lister: Callable[..., Any], limit: int, after: str | None) -> dict[str, Any]:
        response = lister(
            limit=limit, _continue=after, _preload_content=False,
            _headers={"Accept": METADATA_LIST},
        )  # fmt: skip
        return cast(dict[str, Any], json.loads(cast(Any, response).data))

    async def agent_pod_counts(
        self, namespace: str, label_selector: str, label: str
    ) -> dict[str, tuple[int, int]]:
        """Per value of the label `label`: (desiredNumberScheduled, numberReady) of the
        DaemonSets in `namespace` that `label_selector` selects; those without a status yet
        (no DaemonSet controller has looked at them) are left out."""
        found = await self._run(
            Concern.OTHER,
            self.apps.list_namespaced_daemon_set,
            namespace,
            label_selector=label_selector,
        )
        counts: dict[str, tuple[int, int]] = {}
        for ds in cast(Any, found).items:
            value = (ds.metadata.labels or {}).get(label)
            if value is None or ds.status is None:
                continue
            counts[value] = (ds.status.desired_number_scheduled, ds.status.number_ready)
        return counts

    async def patch_status(self, name: str, status: dict[str, Any]) -> None:
        """A merge patch of the status subresource, one attempt: the status writer retries
        a failed write at its next window with the status computed then, so a retry never
        writes a status older than one computed since."""
        await self._run(
            Concern.STATUS,
            self.custom.patch_cluster_custom_object_status,
            API_GROUP,
            VERSION,
            PLURAL,
            name,
            {"status": status},
            _attempts=1,
        )

    # -- NetworkLoadTest (netval.operator.loadtest.runner) ----------------------------------

    async def patch_loadtest_status(self, name: str, status: dict[str, Any]) -> None:
        """A merge patch of a NetworkLoadTest's status, one attempt (the coordinator writes
        again at its next tick with what it knows then)."""
        await self._run(
            Concern.STATUS,
            self.custom.patch_cluster_custom_object_status,
            API_GROUP,
            VERSION,
            LOADTEST_PLURAL,
            name,
            {"status": status},
            _attempts=1,
        )

    async def gpu_pod_nodes(self, page: int = NODE_PAGE) -> set[str]:
        """The nodes running a pod that requests GPUs: paged lists of the Pods scheduled
        and not finished (a field selector: the apiserver filters), read page by page so
        10,000 nodes' pods are never held at once."""

        def listed() -> set[str]:
            found: set[str] = set()
            pods = paged_items(
                self.core.list_pod_for_all_namespaces,
                page=page,
                field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
            )
            for pod in pods:
                spec = pod.get("spec") or {}
                if spec.get("nodeName") and requests_gpus(spec):
                    found.add(str(spec["nodeName"]))
            return found

        return await self._run(Concern.OTHER, listed)


def requests_gpus(pod_spec: Mapping[str, Any]) -> bool:
    """A pod spec whose containers request or limit a `<vendor>/gpu` resource (nvidia.com,
    amd.com, gpu.intel.com ...)."""
    for container in [*(pod_spec.get("containers") or []), *(pod_spec.get("initContainers") or [])]:
        resources = (container or {}).get("resources") or {}
        for kind in ("requests", "limits"):
            for resource, amount in ((resources.get(kind) or {}) or {}).items():
                if str(resource).endswith("/gpu") and str(amount) not in ("0", ""):
                    return True
    return False
