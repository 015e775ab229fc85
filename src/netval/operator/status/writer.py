"""The status writer: one merge patch per validation per status window, only when the status
changed, and only after the retained reports were read back after a start (so a restart
does not flip conditions). Each write links the traces of the reports it carries and is
followed by the Events of the failures it starts or ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import Link, Span, Tracer

from netval.model.keys import LabelKey
from netval.model.status import NetworkValidationStatus
from netval.operator.agents.manifests import AGENT_APP_NAME, validation_label_value
from netval.operator.gating.decisions import GatingCondition
from netval.operator.kube.api import KubeApi
from netval.operator.rounds import every_window
from netval.operator.settings import OperatorSettings
from netval.operator.state import validation as vs
from netval.operator.state.store import Store, utcnow
from netval.operator.status.compute import validation_status
from netval.operator.status.events import Events

log = logging.getLogger("netval.operator")

MAX_LINKS_PER_WRITE: Final = 128  # trace links from a status write to the reports in it
# Seconds between reads of the agent DaemonSets' status: it only explains missing reports
# (Ready's message), so a read now and then is enough; a watch would need a cluster-wide
# permission or a second, namespaced Kopf operator.
AGENT_PODS_EVERY: Final = 10.0


class StatusWriter:
    def __init__(
        self,
        settings: OperatorSettings,
        kube: KubeApi,
        store: Store,
        events: Events,
        tracer: Tracer,
        *,
        gating_conditions: Mapping[str, GatingCondition],
        before_round: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.store = store
        self.events = events
        self.tracer = tracer
        self.gating_conditions = gating_conditions
        self.before_round = before_round  # e.g. redo what changed targets ask for
        self.links: dict[str, list[Link]] = {}
        self.writes = 0
        self.write_failures = 0
        self.agent_pods_every = AGENT_PODS_EVERY
        self._agent_pods_due = 0.0

    def link(self, name: str, span: Span) -> None:
        """The next status write of `name` carries the report traced by `span`."""
        links = self.links.setdefault(name, [])
        if len(links) < MAX_LINKS_PER_WRITE:
            links.append(Link(span.get_span_context()))

    def forget(self, name: str) -> None:
        self.links.pop(name, None)

    def compute(self, name: str, now: datetime) -> NetworkValidationStatus:
        store = self.store
        return validation_status(
            store.states[name],
            store.specs.get(name),
            node_labels=store.node_labels,
            previous=store.previous.get(name),
            gate=self.gating_conditions.get(name),
            now=now,
        )

    async def loop(self, synced: asyncio.Event) -> None:
        # Before the retained reports are read back, status would say "no reports".
        await synced.wait()
        await every_window(
            lambda: self.settings.status_window,
            self._round,
            "status writer failed; retrying next window",
        )

    async def _round(self) -> None:
        if time.monotonic() >= self._agent_pods_due and self.store.states:
            self._agent_pods_due = time.monotonic() + self.agent_pods_every
            await self.refresh_agent_pods()
        await self.write_due(utcnow())

    async def refresh_agent_pods(self) -> None:
        """What the agent DaemonSets' status says (e.g. "2 of 4 agent pods ready"), for the
        Ready message while nodes have not reported."""
        try:
            counts = await self.kube.agent_pod_counts(
                self.settings.agent_namespace,
                f"{LabelKey.NAME}={AGENT_APP_NAME}",
                LabelKey.VALIDATION,
            )
        except Exception as exc:
            log.warning("cannot read the agent DaemonSets' status: %s", exc)
            return
        for name, state in self.store.states.items():
            count = counts.get(validation_label_value(name))
            detail = (
                ""
                if count is None
                else vs.agent_pods_detail(
                    desired=count[0], ready=count[1], targeted=len(state.targeted)
                )
            )
            vs.set_agent_pods(state, detail)

    async def write_due(self, now: datetime) -> None:
        self.before_round()
        await self.events.flush()
        for name, state in list(self.store.states.items()):
            deadline = vs.next_deadline(state, now)
            if not state.dirty and (deadline is None or deadline > now):
                continue
            # Cleared before computing: a change made while the patch is in flight (ingest,
            # the gating task) marks it dirty again and is written next window.
            state.dirty = False
            status = self.compute(name, now)
            previous = self.store.previous.get(name)
            if previous is not None and status == previous:
                continue
            if not await self.write(name, status, previous):
                state.dirty = True

    async def write(
        self, name: str, status: NetworkValidationStatus, previous: NetworkValidationStatus | None
    ) -> bool:
        links = self.links.pop(name, [])
        with self.tracer.start_as_current_span(
            "netval.status_write", links=links, attributes={"netval.validation": name}
        ) as span:
            try:
                await self.kube.patch_status(name, status.to_patch())
            except Exception as exc:
                self.write_failures += 1
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR))
                log.warning("status write for %s failed: %s", name, exc)
                return False
        self.writes += 1
        self.store.previous[name] = status
        await self.events.transitions(name, previous, status)
        return True
