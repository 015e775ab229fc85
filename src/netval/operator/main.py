"""`netval operator`: run the Kopf operator with netval's handlers."""

from __future__ import annotations

import asyncio
from typing import Final

import kopf

from netval.operator.settings import OperatorSettings

PEERING_NAME: Final = "netval"


async def run_operator(
    settings: OperatorSettings,
    *,
    standalone: bool,
    liveness_endpoint: str | None = None,
    metrics_addr: tuple[str, int] | None = None,
    stop_flag: asyncio.Event | None = None,
) -> None:
    """With peering (not standalone), several replicas run and one is active at a time."""
    import netval.operator.handlers  # noqa: F401  (registers the handlers with Kopf)

    await kopf.operator(
        clusterwide=True,
        standalone=standalone,
        peering_name=PEERING_NAME,
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(settings=settings, metrics_addr=metrics_addr),
        stop_flag=stop_flag,
    )
