"""The operator's start and stop (the runtime lives in Kopf's memo in between)."""

from __future__ import annotations

from typing import Any

import kopf

from netval.operator.identity.service import start_identity, stop_identity
from netval.operator.main import configure_kopf, start_runtime, stop_runtime


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure_kopf(settings, memo)
    await start_runtime(memo)
    await start_identity(memo, memo["settings"])  # agent enrollment, if configured


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    await stop_identity(memo)
    await stop_runtime(memo)
