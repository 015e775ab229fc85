"""Background tasks that come back: a loop that ends or raises is logged, counted
(`netval_task_restarts_total{task}`) and started again after a backoff. The backoff doubles
up to `max_backoff` and starts over once a run lasted `stable_after` seconds, so a task that
failed a few times last week restarts quickly today."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("netval.supervised")

TASK_RESTARTS: Final[Counter[str]] = Counter()  # task name -> restarts, process-wide


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    initial_backoff: float = 0.5,
    max_backoff: float = 30.0,
    stable_after: float = 60.0,
) -> None:
    """Run `run()` until cancelled, restarting it whenever it returns or raises."""
    backoff = initial_backoff
    while True:
        started = time.monotonic()
        try:
            await run()
            log.error("background task %s ended; restarting in %.1fs", name, backoff)
        except Exception:
            log.exception("background task %s failed; restarting in %.1fs", name, backoff)
        if time.monotonic() - started >= stable_after:
            backoff = initial_backoff
        TASK_RESTARTS[name] += 1
        await asyncio.sleep(backoff)
        backoff = min(max_backoff, backoff * 2)


def supervised_task(name: str, run: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    return asyncio.create_task(supervise(name, run), name=name)


class TaskRestartsCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "netval_task_restarts",
            "Background tasks restarted after they ended or failed",
            labels=["task"],
        )
        for task, count in sorted(TASK_RESTARTS.items()):
            family.add_metric([task], count)
        yield family
