"""Does the broker enforce netval's topic ACL? A probe publishes, as one identity, to the
topics of a node that identity does not own, and reports each publish the broker took.

netval's ACL (docs/operations.md "Broker ACL"): a node publishes only
`netval/v1/+/<its node>/{report,state,endpoint}`; the operator reads everything and writes
only assignments. So neither the operator's identity nor a node's may publish a report, state
or endpoint under another node's name. The probe uses a reserved validation and node name
(`PROBE_VALIDATION` / `PROBE_NODE`, never real: neither can be a Kubernetes name of netval's)
and non-retained messages, so a broker that wrongly accepts them keeps nothing.

How a refusal is seen: the MQTT v5 PUBACK of the QoS 1 publish carries a failure reason code
(MQTT 5 section 3.4.2.1; Mosquitto 2 answers 0x87 "not authorized"). A success code (0x00, or
0x10 "no matching subscribers") means the broker took the message: a violation. A broker that
drops denied publishes silently behind a success code is reported as violating too, since
the probe cannot tell its drop from an acceptance: configure it to answer MQTT 5 clients with
the reason code.

`AclProbe.verdict` is the one reading of a probe's outcomes: `netval doctor` (broker.acl) and
the operator's start check (`operator.broker_check`) both report it.

Blocking (paho's network loop in a thread); call it from a worker thread in async code.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from netval.infra.mqtt_settings import MqttSettings

__all__ = [
    "PROBE_KINDS",
    "PROBE_NODE",
    "PROBE_VALIDATION",
    "AclProbe",
    "AclVerdict",
    "Outcome",
    "probe_node_topics",
]

# Reserved: a NetworkValidation is a DNS-1123 name and so is a node, so a leading "_" can
# name neither; agents and the operator drop what arrives on these topics.
PROBE_VALIDATION: Final = "_netval-acl-probe"
PROBE_NODE: Final = "_netval-acl-probe-node"
PROBE_KINDS: Final = ("report", "state", "endpoint")
_PAYLOAD: Final = b"netval broker ACL probe: this publish should have been refused"


class Outcome(StrEnum):
    REFUSED = "refused"  # PUBACK with a failure reason code
    ACCEPTED = "accepted"  # acknowledged with a success reason code
    UNKNOWN = "unknown"  # no acknowledgement within the timeout


class AclVerdict(StrEnum):
    ENFORCED = "enforced"  # the broker refused every probe publish
    VIOLATED = "violated"  # it took at least one: the identity may speak for another node
    UNCONFIRMED = "unconfirmed"  # none taken, but some never acknowledged (within the timeout)
    UNCHECKED = "unchecked"  # the probe could not run (`AclProbe.error` says why)


@dataclass
class AclProbe:
    """What the broker did with each probe publish, or why the probe could not run."""

    identity: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # topic -> outcome
    error: str | None = None

    @property
    def violations(self) -> list[str]:
        """Topics the identity could publish to and must not."""
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
        if self.unacknowledged or not self.outcomes:
            return AclVerdict.UNCONFIRMED
        return AclVerdict.ENFORCED


def _topic(kind: str, node: str) -> str:
    return f"netval/v1/{PROBE_VALIDATION}/{node}/{kind}"


class _Session:
    def __init__(self) -> None:
        self.connected = threading.Event()
        self.connect_reason: ReasonCode | None = None
        self.acks: dict[int, ReasonCode] = {}
        self.changed = threading.Condition()

    def on_connect(self, _c: Any, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        self.connect_reason = reason
        self.connected.set()

    def on_publish(self, _c: Any, _u: Any, mid: int, reason: ReasonCode, _p: Any) -> None:
        with self.changed:
            self.acks[mid] = reason
            self.changed.notify_all()


def probe_node_topics(
    settings: MqttSettings,
    tls_context: ssl.SSLContext | None,
    *,
    node: str = PROBE_NODE,
    timeout: float = 5.0,
    exact_client_id: bool = False,
) -> AclProbe:
    """Publish to `node`'s report, state and endpoint topics as `settings`' identity.

    `node` must be one the identity does not own (the default is owned by nobody). Never
    raises for broker or network trouble: `AclProbe.error` says what went wrong."""
    identity = settings.username or "(anonymous)"
    result = AclProbe(identity)
    session = _Session()
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        # a per-node credential is bound to its client id; else never take over a session
        client_id=(
            settings.client_id or ""
            if exact_client_id
            else f"{settings.client_id or 'netval'}-acl-probe"
        ),
        protocol=paho.MQTTv5,
    )
    if settings.username is not None:
        client.username_pw_set(settings.username, settings.password)
    if settings.tls:
        if tls_context is None:
            raise ValueError(f"{settings.url}: TLS settings without a TLS context")
        client.tls_set_context(tls_context)
    client.on_connect = session.on_connect
    client.on_publish = session.on_publish
    try:
        client.connect(settings.host, settings.port, keepalive=max(int(timeout) * 2, 10))
    except (OSError, ValueError) as exc:
        result.error = f"cannot connect to {settings.url}: {exc}"
        return result
    client.loop_start()
    try:
        if not session.connected.wait(timeout):
            result.error = f"no CONNACK from {settings.url} within {timeout:g} s"
            return result
        if session.connect_reason is None or session.connect_reason.is_failure:
            result.error = f"login as {identity!r} refused: {session.connect_reason}"
            return result
        mids = {}
        for kind in PROBE_KINDS:
            info = client.publish(_topic(kind, node), _PAYLOAD, qos=1, retain=False)
            mids[info.mid] = _topic(kind, node)
        _collect(session, mids, result, timeout)
    finally:
        client.disconnect()
        client.loop_stop()
    return result


def _collect(session: _Session, mids: dict[int, str], result: AclProbe, timeout: float) -> None:
    with session.changed:
        session.changed.wait_for(lambda: all(mid in session.acks for mid in mids), timeout)
        for mid, topic in mids.items():
            ack = session.acks.get(mid)
            result.outcomes[topic] = (
                Outcome.UNKNOWN
                if ack is None
                else Outcome.REFUSED
                if ack.is_failure
                else Outcome.ACCEPTED
            )
