"""MQTT ingest: one subscription for every agent's report, state, beat and endpoint topics.

NetworkLoadTest results (`loadresult` topics) are subscribed to on the same connection when
a taker is given (`on_load_result`) and handed over undecoded, by topic: the load-test
coordinator decodes and counts them. The retained messages the operator keeps are grouped
(`set_retained(..., group=)`: agent assignments, each load-test run's plans).

Messages are decoded by `netval.operator.ingest.decode`; a dropped one is counted by reason
and logged (rate-limited); whatever raises while a message is handled is an `internal_error`
drop, never the session's end. The same connection keeps the operator's own retained
messages (agent assignments) on the broker and clears the retained topics of deleted
validations; that sync is supervised (a failed publish is logged, counted and retried).

Reconnects follow the rule of every MQTT connection (`infra.mqtt_client.reconnect_loop`)
with the operator's policy (`OPERATOR_RECONNECT`): the first attempt at once, then 0.25 s
doubling to 2 s with full jitter, so it is back before the fleet (the agents' ceiling is
30 s); a session that stayed up for `STABLE_SESSION_SECONDS` starts the count over.
After every (re)subscribe the retained replay is recorded (`replayed`: which validation/node reports came back) and handed to `on_replayed`,
so a gap (targeted nodes without a retained report) is counted instead of trusted; every
reconnect after the first is reported with the session's shard (`on_reconnected`: the
operator could not hear that shard's agents meanwhile, `state.hearing`).

With broker shards (`ingest.shards`) each session owns the nodes that hash to its shard
(`netval.model.shards.shard_of`). A node's report, state, beat or endpoint arriving on
another shard (an agent that moved when the shard count changed left its last will there;
a misconfigured agent) is dropped, counted (`wrong_shard`) and its retained topic cleared on
that shard, so an old `offline` never marks a moved node offline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Final

import aiomqtt
from aiomqtt import MqttError
from opentelemetry import trace
from opentelemetry.trace import Tracer

from netval.infra.mqtt_client import (
    OPERATOR_RECONNECT,
    ReconnectPolicy,
    ReconnectRule,
    SessionEnd,
    make_client,
    reconnect_loop,
)
from netval.infra.mqtt_settings import MqttSettings
from netval.infra.telemetry import process_span
from netval.model.results import Report
from netval.model.shards import shard_of
from netval.model.topics import DropReason, TopicKind, parse_topic, subscription
from netval.operator.ingest.decode import (
    BeatMessage,
    Dropped,
    EndpointAnnounce,
    StateChange,
    decode_message,
)
from netval.operator.ingest.publish_window import PUBLISH_WINDOW, publish_all
from netval.operator.leadership.fence import WRITE_FENCE

log = logging.getLogger("netval.operator.ingest")

LOG_EVERY_SECONDS: Final = 60.0
# Topics remembered for rate-limiting internal-error logs; past this the memory starts over.
MAX_LOGGED_TOPICS: Final = 1024
# Retained messages arrive right after SUBACK; once none came for this long the initial
# state is complete and status may be written without flipping conditions.
SYNC_QUIET_SECONDS: Final = 0.5
# A safety cap only: the replay of a big fleet takes as long as the ingest needs to decode it
# (10,000 nodes: several seconds on a loaded 2-core machine), and status written before its
# end would call the nodes not replayed yet "awaiting". Retained messages stop coming once
# the replay is over, so the quiet condition above ends the wait.
SYNC_MAX_SECONDS: Final = 60.0
# A session up this long counts as stable: the next reconnect starts from the base delay.
STABLE_SESSION_SECONDS: Final = 10.0
# The retained sync's wait after a failed publish (doubling, capped).
RETAINED_RETRY_BASE: Final = 0.5
RETAINED_RETRY_CAP: Final = 10.0
# Topics to clear, at most: beyond, the oldest requests are dropped (and counted).
MAX_CLEARS: Final = 200_000

_LOAD_RESULT_SUFFIX: Final = f"/{TopicKind.LOAD_RESULT.value}"

ReplayKey = tuple[str, str]  # (validation, node) of a retained report


class IngestStats:
    def __init__(self) -> None:
        self.reports = 0
        self.states = 0
        # valid beats by what they did (netval.operator.state.beats.BeatOutcome values);
        # invalid ones are `dropped[DropReason.INVALID_BEAT]`
        self.beats: Counter[str] = Counter()
        self.dropped: Counter[DropReason] = Counter()
        self.connected = False
        self.reconnects = 0
        self.sessions = 0  # subscribed sessions so far
        self.failures_in_a_row = 0  # sessions that ended since the last stable one
        self.backoff_resets = 0  # stable sessions that reset the reconnect backoff
        self.retained_failures = 0  # failed publishes of the operator's retained messages
        self.clears_dropped = 0  # topics to clear beyond MAX_CLEARS
        self.cleared_late = 0  # messages of a just-deleted validation, cleared on arrival
        self.load_results = 0  # loadresult messages handed to the load-test coordinator
        self._last_log: dict[DropReason, float] = {}
        self._last_topic_log: dict[str, float] = {}

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

    def internal_error(self, topic_name: str, exc: Exception) -> None:
        """Handling a message raised: counted as a drop, logged with its traceback once per
        topic and LOG_EVERY_SECONDS (a retained poison comes back on every resubscribe)."""
        self.dropped[DropReason.INTERNAL_ERROR] += 1
        now = time.monotonic()
        if len(self._last_topic_log) > MAX_LOGGED_TOPICS:
            self._last_topic_log.clear()
        if now - self._last_topic_log.get(topic_name, float("-inf")) >= LOG_EVERY_SECONDS:
            self._last_topic_log[topic_name] = now
            log.error(
                "dropped MQTT message on %s (internal_error, %d so far): %s: %s",
                topic_name[:300],
                self.dropped[DropReason.INTERNAL_ERROR],
                type(exc).__name__,
                exc,
                exc_info=exc,
            )


class ReportIngest:
    """Owns the operator's MQTT subscription; hands decoded messages to callbacks."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        on_report: Callable[[Report, bool], None],
        on_state: Callable[[StateChange], None],
        on_beat: Callable[[BeatMessage, bool], object] = lambda message, retained: None,
        on_endpoint: Callable[[EndpointAnnounce], None] = lambda announce: None,
        on_replayed: Callable[[frozenset[ReplayKey]], None] = lambda keys: None,
        deleted: Callable[[str], bool] = lambda validation: False,
        on_load_result: Callable[[str, str, bytes], None] | None = None,
        on_reconnected: Callable[[int], None] = lambda shard: None,
        shard: int = 0,
        shards: int = 1,
        backoff_base: float = OPERATOR_RECONNECT.base,
        backoff_cap: float = OPERATOR_RECONNECT.cap,
        stable_after: float = STABLE_SESSION_SECONDS,
        tracer: Tracer | None = None,
    ) -> None:
        self.settings = settings
        # a session after an earlier one: the operator was deaf in between (Store.note_deaf),
        # called with this session's shard
        self.on_reconnected = on_reconnected
        self.shard = shard
        self.shards = shards  # > 1: messages of nodes of other shards are dropped
        self._tracer = tracer or trace.NoOpTracer()  # CONSUMER spans, netval.infra.telemetry
        self.on_report = on_report
        self.on_state = on_state
        self.on_beat = on_beat  # returns what the beat did (counted by its str), or None
        self.on_endpoint = on_endpoint  # the peer sets in the assignments (peer_sets)
        self.on_replayed = on_replayed
        # a validation deleted moments ago: what its agents still publish is cleared
        self.deleted = deleted
        # NetworkLoadTest results (validation, node, raw payload): decoded and counted by the
        # load-test coordinator; the subscription exists only when someone takes them
        self.on_load_result = on_load_result
        self.stable_after = stable_after
        # the operator's policy: at once, then a short backoff (`OPERATOR_RECONNECT`)
        self._reconnect = ReconnectRule(
            ReconnectPolicy(backoff_base, backoff_cap, stable_after, immediate=True)
        )
        # the reports handled during the current session's replay (retained, or live ones
        # published after the subscribe)
        self.replayed: set[ReplayKey] = set()
        self._replaying = False
        # retained topics to clear (a deleted validation's), in order; kept across sessions
        self._clears: dict[str, None] = {}
        self.stats = IngestStats()
        self.synced = asyncio.Event()
        # retained messages the operator owns (agent assignments): topic -> payload
        self._desired: dict[str, bytes] = {}
        self._groups: dict[str, dict[str, bytes]] = {}  # set_retained's groups
        self._published: dict[str, bytes] = {}
        self._retained_changed = asyncio.Event()

    def set_retained(self, desired: Mapping[str, bytes], *, group: str = "assignments") -> None:
        """The retained messages the operator wants on the broker for one `group` (agent
        assignments; a load-test run's plans); what it published before and no group wants
        any more is cleared. Sent by the connection task, again after every reconnect (a
        broker without persistence forgets them)."""
        if desired:
            self._groups[group] = dict(desired)
        else:
            self._groups.pop(group, None)
        self._desired = {name: p for wanted in self._groups.values() for name, p in wanted.items()}
        self._retained_changed.set()

    def clear_retained(self, topics: list[str]) -> None:
        """Publish empty retained payloads on `topics` (which deletes what the broker
        retains there), from the connection task; kept until done, across reconnects."""
        for name in topics:
            self._clears[name] = None
        while len(self._clears) > MAX_CLEARS:
            del self._clears[next(iter(self._clears))]
            self.stats.clears_dropped += 1
        self._retained_changed.set()

    async def _sync_retained(self, client: aiomqtt.Client) -> None:
        """Supervised: a publish that fails is logged and counted, and the whole sync is
        tried again after a backoff (what was not published stays pending); only the
        session's end stops it."""
        # aiomqtt warns on every call beyond 10 awaiting their acknowledgement: the window
        # of retained publishes is meant to (plus the session's few other calls)
        client.pending_calls_threshold = PUBLISH_WINDOW + 16
        failures = 0
        while True:
            try:
                await self._sync_retained_once(client)
                failures = 0
                await self._retained_changed.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.stats.retained_failures += 1
                log.warning(
                    "publishing the operator's retained messages failed (%d in a row): %s",
                    failures,
                    exc,
                )
                await asyncio.sleep(
                    min(RETAINED_RETRY_CAP, RETAINED_RETRY_BASE * 2 ** min(failures - 1, 10))
                )

    async def _sync_retained_once(self, client: aiomqtt.Client) -> None:
        """Publish what differs; a topic that fails does not hold the others (it is raised
        after the rest were tried, and tried again by the next pass)."""
        self._retained_changed.clear()
        desired = dict(self._desired)
        failed: list[tuple[str, Exception]] = []

        async def put(name: str, payload: bytes) -> bool:
            try:
                # the broker's retained state is written by the leader only, like the API's
                WRITE_FENCE.write_timeout(f"MQTT publish {name}")
                await client.publish(name, payload, qos=1, retain=True)
            except MqttError:
                raise  # the session is gone: the next one publishes everything again
            except Exception as exc:
                failed.append((name, exc))
                return False
            return True

        async def publish(name: str, payload: bytes) -> None:
            if await put(name, payload):
                self._published[name] = payload

        async def clear(name: str, _payload: bytes) -> None:
            if await put(name, b""):  # an empty retained payload clears the retained one
                self._published.pop(name, None)
                self._clears.pop(name, None)

        # each pass names distinct topics, so their publishes may overlap (a bounded window)
        changed = [(n, p) for n, p in desired.items() if self._published.get(n) != p]
        await publish_all(changed, publish)
        await publish_all(((n, b"") for n in list(self._published) if n not in desired), clear)
        for name in [n for n in self._clears if n in desired]:
            self._clears.pop(name, None)
        await publish_all(((n, b"") for n in list(self._clears)), clear)
        if failed:
            name, exc = failed[0]
            raise RuntimeError(f"{len(failed)} retained publishes failed, first {name!r}: {exc}")

    def handle(self, topic_name: str, payload: bytes, *, retained: bool = False) -> None:
        """`retained`: replayed by the broker on subscribe, not sent just now. Never raises:
        whatever goes wrong with one message is that message's drop, not the session's end
        (the broker would replay a retained poison on every reconnect)."""
        try:
            if self.on_load_result is not None and topic_name.endswith(_LOAD_RESULT_SUFFIX):
                parsed = parse_topic(topic_name)
                if parsed is not None and parsed.kind is TopicKind.LOAD_RESULT:
                    self.stats.load_results += 1
                    self.on_load_result(parsed.validation, parsed.node, payload)
                    return
            if self.shards > 1 and not self._owns(topic_name):
                if payload:  # (an empty one is a clear, ours coming back among them)
                    self.stats.drop(Dropped(DropReason.WRONG_SHARD, f"{topic_name[:300]} is "
                                            f"not on shard {self.shard} of {self.shards}"))  # fmt: skip
                    self.clear_retained([topic_name])  # on this shard's broker only
                return
            decoded = decode_message(topic_name, payload)
            if isinstance(decoded, Dropped):
                self.stats.drop(decoded)
            elif isinstance(decoded, Report | StateChange | BeatMessage) and self.deleted(
                decoded.validation
            ):
                if payload:
                    self.stats.cleared_late += 1
                    self.clear_retained([topic_name])
            elif isinstance(decoded, Report):
                if self._replaying:
                    # a live report that overtook the replay counts too: the broker sends
                    # no retained copy of a report published after the subscribe, so the
                    # node would look lost although it just spoke
                    self.replayed.add((decoded.validation, decoded.node))
                self.on_report(decoded, retained)
                self.stats.reports += 1
            elif isinstance(decoded, StateChange):
                self.on_state(decoded)
                self.stats.states += 1
            elif isinstance(decoded, BeatMessage):
                outcome = self.on_beat(decoded, retained)
                self.stats.beats[str(outcome) if outcome is not None else "received"] += 1
            elif isinstance(decoded, EndpointAnnounce):
                self.on_endpoint(decoded)
        except Exception as exc:
            self.stats.internal_error(topic_name, exc)

    def _owns(self, topic_name: str) -> bool:
        """Whether the node a topic names is on this session's shard (a topic that names no
        node, or one not read here, is decoded and dropped as such)."""
        parsed = parse_topic(topic_name)
        return parsed is None or shard_of(parsed.node, self.shards) == self.shard

    async def run(self) -> None:
        """The subscription until cancelled: reconnects for ever, with backoff."""
        try:
            await reconnect_loop(self._session, self._reconnect, on_end=self._ended)
        finally:
            self.stats.connected = False

    def _ended(self, end: SessionEnd) -> None:
        self.stats.connected = False
        if end.error is not None and not isinstance(end.error, MqttError):
            log.error("MQTT ingest: unexpected error", exc_info=end.error)
        else:
            log.warning("MQTT ingest %s: %s", self.settings.url, end.error or "session ended")
        if end.refused:
            log.error("MQTT ingest %s: the broker refuses the operator's credential (check "
                      "its user name and password)", self.settings.url)  # fmt: skip
        if end.reset:
            self.stats.backoff_resets += 1  # a stable session: start over from the base delay
        self.stats.failures_in_a_row = end.failures
        self.stats.reconnects += 1

    async def _session(self) -> None:
        s = self.settings
        async with make_client(s, keepalive=30, tls_context=s.ssl_context()) as client:
            self.stats.connected = True
            self._reconnect.connected()
            log.info("MQTT ingest connected to %s", s.url)
            if self.stats.sessions:
                self.on_reconnected(self.shard)
            self.replayed = set()
            self._replaying = True
            self._live_seen = False
            # in this order: the broker replays each filter's retained messages in turn, so
            # a node's report comes before its beat (a beat first is kept until it does)
            topics = [
                (subscription(TopicKind.REPORT), 1),
                (subscription(TopicKind.STATE), 1),
                (subscription(TopicKind.BEAT), 1),
                (subscription(TopicKind.ENDPOINT), 1),
            ]
            if self.on_load_result is not None:
                topics.append((subscription(TopicKind.LOAD_RESULT), 1))
            await client.subscribe(topics)
            self.stats.sessions += 1
            sync = asyncio.create_task(self._mark_synced(client))
            self._published = {}  # a new session: publish everything again
            retained_task = asyncio.create_task(self._sync_retained(client))
            try:
                async for message in client.messages:
                    payload = message.payload
                    data = payload if isinstance(payload, bytes) else str(payload or "").encode()
                    if message.retain:
                        self._last_retained = time.monotonic()
                    else:
                        self._live_seen = True
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
    _live_seen = False

    async def _mark_synced(self, client: aiomqtt.Client) -> None:
        """The replay is over once a live (not retained) message was handled: the broker
        queues a subscription's retained messages before anything published after it; or
        when no retained message was handled for SYNC_QUIET_SECONDS and none waits in the
        client's queue (a loop busy elsewhere, e.g. computing a big status, handles none for
        a while without the replay being over)."""
        start = time.monotonic()
        self._last_retained = start
        while time.monotonic() - start < SYNC_MAX_SECONDS:
            await asyncio.sleep(SYNC_QUIET_SECONDS / 2)
            if self._live_seen:
                break
            if len(client.messages):
                continue
            if time.monotonic() - self._last_retained >= SYNC_QUIET_SECONDS:
                break
        self._replaying = False
        try:
            self.on_replayed(frozenset(self.replayed))
        except Exception:
            log.exception("checking the retained replay failed")
        self.synced.set()
