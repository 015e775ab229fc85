"""A stateful Kubernetes API for the operator tests: kmock 0.8 plus what a real apiserver stamps.

``KubeCluster`` serves :class:`StatefulKubeAPI` (a thin subclass of ``kmock.KubernetesEmulator``)
over real HTTP on 127.0.0.1 (a free port) from its own thread and event loop, so sync tests, the
official ``kubernetes`` client, an in-process Kopf (another thread, see ``kopf_harness.py``) and
subprocesses all reach it the same way: by URL or by the kubeconfig file it writes.

What a real apiserver does and this one does too (kmock 0.8 gaps closed here):

- **Stamping**: ``metadata.uid``, ``creationTimestamp``, ``generation`` (1 on create, +1 when
  anything but ``metadata`` -- and ``status`` where the resource has a status subresource --
  changes) and ``resourceVersion`` from one cluster-wide monotonic counter, bumped on every
  write; ``kind``/``apiVersion`` filled in (a mismatch with the URL is 400). kmock stamps none.
- **Create** answers 201 (kmock: 200), needs the namespace to exist (404 like the real thing;
  ``default``, ``kube-system``, ``kube-public`` and ``kube-node-lease`` exist from the start),
  supports ``generateName`` (kmock keyed such objects by ``None``, so Kopf's second event
  collided), returns 409 AlreadyExists, and drops ``status`` for resources with a status
  subresource (except ``v1/nodes``, whose status is kept on create as the real registry does).
- **Update**: PUT (kmock had none) replaces; PATCH understands ``application/merge-patch+json``
  (RFC 7386), ``application/json-patch+json`` (RFC 6902 via ``jsonpatch``; a failed ``test`` op or
  a bad path is 422, which Kopf relies on) and ``application/strategic-merge-patch+json`` (the
  official client's default for dicts), applied as a merge patch -- see the gaps. kmock merged
  every body recursively whatever the content type and could not apply JSON patches.
- **Status subresource**: ``.../status`` writes change only ``status``; writes to the main resource
  ignore ``status`` for resources that have the subresource (kmock ignored the subresource).
- **Optimistic concurrency**: a PUT/PATCH whose resulting ``metadata.resourceVersion`` differs from
  the stored one is 409 Conflict (for merge patches: one that carries a stale resourceVersion);
  a PUT without one is unconditional for built-in types and 422 for custom resources, as in a
  real cluster; DELETE honours ``preconditions`` (uid, resourceVersion). A no-op write changes
  nothing (no new resourceVersion, no watch event), like the real thing.
- **Immutable/system metadata** (name, namespace, uid, creationTimestamp, generation,
  deletionTimestamp) cannot be changed by writes; a terminating object takes no new finalizers.
- **DELETE** removes the object (DELETED event), or with finalizers sets ``deletionTimestamp``
  and removes it when the last finalizer goes.
- **Lists** carry ``kind: <Kind>List``, ``apiVersion`` and the current ``resourceVersion``
  (kmock: no kind, resourceVersion "..."); items of custom resources carry kind/apiVersion,
  items of built-in types don't (as in a real cluster; Kopf fills them in).
- **Selectors**: ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``)
  and ``fieldSelector`` (``=``, ``==``, ``!=``) on lists and watches (kmock ignored both).
- **Watch** is served as ``application/json`` lines (kmock: octet-stream); without a
  resourceVersion (or "0") it starts with ADDED for what exists, with one it replays only the
  events after it (kmock re-sent every object as ADDED on each reconnect); ``timeoutSeconds``
  ends the stream; ``sendInitialEvents=true`` ends the initial ADDEDs with the
  ``k8s.io/initial-events-end`` BOOKMARK; with selectors, objects that start/stop matching come
  as ADDED/DELETED, as from a real apiserver.
- **Discovery**: ``/api/v1`` reports groupVersion ``v1`` (kmock: ``/v1``); every resource
  below is declared with kind, scope, verbs, short names and subresources; a group's preferred
  version is the highest by Kubernetes version priority (v1 > v1beta2 > v1beta1 > v1alpha1;
  kmock picked one at random from a set). Unknown resources are 404 (kmock served any).
- **CRD schemas** (structural): on every write, fields the ``openAPIV3Schema`` does not declare are
  pruned (unless ``x-kubernetes-preserve-unknown-fields`` / ``additionalProperties``) and missing
  fields with a ``default`` get it -- so a status field the CRD lacks vanishes here as on a
  cluster (Kopf then warns "Merge-patching finished with inconsistencies").
- **Paths**: kmock 0.8 cannot parse ``/api/v1/namespaces`` (500) and reads
  ``/api/v1/namespaces/NAME`` as a namespace with no resource; ``_parse_path`` below fixes both
  (installed into kmock once, at import; it only changes those two shapes).

Faults: ``kube.inject(method, path_regex, status=503 | 409 | ..., hang=seconds, times=n)``
fails or hangs chosen requests before anything else sees them (``Fault.hits`` counts them;
``clear_faults()``). kmock reactions still come next (``kube.api[kmock.action.CREATE,
kmock.resource("v1/configmaps")] << 503``, added through ``kube.call``); a write a reaction
answers is not applied. Mind kmock's slices (``[:1]``) count every matching request so far.

Resources: the kmock bundle of built-in types (core v1 namespaces, nodes, pods, configmaps,
secrets, events, serviceaccounts, ...; apps/v1 daemonsets, deployments; batch/v1 jobs;
coordination.k8s.io/v1 leases; events.k8s.io/v1 events; ...), plus every CRD in ``crds/*.yaml``
(so ``netval.io/v1alpha1 networkvalidations`` comes from the project's CRD, with a built-in
fallback), ``kopf.dev/v1`` clusterkopfpeerings/kopfpeerings and ``kueue.x-k8s.io`` v1beta1 AND
v1beta2 workloads, localqueues, clusterqueues, admissionchecks, resourceflavors. More with
``KubeCluster.add_crd(...)``.

Gaps left (a test that depends on one of these would pass here and not on a cluster):

- No validation: neither OpenAPI types/enums/required/bounds nor CEL (x-kubernetes-validations)
  nor list-type/map-key uniqueness; a real apiserver answers 422 where this one stores.
  Defaulting happens on writes only (a real apiserver also defaults on reads).
- ``generation`` is stamped on every kind (a real apiserver leaves it out of ConfigMaps,
  Secrets, Events and the like); pods get no ``status.phase`` on create.
- Strategic merge patch is a JSON merge patch: lists are replaced, never merged by key
  (containers, tolerations, ``metadata.finalizers``), and SMP directives (``$patch``,
  ``$setElementOrder``, ...) are rejected with 422 rather than misapplied. For node taints do
  what the real operator should do anyway: read, modify, and write the whole list with the
  resourceVersion (merge or JSON patch, or PUT) -- then 409 tells you someone else won.
- Server-side apply (``application/apply-patch+yaml``) is 415; ``dryRun`` is 400; deletecollection
  and subresources other than ``status`` (scale, eviction, binding, log, exec, ...) are 404.
- No controllers, garbage collection, admission webhooks or namespace cascade: a Deployment gets
  no pods, a DaemonSet no status, ownerReferences delete nothing, deleting a namespace leaves its
  objects. Tests play the controllers (e.g. patch a DaemonSet's ``/status``) when they need one.
- Each version of a multi-version group (kueue v1beta1/v1beta2) is a separate store: no
  conversion between versions. Pick one version per test and use it everywhere.
- ``limit``/``continue`` page a list in (namespace, name) order, with an opaque token that
  is not bound to a resourceVersion (no 410 for an old one); ``Accept: ...;as=
  PartialObjectMetadataList`` answers metadata only, as an apiserver does; no BOOKMARKs except initial-events-end; no
  410 Gone (the whole event history is kept); fieldSelector accepts any dotted path (a real
  apiserver only a few per type); no authn/authz (any token works), no RBAC, no
  ``managedFields``. SelfSubjectAccessReviews are answered by ``api.access_policy`` (default:
  allowed), impersonation by ``api.impersonation``; nothing else looks at either.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import gzip
import importlib.resources
import json
import os
import re
import secrets
import string
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import aiohttp.test_utils
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import parsing as _kmock_parsing
from kmock._internal import rendering as _kmock_rendering

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"

T = TypeVar("T")

# --------------------------------------------------------------------------------------------
# kmock 0.8 path parsing: /api/v1/namespaces crashes, /api/v1/namespaces/NAME is misread.

_original_parse_path = _kmock_parsing.parse_path


def _parse_path(path: str) -> _kmock_parsing.ParsedPath:
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[0] == "api" and parts[2] == "namespaces":
        tail = parts[3:]
        if len(tail) <= 1 or (len(tail) == 2 and tail[1] in ("status", "finalize")):
            return _kmock_parsing.ParsedPath(
                group="",
                version=parts[1],
                plural="namespaces",
                namespace=None,
                name=tail[0] if tail else None,
                subresource=tail[1] if len(tail) == 2 else None,
            )
    return _original_parse_path(path)


if getattr(_kmock_parsing.parse_path, "__module__", None) != __name__:
    _kmock_parsing.parse_path = _parse_path

# --------------------------------------------------------------------------------------------
# Resources beyond kmock's bundle of built-in types.

STATUS = ("status",)
_RW_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _res(
    plural: str,
    kind: str,
    *,
    namespaced: bool,
    shortnames: tuple[str, ...] = (),
    subresources: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
) -> kmock.ResourceInfo:
    return kmock.ResourceInfo(
        namespaced=namespaced,
        kind=kind,
        singular=kind.lower(),
        verbs=set(_RW_VERBS),
        shortnames=set(shortnames),
        subresources=set(subresources),
        categories=set(categories),
    )


# Used only when crds/networkvalidations.netval.io.yaml is absent (the names docs/architecture.md gives).
NETVAL_FALLBACK = {
    "netval.io/v1alpha1/networkvalidations": _res(
        "networkvalidations",
        "NetworkValidation",
        namespaced=False,
        shortnames=("netval",),
        subresources=STATUS,
    ),
}

EXTRA_RESOURCES: dict[str, kmock.ResourceInfo] = {
    # Kopf's peering CRDs (no status subresource: Kopf writes .status through the main resource).
    "kopf.dev/v1/clusterkopfpeerings": _res(
        "clusterkopfpeerings", "ClusterKopfPeering", namespaced=False
    ),
    "kopf.dev/v1/kopfpeerings": _res("kopfpeerings", "KopfPeering", namespaced=True),
}
for _kueue_version in ("v1beta1", "v1beta2"):
    EXTRA_RESOURCES.update(
        {
            f"kueue.x-k8s.io/{_kueue_version}/workloads": _res(
                "workloads", "Workload", namespaced=True, shortnames=("wl",), subresources=STATUS
            ),
            f"kueue.x-k8s.io/{_kueue_version}/localqueues": _res(
                "localqueues",
                "LocalQueue",
                namespaced=True,
                shortnames=("lq", "queue", "queues"),
                subresources=STATUS,
            ),
            f"kueue.x-k8s.io/{_kueue_version}/clusterqueues": _res(
                "clusterqueues",
                "ClusterQueue",
                namespaced=False,
                shortnames=("cq",),
                subresources=STATUS,
            ),
            f"kueue.x-k8s.io/{_kueue_version}/admissionchecks": _res(
                "admissionchecks", "AdmissionCheck", namespaced=False, subresources=STATUS
            ),
            f"kueue.x-k8s.io/{_kueue_version}/resourceflavors": _res(
                "resourceflavors",
                "ResourceFlavor",
                namespaced=False,
                shortnames=("flavor", "flavors", "rf"),
            ),
        }
    )

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
NAMESPACES = kmock.resource("", "v1", "namespaces")
NODES = kmock.resource("", "v1", "nodes")
SELF_SUBJECT_ACCESS_REVIEWS = kmock.resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews"
)
TOKEN_REVIEWS = kmock.resource("authentication.k8s.io", "v1", "tokenreviews")
# Set by the apiserver only; writes cannot change them.
SYSTEM_METADATA = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


def crd_resources(crd: dict[str, Any]) -> dict[str, kmock.ResourceInfo]:
    """The served resources of one CustomResourceDefinition document, keyed 'group/version/plural'."""
    spec = crd["spec"]
    names = spec["names"]
    result = {}
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        result[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            kind=names["kind"],
            singular=names.get("singular") or names["kind"].lower(),
            verbs=set(_RW_VERBS),
            shortnames=set(names.get("shortNames", [])),
            categories=set(names.get("categories", [])),
            subresources=set((version.get("subresources") or {}).keys()),
        )
    return result


def project_crds() -> list[dict[str, Any]]:
    """Every CustomResourceDefinition document under crds/ (none if the folder is absent)."""
    docs = []
    for path in sorted(CRD_DIR.glob("*.y*ml")) if CRD_DIR.is_dir() else []:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                docs.append(doc)
    return docs


# --------------------------------------------------------------------------------------------
# Errors as the apiserver reports them (kind: Status).


def _error(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


def _not_found(what: str, name: str | None = None) -> kmock.KubernetesError:
    return _error(404, "NotFound", f'{what} "{name}" not found' if name else f"{what} not found")


# --------------------------------------------------------------------------------------------
# Selectors and patches.

_SELECTOR_TERM = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|!=|=)\s*(?P<value>[A-Za-z0-9_.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def label_selector_matcher(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    """A predicate over objects for a Kubernetes label selector string (400 if malformed)."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_terms(selector or ""):
        match = _SELECTOR_TERM.match(term)
        if not match or (match["neg"] and (match["op"] or match["setop"])):
            raise _error(400, "BadRequest", f"unable to parse requirement: {term!r}")
        key, op, value, setop = match["key"], match["op"], match["value"], match["setop"]
        if match["neg"]:
            checks.append(lambda labels, k=key: k not in labels)
        elif op in ("=", "=="):
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif setop:
            values = {item.strip() for item in match["values"].split(",") if item.strip()}
            if setop == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            checks.append(lambda labels, k=key: k in labels)
    return lambda obj: all(check(obj.get("metadata", {}).get("labels") or {}) for check in checks)


def field_selector_matcher(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    """A predicate for a field selector: ``path=value``, ``path==value``, ``path!=value``."""
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for term in _split_terms(selector or ""):
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not match:
            raise _error(400, "BadRequest", f"invalid field selector: {term!r}")
        path, op, value = match.groups()

        def lookup(obj: dict[str, Any], path: str = path) -> str:
            node: Any = obj
            for part in path.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            return "" if node is None else str(node)

        if op == "!=":
            checks.append(lambda obj, f=lookup, v=value: f(obj) != v)
        else:
            checks.append(lambda obj, f=lookup, v=value: f(obj) == v)
    return lambda obj: all(check(obj) for check in checks)


def _page(items: list[dict[str, Any]], request: kmock.Request) -> tuple[list[dict[str, Any]], str]:
    """`limit`/`continue`: the items after the token's key, at most `limit`; the next token
    ("" after the last page)."""

    def key(item: dict[str, Any]) -> tuple[str, str]:
        meta = item.get("metadata", {})
        return str(meta.get("namespace", "")), str(meta.get("name", ""))

    items = sorted(items, key=key)
    token = request.params.get("continue") or ""
    if token:
        try:
            after = tuple(json.loads(urllib.parse.unquote(token)))
        except (ValueError, TypeError):
            raise _error(400, "BadRequest", "invalid continue token") from None
        items = [i for i in items if key(i) > after]
    limit = int(request.params.get("limit") or 0)
    if limit <= 0 or len(items) <= limit:
        return items, ""
    page = items[:limit]
    return page, urllib.parse.quote(json.dumps(list(key(page[-1]))))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (None deletes a key; lists and scalars replace)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def prune_and_default(node: Any, schema: dict[str, Any] | None) -> Any:
    """A structural schema's pruning and defaulting, as a real apiserver does on CRD writes:
    fields the schema does not declare are dropped (unless x-kubernetes-preserve-unknown-fields
    or additionalProperties), missing fields with a ``default`` get it. No validation."""
    if not isinstance(schema, dict):
        return node
    if isinstance(node, list):
        items = schema.get("items")
        return (
            [prune_and_default(item, items) for item in node] if isinstance(items, dict) else node
        )
    if not isinstance(node, dict):
        return node
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
    result = {}
    for key, value in node.items():
        if key in properties:
            result[key] = prune_and_default(value, properties[key])
        elif isinstance(extra, dict):
            result[key] = prune_and_default(value, extra)
        elif keep_unknown:
            result[key] = value
    for key, sub in properties.items():
        if key not in result and isinstance(sub, dict) and "default" in sub:
            result[key] = prune_and_default(copy.deepcopy(sub["default"]), sub)
    return result


def _has_smp_directives(node: Any) -> bool:
    if isinstance(node, dict):
        return any(str(k).startswith("$") or _has_smp_directives(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_has_smp_directives(item) for item in node)
    return False


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA > beta > alpha, then by numbers (higher first)."""
    match = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not match:
        return (-1, 0, 0)
    stage = {"alpha": 0, "beta": 1, None: 2}[match[2]]
    return (stage, int(match[1]), int(match[3] or 0))


# --------------------------------------------------------------------------------------------
# The kmock handler.

ObjKey = tuple[kmock.resource, str | None, str]


@attrs.define
class Fault:
    """An injected fault (``KubeCluster.inject``): requests whose method is ``method`` ("*":
    any) and whose path (with query) matches ``path`` (a regex, searched) wait ``hang``
    seconds (a hung apiserver: the client's timeout ends it first, or `clear_faults`), then are answered
    ``status`` with a Kubernetes Status body (None: served normally after the wait). At most
    ``times`` requests (None: all of them); ``hits`` counts those it caught."""

    method: str
    path: re.Pattern[str]
    status: int | None = None
    hang: float = 0.0
    times: int | None = None
    hits: int = 0
    released: asyncio.Event = attrs.field(factory=asyncio.Event)

    _REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError",
                503: "ServiceUnavailable", 504: "Timeout"}  # fmt: skip

    def catches(self, method: str, path: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return self.method in ("*", method) and self.path.search(path) is not None

    def error(self) -> kmock.KubernetesError:
        assert self.status is not None
        reason = self._REASONS.get(self.status, "InternalError")
        return _error(self.status, reason, f"injected fault: {self.status} {reason}")


@attrs.define(kw_only=True)
class StatefulKubeAPI(kmock.KubernetesEmulator):
    """kmock's emulator with the bookkeeping of a real apiserver (see the module docstring).

    The objects live in kmock's ``objects`` (with history, for kmock's pattern asserts), the
    requests in kmock's request log; kmock reactions (``api[...] << 500``) still take priority
    over the emulation here, so tests can inject faults. A write that a reaction intercepts is
    not applied (unlike plain kmock, which applied it anyway).
    """

    _rv: int = attrs.field(default=0, init=False)
    _custom: set[kmock.resource] = attrs.field(factory=set, init=False)
    _schemas: dict[kmock.resource, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _event_log: dict[kmock.resource, list[tuple[int, dict[str, Any]]]] = attrs.field(
        factory=lambda: defaultdict(list), init=False
    )
    # SelfSubjectAccessReview answers: policy(user, resourceAttributes) -> allowed, where user is
    # the Impersonate-User header (None: the caller itself). Default: everything is allowed
    # (there is no RBAC here). ``impersonation`` False answers impersonated requests 403.
    access_policy: Callable[[str | None, dict[str, Any]], bool] | None = attrs.field(
        default=None, init=False
    )
    impersonation: bool = attrs.field(default=True, init=False)
    faults: list[Fault] = attrs.field(factory=list, init=False)
    # TokenReview answers: token_reviewer(spec) -> status (what the real apiserver would say
    # about spec.token for spec.audiences). Default: no token is authenticated.
    token_reviewer: Callable[[dict[str, Any]], dict[str, Any]] | None = attrs.field(
        default=None, init=False
    )
    # (time.monotonic(), METHOD, path) of every request, for tests that count a rate
    stamps: list[tuple[float, str, str]] = attrs.field(factory=list, init=False)
    # Keep only this many newest requests in kmock's log (None: all). kmock matches every
    # request against its whole log, so a run of thousands of requests turns quadratic
    # (1,000 Node patches: two minutes); ``stamps`` keeps counting them all.
    keep_requests: int | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.method.PUT] << self._serve_replace
        # = self.resources.load_bundled(), without its DeprecationWarning (importlib.resources)
        bundle = importlib.resources.files("kmock._internal").joinpath("resources.json.gz")
        self.resources.load_data(gzip.decompress(bundle.read_bytes()))
        for key, info in EXTRA_RESOURCES.items():
            self.add_resource(key, info, custom=True)
        crds = project_crds()
        if not any(crd["spec"]["group"] == "netval.io" for crd in crds):
            for key, info in NETVAL_FALLBACK.items():
                self.add_resource(key, info, custom=True)
        for crd in crds:
            self.add_crd(crd)
        for name in INITIAL_NAMESPACES:
            self._store_new(
                NAMESPACES, None, {"metadata": {"name": name}, "status": {"phase": "Active"}}
            )

    def release_faults(self) -> None:
        for fault in self.faults:
            fault.released.set()
        self.faults.clear()

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Skip KubernetesEmulator._handle: it applies every write before any reaction runs and
        # without the checks here; the write handlers below apply them (and only when reached).
        method, path = str(request.method.value), str(request.url.relative())
        self.stamps.append((time.monotonic(), method, path))
        if self.keep_requests is not None and len(self._requests) > 2 * self.keep_requests:
            del self._requests[: -self.keep_requests]
        for fault in self.faults:
            if fault.catches(method, path):
                fault.hits += 1
                if fault.hang:  # cancelled when the client gives up; ended by clear_faults()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(fault.released.wait(), fault.hang)
                if fault.status is not None:
                    return await self._render_error(fault.error())
                break
        return await kmock.RawHandler._handle(self, request)

    # -- resources ---------------------------------------------------------------------------

    def add_resource(self, key: str, info: kmock.ResourceInfo, *, custom: bool = True) -> None:
        self.resources[key] = info
        if custom:
            self._custom.add(kmock.resource(key))

    def add_crd(self, crd: dict[str, Any]) -> None:
        for key, info in crd_resources(crd).items():
            self.add_resource(key, info, custom=True)
        for version in crd["spec"].get("versions", []):
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            resource = kmock.resource(
                crd["spec"]["group"], version["name"], crd["spec"]["names"]["plural"]
            )
            if schema:
                self._schemas[resource] = schema

    def _structural(self, resource: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        """Prune and default everything but apiVersion/kind/metadata by the CRD's schema."""
        schema = self._schemas.get(resource)
        if schema is None:
            return obj
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        kept = {k: v for k, v in obj.items() if k in ("apiVersion", "kind", "metadata")}
        return {**kept, **prune_and_default(body, schema)}

    def _info(self, resource: kmock.resource | None) -> kmock.ResourceInfo:
        if resource is None or resource.plural is None or resource not in self.resources:
            raise _error(404, "NotFound", "the server could not find the requested resource")
        return self.resources[resource]

    def watcher_count(self, resource: kmock.resource) -> int:
        """How many watch streams on this resource are open right now."""
        return self._buses[resource].consumer_count if resource in self._buses else 0

    @staticmethod
    def _check_subresource(
        info: kmock.ResourceInfo, subresource: str | None, served: tuple[str, ...] = ("status",)
    ) -> None:
        """Only the main resource and (where declared) its status are emulated."""
        if subresource is not None and (
            subresource not in served or subresource not in info.subresources
        ):
            raise _not_found("subresource", subresource)

    @staticmethod
    def _api_version(resource: kmock.resource) -> str:
        return f"{resource.group}/{resource.version}" if resource.group else str(resource.version)

    # -- discovery fixes ---------------------------------------------------------------------

    async def _serve_version(self, request: kmock.Request) -> Any:
        result = await super()._serve_version(request)
        result["groupVersion"] = result["groupVersion"].lstrip("/")
        return result

    @staticmethod
    def _prefer(group_doc: dict[str, Any]) -> dict[str, Any]:
        versions = sorted(
            group_doc["versions"], key=lambda v: _version_priority(v["version"]), reverse=True
        )
        group_doc["versions"] = versions
        group_doc["preferredVersion"] = dict(versions[0])
        return group_doc

    async def _serve_apis(self, request: kmock.Request) -> Any:
        result = await super()._serve_apis(request)
        result["groups"] = [self._prefer(group) for group in result["groups"]]
        return result

    async def _serve_group(self, request: kmock.Request) -> Any:
        return self._prefer(await super()._serve_group(request))

    # -- store helpers (call with self._lock held) -------------------------------------------

    def _current(self, key: ObjKey) -> dict[str, Any] | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    async def _emit(
        self, resource: kmock.resource, etype: str, obj: dict[str, Any], old: Any
    ) -> None:
        item = {"type": etype, "object": copy.deepcopy(obj), "old": old}
        self._event_log[resource].append((int(obj["metadata"]["resourceVersion"]), item))
        await self._buses[resource].put(item)

    def _store_new(
        self, resource: kmock.resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        info = self.resources[resource]
        body = self._structural(resource, body)
        meta = body.setdefault("metadata", {})
        body["apiVersion"] = self._api_version(resource)
        body["kind"] = info.kind
        if namespace:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(field, None)
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=self._next_rv(),
            generation=1,
            creationTimestamp=_now(),
        )
        key: ObjKey = (resource, namespace, meta["name"])
        if key in self.objects:
            self.objects[key].history.append(body)
        else:
            self.objects[key] = body
        return body

    # -- reads -------------------------------------------------------------------------------

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        info = self._info(request.resource)
        assert request.resource is not None and request.name is not None
        self._check_subresource(info, request.subresource)
        key: ObjKey = (
            request.resource,
            request.namespace if info.namespaced else None,
            request.name,
        )
        async with self._lock:
            obj = self._current(key)
        if obj is None:
            raise _not_found(str(request.resource.plural), request.name)
        return obj

    def _selected(self, request: kmock.Request) -> Callable[[dict[str, Any]], bool]:
        labels = label_selector_matcher(request.params.get("labelSelector"))
        fields = field_selector_matcher(request.params.get("fieldSelector"))
        namespace, name = request.namespace, request.name

        def check(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata", {})
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and (name is None or meta.get("name") == name)
                and labels(obj)
                and fields(obj)
            )

        return check

    def _listed(
        self, resource: kmock.resource, check: Callable[[dict[str, Any]], bool]
    ) -> list[dict[str, Any]]:
        items = []
        for (res, _, _), obj in self.objects.items():
            if res == resource and not obj.deleted and check(obj.raw):
                items.append(copy.deepcopy(obj.raw))
        return items

    async def _serve_list(self, request: kmock.Request) -> Any:
        info = self._info(request.resource)
        assert request.resource is not None
        check = self._selected(request)
        async with self._lock:
            items = self._listed(request.resource, check)
            rv = str(self._rv)
        if request.resource not in self._custom:
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        items, after = _page(items, request)
        metadata = {"resourceVersion": rv, "continue": after}
        if "as=PartialObjectMetadataList" in request.headers.get("Accept", ""):
            return {
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadataList",
                "metadata": metadata,
                "items": [
                    {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                     "metadata": item["metadata"]}
                    for item in items
                ],
            }  # fmt: skip
        return {
            "apiVersion": self._api_version(request.resource),
            "kind": f"{info.kind}List",
            "metadata": metadata,
            "items": items,
        }

    async def _serve_watch(self, request: kmock.Request) -> Any:
        info = self._info(request.resource)
        resource = request.resource
        assert resource is not None
        check = self._selected(request)
        since = request.params.get("resourceVersion") or "0"
        if not since.isdigit():
            raise _error(400, "BadRequest", f"invalid resourceVersion {since!r}")
        initial_end = request.params.get("sendInitialEvents") == "true"
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        bus = self._buses[resource]

        def shape(item: dict[str, Any]) -> dict[str, Any] | None:
            # For this watcher: objects that start/stop matching its selectors come and go.
            etype, obj, old = item["type"], item["object"], item["old"]
            now_in, was_in = check(obj), old is not None and check(old)
            if etype == "MODIFIED" and now_in and not was_in:
                etype = "ADDED"
            elif etype == "MODIFIED" and was_in and not now_in:
                etype = "DELETED"
            elif not now_in:
                return None
            return {"type": etype, "object": copy.deepcopy(obj)}

        async with self._lock:  # the snapshot and the subscription are atomic w.r.t. writes
            marker = await bus.mark()
            if since == "0" or initial_end:
                initial = [
                    {"type": "ADDED", "object": obj} for obj in self._listed(resource, check)
                ]
            else:
                replayed = (
                    shape(item) for rv, item in self._event_log[resource] if rv > int(since)
                )
                initial = [event for event in replayed if event is not None]
            if initial_end:
                initial.append(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": info.kind,
                            "apiVersion": self._api_version(resource),
                            "metadata": {
                                "resourceVersion": str(self._rv),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    }
                )

        async def stream() -> AsyncIterator[Any]:
            deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
            live = bus.stream(since=marker)
            try:
                yield b""  # send the headers now, even if nothing happens
                for event in initial:
                    yield event
                while True:
                    remaining = (
                        None if deadline is None else deadline - asyncio.get_running_loop().time()
                    )
                    if remaining is not None and remaining <= 0:
                        return
                    try:
                        item = await asyncio.wait_for(anext(live), remaining)
                    except TimeoutError:
                        return
                    if (event := shape(item)) is not None:
                        yield event
            finally:
                with contextlib.suppress(Exception):
                    await live.aclose()
                with contextlib.suppress(Exception):
                    await bus.unmark(marker)

        return _kmock_rendering.Response(
            headers={"Content-Type": "application/json"}, payload=stream()
        )

    # -- writes ------------------------------------------------------------------------------

    @staticmethod
    def _refuse_dry_run(request: kmock.Request) -> None:
        if request.params.get("dryRun"):
            raise _error(400, "BadRequest", "dryRun is not supported by the test apiserver")

    async def _serve_create(self, request: kmock.Request) -> Any:
        if request.resource == SELF_SUBJECT_ACCESS_REVIEWS:
            return self._access_review(request)
        if request.resource == TOKEN_REVIEWS:
            return self._token_review(request)
        info = self._info(request.resource)
        resource = request.resource
        assert resource is not None
        self._refuse_dry_run(request)
        self._check_subresource(info, request.subresource, served=())
        body = copy.deepcopy(request.data)
        if not isinstance(body, dict):
            raise _error(400, "BadRequest", "the body of the request was in an unknown format")
        self._check_type(resource, info, body)
        meta = body.setdefault("metadata", {})
        namespace = None
        if info.namespaced:
            namespace = request.namespace or meta.get("namespace") or None
            if namespace is None:
                raise _error(
                    405, "MethodNotAllowed", "a namespaced resource is created in a namespace"
                )
            if meta.get("namespace") not in (None, "", namespace):
                raise _error(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _error(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                )
            alphabet = string.ascii_lowercase + string.digits
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(alphabet) for _ in range(5)
            )
        if "status" in info.subresources and resource != NODES:
            body.pop("status", None)
        if resource == NAMESPACES:
            body["status"] = {"phase": "Active"}
        async with self._lock:
            if namespace is not None and self._current((NAMESPACES, None, namespace)) is None:
                raise _not_found("namespaces", namespace)
            key: ObjKey = (resource, namespace, meta["name"])
            if self._current(key) is not None:
                raise _error(
                    409,
                    "AlreadyExists",
                    f'{resource.plural} "{meta["name"]}" already exists',
                    name=meta["name"],
                )
            stored = self._store_new(resource, namespace, body)
            await self._emit(resource, "ADDED", stored, None)
        return _kmock_rendering.Response(status=201, payload=copy.deepcopy(stored))

    def _access_review(self, request: kmock.Request) -> Any:
        """A SelfSubjectAccessReview, answered by ``access_policy`` (not stored, like the real
        one); impersonated (``Impersonate-User``) unless ``impersonation`` is off (403)."""
        body = request.data if isinstance(request.data, dict) else {}
        user = request.headers.get("Impersonate-User") or None
        if user is not None and not self.impersonation:
            raise _error(403, "Forbidden", f'users "{user}" is forbidden: cannot impersonate')
        attributes = (body.get("spec") or {}).get("resourceAttributes") or {}
        allowed = True if self.access_policy is None else bool(self.access_policy(user, attributes))
        answer = {**copy.deepcopy(body), "status": {"allowed": allowed}}
        answer.setdefault("metadata", {})
        return _kmock_rendering.Response(status=201, payload=answer)

    def _token_review(self, request: kmock.Request) -> Any:
        """A TokenReview, answered by ``token_reviewer`` (not stored, like the real one)."""
        body = request.data if isinstance(request.data, dict) else {}
        spec = body.get("spec") or {}
        status = (
            {"authenticated": False, "error": "invalid bearer token"}
            if self.token_reviewer is None
            else self.token_reviewer(spec)
        )
        answer = {**copy.deepcopy(body), "status": status}
        answer.setdefault("metadata", {})
        return _kmock_rendering.Response(status=201, payload=answer)

    def _check_type(
        self, resource: kmock.resource, info: kmock.ResourceInfo, body: dict[str, Any]
    ) -> None:
        api_version = self._api_version(resource)
        if body.get("apiVersion") not in (None, "", api_version) or body.get("kind") not in (
            None,
            "",
            info.kind,
        ):
            raise _error(
                400,
                "BadRequest",
                f"the API version/kind in the data ({body.get('apiVersion')}/{body.get('kind')}) "
                f"does not match the expected {api_version}/{info.kind}",
            )

    async def _serve_update(self, request: kmock.Request) -> Any:
        return await self._write(request)

    async def _serve_replace(self, request: kmock.Request) -> Any:
        if request.resource is None or request.name is None:
            raise _error(405, "MethodNotAllowed", "PUT needs an object URL")
        return await self._write(request)

    def _patched(self, request: kmock.Request, current: dict[str, Any]) -> dict[str, Any]:
        if request.method == kmock.method.PUT:
            if not isinstance(request.data, dict):
                raise _error(400, "BadRequest", "the body of the request was in an unknown format")
            return copy.deepcopy(request.data)
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type == "application/json-patch+json":
            if not isinstance(request.data, list):
                raise _error(400, "BadRequest", "a JSON patch must be a list of operations")
            try:
                return jsonpatch.apply_patch(current, request.data)  # type: ignore[no-any-return]
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                raise _error(
                    422,
                    "Invalid",
                    f"the server rejected our request due to an error in our request: {e}",
                ) from None
        if content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            if not isinstance(request.data, dict):
                raise _error(400, "BadRequest", "a merge patch must be a JSON object")
            if content_type.startswith("application/strategic") and _has_smp_directives(
                request.data
            ):
                raise _error(
                    422,
                    "Invalid",
                    "strategic-merge-patch directives are not supported by the test apiserver",
                )
            return merge_patch(current, request.data)  # type: ignore[no-any-return]
        raise _error(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format: {content_type}",
        )

    async def _write(self, request: kmock.Request) -> Any:
        info = self._info(request.resource)
        resource = request.resource
        assert resource is not None and request.name is not None
        self._refuse_dry_run(request)
        self._check_subresource(info, request.subresource)
        key: ObjKey = (resource, request.namespace if info.namespaced else None, request.name)
        async with self._lock:
            current = self._current(key)
            if current is None:
                raise _not_found(str(resource.plural), request.name)
            new = self._patched(request, copy.deepcopy(current))
            if not isinstance(new, dict):
                raise _error(422, "Invalid", "the patched object is not an object")
            self._check_type(resource, info, new)
            new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
            new_meta = new.get("metadata") if isinstance(new.get("metadata"), dict) else {}
            cur_meta = current["metadata"]

            # Preconditions: the resulting resourceVersion/uid must be the stored ones.
            rv = new_meta.get("resourceVersion")
            if rv in (None, "") and request.method == kmock.method.PUT and resource in self._custom:
                raise _error(
                    422,
                    "Invalid",
                    "metadata.resourceVersion: Invalid value: 0: must be specified for an update",
                )
            if rv not in (None, "") and str(rv) != cur_meta["resourceVersion"]:
                raise _error(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource.plural} "{request.name}": '
                    "the object has been modified; please apply your changes to the latest version and try again",
                    name=request.name,
                )
            if new_meta.get("uid") not in (None, "", cur_meta["uid"]):
                raise _error(
                    409, "Conflict", "Precondition failed: UID mismatch", name=request.name
                )
            if new_meta.get("name") not in (None, cur_meta["name"]):
                raise _error(
                    400, "BadRequest", "the name of the object does not match the name on the URL"
                )

            # Subresource semantics: /status changes only the status; the main resource not it.
            if request.subresource == "status":
                status = new.get("status")
                new = copy.deepcopy(current)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
            else:
                if "status" in info.subresources:
                    if "status" in current:
                        new["status"] = current["status"]
                    else:
                        new.pop("status", None)
                meta = dict(new_meta)
                for field in SYSTEM_METADATA:
                    if field in cur_meta:
                        meta[field] = cur_meta[field]
                    else:
                        meta.pop(field, None)
                added = set(meta.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
                if cur_meta.get("deletionTimestamp") and added:
                    raise _error(
                        422,
                        "Invalid",
                        "metadata.finalizers: Forbidden: no new finalizers "
                        f"can be added if the object is being deleted, found {sorted(added)}",
                    )
                new["metadata"] = meta
            new["metadata"]["resourceVersion"] = cur_meta["resourceVersion"]
            new = self._structural(resource, new)

            if new == current:  # a no-op: no new resourceVersion, no event
                return current

            # generation: +1 when anything but metadata (and status, if a subresource) changed
            ignored = ("metadata", "status") if "status" in info.subresources else ("metadata",)
            if {k: v for k, v in new.items() if k not in ignored} != {
                k: v for k, v in current.items() if k not in ignored
            }:
                new["metadata"]["generation"] = int(cur_meta.get("generation", 1)) + 1
            new["metadata"]["resourceVersion"] = self._next_rv()
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                self.objects[key].history.append(new)
                self.objects[key].delete()
                await self._emit(resource, "DELETED", new, current)
            else:
                self.objects[key].history.append(new)
                await self._emit(resource, "MODIFIED", new, current)
        return copy.deepcopy(new)

    async def _serve_delete(self, request: kmock.Request) -> Any:
        info = self._info(request.resource)
        resource = request.resource
        assert resource is not None and request.name is not None
        self._refuse_dry_run(request)
        self._check_subresource(info, request.subresource, served=())
        options = request.data if isinstance(request.data, dict) else {}
        preconditions = options.get("preconditions") or {}
        key: ObjKey = (resource, request.namespace if info.namespaced else None, request.name)
        async with self._lock:
            current = self._current(key)
            if current is None:
                raise _not_found(str(resource.plural), request.name)
            meta = current["metadata"]
            for field in ("uid", "resourceVersion"):
                if preconditions.get(field) not in (None, "", meta[field]):
                    raise _error(
                        409, "Conflict", f"Precondition failed: {field} mismatch", name=request.name
                    )
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return current
                new = copy.deepcopy(current)
                new["metadata"].update(
                    deletionTimestamp=_now(),
                    deletionGracePeriodSeconds=0,
                    resourceVersion=self._next_rv(),
                )
                self.objects[key].history.append(new)
                await self._emit(resource, "MODIFIED", new, current)
                return copy.deepcopy(new)
            new = copy.deepcopy(current)
            new["metadata"]["resourceVersion"] = self._next_rv()
            self.objects[key].history.append(new)
            self.objects[key].delete()
            await self._emit(resource, "DELETED", new, current)
            return copy.deepcopy(new)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "metadata": {},
                    "status": "Failure",
                    "code": exc.status,
                    "reason": exc.reason,
                    "message": exc.message,
                    "details": exc.details or {},
                },
                status=exc.status,
            )
        return await super()._render_error(exc)


# --------------------------------------------------------------------------------------------
# The threaded server with a small synchronous client.


class KubeAPIError(Exception):
    """A non-2xx answer of the API to one of :class:`KubeCluster`'s client helpers."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        reason = body.get("reason") if isinstance(body, dict) else None
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status} {reason}: {message}")


class KubeResponse(NamedTuple):
    status: int
    body: Any


def wait_for(
    predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned) or fail after ``timeout``.
    Exceptions inside the predicate count as "not yet" (the last one is chained). The timeout
    is generous because it costs nothing when the condition comes true: a loaded CI machine
    is slow, not wrong."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
        except Exception as e:
            last_exc, result = e, None
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or predicate!r}"
            ) from last_exc
        time.sleep(interval)


@contextlib.contextmanager
def kubeconfig_env(path: str | Path) -> Iterator[None]:
    """Point ``KUBECONFIG`` at ``path`` -- and the official client's default kubeconfig location,
    which ``kubernetes.config`` reads from the environment once, at import -- then restore both."""
    saved_env = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    saved_attrs: list[tuple[Any, Any]] = []
    try:
        import kubernetes.config
        import kubernetes.config.kube_config
    except ImportError:
        pass
    else:
        for module in (kubernetes.config, kubernetes.config.kube_config):
            saved_attrs.append((module, module.KUBE_CONFIG_DEFAULT_LOCATION))
            module.KUBE_CONFIG_DEFAULT_LOCATION = str(path)
    try:
        yield
    finally:
        for module, value in reversed(saved_attrs):
            module.KUBE_CONFIG_DEFAULT_LOCATION = value
        if saved_env is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved_env


class KubeCluster:
    """The stateful API on a free 127.0.0.1 port, run in its own thread; see the module docstring.

    ``url``, ``kubeconfig_path``, ``api`` (the kmock handler), client helpers that go over HTTP
    (``create``, ``get``, ``list``, ``patch``, ``replace``, ``delete``, ``watch``, ``request``),
    store inspection without HTTP (``stored``, ``history``, ``store``), ``api_client()`` for the
    official client. ``api_version`` is "v1", "apps/v1", "netval.io/v1alpha1"...; ``kind``
    may be the Kind, the plural, the singular or a short name.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig_path = self.workdir / "kubeconfig.yaml"
        self.url = ""
        self._api: StatefulKubeAPI | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="kube-api", daemon=True)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> KubeCluster:
        self._thread.start()
        if not self._ready.wait(timeout) or self._failure is not None:
            raise RuntimeError("the kube API did not start") from self._failure
        self.kubeconfig_path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
                    "users": [{"name": "kmock", "user": {"token": "kmock-test-token"}}],
                    "contexts": [
                        {
                            "name": "kmock",
                            "context": {
                                "cluster": "kmock",
                                "user": "kmock",
                                "namespace": "default",
                            },
                        }
                    ],
                    "current-context": "kmock",
                }
            )
        )
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._api is not None and self._loop is not None and not self._loop.is_closed():
            # ends hung requests, which would hold the server
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._api.release_faults)
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("the kube API did not stop")

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:
            self._failure = e
        finally:
            self._ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        self._api = StatefulKubeAPI()
        async with self._api:
            # A free port; aiohttp's test server cancels handlers of disconnected clients.
            server = aiohttp.test_utils.RawTestServer(self._api, host="127.0.0.1", port=0)
            await server.start_server()
            try:
                self.url = str(server.make_url("")).rstrip("/")
                self._ready.set()
                await self._stopping.wait()
            finally:
                await server.close()

    @property
    def api(self) -> StatefulKubeAPI:
        """The kmock handler: ``api.objects``, ``api.resources``, reactions (``api[...] << 500``).
        Read or change it with :meth:`call` while something else uses the API."""
        assert self._api is not None, "not started"
        return self._api

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 10.0) -> T:
        """Run ``fn()`` (a coroutine function) in the server's loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)

    def inject(
        self,
        method: str,
        path: str,
        *,
        status: int | None = None,
        hang: float = 0.0,
        times: int | None = None,
    ) -> Fault:
        """Fail or hang requests (see :class:`Fault`), e.g. ``inject("PATCH", r"/status$",
        status=503, times=2)`` or ``inject("PATCH", r"/nodes/", hang=30)``. Returns the
        fault: its ``hits``, and ``times`` may be changed; :meth:`clear_faults` ends all."""
        fault = Fault(method.upper(), re.compile(path), status=status, hang=hang, times=times)

        async def add() -> None:
            self.api.faults.append(fault)

        self.call(add)
        return fault

    def clear_faults(self) -> None:
        async def clear() -> None:
            self.api.release_faults()

        self.call(clear)

    def add_crd(self, crd: dict[str, Any] | str | Path) -> None:
        """Serve the resources of a CustomResourceDefinition (a dict or a YAML file)."""
        doc = yaml.safe_load(Path(crd).read_text()) if isinstance(crd, str | Path) else crd

        async def add() -> None:
            self.api.add_crd(doc)

        self.call(add)

    # -- resource resolution -----------------------------------------------------------------

    def resolve(self, api_version: str, kind: str) -> tuple[kmock.resource, kmock.ResourceInfo]:
        group, _, version = api_version.rpartition("/")
        wanted = kind.lower()
        for resource in list(self.api.resources):
            if resource.group != group or resource.version != version:
                continue
            info = self.api.resources[resource]
            names = {resource.plural, (info.kind or "").lower(), info.singular, *info.shortnames}
            if wanted in names:
                return resource, info
        raise LookupError(f"no resource {kind!r} in {api_version!r}")

    def path(
        self,
        api_version: str,
        kind: str,
        name: str | None = None,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> str:
        resource, info = self.resolve(api_version, kind)
        parts = (
            ["/api", "v1"]
            if not resource.group
            else ["/apis", resource.group, str(resource.version)]
        )
        if info.namespaced and namespace:
            parts += ["namespaces", namespace]
        elif info.namespaced and name is not None:
            raise ValueError(f"{resource.plural} is namespaced: pass namespace=")
        parts.append(str(resource.plural))
        parts += [p for p in (name, subresource) if p]
        return "/".join(parts)

    # -- HTTP client helpers -----------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> KubeResponse:
        """One HTTP request; returns (status, parsed JSON) for 2xx, raises KubeAPIError otherwise."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method.upper())
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with self._opener.open(req, timeout=30) as response:
                raw = response.read()
                return KubeResponse(response.status, json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            raise KubeAPIError(e.code, parsed) from None

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """POST the object (namespaced kinds default to namespace "default"); the stored object."""
        _, info = self.resolve(obj["apiVersion"], obj["kind"])
        namespace = obj.get("metadata", {}).get("namespace") or (
            "default" if info.namespaced else None
        )
        return self.request(
            "POST", self.path(obj["apiVersion"], obj["kind"], namespace=namespace), obj
        ).body  # type: ignore[no-any-return]

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        return self.request("GET", self.path(api_version, kind, name, namespace)).body  # type: ignore[no-any-return]

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """The items (of every namespace when namespace is None)."""
        params = {
            k: v
            for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if v
        }
        body = self.request(
            "GET", self.path(api_version, kind, namespace=namespace), params=params
        ).body
        return body["items"]  # type: ignore[no-any-return]

    PATCH_TYPES = {
        "merge": "application/merge-patch+json",
        "json": "application/json-patch+json",
        "strategic": "application/strategic-merge-patch+json",
    }

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
    ) -> dict[str, Any]:
        """PATCH with ``patch_type`` "merge" (default), "json" (a list of ops) or "strategic"."""
        path = self.path(api_version, kind, name, namespace, subresource)
        return self.request("PATCH", path, patch, content_type=self.PATCH_TYPES[patch_type]).body  # type: ignore[no-any-return]

    def replace(self, obj: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        meta = obj["metadata"]
        path = self.path(
            obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"), subresource
        )
        return self.request("PUT", path, obj).body  # type: ignore[no-any-return]

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        return self.request("DELETE", self.path(api_version, kind, name, namespace)).body  # type: ignore[no-any-return]

    def ensure_namespace(self, name: str) -> dict[str, Any]:
        try:
            return self.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            )
        except KubeAPIError as e:
            if e.status != 409:
                raise
            return self.get("v1", "namespaces", name)

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        timeout_seconds: float = 1.0,
    ) -> Iterator[dict[str, Any]]:
        """Stream watch events until the server ends the stream after ``timeout_seconds``."""
        params = {"watch": "true", "timeoutSeconds": str(timeout_seconds)}
        if resource_version:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        url = (
            self.url
            + self.path(api_version, kind, namespace=namespace)
            + "?"
            + urllib.parse.urlencode(params)
        )
        with self._opener.open(url, timeout=timeout_seconds + 10) as response:
            for line in response:
                if line.strip():
                    yield json.loads(line)

    # -- store inspection (no HTTP; a consistent copy taken in the server's loop) ------------

    def _key(self, api_version: str, kind: str, name: str, namespace: str | None) -> ObjKey:
        resource, info = self.resolve(api_version, kind)
        return (resource, namespace if info.namespaced else None, name)

    def stored(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """The object as stored now (a copy), or None if absent/deleted."""
        key = self._key(api_version, kind, name, namespace)

        async def read() -> dict[str, Any] | None:
            async with self.api._lock:
                return self.api._current(key)

        return self.call(read)

    def history(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> list[dict[str, Any] | None]:
        """Every stored version of the object, oldest first; None marks a deletion."""
        key = self._key(api_version, kind, name, namespace)

        async def read() -> list[dict[str, Any] | None]:
            async with self.api._lock:
                if key not in self.api.objects:
                    return []
                return [
                    None if v is None else copy.deepcopy(v.raw)
                    for v in self.api.objects[key].history
                ]

        return self.call(read)

    def store(self) -> dict[tuple[str, str, str | None, str], dict[str, Any]]:
        """All live objects: {(apiVersion, plural, namespace, name): object}."""

        async def read() -> dict[tuple[str, str, str | None, str], dict[str, Any]]:
            async with self.api._lock:
                return {
                    (self.api._api_version(res), str(res.plural), ns, name): copy.deepcopy(obj.raw)
                    for (res, ns, name), obj in self.api.objects.items()
                    if not obj.deleted
                }

        return self.call(read)

    def watchers(self, api_version: str, kind: str) -> int:
        """How many watch streams on this resource are open right now (any namespace)."""
        resource, _ = self.resolve(api_version, kind)

        async def read() -> int:
            return self.api.watcher_count(resource)

        return self.call(read)

    def requests(self) -> list[tuple[str, str]]:
        """The requests served so far: [(METHOD, path?query)]."""

        async def read() -> list[tuple[str, str]]:
            return [(str(r.method.value), str(r.url.relative())) for r in self.api]

        return self.call(read)

    # -- the official client -----------------------------------------------------------------

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this API (the global default config untouched)."""
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig_path))
