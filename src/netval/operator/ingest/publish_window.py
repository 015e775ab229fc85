"""Many retained publishes with a bounded number awaiting their acknowledgement at once.

A QoS 1 publish awaited one at a time costs a round trip to the broker each: a stage of a
load test on 10,000 nodes (a plan per node) took 5.1 s that way, the whole of the lead it
is published in (bench/loadtest_publish.py). Keeping up to `PUBLISH_WINDOW` in flight
hides the round trips; the bound keeps the client's queue, and the broker's per-client
in-flight budget, small.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

# Below the chart broker's max_inflight_messages (100): what is beyond its receive maximum
# would wait in the client's queue anyway.
PUBLISH_WINDOW: Final = 64


async def publish_all(
    items: Iterable[tuple[str, bytes]],
    put: Callable[[str, bytes], Awaitable[object]],
    window: int = PUBLISH_WINDOW,
) -> None:
    """`put` every (topic, payload), at most `window` at once, in order of start. An
    exception of a `put` (the session's end: `put` handles per-topic failures itself) stops
    the rest and is raised once the ones in flight are cancelled."""
    pending: set[asyncio.Task[object]] = set()
    try:
        for name, payload in items:
            if len(pending) >= window:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            pending.add(asyncio.ensure_future(put(name, payload)))
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
