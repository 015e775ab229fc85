"""Does the broker enforce netval's topic ACL, on every topic kind, in both directions? A
probe identity tries to speak for a node it does not own and to read what is meant for that
node, and an observer (the operator's own login, which may read every netval topic) checks
what actually got through.

netval's ACL (docs/operations.md "Broker ACL"): a node publishes only its own `report`,
`beat`, `endpoint`, `loadresult` and `state` (its last will included) and reads only its own
`assignment` and `loadplan`. The probe, as one identity, against a victim node it does not
own (`PROBE_VALIDATION`/`PROBE_NODE`, reserved names no Kubernetes object can have):

- **publish**: a non-retained QoS 1 message to each of the victim's five topics;
- **will**: a connection whose last will is the victim's `state`, dropped without DISCONNECT;
- **read**: a subscription to the victim's `assignment` and `loadplan`, to which the
  observer then publishes.

How an outcome is read: a failure reason code (MQTT 5 PUBACK/SUBACK >= 0x80, Mosquitto's
0x87) or a broker that closes the connection (RabbitMQ) is `refused`; a message the other
side received is `accepted` (a violation). Delivery decides, not the acknowledgement: a
broker that acknowledges and drops (Mosquitto with MQTT 3.1.1) is `dropped`, enforced. To
know that a message did not arrive without waiting on a clock, each batch is followed by a
fence the identity may send (`own`: the probe identity's own node topics): in-order delivery
from one client to one subscriber means a fence received without the probe message before
it is a drop. The fence is also the positive control: an identity whose own topics do not
get through proves nothing (`unconfirmed`). Without an observer (`netval doctor` with a
node's login only) the acknowledgements are all there is, and an acknowledged publish counts
as accepted, as a broker that drops silently cannot be told apart; reads and the will are
judged only with an observer.

`AclProbe.verdict` is the one reading of a probe: `netval doctor` (broker.acl) and the
operator's start check (`operator.broker_check`) both report it. Blocking (paho's network
loops in threads); call it from a worker thread in async code.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from netval.infra.mqtt_settings import MqttSettings

__all__ = [
    "PROBER_NODE",
    "PROBE_NODE",
    "PROBE_VALIDATION",
    "PUBLISH_KINDS",
    "READ_KINDS",
    "AclProbe",
    "AclVerdict",
    "Outcome",
    "probe_broker_acl",
]

# Reserved: a NetworkValidation is a DNS-1123 name and so is a node, so a leading "_" can
# name neither; agents and the operator drop what arrives on these topics.
PROBE_VALIDATION: Final = "_netval-acl-probe"
PROBE_NODE: Final = "_netval-acl-probe-node"  # the node the probe speaks for (the victim)
PROBER_NODE: Final = "_netval-acl-prober"  # the probe identity's own node (per-node identity)
PUBLISH_KINDS: Final = ("report", "beat", "endpoint", "loadresult", "state")
READ_KINDS: Final = ("assignment", "loadplan")
WILL: Final = "will state"


class Outcome(StrEnum):
    REFUSED = "refused"  # a failure reason code, or the broker closed the connection
    DROPPED = "dropped"  # acknowledged, never delivered (the fence after it was)
    ACCEPTED = "accepted"  # delivered: the identity can do it
    UNKNOWN = "unknown"  # no answer, no fence: the probe cannot tell


class AclVerdict(StrEnum):
    ENFORCED = "enforced"  # every attempt refused or dropped, the identity's own topics work
    VIOLATED = "violated"  # at least one got through: the identity can speak for another node
    UNCONFIRMED = "unconfirmed"  # none got through, but some could not be told
    UNCHECKED = "unchecked"  # the probe could not run (`AclProbe.error` says why)


@dataclass
class AclProbe:
    """What the broker did with each attempt (`publish report`, `read assignment`,
    `will state`, ...), or why the probe could not run."""

    identity: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    error: str | None = None
    control: bool | None = None  # the identity's own topics got through (None: not tried)

    @property
    def violations(self) -> list[str]:
        return [t for t, o in self.outcomes.items() if o is Outcome.ACCEPTED]

    @property
    def unacknowledged(self) -> list[str]:
        return [t for t, o in self.outcomes.items() if o is Outcome.UNKNOWN]

    @property
    def verdict(self) -> AclVerdict:
        if self.error is not None:
            return AclVerdict.UNCHECKED
        if self.violations:
            return AclVerdict.VIOLATED
        if self.unacknowledged or not self.outcomes or self.control is False:
            return AclVerdict.UNCONFIRMED
        return AclVerdict.ENFORCED


def node_topic(validation: str, node: str, kind: str) -> str:
    return f"netval/v1/{validation}/{node}/{kind}"


class _Link:
    """One paho connection: CONNACK, acknowledgements, messages received, the end."""

    def __init__(self, settings: MqttSettings, tls: ssl.SSLContext | None, client_id: str,
                 will: tuple[str, bytes] | None = None) -> None:  # fmt: skip
        v5 = settings.protocol == "5"
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
        )
        if settings.username is not None:
            self.client.username_pw_set(settings.username, settings.password)
        if settings.tls:
            if tls is None:
                raise ValueError(f"{settings.url}: TLS settings without a TLS context")
            self.client.tls_set_context(tls)
        if will is not None:
            self.client.will_set(will[0], will[1], qos=1, retain=False)
        self.settings = settings
        self.changed = threading.Condition()
        self.connack: Any = None
        self.acks: dict[int, Any] = {}
        self.subacks: dict[int, list[Any]] = {}
        self.received: list[tuple[str, bytes]] = []
        self.lost = False
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.on_disconnect = self._on_disconnect

    def _note(self, update: Callable[[], None]) -> None:
        with self.changed:
            update()
            self.changed.notify_all()

    def _on_connect(self, _c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        self._note(lambda: setattr(self, "connack", reason))

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        self._note(lambda: self.acks.__setitem__(mid, reason))

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, reasons: Any, _p: Any) -> None:
        self._note(lambda: self.subacks.__setitem__(mid, list(reasons)))

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        self._note(lambda: self.received.append((message.topic, bytes(message.payload))))

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, _r: Any, _p: Any) -> None:
        self._note(lambda: setattr(self, "lost", True))

    def wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: condition() or self.lost, timeout) and (
                condition()
            )

    def open(self, timeout: float) -> str | None:
        """Connect; None, or why it failed."""
        try:
            self.client.connect(
                self.settings.host, self.settings.port, keepalive=max(int(timeout) * 2, 10)
            )
        except (OSError, ValueError) as exc:
            return f"cannot connect to {self.settings.url}: {exc}"
        self.client.loop_start()
        if not self.wait(lambda: self.connack is not None, timeout):
            self.close()
            return f"no CONNACK from {self.settings.url} within {timeout:g} s"
        if self.connack.is_failure:
            self.close()
            return f"login refused: {self.connack}"
        return None

    def subscribe(self, topic: str, timeout: float) -> Outcome | None:
        """REFUSED on a failure SUBACK or a closed connection, UNKNOWN without an answer,
        None when granted (delivery then decides)."""
        _, sent = self.client.subscribe(topic, qos=1)
        mid = int(sent or 0)
        if not self.wait(lambda: mid in self.subacks, timeout):
            return Outcome.REFUSED if self.lost else Outcome.UNKNOWN
        return Outcome.REFUSED if any(r.is_failure for r in self.subacks[mid]) else None

    def publish(self, topic: str, payload: bytes) -> int:
        return int(self.client.publish(topic, payload, qos=1, retain=False).mid)

    def got(self, topic: str, payload: bytes) -> bool:
        return (topic, payload) in self.received

    def drop(self) -> None:
        """Lose the connection without DISCONNECT (as a crash would): the will fires."""
        sock = self.client.socket()
        self.client.loop_stop()
        if isinstance(sock, socket.socket | ssl.SSLSocket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()


@dataclass
class _Run:
    probe: MqttSettings
    probe_tls: ssl.SSLContext | None
    observer: MqttSettings | None
    observer_tls: ssl.SSLContext | None
    own: tuple[str, str] | None
    victim: tuple[str, str]
    timeout: float
    client_id: str
    marker: bytes = field(default_factory=lambda: secrets.token_hex(8).encode())

    def victim_topic(self, kind: str) -> str:
        return node_topic(*self.victim, kind)

    def own_topic(self, kind: str) -> str | None:
        return node_topic(*self.own, kind) if self.own is not None else None

    def payload(self, what: str) -> bytes:
        return (
            b"netval broker ACL probe (should have been refused): "
            + what.encode()
            + (b" " + self.marker)
        )

    def link(self, will: tuple[str, bytes] | None = None) -> tuple[_Link, str | None]:
        link = _Link(self.probe, self.probe_tls, self.client_id, will)
        return link, link.open(self.timeout)


def probe_broker_acl(
    probe: MqttSettings,
    tls_context: ssl.SSLContext | None,
    *,
    observer: MqttSettings | None = None,
    observer_tls: ssl.SSLContext | None = None,
    own: tuple[str, str] | None = None,
    victim: tuple[str, str] = (PROBE_VALIDATION, PROBE_NODE),
    timeout: float = 5.0,
    exact_client_id: bool = False,
) -> AclProbe:
    """Probe `probe`'s identity against `victim`'s topics (see the module docstring).

    `own`: the (validation, node) the identity owns, for the fences and the positive
    control; `observer`: a login that reads every netval topic and may publish
    assignments and plans. Never raises for broker or network trouble: `AclProbe.error`
    says what went wrong."""
    identity = probe.username or ("(client certificate)" if probe.identity else "(anonymous)")
    result = AclProbe(identity)
    client_id = (
        probe.client_id or "" if exact_client_id else f"{probe.client_id or 'netval'}-acl-probe"
    )
    run = _Run(probe, tls_context, observer, observer_tls, own, victim, timeout, client_id)
    watcher: _Link | None = None
    if observer is not None:
        # a login's session: a client id of its own (never the ingest's); a certificate
        # identity's: its own (the broker binds it anyway)
        watcher_id = (
            observer.client_id or "netval"
            if observer.identity is not None
            else f"{observer.client_id or 'netval'}-acl-observer"
        )
        watcher = _Link(observer, observer_tls, watcher_id)
        error = watcher.open(timeout)
        if error is not None:
            result.error = f"the observer: {error}"
            return result
    try:
        if watcher is not None:
            for target in (victim, own):
                if (
                    target is not None
                    and watcher.subscribe(node_topic(*target, "#"), timeout) is not None
                ):
                    result.error = "the observer cannot subscribe to the probe's topics"
                    return result
        error = _publish(run, watcher, result)
        if error is None:
            error = _read(run, watcher, result)
        if error is None:
            _will(run, watcher, result)
        result.error = error
    finally:
        if watcher is not None:
            watcher.close()
    return result


def _all_delivered(watcher: _Link, markers: list[tuple[str, bytes]], timeout: float) -> bool:
    return watcher.wait(lambda: all(watcher.got(*m) for m in markers), timeout)


def _acked(link: _Link, mid: int, timeout: float) -> bool:
    return link.wait(lambda: mid in link.acks, timeout)


def _publish(run: _Run, watcher: _Link | None, result: AclProbe) -> str | None:
    """Each publish kind on the victim's topics, then the fence on the identity's own report.
    A broker that closes the connection on a refused publish (RabbitMQ) gets a new one; the
    fence, sent last, follows every message acknowledged on an earlier connection too."""
    fence_topic, fence = run.own_topic("report"), run.payload("fence")
    pending = list(PUBLISH_KINDS)
    sent: dict[str, tuple[_Link, int]] = {}
    fenced: bool | None = None
    attempts = 0
    while pending or fenced is None:
        attempts += 1
        if attempts > len(PUBLISH_KINDS) + 2:
            return "the broker keeps closing the probe's connections"
        link, error = run.link()
        if error is not None:
            return error
        try:
            while pending:
                kind = pending.pop(0)
                mid = link.publish(run.victim_topic(kind), run.payload(kind))
                sent[kind] = (link, mid)
                if not _acked(link, mid, run.timeout) and link.lost:
                    break  # closed for it: refused; go on with a new connection
            if pending or link.lost:
                continue
            fenced = False
            if fence_topic is not None and watcher is not None:
                link.publish(fence_topic, fence)
                fenced = watcher.wait(lambda: watcher.got(fence_topic, fence), run.timeout)
                result.control = fenced
            elif watcher is not None:  # no topic of its own: the timeout is the fence
                _all_delivered(watcher, [(run.victim_topic(k), run.payload(k)) for k in sent],
                               run.timeout)  # fmt: skip
                fenced = True
        finally:
            link.close()
    for kind, (sender, mid) in sent.items():
        topic, payload = run.victim_topic(kind), run.payload(kind)
        ack = sender.acks.get(mid)
        if watcher is not None and watcher.got(topic, payload):
            outcome = Outcome.ACCEPTED
        elif ack is not None and ack.is_failure:
            outcome = Outcome.REFUSED
        elif ack is None:
            outcome = Outcome.REFUSED if sender.lost else Outcome.UNKNOWN
        elif watcher is None:
            outcome = Outcome.ACCEPTED  # acknowledged, and nobody can tell a drop
        else:
            outcome = Outcome.DROPPED if fenced else Outcome.UNKNOWN
        result.outcomes[f"publish {kind}"] = outcome
    return None


def _read(run: _Run, watcher: _Link | None, result: AclProbe) -> str | None:
    """Subscriptions to the victim's assignment and plan; the observer publishes to them,
    then to the identity's own assignment (the fence)."""
    link, error = run.link()
    if error is not None:
        return error
    try:
        granted: list[str] = []
        for kind in READ_KINDS:
            outcome = link.subscribe(run.victim_topic(kind), run.timeout)
            if outcome is None:
                granted.append(kind)
            else:
                result.outcomes[f"read {kind}"] = outcome
            if link.lost:
                link.close()
                link, error = run.link()
                if error is not None:
                    return error
        if not granted:
            return None
        if watcher is None:
            # nobody to publish, and a granted subscription proves nothing (Mosquitto grants
            # it and filters at delivery): not judged
            return None
        fence_topic = run.own_topic("assignment")
        fence = run.payload("read fence")
        fenced = False
        if fence_topic is not None and link.subscribe(fence_topic, run.timeout) is None:
            for kind in granted:
                watcher.publish(run.victim_topic(kind), run.payload(kind))
            watcher.publish(fence_topic, fence)
            fenced = link.wait(lambda: link.got(fence_topic, fence), run.timeout)
        else:
            for kind in granted:
                watcher.publish(run.victim_topic(kind), run.payload(kind))
            link.wait(
                lambda: all(link.got(run.victim_topic(k), run.payload(k)) for k in granted),
                run.timeout,
            )
        for kind in granted:
            if link.got(run.victim_topic(kind), run.payload(kind)):
                result.outcomes[f"read {kind}"] = Outcome.ACCEPTED
            else:
                result.outcomes[f"read {kind}"] = Outcome.DROPPED if fenced else Outcome.UNKNOWN
    finally:
        link.close()
    return None


def _will(run: _Run, watcher: _Link | None, result: AclProbe) -> None:
    """A connection whose last will is the victim's state, dropped; then, as the fence, one
    whose will is the identity's own state, dropped after it (wills go out in the order the
    connections end)."""
    if watcher is None:
        return  # a will is not acknowledged: only delivery tells
    topic, payload = run.victim_topic("state"), run.payload("will")
    link, error = run.link(will=(topic, payload))
    if error is not None:
        # a broker may check the will at CONNECT and refuse the connection for it
        result.outcomes[WILL] = Outcome.REFUSED
        return
    link.drop()
    own = run.own_topic("state")
    fenced = False
    if own is not None:
        fence = run.payload("will fence")
        second, error = run.link(will=(own, fence))
        if error is None:
            second.drop()
            fenced = watcher.wait(lambda: watcher.got(own, fence), run.timeout)
    else:
        # no fence: the will either arrives within the timeout or is taken as dropped
        deadline = time.monotonic() + run.timeout
        watcher.wait(lambda: watcher.got(topic, payload), max(0.0, deadline - time.monotonic()))
        fenced = True
    if watcher.got(topic, payload):
        result.outcomes[WILL] = Outcome.ACCEPTED
    else:
        result.outcomes[WILL] = Outcome.DROPPED if fenced else Outcome.UNKNOWN
