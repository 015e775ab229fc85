"""Kubernetes Events about NetworkValidations, for `kubectl describe` readers.

One way out (`Events.post`): Events are posted by the operator's background tasks, not by
Kopf handlers, with netval's own source. Some are queued where they arise (breaker trips,
peers-port conflicts) and posted at the next status window. Failure transitions
(`status.transitions`: CheckFailing, CheckRecovered, NodeStale) are diffed from every
targeted node after each status write, not from the capped failures list, and posted within
the rate cap of `status.event_budget` (10 per validation per minute, then one
EventsSuppressed summary per minute that counts the rest; the status carries the full
picture).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Final

from netval.model.status import EventReason, NetworkValidationStatus
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.state.store import Store
from netval.operator.status import event_budget as budget
from netval.operator.status.transitions import Known, Seen, diff, seed

log = logging.getLogger("netval.operator")

MAX_QUEUED: Final = 1000  # events waiting for the next window; beyond, new ones are dropped

Post = tuple[str, str, str]  # type, reason, message
SUMMARY: Final = EventReason.EVENTS_SUPPRESSED.value


class Events:
    def __init__(
        self, kube: KubeApi, store: Store, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube = kube
        self.store = store
        self.clock = clock
        self.per_window = budget.EVENTS_PER_WINDOW
        self.window = budget.WINDOW_SECONDS
        self._known: dict[str, dict[str, Known]] = {}  # per validation: what Events said
        self._budgets: dict[str, budget.Budget] = {}
        self._queued: list[tuple[str, str, str, str]] = []
        self.dropped = 0  # queued Events dropped because the queue was full
        self.posted = 0  # Events the API accepted (netval_operator_api_writes{kind="event"})
        # transitions counted in a summary instead of posted, by reason (a metric)
        self.suppressed: Counter[EventReason] = Counter()

    def queue(self, name: str, type_: str, reason: str, message: str) -> None:
        """Posted by the next `flush` (the status writer's next window)."""
        if len(self._queued) < MAX_QUEUED:
            self._queued.append((name, type_, reason, message))
        else:
            self.dropped += 1

    async def flush(self) -> None:
        # taken first: a flush still posting (a slow API) never posts the same Event twice
        queued, self._queued = self._queued, []
        for name, type_, reason, message in queued:
            await self.post(name, type_, reason, message)
        now = self.clock()
        for name, state in list(self._budgets.items()):
            summary = budget.due(state, now, cap=self.per_window, window=self.window)
            if summary is not None:
                await self.post(name, "Warning", SUMMARY, summary.message)

    def record(
        self, name: str, seen: Mapping[str, Seen], previous: NetworkValidationStatus | None
    ) -> list[Post]:
        """The Events a status write of `name` calls for: its transitions since the last
        write, within the rate cap. `seen` is every targeted node as that status judged it;
        `previous` the status written before (read back after a start: what an earlier
        term already said). Synchronous, so the writes of one validation are diffed in
        order however slowly their Events are posted."""
        if name not in self.store.bodies:
            return []
        known = self._known.get(name)
        if known is None:
            known = seed(previous, seen)
        transitions, self._known[name] = diff(known, seen)
        state = self._budgets.setdefault(name, budget.Budget())
        admitted = budget.admit(
            state, transitions, self.clock(), cap=self.per_window, window=self.window
        )
        self.suppressed.update(admitted.suppressed)
        posts: list[Post] = [(t.type, t.reason.value, t.message) for t in admitted.post]
        if admitted.summary is not None:
            posts.append(("Warning", SUMMARY, admitted.summary.message))
        return posts

    def forget(self, name: str) -> None:
        self._known.pop(name, None)
        self._budgets.pop(name, None)

    async def post_all(self, name: str, posts: list[Post]) -> None:
        for type_, reason, message in posts:
            await self.post(name, type_, reason, message)

    async def post(self, name: str, type_: str, reason: str, message: str) -> None:
        ref = self.store.bodies.get(name)
        if ref is None:
            return
        involved = {
            "apiVersion": ref["apiVersion"],
            "kind": ref["kind"],
            "name": ref["metadata"]["name"],
            "uid": ref["metadata"].get("uid"),
        }
        try:
            await self.kube.post_event(involved, type=type_, reason=reason, message=message)
            self.posted += 1
        except Exception as exc:
            log.warning("could not post event for %s: %s", name, error_text(exc))
