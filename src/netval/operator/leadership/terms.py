"""Leadership terms: everything that writes runs inside a term, and a term runs only while
this replica holds the Lease.

`run_terms` waits for the Lease, runs `term(stop)` while renewing it, and ends the term when
leadership is lost (`on_lost` first: `netval operator` exits at once, as controller-runtime
does, and its Deployment restarts it as a standby; without it, within `stop_grace`, which
ends before another replica may take the Lease), when `stop` is set (then the Lease is
released for an immediate handover), or when the term ends by itself (Kopf stopped on
SIGTERM: the process ends, the Lease is released). Whatever the term started and left
running is cancelled with it, so the next term starts from fresh state."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from netval.infra.task_stop import cancel_and_wait
from netval.operator.leadership.elector import LeaderElector

log = logging.getLogger("netval.operator.leadership")

Term = Callable[[asyncio.Event], Awaitable[None]]
OnLost = Callable[[], None]
LOST: Final = "leadership lost"


async def run_term(term: Term, stop: asyncio.Event, *, grace: float) -> None:
    """Run one term until `stop` is set or it ends; after `stop`, wait `grace` seconds for it
    to finish, then cancel it. Tasks it created and left behind are cancelled too."""
    before = asyncio.all_tasks()
    task = asyncio.create_task(_wrapped(term, stop), name="netval-term")
    stopping = asyncio.create_task(stop.wait(), name="netval-term-stop")
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            _, pending = await asyncio.wait({task}, timeout=grace)
            if pending:
                log.warning("the term did not stop within %.1fs: cancelling it", grace)
    finally:
        await cancel_and_wait([stopping])
        own = asyncio.current_task()
        left = {t for t in asyncio.all_tasks() - before if t is not own and not t.done()}
        if left - {task}:
            log.info("cancelling %d task(s) the term left running: %s", len(left - {task}),
                     ", ".join(sorted(t.get_name() for t in left - {task})))  # fmt: skip
        stuck = await cancel_within(left | {task}, grace)
        if stuck:  # a task that swallows cancellation; do not let it hold up the handover
            log.error("%d task(s) of the term ignore cancellation: %s", len(stuck),
                      ", ".join(sorted(repr(t.get_coro()) for t in stuck)))  # fmt: skip
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


async def cancel_within(tasks: set[asyncio.Task[Any]], seconds: float) -> set[asyncio.Task[Any]]:
    """Cancel `tasks` (again every 0.5 s, see infra/task_stop.py) for at most `seconds`;
    the ones still running then."""
    pending = {t for t in tasks if not t.done()}
    deadline = time.monotonic() + seconds
    while pending and (remaining := deadline - time.monotonic()) > 0:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(0.5, remaining))
    for t in tasks - pending:
        if not t.cancelled():
            t.exception()  # retrieved: no "never retrieved" warning
    return pending


async def _wrapped(term: Term, stop: asyncio.Event) -> None:
    await term(stop)


async def run_terms(
    elector: LeaderElector,
    term: Term,
    stop: asyncio.Event,
    *,
    grace: float,
    on_lost: OnLost | None = None,
) -> None:
    """Until `stop` is set or a term ends by itself: stand by, lead, stand by again..."""
    while not stop.is_set():
        acquiring = asyncio.create_task(elector.acquire(), name="netval-lease-acquire")
        stopping = asyncio.create_task(stop.wait(), name="netval-process-stop")
        await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
        await cancel_and_wait([acquiring, stopping])
        if not elector.leading:
            break
        why = await _lead(elector, term, stop, grace=grace, on_lost=on_lost)
        if why is None:
            log.info("the operator stopped; leaving")
            return
        if why == LOST:
            log.warning("standing by again after losing leadership")


async def _lead(
    elector: LeaderElector,
    term: Term,
    stop: asyncio.Event,
    *,
    grace: float,
    on_lost: OnLost | None,
) -> str | None:
    """One term while renewing the Lease; why we ended it, None if it ended by itself."""
    term_stop = asyncio.Event()  # Kopf's stop flag (Kopf may set it too, on a signal)
    asked: list[str] = []
    holding = asyncio.create_task(elector.hold(), name="netval-lease-renew")
    stopping = asyncio.create_task(stop.wait(), name="netval-process-stop")

    def end_term(task: asyncio.Task[Any]) -> None:
        if task is holding and on_lost is not None and not task.cancelled():
            on_lost()  # the elector shut the write fence already
        if not asked and not task.cancelled():
            asked.append(LOST if task is holding else "stopping")
            log.info("ending the term: %s", asked[0])
            term_stop.set()

    # callbacks, not a watcher task: Kopf takes every task created while it runs for one of
    # its own, waits for it and cancels it when it stops
    holding.add_done_callback(end_term)
    stopping.add_done_callback(end_term)
    try:
        await run_term(term, term_stop, grace=grace)
    finally:
        why = asked[0] if asked else None
        lost = holding.done()
        await cancel_and_wait([stopping, holding])
        if not lost:
            await elector.release()
    return why
