"""MQTT ingest: one subscription for every agent's report and state topics.

Messages are decoded by `netval.operator.ingest.decode`; a dropped one is counted by reason
and logged (rate-limited). The same connection keeps the operator's own retained messages
(agent assignments) on the broker.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Final

import aiomqtt
from aiomqtt import MqttError
from opentelemetry import trace
from opentelemetry.trace import Tracer

from netval.infra.mqtt_client import backoff_delay, make_client
from netval.infra.mqtt_settings import MqttSettings
from netval.infra.telemetry import process_span
from netval.model.results import Report
from netval.model.topics import DropReason, TopicKind, subscription
from netval.operator.ingest.decode import Dropped, StateChange, decode_message

log = logging.getLogger("netval.operator.ingest")

LOG_EVERY_SECONDS: Final = 60.0
# Retained messages arrive right after SUBACK; once none came for this long the initial
# state is complete and status may be written without flipping conditions.
SYNC_QUIET_SECONDS: Final = 0.5
SYNC_MAX_SECONDS: Final = 5.0


class IngestStats:
    def __init__(self) -> None:
        self.reports = 0
        self.states = 0
        self.dropped: Counter[DropReason] = Counter()
        self.connected = False
        self.reconnects = 0
        self._last_log: dict[DropReason, float] = {}

    def drop(self, dropped: Dropped) -> None:
        self.dropped[dropped.reason] += 1
        now = time.monotonic()
        if now - self._last_log.get(dropped.reason, float("-inf")) >= LOG_EVERY_SECONDS:
            self._last_log[dropped.reason] = now
            log.warning(
                "dropped MQTT message (%s, %d so far): %s",
                dropped.reason.value,
                self.dropped[dropped.reason],
                dropped.detail,
            )


class ReportIngest:
    """Owns the operator's MQTT subscription; hands decoded messages to callbacks."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        on_report: Callable[[Report, bool], None],
        on_state: Callable[[StateChange], None],
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        tracer: Tracer | None = None,
    ) -> None:
        self.settings = settings
        self._tracer = tracer or trace.NoOpTracer()  # CONSUMER spans, netval.infra.telemetry
        self.on_report = on_report
        self.on_state = on_state
        self.stats = IngestStats()
        self.synced = asyncio.Event()
        # retained messages the operator owns (agent assignments): topic -> payload
        self._desired: dict[str, bytes] = {}
        self._published: dict[str, bytes] = {}
        self._retained_changed = asyncio.Event()
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._rng = random.Random()  # noqa: S311 - jitter

    def set_retained(self, desired: Mapping[str, bytes]) -> None:
        """The retained messages the operator wants on the broker; the rest it published
        before are cleared. Sent by the connection task, again after every reconnect (a
        broker without persistence forgets them)."""
        self._desired = dict(desired)
        self._retained_changed.set()

    async def _sync_retained(self, client: aiomqtt.Client) -> None:
        while True:
            self._retained_changed.clear()
            desired = dict(self._desired)
            for name, payload in desired.items():
                if self._published.get(name) != payload:
                    await client.publish(name, payload, qos=1, retain=True)
                    self._published[name] = payload
            for name in [n for n in self._published if n not in desired]:
                await client.publish(name, b"", qos=1, retain=True)  # clears the retained one
                del self._published[name]
            await self._retained_changed.wait()

    def handle(self, topic_name: str, payload: bytes, *, retained: bool = False) -> None:
        """`retained`: replayed by the broker on subscribe, not sent just now."""
        decoded = decode_message(topic_name, payload)
        if isinstance(decoded, Dropped):
            self.stats.drop(decoded)
        elif isinstance(decoded, Report):
            self.stats.reports += 1
            self.on_report(decoded, retained)
        elif isinstance(decoded, StateChange):
            self.stats.states += 1
            self.on_state(decoded)

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.connected = False
                if not isinstance(exc, MqttError):
                    log.exception("MQTT ingest: unexpected error")
                else:
                    log.warning("MQTT ingest %s: %s", self.settings.url, exc)
            failures += 1
            self.stats.reconnects += 1
            await asyncio.sleep(
                backoff_delay(
                    failures, base=self._backoff_base, cap=self._backoff_cap, rng=self._rng
                )
            )

    async def _session(self) -> None:
        s = self.settings
        async with make_client(s, keepalive=30, tls_context=s.ssl_context()) as client:
            self.stats.connected = True
            log.info("MQTT ingest connected to %s", s.url)
            await client.subscribe(
                [(subscription(TopicKind.REPORT), 1), (subscription(TopicKind.STATE), 1)]
            )
            sync = asyncio.create_task(self._mark_synced())
            self._published = {}  # a new session: publish everything again
            retained_task = asyncio.create_task(self._sync_retained(client))
            try:
                async for message in client.messages:
                    payload = message.payload
                    data = payload if isinstance(payload, bytes) else str(payload or "").encode()
                    if message.retain:
                        self._last_retained = time.monotonic()
                    with process_span(
                        self._tracer,
                        message.topic.value,
                        body_size=len(data),
                        properties=message.properties,
                        client_id=s.client_id,
                        retained=bool(message.retain),
                    ):
                        self.handle(message.topic.value, data, retained=bool(message.retain))
            finally:
                sync.cancel()
                retained_task.cancel()

    _last_retained: float = 0.0

    async def _mark_synced(self) -> None:
        start = time.monotonic()
        self._last_retained = start
        while time.monotonic() - start < SYNC_MAX_SECONDS:
            await asyncio.sleep(SYNC_QUIET_SECONDS / 2)
            if time.monotonic() - self._last_retained >= SYNC_QUIET_SECONDS:
                break
        self.synced.set()
