"""MQTT connection pieces shared by agent and operator: the client as both build it, the one
reconnect rule every connection follows (`ReconnectRule`, `reconnect_loop`: capped
exponential backoff with full jitter, reset by a session that held, refusals of the
credential told apart), and connect errors explained (a TLS refusal says which check failed
and what to change)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Self

import aiomqtt
import paho.mqtt.client as paho
from aiomqtt import MqttError, ProtocolVersion, Will
from aiomqtt.exceptions import MqttConnectError

from netval.infra.mqtt_settings import ENV_CA_FILE, MqttSettings

__all__ = [
    "OPERATOR_RECONNECT",
    "CertificateRefused",
    "NetvalMqttClient",
    "PublishRefused",
    "ReconnectPolicy",
    "ReconnectRule",
    "SessionEnd",
    "backoff_delay",
    "credential_refused",
    "explain_connect_error",
    "make_client",
    "reconnect_loop",
]

log = logging.getLogger(__name__)
_warned_plaintext: set[str] = set()
# CONNACKs that refuse the credential: MQTT v5 0x86 (bad user name or password) and 0x87
# (not authorized), MQTT 3.1.1 return codes 4 and 5
V5_REFUSALS: Final = frozenset({0x86, 0x87})
V3_REFUSALS: Final = frozenset({4, 5})
# TLS alerts a broker sends when it does not accept this client's certificate (OpenSSL's
# words, as an SSLError's message has them): expired, not signed by a CA it trusts, none
# given, revoked. Not "certificate verify failed": that is this client refusing the broker's.
CERTIFICATE_ALERTS: Final = (
    "alert certificate expired",
    "alert unknown ca",
    "alert bad certificate",
    "alert certificate required",
    "alert certificate revoked",
    "alert certificate unknown",
    "alert unsupported certificate",
    "alert access denied",
)
# The message id of the publish this task just handed to paho: aiomqtt does not return it.
_last_mid: contextvars.ContextVar[int | None] = contextvars.ContextVar("mid", default=None)


class PublishRefused(MqttError):
    """The broker answered a QoS 1 publish with a failure reason code (MQTT 5 PUBACK >= 0x80,
    e.g. 0x87 not authorized): it did not take the message. aiomqtt returns as if it had."""

    def __init__(self, topic: str, reason: int) -> None:
        super().__init__(f"the broker refused the publish to {topic}: reason code {reason:#04x}")
        self.topic = topic
        self.reason = reason


class CertificateRefused(MqttError):
    """The broker ended the TLS session with an alert about this client's certificate
    (expired, unknown CA, none given): with a client-certificate identity, a refusal of the
    credential, like a CONNACK 0x86."""


def certificate_alert(error: str) -> str | None:
    """The certificate alert `error` (an SSLError's text) reports, if any."""
    lowered = error.lower()
    return next((a for a in CERTIFICATE_ALERTS if a in lowered), None)


def explain_connect_error(error: str, settings: MqttSettings) -> str:
    """A connect failure in words an operator can act on; `error` as aiomqtt gave it."""
    if not settings.tls:
        return error
    trust = f"{ENV_CA_FILE}={settings.ca_file}" if settings.ca_file else "the system trust store"
    lowered = error.lower()
    alert = certificate_alert(error)
    if alert is not None:
        return (
            f"TLS to {settings.url} refused: the broker does not accept this client's "
            f"certificate ({alert.removeprefix('alert ')}): it enrolls again"
        )
    if "hostname mismatch" in lowered or "ip address mismatch" in lowered:
        why = (
            f"the broker's certificate is not valid for {settings.host!r} (host names are "
            "always verified): connect by a name the certificate carries, or reissue it"
        )
    elif "certificate has expired" in lowered:
        why = "the broker's certificate has expired"
    elif "certificate verify failed" in lowered:
        why = f"the broker's certificate is not signed by a CA in {trust}"
    elif any(
        sign in lowered
        for sign in ("wrong version number", "record layer", "eof", "connection reset")
    ):  # a plaintext listener hangs up on the ClientHello
        why = "the TLS handshake failed: does the broker listen with TLS on this port?"
    else:
        return error
    return f"TLS to {settings.url} refused: {why} ({error})"


class NetvalMqttClient(aiomqtt.Client):
    """aiomqtt's client, whose connect errors say what failed (`explain_connect_error`)."""

    def __init__(self, settings: MqttSettings, **kwargs: object) -> None:
        super().__init__(settings.host, settings.port, **kwargs)  # type: ignore[arg-type]
        self._netval_settings = settings
        # mid -> failure reason code, until its publish reads it (a PUBACK after a cancelled
        # publish stays: message ids are 16-bit, so at most 65,535 entries)
        self._refused_mids: dict[int, int] = {}
        paho_publish = self._client.publish

        def publish(*args: Any, **kwargs: Any) -> Any:
            info = paho_publish(*args, **kwargs)
            _last_mid.set(info.mid)
            return info

        self._client.publish = publish  # type: ignore[method-assign]
        self._last_error: str | None = None  # paho's last error log line (a TLS alert)
        self._client.on_log = self._on_log

    def _on_log(self, client: Any, userdata: Any, level: int, buf: str) -> None:
        if level == paho.MQTT_LOG_ERR:
            self._last_error = buf

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any = None) -> None:  # fmt: skip
        """A connection lost before its CONNACK ends the connect at once (aiomqtt waits for
        its timeout): with TLS 1.3 a broker refuses a client certificate after the client's
        side of the handshake, with an alert read as the first bytes, which paho only logs."""
        connected = self._connected
        if not connected.done():
            error = self._last_error or f"connection lost before CONNACK ({reason_code})"
            alert = certificate_alert(error)
            exc: MqttError = CertificateRefused(error) if alert else MqttError(error)
            connected.set_exception(exc)
            return
        super()._on_disconnect(client, userdata, flags, reason_code, properties)

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any,
                    properties: Any) -> None:  # fmt: skip
        value = getattr(reason_code, "value", None)
        if isinstance(value, int) and value >= 0x80:
            self._refused_mids[mid] = value
        super()._on_publish(client, userdata, mid, reason_code, properties)

    async def publish(self, topic: str, *args: Any, **kwargs: Any) -> None:
        """aiomqtt's publish, raising `PublishRefused` when the PUBACK carries a failure."""
        _last_mid.set(None)
        try:
            await super().publish(topic, *args, **kwargs)
        finally:
            mid = _last_mid.get()
            reason = self._refused_mids.pop(mid, None) if mid is not None else None
        if reason is not None:
            raise PublishRefused(topic, reason)

    async def __aenter__(self) -> Self:
        try:
            return await super().__aenter__()
        except MqttError as exc:
            explained = explain_connect_error(str(exc), self._netval_settings)
            if explained == str(exc):
                raise
            if isinstance(exc, CertificateRefused) or certificate_alert(str(exc)):
                raise CertificateRefused(explained) from None
            raise MqttError(explained) from None


def make_client(
    settings: MqttSettings,
    *,
    keepalive: int,
    timeout: float = 10.0,
    will: Will | None = None,
    tls_context: ssl.SSLContext | None = None,
) -> aiomqtt.Client:
    """An MQTT v5 client for `settings` (must be called with an event loop running).

    `tls_context` (build it once with `settings.ssl_context()`) is required for mqtts://: a
    TLS URL never connects in plaintext."""
    if settings.tls and tls_context is None:
        raise ValueError(f"{settings.url}: TLS settings without a TLS context")
    if not settings.tls and settings.url not in _warned_plaintext:
        # Configured explicitly (the scheme says so), but never silently: once per process
        # and broker, when the first connection is made (not at start, where a bad setting
        # must stay the one line printed).
        _warned_plaintext.add(settings.url)
        log.warning(
            "%s is plaintext MQTT: the password and every report cross the network "
            'unencrypted; use mqtts:// (docs/operations.md "Broker TLS")',
            settings.url,
        )
    return NetvalMqttClient(
        settings,
        username=settings.username,
        password=settings.password,
        identifier=settings.client_id,
        protocol=ProtocolVersion.V5 if settings.protocol == "5" else ProtocolVersion.V311,
        will=will,
        keepalive=keepalive,
        timeout=timeout,
        tls_context=tls_context,
    )


def backoff_delay(failures: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(failures-1))], so a fleet of agents that
    lost the broker together does not come back together."""
    ceiling = min(cap, base * 2 ** min(max(failures, 1) - 1, 30))
    return rng.uniform(0, ceiling)


def credential_refused(exc: BaseException) -> bool:
    """True when `exc` is a CONNACK refusing the user name/password or the client, or a TLS
    alert refusing the client's certificate. Nothing else (DNS, TCP refused, a broker
    certificate this client does not trust, a timeout, a restarting broker, "server
    unavailable") says anything about the credential."""
    if isinstance(exc, CertificateRefused):
        return True
    if not isinstance(exc, MqttConnectError):
        return False
    rc = exc.rc
    if isinstance(rc, int):  # MQTT 3.1.1: a bare return code
        return rc in V3_REFUSALS
    value = getattr(rc, "value", None)  # MQTT v5: paho's ReasonCode
    return isinstance(value, int) and value in V5_REFUSALS


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """Delays before the next connect: full jitter up to `base * 2**(failures-1)`, at most
    `cap`; a session that stayed up `stable_after` seconds starts the count over (a broker
    restart after a quiet week is retried at once, a broker that accepts and then drops the
    client at once, e.g. a client-id takeover fight, is not hammered at the base delay).

    The default is the fleet's: thousands of agents that lost the broker together spread
    their returns over up to 30 s. `immediate`: the first attempt after a session ended goes
    at once (no jitter): what one client (the operator) wants, which must be back before
    the fleet it listens to (`OPERATOR_RECONNECT`)."""

    base: float = 0.5
    cap: float = 30.0
    stable_after: float = 10.0
    immediate: bool = False

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap < self.base or self.stable_after < 0:
            raise ValueError("need 0 < base <= cap and stable_after >= 0")


# The operator's sessions (ingest, one per shard): at once, then 0.25 s doubling to 2 s. One
# client, not thousands: no herd to spread, and every second it is away its nodes' silence
# grows; behind the fleet's 30 s ceiling it would come back after the agents it waits for.
OPERATOR_RECONNECT: Final = ReconnectPolicy(base=0.25, cap=2.0, immediate=True)


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """How one session ended, as `ReconnectRule.ended` judged it."""

    error: BaseException | None  # None: the session returned
    connected: bool  # it had connected (`ReconnectRule.connected`)
    refused: bool  # the refusal hook says the broker refused the credential
    reset: bool  # it held `stable_after`: the backoff started over
    failures: int  # ends in a row since the last reset, this one included
    delay: float  # seconds before the next attempt


class ReconnectRule:
    """The reconnect rule of every MQTT connection of netval (agent publisher, operator
    ingest, the broker ACL check's sessions). Pure: the session calls `connected()` once up, and
    `ended(error)` says what the end means and how long to wait; `clock` and `rng` are
    injected (tests use a fake clock and a seeded RNG)."""

    def __init__(
        self,
        policy: ReconnectPolicy,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        refused: Callable[[BaseException], bool] = credential_refused,
    ) -> None:
        self.policy = policy
        self.rng = rng or random.Random()  # noqa: S311 - jitter
        self.clock = clock
        self.refused = refused
        self.failures = 0
        self._up_since: float | None = None

    def connected(self) -> None:
        self._up_since = self.clock()

    def ended(self, error: BaseException | None) -> SessionEnd:
        up, self._up_since = self._up_since, None
        reset = up is not None and self.clock() - up >= self.policy.stable_after
        if reset:
            self.failures = 0
        self.failures += 1
        p = self.policy
        if p.immediate:
            # at once, then the backoff (its first step is the base): one attempt early
            delay = (
                0.0
                if self.failures == 1
                else backoff_delay(self.failures - 1, base=p.base, cap=p.cap, rng=self.rng)
            )
        else:
            delay = backoff_delay(self.failures, base=p.base, cap=p.cap, rng=self.rng)
        return SessionEnd(
            error=error,
            connected=up is not None,
            refused=error is not None and self.refused(error),
            reset=reset,
            failures=self.failures,
            delay=delay,
        )


async def reconnect_loop(
    session: Callable[[], Awaitable[None]],
    rule: ReconnectRule,
    *,
    on_end: Callable[[SessionEnd], None],
    stopping: Callable[[], bool] = lambda: False,
    pause: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """`session()` again and again, until cancelled or `stopping()`: each end (an error, or
    a return) goes to `on_end` (logs, counters), then `pause(delay)` (the rule's delay;
    a caller with a stop signal passes a pause that wakes for it). Any exception ends a
    session, not the loop: an unexpected one must not kill a connection silently."""
    while not stopping():
        error: BaseException | None = None
        try:
            await session()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc
        end = rule.ended(error)
        on_end(end)
        if stopping():
            return
        await pause(end.delay)
