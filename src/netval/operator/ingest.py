"""MQTT ingest: one subscription for every agent's report and state topics.

Every payload is untrusted: decoded and validated with pydantic; a bad one is dropped,
counted by reason and logged (rate-limited), and never disturbs other data. A report whose
node differs from its topic's node is rejected (an agent may only speak for itself).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import aiomqtt
from aiomqtt import MqttError
from pydantic import ValidationError

from netval.infra.mqtt_client import backoff_delay, make_client
from netval.infra.mqtt_settings import MqttSettings
from netval.model.results import Report
from netval.model.topics import OFFLINE, ONLINE, ParsedTopic, TopicKind, parse_topic, subscription

log = logging.getLogger("netval.operator.ingest")

MAX_PAYLOAD: Final = 1 << 20
LOG_EVERY_SECONDS: Final = 60.0
# Retained messages arrive right after SUBACK; once none came for this long the initial
# state is complete and status may be written without flipping conditions.
SYNC_QUIET_SECONDS: Final = 0.5
SYNC_MAX_SECONDS: Final = 5.0


class DropReason(StrEnum):
    BAD_TOPIC = "bad_topic"
    TOO_LARGE = "too_large"
    NOT_UTF8 = "not_utf8"
    INVALID_REPORT = "invalid_report"
    NODE_MISMATCH = "node_mismatch"
    VALIDATION_MISMATCH = "validation_mismatch"
    BAD_STATE = "bad_state"


@dataclass(frozen=True, slots=True)
class Dropped:
    reason: DropReason
    detail: str


@dataclass(frozen=True, slots=True)
class StateChange:
    validation: str
    node: str
    online: bool


Decoded = Report | StateChange | Dropped | None


def decode_message(topic_name: str, payload: bytes) -> Decoded:
    """Pure: what a message means, or why it is dropped (None: a topic we don't consume)."""
    parsed = parse_topic(topic_name)
    if parsed is None:
        return Dropped(DropReason.BAD_TOPIC, f"unexpected topic {topic_name[:200]!r}")
    if parsed.kind is TopicKind.STATE:
        return _decode_state(parsed, payload)
    if parsed.kind is not TopicKind.REPORT:
        return None
    if not payload:
        # an empty retained payload clears the retained report (agent removed): not an error
        return None
    if len(payload) > MAX_PAYLOAD:
        return Dropped(DropReason.TOO_LARGE, f"{len(payload)} bytes from {parsed.node}")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return Dropped(DropReason.NOT_UTF8, f"report from {parsed.node} is not UTF-8")
    try:
        report = Report.model_validate_json(text)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(payload)"
        return Dropped(
            DropReason.INVALID_REPORT, f"report from {parsed.node}: {where}: {err['msg']}"
        )
    if report.node != parsed.node:
        return Dropped(
            DropReason.NODE_MISMATCH,
            f"report on {parsed.node}'s topic claims node {report.node!r}",
        )
    if report.validation != parsed.validation:
        return Dropped(
            DropReason.VALIDATION_MISMATCH,
            f"report on validation {parsed.validation}'s topic claims {report.validation!r}",
        )
    return report


def _decode_state(parsed: ParsedTopic, payload: bytes) -> Decoded:
    if payload == ONLINE:
        return StateChange(parsed.validation, parsed.node, True)
    if payload in (OFFLINE, b""):
        return StateChange(parsed.validation, parsed.node, False)
    return Dropped(DropReason.BAD_STATE, f"state of {parsed.node} is {payload[:40]!r}")


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
    ) -> None:
        self.settings = settings
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
