"""Stopping background tasks: a cancellation lost inside `asyncio.wait_for` (Python 3.11)
must not leave a task running, and the MQTT ingest stops wherever its connection is."""

from __future__ import annotations

import asyncio
import gc

import pytest

from mosquitto import MosquittoBroker
from netval.infra.task_stop import cancel_and_wait
from netval.operator.ingest.subscriber import ReportIngest
from operator_env import settings_for

pytestmark = pytest.mark.asyncio


async def _lost_cancel_worker(fut: asyncio.Future[int], after: asyncio.Event) -> None:
    await asyncio.wait_for(fut, 10)  # on 3.11 returns the result and drops a racing cancel
    after.set()
    await asyncio.sleep(3600)


async def test_a_cancel_lost_in_wait_for_is_repeated() -> None:
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    after = asyncio.Event()
    task = asyncio.create_task(_lost_cancel_worker(fut, after))
    await asyncio.sleep(0)  # the worker waits inside wait_for
    fut.set_result(1)
    task.cancel()  # same loop iteration as the result: the race aiomqtt's connect can hit
    await asyncio.wait_for(cancel_and_wait([task], retry_every=0.05), 5)
    assert task.cancelled()


async def test_errors_of_stopped_tasks_are_retrieved_not_raised() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failing = asyncio.create_task(fails())
    sleeping = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    await cancel_and_wait([failing, sleeping])
    assert failing.done() and not failing.cancelled()
    assert sleeping.cancelled()


async def test_cancel_and_wait_of_nothing_returns() -> None:
    await asyncio.wait_for(cancel_and_wait([]), 1)


@pytest.mark.parametrize("delay_ms", [0, 1, 2, 3, 5, 8, 13, 21, 34])
async def test_ingest_stops_at_any_point_of_its_connection(
    mosquitto_broker: MosquittoBroker, delay_ms: int
) -> None:
    """Stopped while connecting, subscribing or reading: the ingest task finishes."""
    settings = settings_for(mosquitto_broker).mqtt
    ingest = ReportIngest(settings, on_report=lambda r, retained: None, on_state=lambda c: None)
    task = asyncio.create_task(ingest.run())
    await asyncio.sleep(delay_ms / 1000)
    await asyncio.wait_for(cancel_and_wait([task]), 15)
    assert task.done()
    # A connection attempt cut short leaves paho's socket (opened by an executor thread) to
    # the garbage collector, which unregisters it from the loop: let the thread finish and
    # collect while the loop still runs, as the operator's process does when it exits.
    del task, ingest
    await asyncio.get_running_loop().shutdown_default_executor()
    gc.collect()
