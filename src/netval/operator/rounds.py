"""The operator's background loops: one round per status window, a failed round logged and
retried at the next window (one bad validation must not stop the loop)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("netval.operator")


async def every_window(
    window: Callable[[], float], round_: Callable[[], Awaitable[None]], failed: str
) -> None:
    """Run `round_` every `window()` seconds (measured from round start) until cancelled;
    `failed` is the log message for a round that raised."""
    while True:
        started = time.monotonic()
        try:
            await round_()
        except Exception:
            log.exception(failed)
        await asyncio.sleep(max(0.0, window() - (time.monotonic() - started)))
