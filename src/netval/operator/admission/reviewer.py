"""Answering admission.k8s.io/v1 AdmissionReviews: look the validation up, judge, mutate."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any, Final

import aiohttp.web
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netval.model.keys import AnnotationKey, SchedulingGate
from netval.model.manifest import API_GROUP
from netval.model.spec import AdmissionMode, AdmissionPolicy
from netval.operator.admission.configurations import HOOKS, Hook
from netval.operator.admission.gate_release import (
    RELEASER_MEMO_KEY,
    RUNTIME_MEMO_KEY,
    WARN_EVERY,
    GateReleaser,
)
from netval.operator.admission.mutate import (
    JOB_PATHS,
    POD_PATHS,
    detached,
    json_patch,
    mutate_job,
    mutate_pod,
)
from netval.operator.gating.capacity import AdmissionVerdict, judge, min_healthy_nodes
from netval.operator.kube.api import PLURAL, VERSION, error_text, load_kube_client
from netval.operator.term_runtime import OperatorRuntime, ValidationView
from netval.operator.thread_pools import PROCESS_POOLS, Concern

log = logging.getLogger("netval.operator.admission")

MAX_MESSAGE: Final = 1024  # refusal messages: kubectl prints them whole
LOOKUP_TIMEOUT: Final = 2.0  # seconds for the one API read an admission may make
# Each cache holds at most this many names (oldest dropped first): an annotation is written
# by whoever creates a Pod, so its values are unbounded; a cluster has far fewer validations.
MAX_CACHED: Final = 1024
# A NetworkValidation is a cluster-scoped object: its name is a DNS-1123 subdomain.
MAX_NAME: Final = 253
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


class Refusal(Exception):
    """Admission refused: `message` goes to the client, `code` is the HTTP status it sees."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message[:MAX_MESSAGE]
        self.code = code


class Reviewer:
    """Answers admission.k8s.io/v1 AdmissionReviews for the four webhooks (by URL path).

    Served by Kopf's `WebhookServer` (HTTPS, certificate reloading), called directly rather
    than through Kopf's admission handlers: Kopf's per-request machinery (causes, handler
    state, a deep copy and a full JSON diff of the object, log records) costs ~0.45 ms per
    review, which at 100 concurrent reviews is a p99 of ~55 ms on a 2-core machine; this path
    needs a fraction of that (bench/webhook_latency.py).

    A validation is judged as the runtime holds it; one the runtime has not loaded (a standby
    replica behind the Service, a restart before Kopf resumed the validations) is judged by
    its object in the API -- spec.gating.admission and admissionPolicy, and the Healthy and
    Usable conditions, node counts and failures of its status, as the active replica wrote
    them -- read at most every `cache_ttl` seconds.
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
        self.max_cached = MAX_CACHED

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
            and AnnotationKey.REQUIRE_HEALTHY in annotations
        ):
            try:
                self._judge(
                    hook, obj, await self.view(annotations[AnnotationKey.REQUIRE_HEALTHY]), answer
                )
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
        self, hook: Hook, obj: Mapping[str, Any], view: ValidationView, answer: dict[str, Any]
    ) -> None:
        try:
            needed = min_healthy_nodes((obj.get("metadata") or {}).get("annotations"))
        except ValueError as exc:
            raise Refusal(str(exc), 400) from None
        verdict = judge(view, needed)
        gate = view.admission is AdmissionMode.GATE and not verdict.ok
        if not hook.mutating:
            if view.admission is AdmissionMode.DENY and not verdict.ok:
                raise Refusal(deny_message(view, verdict), 403)
            return
        paths = POD_PATHS if hook.kind == "Pod" else JOB_PATHS
        new = detached(obj, paths)
        (mutate_pod if hook.kind == "Pod" else mutate_job)(new, gate=gate, validation=view.name)
        ops = json_patch(obj, new, paths)
        if ops:
            answer["patchType"] = "JSONPatch"
            answer["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        if gate:
            answer["warnings"] = [
                f"held by scheduling gate {SchedulingGate.FABRIC} until {verdict.waits_for}: "
                f"{verdict.why}"[:MAX_MESSAGE]
            ]
            releaser = self.memo.get(RELEASER_MEMO_KEY)
            if isinstance(releaser, GateReleaser):
                releaser.note_gated(view.name)

    async def view(self, annotation: Any) -> ValidationView:
        """The validation the annotation names, or a Refusal saying why it cannot be judged."""
        name = str(annotation or "").strip()
        if not name:
            raise Refusal(
                f"annotation {AnnotationKey.REQUIRE_HEALTHY} is empty: name a NetworkValidation",
                400,
            )
        if len(name) > MAX_NAME or not _DNS1123_SUBDOMAIN.fullmatch(name):
            # before any lookup: a name no object can have is never read from the API nor cached
            raise Refusal(
                f"annotation {AnnotationKey.REQUIRE_HEALTHY}: {name[:80]!r} is not a "
                "NetworkValidation name (a DNS-1123 subdomain: lower-case letters, digits, "
                "'-' and '.', at most 253 characters)",
                400,
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
                _remember(self._views, name, (now + self.view_ttl, view), self.max_cached)
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
                f"no NetworkValidation named {name!r} (annotation {AnnotationKey.REQUIRE_HEALTHY}); create "
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
            found = await PROCESS_POOLS.run(Concern.ADMISSION, read)
        except Exception as exc:
            if time.monotonic() - self._warned >= WARN_EVERY:
                self._warned = time.monotonic()
                log.warning("looking up NetworkValidation %s failed: %s", name, error_text(exc))
            raise Refusal(
                f"could not look up NetworkValidation {name!r}; retry in a few seconds", 503
            ) from None
        view = view_from_object(found) if found is not None else None
        _remember(self._cache, name, (time.monotonic() + self.cache_ttl, view), self.max_cached)
        return view


def _remember(cache: dict[str, Any], key: str, value: Any, bound: int) -> None:
    """Insert `key` last; past `bound`, drop the oldest entries (dicts keep insertion order)."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > bound:
        del cache[next(iter(cache))]


def view_from_object(obj: Mapping[str, Any]) -> ValidationView:
    """A NetworkValidation object as admission sees it (no per-node decisions: the object
    does not carry them; admission needs only the conditions, counts, failures and the
    modes)."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    gating = spec.get("gating") or {}
    mode = gating.get("admission") or AdmissionMode.GATE.value
    conditions = status.get("conditions") or []
    healthy = next((c for c in conditions if c.get("type") == "Healthy"), None)
    usable = next((c for c in conditions if c.get("type") == "Usable"), None)
    nodes = status.get("nodes") or {}
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
        decisions={},
        failures=failures,
        # an unknown policy (a newer operator's) is judged the stricter way
        policy=AdmissionPolicy.CAPACITY
        if gating.get("admissionPolicy", AdmissionPolicy.CAPACITY.value)
        == AdmissionPolicy.CAPACITY.value
        else AdmissionPolicy.STRICT,
        usable=usable is not None and usable.get("status") == "True",
        usable_message=str(usable.get("message") or "") if usable else "no status yet",
        # the verdict's count; a status written before it had one: passing + warning
        healthy_nodes=_count(nodes.get("admissible"))
        if "admissible" in nodes
        else _count(nodes.get("passing")) + _count(nodes.get("warning")),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def deny_message(view: ValidationView, verdict: AdmissionVerdict) -> str:
    """Why admission is refused: under strict, the failing nodes with their checks; under
    capacity, why the validation is not usable or short of nodes. Bounded."""
    tail = f"admission is refused until {verdict.waits_for}; retry later"
    if view.policy is AdmissionPolicy.CAPACITY:
        return f"{verdict.why}; {tail}"[:MAX_MESSAGE]
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
