"""NetworkValidation handlers: read the spec, hand it to the runtime (which owns status),
apply the agent objects."""

from __future__ import annotations

from typing import Any

import kopf
from pydantic import ValidationError

from netval.model.manifest import API_GROUP, describe_validation_error
from netval.model.spec import NetworkValidationSpec, deprecated_fields_set
from netval.model.status import EventReason
from netval.operator.agents.rollout import apply_agents, delete_agents
from netval.operator.kube.api import PLURAL, VERSION
from netval.operator.term_startup import required_runtime


@kopf.on.create(API_GROUP, VERSION, PLURAL)
@kopf.on.update(API_GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(API_GROUP, VERSION, PLURAL)
async def networkvalidation_apply(
    name: str, spec: kopf.Spec, meta: kopf.Meta, body: kopf.Body, memo: kopf.Memo,
    status: kopf.Status, **_: Any,
) -> None:  # fmt: skip
    runtime = required_runtime(memo)
    generation = int(meta.get("generation") or 1)
    try:
        parsed = NetworkValidationSpec.model_validate(dict(spec))
    except ValidationError as exc:
        message = describe_validation_error(exc, "spec")
        await runtime.invalid_spec(name, generation=generation, message=message, body=body)
        raise kopf.PermanentError(f"invalid spec: {message}") from None
    runtime.store.upsert_validation(
        name, generation=generation, spec=parsed, body=body, status=dict(status) if status else None
    )
    # Said once per spec change (create, edit, operator start): the field still works, read
    # as its replacement, and the Event says which value was used.
    for message in deprecated_fields_set(parsed):
        runtime.events.queue(name, "Warning", EventReason.DEPRECATED_FIELD, message)
    try:
        rdma = await runtime.rdma_load(name)
    except Exception as exc:  # the load tests' list: try again (a wrong guess would roll)
        raise kopf.TemporaryError(f"cannot list NetworkLoadTests: {exc}", delay=5) from None
    await apply_agents(runtime.kube, runtime.settings, body, generation, parsed, rdma=rdma)
    runtime.store.agents_applied(name)


@kopf.on.delete(API_GROUP, VERSION, PLURAL)
async def networkvalidation_delete(name: str, memo: kopf.Memo, **_: Any) -> None:
    runtime = required_runtime(memo)
    await delete_agents(runtime.kube, runtime.settings, name)
    runtime.remove_validation(name)
