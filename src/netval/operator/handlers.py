"""Kopf handlers: thin and idempotent. Read the spec, render with pure functions, apply,
record what happened in the runtime (which owns status)."""

from __future__ import annotations

import logging
import random
from typing import Any, Final

import kopf
from pydantic import ValidationError

from netval.infra.metrics_server import serve_metrics
from netval.model.manifest import API_GROUP, describe_validation_error
from netval.model.spec import NetworkValidationSpec
from netval.operator import manifests
from netval.operator.kube_api import PLURAL, VERSION
from netval.operator.metrics import operator_registry
from netval.operator.runtime import OperatorRuntime
from netval.operator.startup import build_runtime

RUNTIME_KEY: Final = "runtime"
SETTINGS_KEY: Final = "settings"


def _runtime(memo: kopf.Memo) -> OperatorRuntime:
    runtime = memo.get(RUNTIME_KEY)
    if not isinstance(runtime, OperatorRuntime):
        raise kopf.TemporaryError("operator runtime not started yet", delay=1)
    return runtime


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Kopf's own bookkeeping goes to annotations so status stays ours, and only warnings of
    # handler logs become Events (explicit Events are posted by the runtime).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Replicas with equal peering priorities all pause (Kopf treats them as a conflict); a
    # random priority per replica makes the highest one active and the others stand by.
    settings.peering.priority = random.randint(0, 32767)  # noqa: S311 - not crypto
    settings.watching.server_timeout = memo.get("watch_timeout", settings.watching.server_timeout)
    runtime = build_runtime(memo)
    memo[RUNTIME_KEY] = runtime
    runtime.start()
    addr = memo.get("metrics_addr")
    if addr is not None:
        host, port = addr
        registry = operator_registry(runtime)

        def healthy() -> tuple[bool, str]:
            connected = runtime.ingest.stats.connected
            return connected, "ok" if connected else "not connected to the MQTT broker"

        runtime.metrics_server = await serve_metrics(host, port, registry, healthy)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime = memo.get(RUNTIME_KEY)
    if isinstance(runtime, OperatorRuntime):
        await runtime.stop()
        if runtime.metrics_server is not None:
            runtime.metrics_server.close()


async def _apply(
    name: str,
    spec: kopf.Spec,
    meta: kopf.Meta,
    body: kopf.Body,
    memo: kopf.Memo,
    status: kopf.Status,
) -> None:
    runtime = _runtime(memo)
    generation = int(meta.get("generation") or 1)
    ref = {
        "apiVersion": f"{API_GROUP}/{VERSION}",
        "kind": "NetworkValidation",
        "metadata": {"name": name, "uid": meta.get("uid")},
    }
    try:
        parsed = NetworkValidationSpec.model_validate(dict(spec))
    except ValidationError as exc:
        message = describe_validation_error(exc, "spec")
        invalid = runtime.invalid_spec(name, generation=generation, message=message, body=ref)
        await runtime.write_status(name, invalid, runtime.previous.get(name))
        raise kopf.PermanentError(f"invalid spec: {message}") from None
    runtime.upsert_validation(
        name, generation=generation, spec=parsed, body=ref, status=dict(status) if status else None
    )
    settings = runtime.settings
    owner = {
        "apiVersion": f"{API_GROUP}/{VERSION}",
        "kind": "NetworkValidation",
        "name": name,
        "uid": meta.get("uid"),
    }
    configmap = manifests.render_configmap(
        name, generation, parsed, namespace=settings.namespace, owner=owner
    )
    daemonset = manifests.render_daemonset(
        name,
        generation,
        parsed,
        namespace=settings.namespace,
        owner=owner,
        image=settings.agent_image,
        mqtt=manifests.AgentMqttWiring(
            url=settings.agent_mqtt_url,
            username=settings.agent_mqtt_username,
            # an anonymous broker: no password to mount
            password_secret=settings.agent_mqtt_secret if settings.agent_mqtt_username else None,
            ca_secret=settings.agent_mqtt_ca_secret,
        ),
        config_hash=manifests.config_hash(
            manifests.agent_config_document(name, generation, parsed)
        ),
        metrics_port=manifests.metrics_port_for(name),
        resources=settings.agent_resources,
        extra_tolerations=settings.agent_tolerations,
    )
    await runtime.kube.apply_configmap(configmap)
    await runtime.kube.apply_daemonset(daemonset)
    runtime.agents_applied(name)


@kopf.on.create(API_GROUP, VERSION, PLURAL)
async def networkvalidation_create(
    name: str,
    spec: kopf.Spec,
    meta: kopf.Meta,
    body: kopf.Body,
    memo: kopf.Memo,
    status: kopf.Status,
    **_: Any,
) -> None:
    await _apply(name, spec, meta, body, memo, status)


@kopf.on.update(API_GROUP, VERSION, PLURAL, field="spec")
async def networkvalidation_update(
    name: str,
    spec: kopf.Spec,
    meta: kopf.Meta,
    body: kopf.Body,
    memo: kopf.Memo,
    status: kopf.Status,
    **_: Any,
) -> None:
    await _apply(name, spec, meta, body, memo, status)


@kopf.on.resume(API_GROUP, VERSION, PLURAL)
async def networkvalidation_resume(
    name: str,
    spec: kopf.Spec,
    meta: kopf.Meta,
    body: kopf.Body,
    memo: kopf.Memo,
    status: kopf.Status,
    **_: Any,
) -> None:
    await _apply(name, spec, meta, body, memo, status)


@kopf.on.delete(API_GROUP, VERSION, PLURAL)
async def networkvalidation_delete(name: str, memo: kopf.Memo, **_: Any) -> None:
    runtime = _runtime(memo)
    # Owner references would let the garbage collector do this; deleting explicitly makes
    # removal immediate and independent of GC.
    await runtime.kube.delete_agent_objects(
        runtime.settings.namespace, manifests.agent_object_name(name)
    )
    runtime.remove_validation(name)


@kopf.on.event("", "v1", "nodes")
async def node_event(
    type: str | None, name: str, labels: kopf.Labels, spec: kopf.Spec, memo: kopf.Memo, **_: Any
) -> None:
    runtime = memo.get(RUNTIME_KEY)
    if not isinstance(runtime, OperatorRuntime):
        return  # the initial listing is replayed to handlers once the runtime exists
    if type == "DELETED":
        runtime.on_node(name, None)
    else:
        runtime.on_node(name, dict(labels), list(spec.get("taints") or []))
