"""The four webhooks and the two configurations (both named `netval.io`) the operator writes.

Kopf's managed configurations hard-code `timeoutSeconds: 30` and a failurePolicy fixed at
import time, and cannot express the `matchConditions` that keep unannotated objects from ever
reaching the webhook: netval writes its own (`ConfigurationWriter`), for each client config
the server yields."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netval.infra.task_stop import cancel_and_wait
from netval.model.keys import MANAGED_BY_OPERATOR, AnnotationKey, LabelKey
from netval.operator.admission.options import FailurePolicy, ServiceRef, WebhookOptions
from netval.operator.kube.api import load_kube_client
from netval.operator.thread_pools import PROCESS_POOLS, Concern

log = logging.getLogger("netval.operator.admission")

CONFIGURATION_NAME: Final = "netval.io"  # both webhook configurations

# Webhook ids: the last URL path segment, by which Kopf's server tells the webhooks apart.
MUTATE_PODS: Final = "netval-gate-pods"
MUTATE_JOBS: Final = "netval-gate-jobs"
VALIDATE_PODS: Final = "netval-deny-pods"
VALIDATE_JOBS: Final = "netval-deny-jobs"


@dataclass(frozen=True, slots=True)
class Hook:
    name: str  # the webhook's name in its configuration
    kind: str  # the object's kind this webhook takes
    group: str  # and its API group (version v1)
    plural: str
    mutating: bool


HOOKS: Final = {
    MUTATE_PODS: Hook("pods.gate.netval.io", "Pod", "", "pods", mutating=True),
    MUTATE_JOBS: Hook("jobs.gate.netval.io", "Job", "batch", "jobs", mutating=True),
    VALIDATE_PODS: Hook("pods.deny.netval.io", "Pod", "", "pods", mutating=False),
    VALIDATE_JOBS: Hook("jobs.deny.netval.io", "Job", "batch", "jobs", mutating=False),
}

# Evaluated by the API server (matchConditions, GA in Kubernetes 1.30): only annotated objects
# are sent. Older API servers drop the field and send everything; the reviewer admits an
# unannotated object unchanged at once.
MATCH_CONDITION: Final = {
    "name": "require-healthy-annotation",
    "expression": (
        f"has(object.metadata.annotations) && '{AnnotationKey.REQUIRE_HEALTHY}' in "
        "object.metadata.annotations"
    ),
}


def _labels() -> dict[str, str]:
    return {LabelKey.MANAGED_BY.value: MANAGED_BY_OPERATOR}


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
    for handler_id, spec in HOOKS.items():
        if spec.mutating != mutating:
            continue
        cc = copy.deepcopy(dict(config))
        if "url" in cc:
            cc["url"] = f"{cc['url'].rstrip('/')}/{handler_id}"
        if "service" in cc:
            cc["service"]["path"] = f"/{handler_id}"
        hook: dict[str, Any] = {
            "name": spec.name,
            "clientConfig": cc,
            "rules": [
                {
                    "apiGroups": [spec.group],
                    "apiVersions": ["v1"],
                    "resources": [spec.plural],
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
                await PROCESS_POOLS.run(Concern.ADMISSION, self._write, config)
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
                "metadata": {"name": CONFIGURATION_NAME, "labels": _labels()},
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
                {"metadata": {"labels": _labels()}, "webhooks": webhooks},
                _content_type="application/merge-patch+json",
            )
