"""What an MQTT message on a netval topic means, decoded from untrusted bytes (pure).

Every payload is untrusted: decoded and validated with pydantic; a bad one is dropped with
a reason, never disturbing other data. A report whose node differs from its topic's node is
rejected (an agent may only speak for itself). Numbers and times are bounded by the model
(`netval.model.results`: finite floats, int64 integers, durationMs at most a day, startedAt
within a day before and ten minutes after `now`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from pydantic import ValidationError

from netval.model.beat import MAX_BEAT_BYTES, Beat
from netval.model.results import Report
from netval.model.topics import (
    MAX_REPORT_BYTES,
    OFFLINE,
    ONLINE,
    DropReason,
    ParsedTopic,
    TopicKind,
    parse_topic,
)

MAX_PAYLOAD: Final = MAX_REPORT_BYTES

# The reasons this decoder drops a message for (the agent's peer service has others).
INGEST_DROP_REASONS: Final = (
    DropReason.BAD_TOPIC,
    DropReason.TOO_LARGE,
    DropReason.NOT_UTF8,
    DropReason.INVALID_REPORT,
    DropReason.INVALID_BEAT,
    DropReason.NODE_MISMATCH,
    DropReason.VALIDATION_MISMATCH,
    DropReason.BAD_STATE,
    DropReason.INTERNAL_ERROR,
    DropReason.WRONG_SHARD,
)


@dataclass(frozen=True, slots=True)
class Dropped:
    reason: DropReason
    detail: str


@dataclass(frozen=True, slots=True)
class StateChange:
    validation: str
    node: str
    online: bool


@dataclass(frozen=True, slots=True)
class BeatMessage:
    """A validated beat from the node of its topic (the topic names the node: a beat has no
    node field to disagree with it)."""

    validation: str
    node: str
    beat: Beat


@dataclass(frozen=True, slots=True)
class EndpointAnnounce:
    """An agent's retained endpoint (validated by `peer_sets.EndpointTable`; empty: gone)."""

    validation: str
    node: str
    payload: bytes


MAX_ENDPOINT_PAYLOAD: Final = 4096

Decoded = Report | StateChange | BeatMessage | EndpointAnnounce | Dropped | None


def decode_message(topic_name: str, payload: bytes, *, now: datetime | None = None) -> Decoded:
    """What a message means, or why it is dropped (None: a topic we don't consume). Pure
    given `now` (the clock startedAt is checked against; default: the current time)."""
    parsed = parse_topic(topic_name)
    if parsed is None:
        return Dropped(DropReason.BAD_TOPIC, f"unexpected topic {topic_name[:200]!r}")
    if parsed.kind is TopicKind.STATE:
        return _decode_state(parsed, payload)
    if parsed.kind is TopicKind.BEAT:
        return _decode_beat(parsed, payload, now or datetime.now(UTC))
    if parsed.kind is TopicKind.ENDPOINT:
        if len(payload) > MAX_ENDPOINT_PAYLOAD:
            return Dropped(DropReason.TOO_LARGE, f"{len(payload)} bytes from {parsed.node}")
        return EndpointAnnounce(parsed.validation, parsed.node, payload)
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
        report = Report.model_validate_json(text, context={"now": now or datetime.now(UTC)})
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


def _decode_beat(parsed: ParsedTopic, payload: bytes, now: datetime) -> Decoded:
    if not payload:
        return None  # the retained beat cleared
    if len(payload) > MAX_BEAT_BYTES:
        return Dropped(DropReason.TOO_LARGE, f"beat of {len(payload)} bytes from {parsed.node}")
    try:
        beat = Beat.model_validate_json(payload, context={"now": now})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(payload)"
        return Dropped(DropReason.INVALID_BEAT, f"beat from {parsed.node}: {where}: {err['msg']}")
    return BeatMessage(parsed.validation, parsed.node, beat)


def _decode_state(parsed: ParsedTopic, payload: bytes) -> Decoded:
    if payload == ONLINE:
        return StateChange(parsed.validation, parsed.node, True)
    if payload in (OFFLINE, b""):
        return StateChange(parsed.validation, parsed.node, False)
    return Dropped(DropReason.BAD_STATE, f"state of {parsed.node} is {payload[:40]!r}")
