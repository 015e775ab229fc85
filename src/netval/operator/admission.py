"""Workload gating at admission: Pods and Jobs annotated `netval.io/require-healthy: <name>`.

The operator serves two webhooks over HTTPS (`--webhook-addr`), each for Pods and Jobs:

- mutating (`gating.admission: gate`, the default, and `deny` alike): adds the required node
  affinity `netval.io/fabric NotIn [unhealthy]` (merged into any existing required terms); in
  gate mode, while the validation is not Healthy, also the scheduling gate `netval.io/fabric`
  and the label `netval.io/gated-by: <validation>` by which the operator finds the Pod again
  and removes the gate once the validation is Healthy (`GateReleaser`). A Pod admitted while
  Healthy loses a gate it inherited from its Job's template: health is judged when each Pod
  is created. A Job's template gets the annotation too, so the Job's Pods pass through the
  same webhooks when the Job controller creates them.
- validating (`gating.admission: deny`): refuses while the validation is not Healthy, naming
  the failing nodes and checks.

An annotation naming no NetworkValidation is refused in both modes (HTTP 400); so is every
annotated object while the validation cannot be looked up (503, "retry"). Whether the API
server admits objects when the webhook cannot be reached at all is the failurePolicy's
choice (`--webhook-failure-policy`, default Fail).

Serving: Kopf's `WebhookServer` (TLS, certificate reloading) calls `Reviewer` directly, not
Kopf's admission handlers (see `Reviewer` for why). netval writes the two webhook
configurations (both named `netval.io`) itself: Kopf's managed configurations hard-code
`timeoutSeconds: 30` and a failurePolicy fixed at import time, and cannot express the
`matchConditions` that keep unannotated objects from ever reaching the webhook (a CEL test of
the annotation, evaluated by the API server; objectSelector matches labels only).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import hashlib
import ipaddress
import json
import logging
import re
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

import aiohttp.web
import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netval.infra.metrics_server import parse_host_port
from netval.infra.task_stop import cancel_and_wait
from netval.model.keys import LabelKey
from netval.model.manifest import API_GROUP
from netval.model.spec import AdmissionMode
from netval.operator.kube import certs as webhook_certs
from netval.operator.kube.api import PLURAL, VERSION, load_kube_client
from netval.operator.runtime import OperatorRuntime, ValidationView

FABRIC_LABEL = LabelKey.FABRIC.value  # import shim (layout-operator); the lead rewires this

log = logging.getLogger("netval.operator.admission")

REQUIRE_ANNOTATION: Final = "netval.io/require-healthy"
GATE_NAME: Final = "netval.io/fabric"
GATED_BY_LABEL: Final = "netval.io/gated-by"
# On a Pod gated for a validation that no longer exists: why it stays gated (kubectl describe).
GATE_MESSAGE_ANNOTATION: Final = "netval.io/gate-message"
UNHEALTHY: Final = "unhealthy"
CONFIGURATION_NAME: Final = "netval.io"  # both webhook configurations
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "netval-operator"}
WEBHOOK_MEMO_KEY: Final = "webhook"  # memo: WebhookOptions, or absent for no webhook
RELEASER_MEMO_KEY: Final = "gate_releaser"
SERVICE_MEMO_KEY: Final = "webhook_service"
RUNTIME_MEMO_KEY: Final = "runtime"

# Webhook ids: the last URL path segment, by which Kopf's server tells the webhooks apart.
MUTATE_PODS: Final = "netval-gate-pods"
MUTATE_JOBS: Final = "netval-gate-jobs"
VALIDATE_PODS: Final = "netval-deny-pods"
VALIDATE_JOBS: Final = "netval-deny-jobs"

# Evaluated by the API server (matchConditions, GA in Kubernetes 1.30): only annotated objects
# are sent. Older API servers drop the field and send everything; the reviewer admits an
# unannotated object unchanged at once.
MATCH_CONDITION: Final = {
    "name": "require-healthy-annotation",
    "expression": (
        f"has(object.metadata.annotations) && '{REQUIRE_ANNOTATION}' in object.metadata.annotations"
    ),
}
MAX_MESSAGE: Final = 1024  # refusal messages: kubectl prints them whole
LOOKUP_TIMEOUT: Final = 2.0  # seconds for the one API read an admission may make
WARN_EVERY: Final = 30.0  # seconds between warnings about the same repeated failure

FailurePolicy = Literal["Fail", "Ignore"]
FAILURE_POLICIES: Final[tuple[FailurePolicy, ...]] = ("Fail", "Ignore")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# -- options (`netval operator --webhook-*`) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceRef:
    namespace: str
    name: str
    port: int = 443


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    host: str  # listening address; also the URL host without a Service
    port: int  # 0: any free port (the configurations carry the one chosen)
    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None  # caBundle for the configurations (default: cert_file)
    service: ServiceRef | None = None
    failure_policy: FailurePolicy = "Fail"
    timeout_seconds: int = 10
    cert_dir: Path | None = None  # where generated certificates go (default: a new temp dir)
    excluded_namespaces: tuple[str, ...] = ("kube-system",)  # plus the operator's namespace


def parse_addr(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:9443` for IPv6, `:9443` for every IPv4 interface) -> (host, port)."""
    addr = parse_host_port(text, variable="--webhook-addr")
    if addr is None:
        raise ValueError(f"--webhook-addr: expected HOST:PORT, e.g. 0.0.0.0:9443, got {text!r}")
    return addr


def parse_service(text: str) -> ServiceRef:
    """`NAMESPACE/NAME[:PORT]` (port of the Service, default 443)."""
    ref, _, port_text = text.strip().partition(":")
    namespace, sep, name = ref.partition("/")
    if not sep or not _DNS_LABEL.match(namespace) or not _DNS_LABEL.match(name):
        raise ValueError(f"--webhook-service: expected NAMESPACE/NAME[:PORT], got {text!r}")
    port = 443
    if port_text:
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"--webhook-service: not a port number: {port_text!r}") from None
        if not 1 <= port <= 65535:
            raise ValueError(f"--webhook-service: port must be 1..65535, got {port}")
    return ServiceRef(namespace, name, port)


def webhook_options(
    addr: str | None,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    ca: Path | None = None,
    service: str | None = None,
    failure_policy: str = "Fail",
    timeout_seconds: int = 10,
) -> WebhookOptions | None:
    """The webhook options from the command line; None without `--webhook-addr`. Raises
    ValueError (one line, naming the flag) on inconsistent flags."""
    if addr is None:
        given = [
            flag
            for flag, value in (
                ("--webhook-cert", cert),
                ("--webhook-key", key),
                ("--webhook-ca", ca),
                ("--webhook-service", service),
            )
            if value is not None
        ]
        if given:
            raise ValueError(f"{given[0]} needs --webhook-addr")
        return None
    if (cert is None) != (key is None):
        raise ValueError("--webhook-cert and --webhook-key go together")
    if ca is not None and cert is None:
        raise ValueError("--webhook-ca needs --webhook-cert and --webhook-key")
    for flag, path in (("--webhook-cert", cert), ("--webhook-key", key), ("--webhook-ca", ca)):
        if path is not None and not path.is_file():
            raise ValueError(f"{flag}: no such file: {path}")
    if failure_policy not in FAILURE_POLICIES:
        raise ValueError(f"--webhook-failure-policy: Fail or Ignore, got {failure_policy!r}")
    if not 1 <= timeout_seconds <= 30:
        raise ValueError(f"--webhook-timeout: 1..30 seconds, got {timeout_seconds}")
    host, port = parse_addr(addr)
    return WebhookOptions(
        host=host,
        port=port,
        cert_file=cert,
        key_file=key,
        ca_file=ca,
        service=parse_service(service) if service is not None else None,
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
    )


# -- mutations (pure, in place; `json_patch` turns them into the review's JSONPatch) ----------


def fabric_requirement() -> dict[str, Any]:
    return {"key": FABRIC_LABEL, "operator": "NotIn", "values": [UNHEALTHY]}


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
    gates = [g for g in pod_spec.get("schedulingGates") or [] if g.get("name") != GATE_NAME]
    if present:
        gates.append({"name": GATE_NAME})
    if gates:
        pod_spec["schedulingGates"] = gates
    else:
        pod_spec.pop("schedulingGates", None)


def has_fabric_gate(pod_spec: Mapping[str, Any] | None) -> bool:
    return any(g.get("name") == GATE_NAME for g in (pod_spec or {}).get("schedulingGates") or [])


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
        f" and is Healthy; to run the pod without it, remove the {GATE_NAME!r} scheduling gate"
    )


def mutate_pod(body: dict[str, Any], *, gate: bool, validation: str) -> None:
    spec = _mapping(body, "spec")
    add_fabric_affinity(spec)
    set_fabric_gate(spec, gate)
    _set_gated_label(_mapping(body, "metadata"), validation if gate else None)


def mutate_job(body: dict[str, Any], *, gate: bool, validation: str) -> None:
    template = _mapping(_mapping(body, "spec"), "template")
    meta = _mapping(template, "metadata")
    # The Job's Pods carry the annotation too: each one is judged when it is created.
    _mapping(meta, "annotations").setdefault(REQUIRE_ANNOTATION, validation)
    pod_spec = _mapping(template, "spec")
    add_fabric_affinity(pod_spec)
    set_fabric_gate(pod_spec, gate)
    _set_gated_label(meta, validation if gate else None)


def deny_message(view: ValidationView) -> str:
    """Why admission is refused: the failing nodes with their checks, bounded."""
    by_node: dict[str, list[str]] = {}
    for node, check in view.failures:
        checks = by_node.setdefault(node, [])
        if check not in checks:
            checks.append(check)
    head = f"NetworkValidation {view.name!r} is not Healthy"
    if by_node:
        failing = sorted(set(by_node) | set(view.unhealthy_nodes))
        detail = f"{len(failing)} node(s) failing: " + _bounded(
            [f"{n} ({', '.join(by_node[n])})" if n in by_node else n for n in failing],
            MAX_MESSAGE - 200,
        )
    else:
        detail = view.healthy_message
    tail = "admission is refused until it is Healthy; retry later"
    return f"{head}: {detail}; {tail}"[:MAX_MESSAGE]


def _bounded(items: list[str], limit: int) -> str:
    shown: list[str] = []
    used = 0
    for i, item in enumerate(items):
        if used + len(item) + 2 > limit:
            shown.append(f"... and {len(items) - i} more")
            break
        shown.append(item)
        used += len(item) + 2
    return ", ".join(shown)


def _mapping(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """obj[key] as a dict, created (or replacing an explicit null) when absent."""
    value = obj.get(key)
    if not isinstance(value, dict):
        value = {}
        obj[key] = value
    return value


def _is_fabric_requirement(expr: Mapping[str, Any]) -> bool:
    return (
        expr.get("key") == FABRIC_LABEL
        and expr.get("operator") == "NotIn"
        and UNHEALTHY in (expr.get("values") or [])
    )


def _set_gated_label(meta: dict[str, Any], validation: str | None) -> None:
    labels = _mapping(meta, "labels")
    if validation is not None:
        labels[GATED_BY_LABEL] = validation_label(validation)
    else:
        labels.pop(GATED_BY_LABEL, None)
        if not labels:
            meta.pop("labels", None)


# -- answering AdmissionReviews -----------------------------------------------------------------


class Refusal(Exception):
    """Admission refused: `message` goes to the client, `code` is the HTTP status it sees."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message[:MAX_MESSAGE]
        self.code = code


@dataclass(frozen=True, slots=True)
class _Hook:
    kind: str  # the object's kind this webhook takes
    mutating: bool


HOOKS: Final = {
    MUTATE_PODS: _Hook("Pod", mutating=True),
    MUTATE_JOBS: _Hook("Job", mutating=True),
    VALIDATE_PODS: _Hook("Pod", mutating=False),
    VALIDATE_JOBS: _Hook("Job", mutating=False),
}
_POD_PATHS: Final = (("metadata", "labels"), ("spec", "affinity"), ("spec", "schedulingGates"))
_JOB_PATHS: Final = tuple(
    ("spec", "template", *p)
    for p in (
        ("metadata", "labels"),
        ("metadata", "annotations"),
        ("spec", "affinity"),
        ("spec", "schedulingGates"),
    )
)
_MISSING: Final = object()


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


def _detached(obj: Mapping[str, Any], paths: Iterable[tuple[str, ...]]) -> dict[str, Any]:
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


class Reviewer:
    """Answers admission.k8s.io/v1 AdmissionReviews for the four webhooks (by URL path).

    Served by Kopf's `WebhookServer` (HTTPS, certificate reloading), called directly rather
    than through Kopf's admission handlers: Kopf's per-request machinery (causes, handler
    state, a deep copy and a full JSON diff of the object, log records) costs ~0.45 ms per
    review, which at 100 concurrent reviews is a p99 of ~55 ms on a 2-core machine; this path
    needs a fraction of that (bench/webhook_latency.py).

    A validation is judged as the runtime holds it; one the runtime has not loaded (a standby
    replica behind the Service, a restart before Kopf resumed the validations) is judged by
    its object in the API -- spec.gating.admission and the Healthy condition and failures of
    its status, as the active replica wrote them -- read at most every `cache_ttl` seconds.
    A view from the runtime is reused for `view_ttl` seconds.
    """

    def __init__(
        self, memo: Mapping[str, Any], *, cache_ttl: float = 2.0, view_ttl: float = 0.25
    ) -> None:
        self.memo = memo
        self.cache_ttl = cache_ttl
        self.view_ttl = view_ttl
        self.reviews = 0
        self.refusals = 0
        self._api: client.CustomObjectsApi | None = None
        self._views: dict[str, tuple[float, ValidationView]] = {}  # from the runtime
        self._cache: dict[str, tuple[float, ValidationView | None]] = {}  # from the API
        self._reads: dict[str, asyncio.Task[ValidationView | None]] = {}
        self._warned = -WARN_EVERY

    async def __call__(
        self,
        request: Mapping[str, Any],
        *,
        webhook: str | None = None,
        headers: Mapping[str, str] | None = None,
        sslpeer: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        hook = HOOKS.get(webhook or "")
        if hook is None:
            raise aiohttp.web.HTTPNotFound(reason=f"no webhook at /{webhook}")
        payload = request.get("request") if isinstance(request, Mapping) else None
        obj = payload.get("object") if isinstance(payload, Mapping) else None
        if not isinstance(payload, Mapping) or not isinstance(obj, Mapping):
            raise aiohttp.web.HTTPBadRequest(reason="not an AdmissionReview request")
        answer: dict[str, Any] = {"uid": payload.get("uid", ""), "allowed": True}
        self.reviews += 1
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if (
            payload.get("operation") == "CREATE"
            and obj.get("kind", hook.kind) == hook.kind
            and REQUIRE_ANNOTATION in annotations
        ):
            try:
                self._judge(hook, obj, await self.view(annotations[REQUIRE_ANNOTATION]), answer)
            except Refusal as refusal:
                self.refusals += 1
                answer["allowed"] = False
                answer["status"] = {"code": refusal.code, "message": refusal.message}
                meta = obj.get("metadata") or {}
                log.info("refused %s %s/%s: %s", hook.kind, payload.get("namespace"),
                         meta.get("name") or meta.get("generateName"), refusal.message)  # fmt: skip
        return {
            "apiVersion": request.get("apiVersion", "admission.k8s.io/v1"),
            "kind": "AdmissionReview",
            "response": answer,
        }

    def _judge(
        self, hook: _Hook, obj: Mapping[str, Any], view: ValidationView, answer: dict[str, Any]
    ) -> None:
        gate = view.admission is AdmissionMode.GATE and not view.healthy
        if not hook.mutating:
            if view.admission is AdmissionMode.DENY and not view.healthy:
                raise Refusal(deny_message(view), 403)
            return
        paths = _POD_PATHS if hook.kind == "Pod" else _JOB_PATHS
        new = _detached(obj, paths)
        (mutate_pod if hook.kind == "Pod" else mutate_job)(new, gate=gate, validation=view.name)
        ops = json_patch(obj, new, paths)
        if ops:
            answer["patchType"] = "JSONPatch"
            answer["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        if gate:
            answer["warnings"] = [
                f"held by scheduling gate {GATE_NAME} until NetworkValidation {view.name!r} "
                f"is Healthy ({view.healthy_message})"[:MAX_MESSAGE]
            ]
            releaser = self.memo.get(RELEASER_MEMO_KEY)
            if isinstance(releaser, GateReleaser):
                releaser.note_gated(view.name)

    async def view(self, annotation: Any) -> ValidationView:
        """The validation the annotation names, or a Refusal saying why it cannot be judged."""
        name = str(annotation or "").strip()
        if not name:
            raise Refusal(
                f"annotation {REQUIRE_ANNOTATION} is empty: name a NetworkValidation", 400
            )
        now = time.monotonic()
        known = self._views.get(name)
        if known is not None and known[0] > now:
            return known[1]
        runtime = self.memo.get(RUNTIME_MEMO_KEY)
        if isinstance(runtime, OperatorRuntime):
            # validation_view costs O(targeted nodes): keep it for a moment (health changes
            # reach the status only once per status window anyway)
            view = runtime.validation_view(name)
            if view is not None:
                self._views[name] = (now + self.view_ttl, view)
                return view
        cached = self._cache.get(name)
        if cached is not None and cached[0] > time.monotonic():
            view = cached[1]
        else:
            task = self._reads.get(name)
            if task is None:  # one read per name at a time, however many reviews wait
                task = asyncio.create_task(self._read(name))
                self._reads[name] = task
                task.add_done_callback(functools.partial(self._read_done, name))
            view = await asyncio.shield(task)
        if view is None:
            raise Refusal(
                f"no NetworkValidation named {name!r} (annotation {REQUIRE_ANNOTATION}); create "
                "it or fix the annotation",
                400,
            )
        return view

    def _read_done(self, name: str, _task: asyncio.Task[ValidationView | None]) -> None:
        self._reads.pop(name, None)

    async def _read(self, name: str) -> ValidationView | None:
        def read() -> dict[str, Any] | None:
            if self._api is None:
                self._api = client.CustomObjectsApi(load_kube_client())
            try:
                found = self._api.get_cluster_custom_object(
                    API_GROUP, VERSION, PLURAL, name, _request_timeout=LOOKUP_TIMEOUT
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return found if isinstance(found, dict) else None

        try:
            found = await asyncio.to_thread(read)
        except Exception as exc:
            if time.monotonic() - self._warned >= WARN_EVERY:
                self._warned = time.monotonic()
                log.warning("looking up NetworkValidation %s failed: %s", name, exc)
            raise Refusal(
                f"could not look up NetworkValidation {name!r}; retry in a few seconds", 503
            ) from None
        view = view_from_object(found) if found is not None else None
        self._cache[name] = (time.monotonic() + self.cache_ttl, view)
        return view


def view_from_object(obj: Mapping[str, Any]) -> ValidationView:
    """A NetworkValidation object as admission sees it (no per-node health: the object does
    not carry it; admission needs only Healthy, the failures and the mode)."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    mode = ((spec.get("gating") or {}).get("admission")) or AdmissionMode.GATE.value
    healthy = next((c for c in status.get("conditions") or [] if c.get("type") == "Healthy"), None)
    failures = tuple(
        (str(f.get("node")), str(f.get("check")))
        for f in status.get("failures") or []
        if isinstance(f, Mapping)
    )
    return ValidationView(
        name=str((obj.get("metadata") or {}).get("name")),
        healthy=healthy is not None and healthy.get("status") == "True",
        healthy_message=str(healthy.get("message") or "") if healthy else "no status yet",
        admission=AdmissionMode.DENY if mode == AdmissionMode.DENY.value else AdmissionMode.GATE,
        node_health={},
        failures=failures,
    )


# -- serving and the webhook configurations -----------------------------------------------------


def client_config(base: Mapping[str, Any], service: ServiceRef | None) -> dict[str, Any]:
    """What the API server is told to call: Kopf's URL and CA bundle, or the Service."""
    out: dict[str, Any] = {}
    if service is not None:
        out["service"] = {
            "namespace": service.namespace,
            "name": service.name,
            "port": service.port,
            "path": "/",
        }
    else:
        out["url"] = base["url"]
    if base.get("caBundle"):
        out["caBundle"] = base["caBundle"]
    return out


_HOOKS: Final = (
    # (webhook name, handler id, group, version, plural, mutating)
    ("pods.gate.netval.io", MUTATE_PODS, "", "v1", "pods", True),
    ("jobs.gate.netval.io", MUTATE_JOBS, "batch", "v1", "jobs", True),
    ("pods.deny.netval.io", VALIDATE_PODS, "", "v1", "pods", False),
    ("jobs.deny.netval.io", VALIDATE_JOBS, "batch", "v1", "jobs", False),
)


def build_webhooks(
    config: Mapping[str, Any],
    *,
    mutating: bool,
    failure_policy: FailurePolicy,
    timeout_seconds: int,
    excluded_namespaces: Iterable[str],
) -> list[dict[str, Any]]:
    """The `webhooks` of the mutating or the validating configuration."""
    hooks = []
    for name, handler_id, group, version, plural, is_mutating in _HOOKS:
        if is_mutating != mutating:
            continue
        cc = copy.deepcopy(dict(config))
        if "url" in cc:
            cc["url"] = f"{cc['url'].rstrip('/')}/{handler_id}"
        if "service" in cc:
            cc["service"]["path"] = f"/{handler_id}"
        hook: dict[str, Any] = {
            "name": name,
            "clientConfig": cc,
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version],
                    "resources": [plural],
                    "operations": ["CREATE"],
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": failure_policy,
            "matchPolicy": "Equivalent",
            "namespaceSelector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": sorted(set(excluded_namespaces)),
                    }
                ]
            },
            "matchConditions": [dict(MATCH_CONDITION)],
            "sideEffects": "None",
            "timeoutSeconds": timeout_seconds,
            "admissionReviewVersions": ["v1"],
        }
        if mutating:
            # idempotent: run again if a later webhook changed the object
            hook["reinvocationPolicy"] = "IfNeeded"
        hooks.append(hook)
    return hooks


class ConfigurationWriter:
    """Creates or rewrites both webhook configurations for the newest client config, retrying
    (with backoff) until the API takes them."""

    def __init__(self, options: WebhookOptions, excluded_namespaces: Iterable[str]) -> None:
        self.options = options
        self.excluded = tuple(excluded_namespaces)
        self.writes = 0
        self._api: client.AdmissionregistrationV1Api | None = None
        self._task: asyncio.Task[None] | None = None

    def submit(self, config: Mapping[str, Any]) -> None:
        if self._task is not None:
            self._task.cancel()
        self._task = asyncio.create_task(self._apply(dict(config)), name="netval-webhook-config")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def _apply(self, config: dict[str, Any]) -> None:
        delay = 0.5
        while True:
            try:
                await asyncio.to_thread(self._write, config)
            except Exception as exc:
                log.warning("writing the webhook configurations failed (retry in %gs): %s",
                            delay, exc)  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            self.writes += 1
            where = config.get("url") or config.get("service")
            log.info("webhook configurations %s point at %s", CONFIGURATION_NAME, where)
            return

    def _write(self, config: dict[str, Any]) -> None:
        if self._api is None:
            self._api = client.AdmissionregistrationV1Api(load_kube_client())
        api = self._api
        for mutating in (True, False):
            webhooks = build_webhooks(
                config,
                mutating=mutating,
                failure_policy=self.options.failure_policy,
                timeout_seconds=self.options.timeout_seconds,
                excluded_namespaces=self.excluded,
            )
            kind = "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration"
            body = {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": CONFIGURATION_NAME, "labels": dict(MANAGED_BY)},
                "webhooks": webhooks,
            }
            read: Any
            create: Any
            patch: Any
            if mutating:
                read = api.read_mutating_webhook_configuration
                create = api.create_mutating_webhook_configuration
                patch = api.patch_mutating_webhook_configuration
            else:
                read = api.read_validating_webhook_configuration
                create = api.create_validating_webhook_configuration
                patch = api.patch_validating_webhook_configuration
            try:
                read(CONFIGURATION_NAME, _preload_content=False)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                create(cast(Any, body))
                continue
            # A merge patch replaces the whole webhooks list: ours is the only content.
            patch(
                CONFIGURATION_NAME,
                {"metadata": {"labels": dict(MANAGED_BY)}, "webhooks": webhooks},
                _content_type="application/merge-patch+json",
            )


class WebhookService:
    """Kopf's HTTPS `WebhookServer` answering with `Reviewer`, and the configurations.

    Without a certificate and key, a self-signed CA and certificate are generated
    (`webhook_certs`). Kopf's server reloads renewed certificate files and yields a new client
    config each time; each is written to both webhook configurations. A server that fails
    (e.g. the port is taken) is logged and started again."""

    def __init__(
        self, options: WebhookOptions, reviewer: Reviewer, excluded_namespaces: Iterable[str]
    ) -> None:
        self.options = options
        self.reviewer = reviewer
        self.writer = ConfigurationWriter(options, excluded_namespaces)
        self.cert_files: webhook_certs.CertFiles | None = None
        self.client_config: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None

    def certificates(self) -> webhook_certs.CertFiles:
        o = self.options
        if o.cert_file is not None and o.key_file is not None:
            return webhook_certs.CertFiles(ca=o.ca_file or o.cert_file, cert=o.cert_file,
                                           key=o.key_file)  # fmt: skip
        if self.cert_files is None:
            directory = o.cert_dir or Path(tempfile.mkdtemp(prefix="netval-webhook-"))
            extra = (
                webhook_certs.service_dns_names(o.service.namespace, o.service.name)
                if o.service is not None
                else []
            )
            self.cert_files = webhook_certs.generate_self_signed(
                directory, webhook_certs.server_sans(o.host, extra)
            )
            log.info("generated a self-signed webhook certificate in %s", directory)
        return self.cert_files

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="netval-webhook")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        await self.writer.stop()

    async def run(self) -> None:
        while True:
            try:
                await self.serve()
            except Exception:
                log.exception("the admission webhook server failed; restarting in 5s")
            await asyncio.sleep(5)

    async def serve(self) -> None:
        files = self.certificates()
        o = self.options
        server = kopf.WebhookServer(
            addr=o.host,
            port=o.port or None,
            host=None if _is_unspecified(o.host) else o.host,
            certfile=files.cert,
            pkeyfile=files.key,
            cafile=files.ca,
        )
        async with server:
            async for base in server(cast(kopf.WebhookFn, self.reviewer)):
                self.client_config = client_config(base, o.service)
                log.info("serving admission webhooks at %s", base.get("url"))
                self.writer.submit(self.client_config)


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


# -- removing the gate when the validation is Healthy -------------------------------------------


class GateReleaser:
    """Removes `netval.io/fabric` from gated Pods (found by their `netval.io/gated-by` label)
    once their validation is Healthy.

    Every `interval` it asks the runtime (in memory) which validations are Healthy; it lists
    the gated Pods of one (a label-selected list) when the validation has just turned
    Healthy, when the webhook gated a Pod for it in the last `dirty_grace` seconds (a Pod
    gated just before the turn), or every `resync` seconds. Each Pod is patched with its
    resourceVersion (a 409 re-reads and retries); other gates and labels stay.

    Every `resync` seconds, once all validations are loaded, Pods gated for a validation that
    no longer exists get the annotation `netval.io/gate-message` saying so: they stay gated
    (releasing them would admit them onto fabric nobody judged), and the annotation tells
    their owner why and what to do. It is removed when the Pod is released."""

    def __init__(
        self,
        memo: Mapping[str, Any],
        *,
        interval: float = 1.0,
        resync: float = 15.0,
        dirty_grace: float = 5.0,
    ) -> None:
        self.memo = memo
        self.interval = interval
        self.resync = resync
        self.dirty_grace = dirty_grace
        self.released = 0
        self._healthy: dict[str, bool] = {}
        self._listed: dict[str, float] = {}
        self._dirty: dict[str, float] = {}
        self._warned = -WARN_EVERY
        self._orphans_checked = -1e9
        self.orphans_marked = 0
        self.orphan_checks = 0
        self._task: asyncio.Task[None] | None = None

    def note_gated(self, validation: str) -> None:
        self._dirty[validation] = time.monotonic()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="netval-gate-releaser")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def run(self) -> None:
        while True:
            runtime = self.memo.get(RUNTIME_MEMO_KEY)
            if isinstance(runtime, OperatorRuntime):
                try:
                    await self.pass_once(runtime)
                except Exception:  # a bug, not the API: pass_once handles API failures
                    log.exception("releasing gated pods failed; retrying")
            await asyncio.sleep(self.interval)

    async def pass_once(self, runtime: OperatorRuntime) -> None:
        for name in list(runtime.specs):
            view = runtime.validation_view(name)
            healthy = view is not None and view.healthy
            turned = healthy and not self._healthy.get(name, False)
            self._healthy[name] = healthy
            if not healthy:
                continue
            now = time.monotonic()
            if not (
                turned or name in self._dirty or now - self._listed.get(name, -1e9) >= self.resync
            ):
                continue
            try:
                count = await asyncio.to_thread(self._release_all, runtime.kube.core, name)
            except Exception as exc:
                self._healthy[name] = False  # a turn not handled yet: try again next tick
                if now - self._warned >= WARN_EVERY:
                    self._warned = now
                    log.warning("releasing the gated pods of %s failed (retrying): %s", name, exc)
                continue
            self._listed[name] = now
            if (dirty := self._dirty.get(name)) is not None and dirty < now - self.dirty_grace:
                del self._dirty[name]
            if count:
                self.released += count
                log.info("NetworkValidation %s is Healthy: released %d gated pod(s)", name, count)
        for name in set(self._healthy) - set(runtime.specs):
            self._healthy.pop(name, None)
            self._listed.pop(name, None)
        now = time.monotonic()
        if now - self._orphans_checked >= self.resync and await runtime.validations_loaded():
            self._orphans_checked = now
            try:
                marked = await asyncio.to_thread(
                    self._mark_orphans, runtime.kube.core, set(runtime.states)
                )
            except Exception as exc:
                self._orphans_checked = now - self.resync + self.interval  # retry soon
                log.warning("checking gated pods for deleted validations failed: %s", exc)
                return
            self.orphan_checks += 1
            if marked:
                self.orphans_marked += marked
                log.warning(
                    "%d pod(s) gated for a NetworkValidation that does not exist: annotated %s",
                    marked,
                    GATE_MESSAGE_ANNOTATION,
                )

    def _release_all(self, core: client.CoreV1Api, validation: str) -> int:
        response = core.list_pod_for_all_namespaces(
            label_selector=f"{GATED_BY_LABEL}={validation_label(validation)}",
            _preload_content=False,
        )
        pods = json.loads(cast(Any, response).data).get("items") or []
        released = 0
        for pod in pods:
            meta = pod.get("metadata") or {}
            try:
                if self._release_pod(core, meta["namespace"], meta["name"], pod):
                    released += 1
            except ApiException as exc:
                log.warning("could not release pod %s/%s: %s", meta.get("namespace"),
                            meta.get("name"), exc.reason)  # fmt: skip
        return released

    @staticmethod
    def _mark_orphans(core: client.CoreV1Api, known: set[str]) -> int:
        """Annotate (or, once the validation is back, un-annotate) Pods gated for a validation
        not in `known`; the number newly annotated."""
        response = core.list_pod_for_all_namespaces(
            label_selector=GATED_BY_LABEL, _preload_content=False
        )
        pods = json.loads(cast(Any, response).data).get("items") or []
        marked = 0
        for pod in pods:
            meta = pod.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            validation = annotations.get(REQUIRE_ANNOTATION)
            if not has_fabric_gate(pod.get("spec")) or not isinstance(validation, str):
                continue
            message = None if validation in known else orphan_message(validation)
            if annotations.get(GATE_MESSAGE_ANNOTATION) == message:
                continue
            patch = {"metadata": {"annotations": {GATE_MESSAGE_ANNOTATION: message}}}
            try:
                core.patch_namespaced_pod(
                    meta["name"], meta["namespace"], patch,
                    _content_type="application/merge-patch+json",
                )  # fmt: skip
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("could not annotate pod %s/%s: %s", meta.get("namespace"),
                                meta.get("name"), exc.reason)  # fmt: skip
                continue
            if message is not None:
                marked += 1
        return marked

    @staticmethod
    def _release_pod(
        core: client.CoreV1Api, namespace: str, name: str, pod: dict[str, Any]
    ) -> bool:
        for _ in range(5):
            gated = has_fabric_gate(pod.get("spec"))
            patch: dict[str, Any] = {
                "metadata": {
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                    "labels": {GATED_BY_LABEL: None},
                    "annotations": {GATE_MESSAGE_ANNOTATION: None},
                }
            }
            if gated:
                spec = copy.deepcopy(pod.get("spec") or {})
                set_fabric_gate(spec, False)
                patch["spec"] = {"schedulingGates": spec.get("schedulingGates")}
            try:
                core.patch_namespaced_pod(
                    name, namespace, patch, _content_type="application/merge-patch+json"
                )
                return gated
            except ApiException as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409:
                    raise
            response = core.read_namespaced_pod(name, namespace, _preload_content=False)
            pod = json.loads(cast(Any, response).data)
        raise ApiException(status=409, reason="Conflict: the pod kept changing")


# -- lifecycle ----------------------------------------------------------------------------------


@kopf.on.startup()
async def admission_startup(memo: kopf.Memo, **_: Any) -> None:
    """Without --webhook-addr nothing runs: no Pod is gated, and the RBAC for Pods and the
    webhook configurations comes with the webhook."""
    options = memo.get(WEBHOOK_MEMO_KEY)
    if isinstance(options, WebhookOptions):
        releaser = GateReleaser(memo)
        memo[RELEASER_MEMO_KEY] = releaser
        releaser.start()
        own_namespace = getattr(memo.get("settings"), "namespace", None)
        excluded = [*options.excluded_namespaces, *([own_namespace] if own_namespace else [])]
        service = WebhookService(options, Reviewer(memo), excluded)
        memo[SERVICE_MEMO_KEY] = service
        service.start()


@kopf.on.cleanup()
async def admission_cleanup(memo: kopf.Memo, **_: Any) -> None:
    for key in (SERVICE_MEMO_KEY, RELEASER_MEMO_KEY):
        worker = memo.get(key)
        if isinstance(worker, WebhookService | GateReleaser):
            await worker.stop()
