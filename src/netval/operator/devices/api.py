"""The calls device taints make (synchronous: run them in the term's worker threads).

Discovery: `GET /apis/resource.k8s.io/<version>` for each version netval knows, newest first;
DeviceTaintRules are written in the newest version serving `devicetaintrules`
(`resource.k8s.io/v1` from Kubernetes 1.37, `v1beta2` in 1.36), ResourceSlices read in the
newest serving `resourceslices` (`v1`, `v1beta2`, `v1beta1`, whose devices nest their
attributes under `basic`). A version the cluster does not serve is a 404, not an error.

Slices are listed in pages of 500 and watched per driver (`fieldSelector=spec.driver=...`:
the apiserver filters, a GPU driver's slices never reach the operator), each watch ending
server-side after WATCH_SECONDS: one request per driver a minute while nothing changes.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final, cast

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from netval.operator.devices.rules import GROUP, RULES, SELECTOR, SLICES
from netval.operator.kube.api import KubeApi

RULE_VERSIONS: Final = ("v1", "v1beta2")
SLICE_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
PAGE: Final = 500
WATCH_SECONDS: Final = 60
WATCH_READ_TIMEOUT: Final = WATCH_SECONDS + 15  # the server ends the watch before this


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class WatchStop:
    """Ends a watch from another thread: the flag, and the open response shut down so that
    the thread blocked reading it returns at once (a term's end does not wait a minute)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.response: Any = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()
        response = self.response
        if response is not None:
            with contextlib.suppress(Exception):  # already closed: nothing to unblock
                response.shutdown()


def served(kube: KubeApi) -> tuple[str | None, str | None]:
    """(the version to write DeviceTaintRules in, the version to read ResourceSlices in);
    None where the cluster serves none."""
    resources: dict[str, set[str]] = {}
    for version in dict.fromkeys((*RULE_VERSIONS, *SLICE_VERSIONS)):
        try:
            found = kube.custom.get_api_resources(GROUP, version)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        resources[version] = {r.name for r in found.resources or []}
    rules = next((v for v in RULE_VERSIONS if RULES in resources.get(v, ())), None)
    slices = next((v for v in SLICE_VERSIONS if SLICES in resources.get(v, ())), None)
    return rules, slices


def list_slices(kube: KubeApi, version: str, driver: str) -> tuple[list[dict[str, Any]], str]:
    """Every slice of `driver`, in pages, and the resourceVersion to watch from."""
    items: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        extra: dict[str, Any] = {"_continue": after} if after else {}
        response = kube.custom.list_cluster_custom_object(
            GROUP, version, SLICES, field_selector=f"spec.driver={driver}", limit=PAGE,
            _preload_content=False, **extra,
        )  # fmt: skip
        body = json.loads(cast(Any, response).data)
        items.extend(body.get("items") or [])
        meta = body.get("metadata") or {}
        after = meta.get("continue") or None
        if after is None:
            return items, str(meta.get("resourceVersion") or "")


def watch_slices(
    kube: KubeApi,
    version: str,
    driver: str,
    resource_version: str,
    on_event: Callable[[str, dict[str, Any]], None],
    stop: WatchStop,
) -> str:
    """One watch of `driver`'s slices from `resource_version` until the server ends it (or
    `stop`); every event to `on_event(type, object)`. Returns the resourceVersion to watch
    on from; raises Gone when it is too old."""
    response = kube.custom.list_cluster_custom_object(
        GROUP, version, SLICES, field_selector=f"spec.driver={driver}", watch=True,
        resource_version=resource_version, allow_watch_bookmarks=True,
        timeout_seconds=WATCH_SECONDS, _preload_content=False,
        _request_timeout=(5.0, WATCH_READ_TIMEOUT),
    )  # fmt: skip
    stop.response = response
    if stop.is_set():
        stop.set()  # stopped while the request was on its way
    latest = resource_version
    try:
        for line in cast(Iterator[str], iter_resp_lines(response)):  # type: ignore[no-untyped-call]
            if stop.is_set():
                break
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message", "resourceVersion too old"))
                raise ApiException(status=obj.get("code") or 500, reason=obj.get("message"))
            latest = str((obj.get("metadata") or {}).get("resourceVersion") or latest)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                on_event(kind, obj)
    except Exception:
        if stop.is_set():
            return latest  # the read was cut by stop(): not a failure
        raise
    finally:
        stop.response = None
        cast(Any, response).release_conn()
    return latest


def list_rules(kube: KubeApi, version: str) -> list[dict[str, Any]]:
    found = kube.custom.list_cluster_custom_object(GROUP, version, RULES, label_selector=SELECTOR)
    return list(cast(dict[str, Any], found).get("items") or [])


def create_rule(kube: KubeApi, version: str, obj: dict[str, Any]) -> bool:
    """True when created or already there (409: the name is the target's hash, so a rule of
    that name is the same rule)."""
    try:
        kube.custom.create_cluster_custom_object(GROUP, version, RULES, obj)
    except ApiException as exc:
        if exc.status != 409:
            raise
    return True


def delete_rule(kube: KubeApi, version: str, name: str) -> bool:
    """True when deleted or already gone."""
    try:
        kube.custom.delete_cluster_custom_object(GROUP, version, RULES, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
    return True


__all__ = [
    "RULE_VERSIONS",
    "SLICE_VERSIONS",
    "WATCH_SECONDS",
    "Gone",
    "WatchStop",
    "create_rule",
    "delete_rule",
    "list_rules",
    "list_slices",
    "served",
    "watch_slices",
]
