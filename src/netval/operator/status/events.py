"""Kubernetes Events about NetworkValidations, for `kubectl describe` readers.

One way out (`Events.post`): Events are posted by the operator's background tasks, not by
Kopf handlers, with netval's own source. Some are queued where they arise (breaker trips,
peers-port conflicts) and posted at the next status window; failure transitions are posted
after the status write that contains them, at most `EVENTS_PER_MINUTE` per validation (the
status carries the full picture).
"""

from __future__ import annotations

import logging
import time
from typing import Final

from netval.model.status import NetworkValidationStatus
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.state.store import Store

log = logging.getLogger("netval.operator")

EVENTS_PER_MINUTE: Final = 10
MAX_QUEUED: Final = 1000  # events waiting for the next window; beyond, new ones are dropped


class Events:
    def __init__(self, kube: KubeApi, store: Store) -> None:
        self.kube = kube
        self.store = store
        self._times: dict[str, list[float]] = {}
        self._queued: list[tuple[str, str, str, str]] = []
        self.dropped = 0  # queued Events dropped because the queue was full

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

    async def transitions(
        self, name: str, before: NetworkValidationStatus | None, after: NetworkValidationStatus
    ) -> None:
        """A node started or stopped failing a check between two written statuses."""
        if name not in self.store.bodies:
            return
        old = {(f.node, f.check) for f in (before.failures if before else [])}
        new = {(f.node, f.check): f for f in after.failures}
        transitions = [(True, key) for key in sorted(set(new) - old)]
        transitions += [(False, key) for key in sorted(old - set(new))]
        now = time.monotonic()
        window = [t for t in self._times.get(name, []) if now - t < 60]
        for failing, (node, check) in transitions:
            if len(window) >= EVENTS_PER_MINUTE:
                break
            window.append(now)
            if failing:
                args = (
                    "Warning",
                    "CheckFailing",
                    f"node {node} fails {check}: {new[(node, check)].message}",
                )
            else:
                args = ("Normal", "CheckRecovered", f"node {node} passes {check} again")
            await self.post(name, *args)
        self._times[name] = window

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
        except Exception as exc:
            log.warning("could not post event for %s: %s", name, error_text(exc))
