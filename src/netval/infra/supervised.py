"""Background tasks that come back: a loop that ends or raises is logged, counted
(`netval_task_restarts_total{task}`) and started again after a backoff, by the rule every
MQTT connection follows too (`infra.mqtt_client.ReconnectRule`): full jitter up to a ceiling
that doubles from `initial_backoff` to `max_backoff`, and starts over once a run lasted
`stable_after` seconds, so a task that failed a few times last week restarts quickly today."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from netval.infra.mqtt_client import ReconnectPolicy, ReconnectRule, SessionEnd, reconnect_loop

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
    rule = ReconnectRule(
        ReconnectPolicy(initial_backoff, max_backoff, stable_after), refused=lambda exc: False
    )

    async def attempt() -> None:
        rule.connected()  # a task is up as soon as it runs
        await run()

    def ended(end: SessionEnd) -> None:
        if end.error is None:
            log.error("background task %s ended; restarting in %.1fs", name, end.delay)
        else:
            log.error("background task %s failed; restarting in %.1fs", name, end.delay,
                      exc_info=end.error)  # fmt: skip
        TASK_RESTARTS[name] += 1

    await reconnect_loop(attempt, rule, on_end=ended)


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
