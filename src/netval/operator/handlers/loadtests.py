"""NetworkLoadTest handlers: hand the spec to the run coordinator of the term's runtime
(`netval.operator.loadtest.runner`), which owns runs and status."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import kopf

from netval.model.manifest import API_GROUP
from netval.operator.kube.api import LOADTEST_PLURAL, VERSION
from netval.operator.loadtest.validate import SpecProblem
from netval.operator.term_startup import required_runtime, started_runtime

# how long a test's handler waits at start-up for the validations to load before it gives
# the event back to Kopf for a retry
_LOAD_WAIT_SECONDS: Final = 10.0


@kopf.on.create(API_GROUP, VERSION, LOADTEST_PLURAL)
@kopf.on.update(API_GROUP, VERSION, LOADTEST_PLURAL, field="spec")
@kopf.on.resume(API_GROUP, VERSION, LOADTEST_PLURAL)
async def netload_apply(
    name: str, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status, memo: kopf.Memo, **_: Any
) -> None:
    runtime = required_runtime(memo)
    validation = spec.get("validation")
    if isinstance(validation, str) and validation not in runtime.store.specs:
        # at start-up the validation may exist but not be loaded yet: not "not found". The
        # load takes moments; waiting here keeps a routine start-up out of the error log
        # (Kopf logs a TemporaryError as an error), which is kept for a load that stalls.
        deadline = asyncio.get_running_loop().time() + _LOAD_WAIT_SECONDS
        while not await runtime.validations_loaded():
            if asyncio.get_running_loop().time() > deadline:
                raise kopf.TemporaryError("NetworkValidations not loaded yet", delay=1)
            await asyncio.sleep(0.2)
    outcome = runtime.loadtests.upsert(
        name,
        generation=int(meta.get("generation") or 1),
        raw=dict(spec),
        status=dict(status) if status else None,
    )
    await runtime.loadtest_seen(name, dict(spec))
    if isinstance(outcome, SpecProblem):
        await runtime.loadtests.write_now(name)
        raise kopf.PermanentError(f"{outcome.reason.value}: {outcome.message}")


# The watch's DELETED event, not `kopf.on.delete`: no finalizer on NetworkLoadTests, so one
# is never stuck in deletion without an operator (nor left for the uninstall hook). A test
# deleted while no operator ran has no run to abort: its agents stop at their plan's
# deadline, and the next leader reads no run of it.
@kopf.on.event(API_GROUP, VERSION, LOADTEST_PLURAL)
async def netload_delete(type: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    if type != "DELETED":
        return
    runtime = started_runtime(memo)
    if runtime is not None:
        await runtime.loadtests.delete(name)
        await runtime.loadtest_seen(name, None)
