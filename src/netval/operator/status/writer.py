"""The status writer: one merge patch per validation per status window, only when something a
reader uses changed (conditions, counts, failures, checks, east-west; `lastReportTime`
alone, which moves with every report, waits for the next such change or the slow resync),
and only after the retained reports were read back after a start (so a restart
does not flip conditions). Each write links the traces of the reports it carries and is
followed by the Events of the transitions it carries (`status.events`), diffed from every
targeted node as judged at the same `now` as the status.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import Link, Span, Tracer

from netval.model.keys import LabelKey
from netval.model.status import EventReason, NetworkValidationStatus
from netval.operator.agents.manifests import AGENT_APP_NAME, validation_label_value
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.rounds import every_window
from netval.operator.settings import OperatorSettings
from netval.operator.state import validation as vs
from netval.operator.state.store import ReplayGap, Store, utcnow
from netval.operator.status.compute import validation_status
from netval.operator.status.culprits import culprit
from netval.operator.status.events import Events
from netval.operator.status.transitions import Seen, observe

log = logging.getLogger("netval.operator")

MAX_LINKS_PER_WRITE: Final = 128  # trace links from a status write to the reports in it
# Status writes in flight at once: one slow or failing validation never holds the others
# (each call is bounded by the API client's timeout and retries, netval.operator.kube.api).
STATUS_CONCURRENCY: Final = 4
# Seconds between reads of the agent DaemonSets' status: it only explains missing reports
# (Ready's message), so a read now and then is enough; a watch would need a cluster-wide
# permission or a second, namespaced Kopf operator.
AGENT_PODS_EVERY: Final = 10.0
# Seconds between writes that only move `lastReportTime`: with agents reporting every
# interval it changes every window, and writing it would cost one patch per validation per
# window forever; readers (`netval status`) see it at most this old.
STATUS_RESYNC: Final = 300.0


def needs_write(
    status: NetworkValidationStatus,
    previous: NetworkValidationStatus | None,
    *,
    resync_due: bool,
) -> bool:
    """Whether `status` is worth a patch over `previous` (the status last written)."""
    if previous is None:
        return True
    if status == previous:
        return False
    if resync_due:
        return True
    return status.model_copy(update={"last_report_time": previous.last_report_time}) != previous


def status_patch(
    status: NetworkValidationStatus, previous: NetworkValidationStatus | None
) -> dict[str, object]:
    """The merge patch that writes `status`: `checks` is a map, which a merge patch merges,
    so the check ids `previous` had and `status` no longer has are nulled (removed)."""
    patch = status.to_patch()
    gone = set(previous.checks) - set(status.checks) if previous is not None else set()
    if gone:
        checks = patch.get("checks")
        merged: dict[str, object] = dict(checks) if isinstance(checks, dict) else {}
        merged.update(dict.fromkeys(sorted(gone)))
        patch["checks"] = merged
    return patch


class StatusWriter:
    def __init__(
        self,
        settings: OperatorSettings,
        kube: KubeApi,
        store: Store,
        events: Events,
        tracer: Tracer,
        *,
        before_round: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.store = store
        self.events = events
        self.tracer = tracer
        self.before_round = before_round  # e.g. redo what changed targets ask for
        self.links: dict[str, list[Link]] = {}
        self.writes = 0
        self.write_failures = 0
        self.agent_pods_every = AGENT_PODS_EVERY
        self.resync_seconds = STATUS_RESYNC
        self._synced_at: dict[
            str, float
        ] = {}  # per validation: monotonic time it was last written or found in sync
        self._agent_pods_due = 0.0
        self._inflight: dict[str, asyncio.Task[None]] = {}
        # per validation: when time alone changes its status next (a node turns stale)
        self._due: dict[str, datetime | None] = {}
        self._event_tasks: set[asyncio.Task[None]] = set()
        # per validation: the gap of the last retained replay, and which replay was checked
        self.gaps: dict[str, ReplayGap] = {}
        self.gap_events = 0  # checks that found targeted nodes without a retained report
        self._gap_checked: dict[str, int] = {}
        self._limit = asyncio.Semaphore(STATUS_CONCURRENCY)
        self._culprits: dict[str, str] = {}  # validation -> the first culprit an Event named
        self._localized: dict[str, str] = {}  # validation -> the east-west culprit last named

    def link(self, name: str, span: Span) -> None:
        """The next status write of `name` carries the report traced by `span`."""
        links = self.links.setdefault(name, [])
        if len(links) < MAX_LINKS_PER_WRITE:
            links.append(Link(span.get_span_context()))

    def forget(self, name: str) -> None:
        self.links.pop(name, None)
        self.gaps.pop(name, None)
        self._gap_checked.pop(name, None)
        self._due.pop(name, None)
        self._synced_at.pop(name, None)
        self._culprits.pop(name, None)
        self._localized.pop(name, None)
        self.events.forget(name)

    def check_replay_gaps(self) -> None:
        """Once per retained replay and validation (the first window that knows both): the
        targeted nodes the broker had no retained report of are recorded (a gauge). When
        the broker should have held them (nodes that reported before, or fewer than the
        last status counted as reporting) the gap is counted and logged as a warning, not
        trusted: a broker that dropped its queue or lost its store looks just like nodes
        that have not reported."""
        store = self.store
        for name in list(store.states):
            if self._gap_checked.get(name) == store.replays:
                continue
            gap = store.replay_gap(name)
            if gap is None or not gap.targeted:
                continue
            self._gap_checked[name] = store.replays
            self.gaps[name] = gap
            if not gap.missing:
                continue
            shown = ", ".join(gap.missing[:5])
            more = f" and {len(gap.missing) - 5} more" if len(gap.missing) > 5 else ""
            if not gap.suspicious:
                log.info(
                    "retained replay of %s: %d of %d targeted nodes have not reported yet: %s%s",
                    name,
                    len(gap.missing),
                    gap.targeted,
                    shown,
                    more,
                )
                continue
            self.gap_events += 1
            expected = f", the last status counted {gap.expected}" if gap.expected else ""
            log.warning(
                "retained replay of %s: %d of %d targeted nodes have no retained report"
                " (%d of them reported before%s): the broker lost or dropped them: %s%s",
                name,
                len(gap.missing),
                gap.targeted,
                len(gap.lost),
                expected,
                shown,
                more,
            )

    def compute(self, name: str, now: datetime) -> NetworkValidationStatus:
        store = self.store
        return validation_status(
            store.states[name],
            store.specs.get(name),
            node_labels=store.node_labels,
            previous=store.previous.get(name),
            now=now,
            load_run=store.load_runs.get(name),
            node_fabric=store.node_fabric,
            gate=store.device_gate(name),
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
        self.check_replay_gaps()
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
            log.warning("cannot read the agent DaemonSets' status: %s", error_text(exc))
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
        """Every validation whose status changed, written concurrently. A validation whose
        status cannot be computed or written stays dirty (recomputed from the state of then
        and written next window, so its change is not lost); one whose write is still in
        flight (a slow API, retries) is left for a later window and delays no other: the
        round waits for its writes at most one status window."""
        self.before_round()
        started: list[asyncio.Task[None]] = []
        for name, state in list(self.store.states.items()):
            if name in self._inflight:
                continue  # written when that write is done: never two at once, never stale
            due = self._due.get(name)
            resync_due = (
                time.monotonic() - self._synced_at.get(name, float("-inf")) >= self.resync_seconds
            )
            if not state.dirty and (due is None or due > now) and not resync_due:
                continue
            # Cleared before computing: a change made while the patch is in flight (ingest,
            # the gating task) marks it dirty again and is written next window.
            state.dirty = False
            # Kept from this computation: asked again at a later window, `next_deadline`
            # would already be past the node that turned stale meanwhile, never due.
            self._due[name] = vs.next_deadline(state, now)
            try:
                status = self.compute(name, now)
                seen = observe(state, now)
            except Exception:
                state.dirty = True
                self.write_failures += 1
                log.exception("status of %s cannot be computed; retrying next window", name)
                continue
            previous = self.store.previous.get(name)
            self._note_retries(name, status, previous)
            self._note_localized(name, status)
            if previous is not None and not needs_write(status, previous, resync_due=resync_due):
                if resync_due:
                    self._synced_at[name] = time.monotonic()
                # nothing to write, yet nodes may have swapped places past the failures cap
                self._post_events(name, seen, previous)
                continue
            task = asyncio.create_task(self._write_one(name, state, status, seen))
            self._inflight[name] = task
            task.add_done_callback(functools.partial(self._done, name))
            started.append(task)
        flush = asyncio.create_task(self.events.flush())
        await asyncio.wait([flush, *started], timeout=max(self.settings.status_window, 1.0))

    def _note_retries(
        self,
        name: str,
        status: NetworkValidationStatus,
        previous: NetworkValidationStatus | None,
    ) -> None:
        """An Event when retries on many nodes get a (new) first culprit."""
        retries = status.retries
        first = retries.culprits[0].node if retries is not None and retries.culprits else None
        said = self._culprits.get(name)
        if said is None and previous is not None and previous.retries is not None:
            culprits = previous.retries.culprits  # said by an earlier term
            said = self._culprits[name] = culprits[0].node if culprits else ""
        if retries is None or first is None or first == said:
            if first is None:
                self._culprits[name] = ""
            return
        self._culprits[name] = first
        self.events.queue(name, "Warning", EventReason.RETRIES_ATTRIBUTED, retries.message)

    def _note_localized(self, name: str, status: NetworkValidationStatus) -> None:
        """An Event when the east-west results name a new first culprit (`status.culprits`)."""
        found = culprit(status.east_west)
        if found is None:
            self._localized[name] = ""
            return
        key, message = found
        if self._localized.get(name) == key:
            return
        self._localized[name] = key
        self.events.queue(name, "Warning", EventReason.CULPRIT_LOCALIZED, message)

    def _done(self, name: str, _: asyncio.Task[None]) -> None:
        self._inflight.pop(name, None)

    async def _write_one(
        self,
        name: str,
        state: vs.ValidationState,
        status: NetworkValidationStatus,
        seen: dict[str, Seen],
    ) -> None:
        async with self._limit:
            if not await self.write(name, status, self.store.previous.get(name), seen=seen):
                state.dirty = True

    async def drain(self) -> None:
        """Wait for the writes and Events in flight (a stop, tests)."""
        pending = [*self._inflight.values(), *self._event_tasks]
        if pending:
            await asyncio.wait(pending)

    async def write(
        self,
        name: str,
        status: NetworkValidationStatus,
        previous: NetworkValidationStatus | None,
        *,
        seen: dict[str, Seen] | None = None,
    ) -> bool:
        """Patch the status; then post the Events of its transitions (`seen`: the targeted
        nodes as `status` judged them; judged now when not given)."""
        links = self.links.pop(name, [])
        if name not in self.store.states:
            return True  # deleted while this write waited: nothing to write any more
        with self.tracer.start_as_current_span(
            "netval.status_write", links=links, attributes={"netval.validation": name}
        ) as span:
            try:
                await self.kube.patch_status(name, status_patch(status, previous))
            except Exception as exc:
                self.write_failures += 1
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR))
                log.warning("status write for %s failed: %s", name, error_text(exc))
                return False
        self.writes += 1
        self._synced_at[name] = time.monotonic()
        state = self.store.states.get(name)
        if state is not None:  # not deleted while the patch was in flight
            self.store.previous[name] = status
            self._post_events(
                name, seen if seen is not None else observe(state, utcnow()), previous
            )
        return True

    def _post_events(
        self, name: str, seen: dict[str, Seen], previous: NetworkValidationStatus | None
    ) -> None:
        posts = self.events.record(name, seen, previous)
        if not posts:
            return
        # Posted in the background: a slow Events API must not hold status writes.
        task = asyncio.create_task(self.events.post_all(name, posts))
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)
