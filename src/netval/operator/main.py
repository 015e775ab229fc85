"""`netval operator`: run the Kopf operator with netval's handlers."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

import kopf

from netval.operator.settings import OperatorSettings

if TYPE_CHECKING:
    from netval.operator.admission.options import WebhookOptions

PEERING_NAME: Final = "netval"


async def run_operator(
    settings: OperatorSettings,
    *,
    standalone: bool,
    liveness_endpoint: str | None = None,
    metrics_addr: tuple[str, int] | None = None,
    stop_flag: asyncio.Event | None = None,
    webhook: WebhookOptions | None = None,
) -> None:
    """With peering (not standalone), several replicas run and one is active at a time.
    Without `webhook` no admission webhook is served."""
    # importing them registers the handlers with Kopf
    import netval.operator.admission.handlers  # admission webhooks, gate release
    import netval.operator.handlers

    if settings.kueue_enabled:  # Kopf watches Kueue objects only then (it needs their RBAC)
        import netval.operator.kueue.handlers  # noqa: F401  (Kueue AdmissionCheck controller)

    await kopf.operator(
        clusterwide=True,
        standalone=standalone,
        peering_name=PEERING_NAME,
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(settings=settings, metrics_addr=metrics_addr, webhook=webhook),
        stop_flag=stop_flag,
    )
