"""Publish one node's reports for one validation over MQTT v5 (docs/architecture.md, "MQTT").

Topics, all under ``netval/v1/<validation>/<node>/``:

- ``report``: the JSON report, QoS 1, retained.
- ``beat``: a `netval.model.beat.Beat` instead of the report when nothing material changed
  (`netval.agent.report_digest`; ``full_every`` cycles at most between two full reports),
  QoS 0, retained (docs/architecture.md, "Reports and beats").
- ``state``: ``online`` (retained, on every connect); ``offline`` as the retained last will
  (the broker publishes it when the connection dies: SIGKILL, node loss, keepalive timeout)
  and published explicitly on a clean `ReportPublisher.stop`.
- any other single level, retained (``endpoint``) or once (``loadresult``):
  `netval.agent.publish_extras`.

One background task owns the connection: connect, publish ``online`` and the extras, then
send reports as they come. Any `aiomqtt.MqttError` (refused, bad credentials, broker
gone, PUBACK timeout) tears the connection down and the task reconnects after a capped
exponential backoff with full jitter. Reports are never queued: a single slot holds the
newest unsent report, a newer one replaces it (counted in ``replaced``), so memory is bounded
whatever the outage length. A report leaves the slot only when the broker acknowledged it
(PUBACK); a report whose publish failed goes back to the slot unless a newer one arrived.
Reports are not re-sent after a reconnect once acknowledged (the operator counts consecutive
reports for taint recovery; a duplicate would count twice), but the first cycle after one goes
out in full, not as a beat (the broker may have lost the retained report). A beat is never
retried: the next cycle has its own.

Optionally the same connection subscribes to topic filters (e.g. the operator's retained
``assignment``) and hands messages to a callback; subscriptions are renewed on reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import aiomqtt
from aiomqtt import MqttError, Will
from opentelemetry import trace
from opentelemetry.trace import Tracer

from netval.agent.publish_extras import ExtraTopics
from netval.agent.refusal import (
    PUBLISH_REFUSAL_GRACE,
    Login,
    PublishRefusals,
    credential_refused,
)
from netval.agent.report_digest import ReportCadence
from netval.infra.mqtt_client import (
    PublishRefused,
    ReconnectPolicy,
    ReconnectRule,
    SessionEnd,
    make_client,
    reconnect_loop,
)
from netval.infra.mqtt_settings import MqttSettings
from netval.infra.task_stop import cancel_and_wait
from netval.infra.telemetry import publish_span, trace_properties
from netval.model.beat import Beat
from netval.model.results import Report
from netval.model.topics import (
    MAX_REPORT_BYTES,
    OFFLINE,
    ONLINE,
    TopicKind,
    topic_prefix,
)

log = logging.getLogger(__name__)

REPORT: Final = TopicKind.REPORT.value
STATE: Final = TopicKind.STATE.value
BEAT: Final = TopicKind.BEAT.value
_STABLE_AFTER: Final = 10.0  # seconds a connection must hold before the backoff resets

MessageHandler = Callable[[aiomqtt.Message], None]


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """A snapshot of the counters (they feed /metrics)."""

    published: int  # reports acknowledged by the broker
    publish_failures: int  # report publishes that raised (the report was kept for a retry)
    replaced: int  # unsent reports dropped because a newer one arrived
    reconnects: int  # connection attempts after the first one
    connect_failures: int  # connection attempts that failed (refused, bad credentials, ...)
    connected: bool
    # connects refused for the credential (CONNACK), and publishes (PUBACK 0x86/0x87) once
    # their refusals lasted the grace (then the agent enrolls again)
    credential_refusals: int = 0
    publish_refusals: int = 0  # publishes the broker answered with a failure reason code
    beats: int = 0  # beats published (QoS 0: handed to the connection)


class ReportPublisher:
    """Owns the MQTT connection of one (validation, node); see the module docstring."""

    def __init__(
        self,
        settings: MqttSettings,
        validation: str,
        node: str,
        *,
        keepalive: int = 30,
        timeout: float = 10.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        stop_timeout: float = 5.0,
        publish_refusal_grace: float = PUBLISH_REFUSAL_GRACE,
        subscriptions: Sequence[str] = (),
        on_message: MessageHandler | None = None,
        rng: random.Random | None = None,
        tracer: Tracer | None = None,
        full_every: int = 1,
    ) -> None:
        if keepalive < 1 or timeout <= 0 or stop_timeout <= 0:
            raise ValueError("keepalive, timeout and stop_timeout must be positive")
        if backoff_base <= 0 or backoff_cap < backoff_base:
            raise ValueError("need 0 < backoff_base <= backoff_cap")
        if subscriptions and on_message is None:
            raise ValueError("subscriptions need an on_message handler")
        self._settings = settings
        self.validation = validation
        self.node = node
        self.prefix = topic_prefix(validation, node)
        self.report_topic = f"{self.prefix}/{REPORT}"
        self.state_topic = f"{self.prefix}/{STATE}"
        self.beat_topic = f"{self.prefix}/{BEAT}"
        # 1 (the default here): every report in full; `netval agent` sets spec.report.fullEvery
        self._cadence = ReportCadence(full_every=full_every)
        self._keepalive = keepalive
        self._timeout = timeout
        # the reconnect rule of every netval MQTT connection: jittered exponential backoff,
        # reset after a session that held, CONNACK refusals of the credential told apart
        self._reconnect = ReconnectRule(
            ReconnectPolicy(backoff_base, backoff_cap, _STABLE_AFTER),
            rng=rng,
            refused=credential_refused,
        )
        self._stop_timeout = stop_timeout
        self._subscriptions = tuple(subscriptions)
        self._on_message = on_message
        # built once per credential, not per reconnect (`settings` setter)
        self._tls_context = settings.ssl_context()
        # PRODUCER spans for report publishes (none without a tracer: a no-op one)
        self._tracer = tracer or trace.NoOpTracer()

        self._pending: Report | None = None  # the single slot
        self._pending_beat: Beat | None = None  # the newest unsent beat (after the report)
        # retained extras (endpoint) and one-shot messages (load-test results)
        self._extras = ExtraTopics(self.prefix)
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

        self._published = 0
        self._beats = 0
        self._sessions = 0  # connections made so far
        self._publish_failures = 0
        self._replaced = 0
        self._reconnects = 0
        self._attempts = 0
        self._login: Login = (None, None, None)  # of the current attempt
        self._connect_failures = 0
        self._credential_refusals = 0
        self._publish_refusals = PublishRefusals(publish_refusal_grace)
        # the login of the last connect the broker refused for the credential; None once a
        # connect succeeds (netval.agent.enroll re-enrolls on it, nothing else)
        self._refused: Login | None = None
        self._connected = False

    @property
    def settings(self) -> MqttSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: MqttSettings) -> None:
        """A new credential (enrollment): used from the next connect; the TLS context is
        built again when it carries a client certificate."""
        if settings.tls and (
            settings.identity is not self._settings.identity
            or settings.cert_file != self._settings.cert_file
        ):
            self._tls_context = settings.ssl_context()
        self._settings = settings

    @property
    def login(self) -> Login:
        return login_of(self._settings)

    # ---- counters -------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """True between a successful connect (``online`` acknowledged) and its loss."""
        return self._connected

    @property
    def published(self) -> int:
        return self._published

    @property
    def beats(self) -> int:
        return self._beats

    @property
    def full_every(self) -> int:
        return self._cadence.full_every

    @full_every.setter
    def full_every(self, cycles: int) -> None:
        """spec.report.fullEvery, again after a config reload."""
        self._cadence.full_every = cycles

    @property
    def publish_failures(self) -> int:
        return self._publish_failures

    @property
    def replaced(self) -> int:
        return self._replaced

    @property
    def reconnects(self) -> int:
        return self._reconnects

    @property
    def connect_failures(self) -> int:
        return self._connect_failures

    def refused(self, login: Login) -> bool:
        """The last connect with this login was refused for the credential (CONNACK
        0x86/0x87, v3 rc 4/5, a TLS alert about the client certificate) and none succeeded
        since, or a publish with it was (PUBACK 0x86/0x87) and none succeeded since (a
        reconnect does not clear that: the broker takes the connection and refuses the
        publish again)."""
        return (not self._connected and self._refused == login) or self._publish_refusals.asks(
            login
        )

    @property
    def running(self) -> bool:
        """The connection task is alive (started, not stopped, not crashed)."""
        return self._task is not None and not self._task.done()

    @property
    def has_pending(self) -> bool:
        """A report (or a beat) waits in the slot (not yet acknowledged by the broker)."""
        return self._pending is not None or self._pending_beat is not None

    def stats(self) -> PublisherStats:
        return PublisherStats(
            published=self._published,
            publish_failures=self._publish_failures,
            replaced=self._replaced,
            reconnects=self._reconnects,
            connect_failures=self._connect_failures,
            connected=self._connected,
            credential_refusals=self._credential_refusals
            + self._publish_refusals.credential_refusals,
            publish_refusals=self._publish_refusals.refusals,
            beats=self._beats,
        )

    # ---- public API -----------------------------------------------------------------
    async def start(self) -> None:
        """Start the connection task; returns at once (the connection comes up in the
        background, ``connected`` tells when)."""
        if self._task is not None:
            raise RuntimeError("ReportPublisher already started")
        self._task = asyncio.create_task(self._run(), name=f"mqtt-publisher {self.prefix}")

    async def publish(self, report: Report) -> None:
        """Put ``report`` in the slot for sending; never blocks on the network."""
        self.publish_nowait(report)

    def publish_nowait(self, report: Report) -> None:
        """The cycle's report goes out in full, or as a beat when it matches the standing
        one (`ReportCadence`)."""
        if report.validation != self.validation or report.node != self.node:
            raise ValueError(
                f"report for {report.validation}/{report.node} given to the publisher of "
                f"{self.validation}/{self.node}"
            )
        beat = self._cadence.next(report, session=self._sessions)
        if beat is not None:
            self._pending_beat = beat  # an unsent older beat is simply superseded
        else:
            if self._pending is not None:
                self._replaced += 1
            self._pending = report
            self._pending_beat = None  # it spoke for the report this one replaces
        self._wakeup.set()

    def publish_retained(self, topic_suffix: str, payload: bytes) -> None:
        """Publish ``payload`` retained (QoS 1) on ``<prefix>/<topic_suffix>`` now or on the
        next connect, and again on every reconnect. Only the latest payload per suffix is
        kept. ``report`` and ``state`` are owned by the publisher."""
        self._extras.retain(topic_suffix, payload)
        self._wakeup.set()

    def publish_message(self, topic_suffix: str, payload: bytes) -> None:
        """Publish ``payload`` once (QoS 1, not retained) on ``<prefix>/<topic_suffix>``, now
        or after the next connect (`publish_extras.MAX_QUEUED_MESSAGES` wait at most)."""
        self._extras.send_once(topic_suffix, payload)
        self._wakeup.set()

    async def stop(self) -> None:
        """Send the pending report, publish ``offline`` (retained), disconnect cleanly.

        Bounded by ``stop_timeout``: past it the task is cancelled. When the broker is not
        reachable nothing is sent; the broker has then already published the will, or
        (restarted without persistence) holds no state for this node.
        """
        task = self._task
        if task is None or task.done():
            self._connected = False
            return
        self._stopping = True
        self._wakeup.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), self._stop_timeout)
        except TimeoutError:
            log.warning("MQTT publisher %s: clean stop timed out; cancelling", self.prefix)
            await cancel_and_wait([task])
        finally:
            self._connected = False

    async def __aenter__(self) -> ReportPublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ---- the connection task --------------------------------------------------------
    def _client(self) -> aiomqtt.Client:
        return make_client(
            self.settings,
            keepalive=self._keepalive,
            timeout=self._timeout,
            will=Will(self.state_topic, OFFLINE, qos=1, retain=True),
            tls_context=self._tls_context,
        )

    async def _run(self) -> None:
        await reconnect_loop(
            self._attempt,
            self._reconnect,
            on_end=self._ended,
            stopping=lambda: self._stopping,
            pause=self._pause,
        )

    async def _attempt(self) -> None:
        if self._attempts:
            self._reconnects += 1
        self._attempts += 1
        self._login = login_of(self.settings)
        await self._session()

    def _ended(self, end: SessionEnd) -> None:
        """Counters and logs of a session's end (`reconnect_loop`); the backoff, its reset
        after a stable session included, is the shared rule's."""
        self._connected = False
        exc = end.error
        if exc is None:
            return  # a clean stop
        if not isinstance(exc, MqttError):
            # a paho or TLS surprise must not kill the task silently either
            log.error("MQTT %s: unexpected error", self.settings.url, exc_info=exc)
        elif end.connected:
            log.warning("MQTT %s: connection lost: %s", self.settings.url, exc)
        else:
            level = logging.WARNING if end.failures == 1 else logging.DEBUG
            log.log(level, "MQTT %s: cannot connect: %s", self.settings.url, exc)
        if not end.connected:
            self._connect_failures += 1
            if end.refused:
                self._credential_refusals += 1
                self._refused = self._login

    async def _pause(self, delay: float) -> None:
        """Sleep, but wake at once for stop(); new reports just wait in the slot."""
        stop_wait = asyncio.create_task(self._wait_stopping())
        try:
            await asyncio.wait({stop_wait}, timeout=delay)
        finally:
            stop_wait.cancel()

    async def _wait_stopping(self) -> None:
        while not self._stopping:
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _session(self) -> None:
        """One connection: returns after a clean stop, raises MqttError when it breaks."""
        client = self._client()
        async with client:
            try:
                await client.publish(self.state_topic, ONLINE, qos=1, retain=True)
            except PublishRefused as exc:
                self._refused_publish(exc)
                raise
            for topic in self._subscriptions:
                granted = await client.subscribe(topic, qos=1)
                # MQTT v5 SUBACK carries a reason code per filter; >= 0x80 is a refusal
                # (e.g. an ACL), which aiomqtt returns instead of raising.
                if any(getattr(code, "is_failure", False) for code in granted):
                    log.warning(
                        "MQTT %s: subscription to %s refused: %s", self.settings.url, topic, granted
                    )
            self._extras.connected()
            self._sessions += 1
            self._refused = None
            self._connected = True
            self._reconnect.connected()
            log.info("MQTT %s: connected as %s", self.settings.url, self.prefix)
            watcher = asyncio.create_task(self._watch(client))
            try:
                while True:
                    self._wakeup.clear()
                    await self._flush(client)
                    if self._stopping:
                        break
                    waiter = asyncio.create_task(self._wakeup.wait())
                    try:
                        await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        waiter.cancel()
                    if watcher.done():
                        watcher.result()  # re-raises the MqttError of the lost connection
                        raise MqttError("connection closed")
                await client.publish(self.state_topic, OFFLINE, qos=1, retain=True)
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, MqttError):
                    await watcher
            self._connected = False
            # leaving the context sends DISCONNECT (reason 0): the broker drops the will

    async def _watch(self, client: aiomqtt.Client) -> None:
        """Ends with MqttError when the connection drops; dispatches subscribed messages."""
        async for message in client.messages:
            if self._on_message is None:
                continue
            try:
                self._on_message(message)
            except Exception:
                log.exception("MQTT message handler failed for %s", message.topic)

    async def _flush(self, client: aiomqtt.Client) -> None:
        report = self._pending
        if report is not None:
            self._pending = None
            payload = report.to_json().encode()
            if len(payload) > MAX_REPORT_BYTES:
                # the operator would drop it and the broker ends the session of a packet
                # this size: sent, it would be retried forever; the next report may fit
                self._publish_failures += 1
                log.error("report of %d bytes not sent: the limit is %d (results too many or"
                          " too large)", len(payload), MAX_REPORT_BYTES)  # fmt: skip
                report = None
                self._cadence.forget()  # no beat may vouch for it
                self._pending_beat = None
        if report is not None:
            try:
                with publish_span(
                    self._tracer,
                    self.report_topic,
                    body_size=len(payload),
                    client_id=self.settings.client_id,
                    parent_traceparent=report.traceparent,
                ) as span:
                    await client.publish(
                        self.report_topic,
                        payload,
                        qos=1,
                        retain=True,
                        properties=trace_properties(span),
                    )
            except MqttError as exc:
                self._publish_failures += 1
                if isinstance(exc, PublishRefused):
                    self._refused_publish(exc)
                if self._pending is None:
                    self._pending = report  # retry after reconnect
                else:
                    self._replaced += 1  # a newer one arrived meanwhile
                raise
            self._published += 1
            self._publish_refusals.taken()
            if self._pending is None:  # else a newer full report is the standing one
                self._cadence.sent(self._sessions)
        beat = self._pending_beat
        if beat is not None:
            self._pending_beat = None
            # QoS 0: a lost beat costs one interval of freshness (a node turns stale after
            # three), while QoS 1 would double the packets per beat (PUBACK) and keep it in
            # flight; retained: an operator that (re)subscribes learns the node is current
            # without waiting for its next cycle.
            await client.publish(self.beat_topic, beat.to_json().encode(), qos=0, retain=True)
            self._beats += 1
        await self._extras.flush(client, self._refused_publish)

    def _refused_publish(self, exc: PublishRefused) -> None:
        """The broker did not take a publish: counted as refused, never as published; the
        session ends (the caller raises) and is retried with backoff. Whether it asks for a
        new credential: `PublishRefusals`."""
        log.warning("MQTT %s: %s", self.settings.url, exc)
        self._publish_refusals.refused(exc.reason, login_of(self.settings))


def login_of(settings: MqttSettings) -> Login:
    """What the broker knows these settings by (a credential refused is refused for it)."""
    cert = settings.identity.pem()[0] if settings.identity is not None else None
    return settings.username, settings.password, cert
