"""The operator's ingest over N broker shards (``mqtt.shards``, docs/operations.md "Brokers
beyond one process"): one `ReportIngest` session per shard, all feeding the same callbacks
(the same store), each reconnecting on its own.

What the operator publishes (agent assignments, load-test plans and aborts, clears of a
deleted validation's topics) goes to the shard of the node the topic names
(`netval.model.shards.shard_of`); a topic that names no node goes to every shard. Losing one
shard stops only its nodes' reports and beats, so only they turn stale; the other sessions go
on, and a reconnect of one shard gives only its nodes the operator's reconnect grace
(`state.hearing`). Each session owns the nodes of its shard: another node's message arriving
there is dropped, counted (`wrong_shard`) and its retained topic cleared on that shard. The
retained replay each session hands over is merged (the union over shards of their latest
replays) before the store sees it.

`stats` adds the sessions' counters up; `connected` is true while every shard is
subscribed and `shards_down` names those that are not (the health message and the
`netval_operator_mqtt_shard_connected` metric say which). With one shard the runtime uses a
plain `ReportIngest`, not this class: nothing changes for an unsharded install.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from netval.infra.mqtt_settings import MqttSettings
from netval.model.shards import shard_of
from netval.model.topics import parse_topic
from netval.operator.ingest.subscriber import (
    SYNC_MAX_SECONDS,
    IngestStats,
    ReplayKey,
    ReportIngest,
)

log = logging.getLogger("netval.operator.ingest")


class ShardedIngest:
    """The same interface as `ReportIngest` (what the runtime uses of it), over N shards."""

    def __init__(
        self,
        shards: Sequence[MqttSettings],
        *,
        on_replayed: Callable[[frozenset[ReplayKey]], None] = lambda keys: None,
        sync_grace: float = SYNC_MAX_SECONDS,
        **kwargs: Any,
    ) -> None:
        if len(shards) < 2:
            raise ValueError("a sharded ingest needs two shards or more (one: ReportIngest)")
        self._on_replayed = on_replayed
        self._replays: dict[int, frozenset[ReplayKey]] = {}
        self.sessions = [
            ReportIngest(
                settings, on_replayed=self._replayed_by(i), shard=i, shards=len(shards), **kwargs
            )
            for i, settings in enumerate(shards)
        ]
        self.synced = asyncio.Event()
        self.sync_grace = sync_grace

    @property
    def count(self) -> int:
        return len(self.sessions)

    def _replayed_by(self, shard: int) -> Callable[[frozenset[ReplayKey]], None]:
        def replayed(keys: frozenset[ReplayKey]) -> None:
            self._replays[shard] = keys
            self._on_replayed(frozenset().union(*self._replays.values()))

        return replayed

    def shard_of_topic(self, name: str) -> int | None:
        """The shard a topic's node is on; None: a topic naming no node (every shard)."""
        parsed = parse_topic(name)
        return None if parsed is None else shard_of(parsed.node, self.count)

    def _split(self, topics: Mapping[str, bytes]) -> list[dict[str, bytes]]:
        out: list[dict[str, bytes]] = [{} for _ in self.sessions]
        for name, payload in topics.items():
            shard = self.shard_of_topic(name)
            for i in range(self.count) if shard is None else (shard,):
                out[i][name] = payload
        return out

    def set_retained(self, desired: Mapping[str, bytes], *, group: str = "assignments") -> None:
        for session, part in zip(self.sessions, self._split(desired), strict=True):
            session.set_retained(part, group=group)

    def clear_retained(self, topics: list[str]) -> None:
        parts = self._split(dict.fromkeys(topics, b""))
        for session, part in zip(self.sessions, parts, strict=True):
            if part:
                session.clear_retained(list(part))

    @property
    def shards_down(self) -> list[int]:
        return [i for i, s in enumerate(self.sessions) if not s.stats.connected]

    @property
    def stats(self) -> IngestStats:
        """The sessions' counters added up (a fresh object per call: read, never written)."""
        total = IngestStats()
        for session in self.sessions:
            s = session.stats
            total.reports += s.reports
            total.states += s.states
            total.beats.update(s.beats)
            total.dropped.update(s.dropped)
            total.reconnects += s.reconnects
            total.sessions += s.sessions
            total.failures_in_a_row = max(total.failures_in_a_row, s.failures_in_a_row)
            total.backoff_resets += s.backoff_resets
            total.retained_failures += s.retained_failures
            total.clears_dropped += s.clears_dropped
            total.cleared_late += s.cleared_late
            total.load_results += s.load_results
        total.connected = not self.shards_down
        return total

    async def run(self) -> None:
        """Every shard's session until cancelled; `synced` once each shard's replay is over,
        or after `sync_grace` seconds with a shard still down (its nodes then read as
        awaiting, then stale, while the others' status is written)."""
        tasks = [asyncio.create_task(s.run(), name=f"netval-ingest-shard-{i}")
                 for i, s in enumerate(self.sessions)]  # fmt: skip
        try:
            all_synced = asyncio.gather(*(s.synced.wait() for s in self.sessions))
            try:
                await asyncio.wait_for(all_synced, self.sync_grace)
            except TimeoutError:
                log.warning("MQTT shards %s not synced after %.0f s: going on without them",
                            self.shards_down, self.sync_grace)  # fmt: skip
            self.synced.set()
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def broker_health(ingest: ReportIngest | ShardedIngest) -> tuple[bool, str]:
    """The health endpoint's answer: connected to every shard, else which are down."""
    if isinstance(ingest, ShardedIngest):
        down = ingest.shards_down
        if down:
            shards = ", ".join(f"{i} ({ingest.sessions[i].settings.url})" for i in down)
            return False, f"not connected to MQTT shard(s) {shards}"
        return True, "ok"
    connected = ingest.stats.connected
    return connected, "ok" if connected else "not connected to the MQTT broker"
