"""Kopf start-up and clean-up of the admission webhooks and the gate releaser (importing this
module registers them)."""

from __future__ import annotations

from typing import Any

import kopf

from netval.operator.admission.gate_release import RELEASER_MEMO_KEY, GateReleaser
from netval.operator.admission.options import WEBHOOK_MEMO_KEY, WebhookOptions
from netval.operator.admission.reviewer import Reviewer
from netval.operator.admission.server import (
    SERVICE_MEMO_KEY,
    SHARED_SERVICE_MEMO_KEY,
    WebhookService,
)


@kopf.on.startup()
async def admission_startup(memo: kopf.Memo, **_: Any) -> None:
    """Without --webhook-addr nothing runs: no Pod is gated, and the RBAC for Pods and the
    webhook configurations comes with the webhook."""
    options = memo.get(WEBHOOK_MEMO_KEY)
    if isinstance(options, WebhookOptions):
        releaser = GateReleaser(memo)
        memo[RELEASER_MEMO_KEY] = releaser
        releaser.start()
        shared = memo.get(SHARED_SERVICE_MEMO_KEY)
        if isinstance(shared, WebhookService):  # served by the process, leader or not
            shared.write_configurations()
            return
        own_namespace = getattr(memo.get("settings"), "namespace", None)
        excluded = [*options.excluded_namespaces, *([own_namespace] if own_namespace else [])]
        service = WebhookService(options, Reviewer(memo), excluded)
        memo[SERVICE_MEMO_KEY] = service
        service.start()


@kopf.on.cleanup()
async def admission_cleanup(memo: kopf.Memo, **_: Any) -> None:
    shared = memo.get(SHARED_SERVICE_MEMO_KEY)
    if isinstance(shared, WebhookService):
        await shared.stop_writing()
    for key in (SERVICE_MEMO_KEY, RELEASER_MEMO_KEY):
        worker = memo.get(key)
        if isinstance(worker, WebhookService | GateReleaser):
            await worker.stop()
