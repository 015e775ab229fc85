"""The ResourceSlice list and watch, one per configured DRA driver, into a `SliceIndex`.

Each driver: list (pages of 500, `spec.driver` selected by the apiserver), then watch from
the list's resourceVersion; a watch ends server-side after a minute and is opened again from
where it was; a 410 lists again. Each event is trimmed to what matching needs at once
(`slices.parse_slice`), so a slice is held as a few tuples, never as the object. A failure
waits (5 s, doubling to RETRY_CAP) before the next attempt: no request loop against an
apiserver that refuses. `synced` is set once every driver was listed once (the gating
round waits for it, so a restart does not take the node path for a NIC it could taint).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

from netval.operator.devices import api
from netval.operator.devices.slices import SliceIndex
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.thread_pools import Concern

log = logging.getLogger("netval.operator")

RETRY_BASE: Final = 5.0
RETRY_CAP: Final = 300.0


class SliceWatch:
    def __init__(
        self,
        kube: KubeApi,
        index: SliceIndex,
        version: str,
        on_change: Callable[[], None] = lambda: None,
        on_error: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.kube = kube
        self.index = index
        self.version = version
        self.on_change = on_change  # called on the event loop after a change of the index
        self.on_error = on_error  # what failed (the stage tells the validations once)
        self.synced = asyncio.Event()
        self.lists = 0
        self.watches = 0
        self.events = 0
        self._listed: set[str] = set()
        self._stop = api.WatchStop()

    async def run(self) -> None:
        try:
            await asyncio.gather(*(self._driver(d) for d in self.index.drivers))
        finally:
            self._stop.set()

    async def _driver(self, driver: str) -> None:
        loop = asyncio.get_running_loop()

        def on_event(kind: str, obj: dict[str, Any]) -> None:  # in the watch's thread
            loop.call_soon_threadsafe(self._apply, kind, obj)

        delay = RETRY_BASE
        version: str | None = None
        while True:
            try:
                if version is None:
                    items, version = await self.kube.run_in(
                        Concern.DEVICES, api.list_slices, self.kube, self.version, driver
                    )
                    self.lists += 1
                    self.index.replace_all(items, driver)
                    self._listed.add(driver)
                    if self._listed >= set(self.index.drivers):
                        self.synced.set()
                    self.on_change()
                self.watches += 1
                version = await self.kube.run_in(
                    Concern.DEVICES, api.watch_slices, self.kube, self.version, driver,
                    version, on_event, self._stop, _attempts=1,
                )  # fmt: skip
                delay = RETRY_BASE
            except api.Gone:
                version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stop.is_set():
                    return
                problem = f"cannot list or watch {driver}'s ResourceSlices: {error_text(exc)}"
                log.warning("%s; again in %.0f s", problem, delay)
                self.on_error(problem)
                version = None
                await asyncio.sleep(delay)
                delay = min(RETRY_CAP, delay * 2)

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        self.events += 1
        name = (obj.get("metadata") or {}).get("name")
        if kind == "DELETED":
            if isinstance(name, str):
                self.index.delete(name)
        else:
            self.index.upsert(obj)
        self.on_change()

    def stop(self) -> None:
        self._stop.set()


async def stop_watch(task: asyncio.Task[None] | None, watch: SliceWatch | None) -> None:
    if watch is not None:
        watch.stop()
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


__all__ = ["SliceWatch", "stop_watch"]
