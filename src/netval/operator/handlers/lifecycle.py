"""The operator's start and stop (the runtime lives in Kopf's memo in between)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from netval.operator.broker_check import start_acl_check, stop_acl_check, term_hold
from netval.operator.identity.service import start_identity, started_identity, stop_identity
from netval.operator.settings import OperatorSettings
from netval.operator.term_startup import (
    SIGNALS_KEY,
    configure_kopf,
    start_runtime,
    started_runtime,
    stop_runtime,
)


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure_kopf(settings, memo)
    install_signals = memo.get(SIGNALS_KEY)
    if callable(install_signals):
        # the process's over Kopf's (see OperatorProcess._term); later, as Kopf installs its
        # own once its tasks started, which may be after this handler ran
        asyncio.get_running_loop().call_later(0.2, install_signals)
    await start_runtime(memo)
    ours: OperatorSettings = memo["settings"]
    # the broker ACL check's verdict holds gating while it finds a violation
    hold = term_hold(memo, ours.hold_gating_on_acl_violation)
    runtime = started_runtime(memo)
    if runtime is not None:
        runtime.gating.hold = hold.reason
        runtime.gating.writes_wait = hold.writes_wait
    await start_identity(memo, ours, hold)  # agent enrollment, if configured
    if started_identity(memo) is None:  # (else the identity service checks the ACL)
        start_acl_check(memo, ours.acl_probe, ours.mqtt, hold)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    await stop_acl_check(memo)
    await stop_identity(memo)
    await stop_runtime(memo)
