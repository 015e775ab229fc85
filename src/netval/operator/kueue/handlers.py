"""The Kopf handlers of the Kueue AdmissionCheck controller (importing this module registers
them, and makes Kopf watch Kueue's AdmissionChecks and Workloads)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import kopf

from netval.operator.kueue.controller import KUEUE_MEMO_KEY, KueueController

KUEUE_GROUP: Final = "kueue.x-k8s.io"


def _controller(memo: Mapping[str, Any]) -> KueueController | None:
    controller = memo.get(KUEUE_MEMO_KEY)
    return controller if isinstance(controller, KueueController) else None


@kopf.on.startup()
async def kueue_startup(memo: kopf.Memo, **_: Any) -> None:
    if not getattr(memo.get("settings"), "kueue_enabled", False):
        return  # NETVAL_KUEUE_ENABLED=false: watch events are ignored, nothing is written
    controller = KueueController(memo)
    memo[KUEUE_MEMO_KEY] = controller
    controller.start()


@kopf.on.cleanup()
async def kueue_cleanup(memo: kopf.Memo, **_: Any) -> None:
    controller = _controller(memo)
    if controller is not None:
        await controller.stop()


@kopf.on.event(KUEUE_GROUP, "admissionchecks")
@kopf.on.event(KUEUE_GROUP, "workloads")
async def kueue_event(
    type: str | None, body: kopf.Body, resource: kopf.Resource, memo: kopf.Memo, **_: Any
) -> None:
    controller = _controller(memo)
    if controller is not None:
        controller.on_event(resource.plural, type, body)
