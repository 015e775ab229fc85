"""Stopping background tasks so that a stop always finishes.

Python 3.11's `asyncio.wait_for` returns the awaited result when a cancellation arrives in
the same loop iteration as that result, and the cancellation is lost (fixed in 3.12). aiomqtt
connects and disconnects through `wait_for`, so an operator stopped while its MQTT client was
connecting kept the ingest task running and never finished its cleanup. A task that is still
running after `retry_every` seconds is therefore cancelled again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], *, retry_every: float = 0.5) -> None:
    """Cancel `tasks` and wait until every one has finished; their results and errors are
    discarded. A cancellation of the caller propagates (the tasks have been cancelled)."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=retry_every)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log "never retrieved"
