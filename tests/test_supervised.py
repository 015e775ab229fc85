"""Supervised background tasks (infra/supervised.py): a task that raises or ends is restarted
and counted in netval_task_restarts_total{task}; cancelling the supervisor ends it."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

from netval.infra.supervised import TASK_RESTARTS, TaskRestartsCollector, supervise
from netval.infra.task_stop import cancel_and_wait


def test_a_task_that_fails_or_ends_is_restarted_and_counted() -> None:
    runs: list[str] = []
    third = asyncio.Event()

    async def flaky() -> None:
        runs.append("run")
        if len(runs) == 1:
            raise RuntimeError("boom")
        if len(runs) == 2:
            return  # ended: restarted too
        third.set()
        await asyncio.Event().wait()  # the third run stays up

    async def main() -> None:
        task = asyncio.create_task(supervise("test-flaky", flaky, initial_backoff=0.01))
        async with asyncio.timeout(10):
            await third.wait()
        await cancel_and_wait([task])
        assert task.cancelled()

    asyncio.run(main())
    assert len(runs) == 3
    assert TASK_RESTARTS["test-flaky"] == 2
    registry = CollectorRegistry()
    registry.register(TaskRestartsCollector())
    assert 'netval_task_restarts_total{task="test-flaky"} 2.0' in generate_latest(registry).decode()
