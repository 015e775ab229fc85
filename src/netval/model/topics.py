"""MQTT topic contract shared by agent and operator: `netval/v1/<validation>/<node>/<kind>`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

TOPIC_ROOT: Final = "netval/v1"
ONLINE: Final = b"online"
OFFLINE: Final = b"offline"
_MAX_LEVEL: Final = 253
# The largest report the operator reads (bigger ones are dropped, `DropReason.TOO_LARGE`;
# a real one is ~9 KB), and the largest MQTT packet that carries one: the payload plus the
# fixed header (5), the topic (2 + at most 10 + 253 + 1 + 253 + 7 = 526), the packet id (2)
# and MQTT 5 properties (the traceparent user property, ~70), rounded up to 4 KiB of slack.
# The chart's broker refuses larger packets (mqtt.broker.limits.maxPacketSize).
MAX_REPORT_BYTES: Final = 1 << 20
MAX_REPORT_PACKET_BYTES: Final = MAX_REPORT_BYTES + 4096


class DropReason(StrEnum):
    """Why a message on a netval topic was dropped unread (every payload is untrusted)."""

    BAD_TOPIC = "bad_topic"  # not a netval topic, or not one the reader consumes
    TOO_LARGE = "too_large"
    NOT_UTF8 = "not_utf8"  # operator: a report
    INVALID_REPORT = "invalid_report"  # operator
    INVALID_BEAT = "invalid_beat"  # operator: a beat that is no `netval.model.beat.Beat`
    NODE_MISMATCH = "node_mismatch"  # operator: a report speaks for another node
    VALIDATION_MISMATCH = "validation_mismatch"  # operator
    BAD_STATE = "bad_state"  # operator: neither online nor offline
    INTERNAL_ERROR = "internal_error"  # operator: handling the message raised (a bug)
    WRONG_SHARD = "wrong_shard"  # operator: a node's message on a broker shard not its own
    INVALID_ENDPOINT = "invalid_endpoint"  # agent: a peer's responder announcement
    INVALID_ASSIGNMENT = "invalid_assignment"  # agent: the operator's assignment
    TABLE_FULL = "table_full"  # agent: too many peer endpoints


class TopicKind(StrEnum):
    REPORT = "report"  # agent -> operator, retained JSON report
    STATE = "state"  # agent -> operator, retained online/offline (last will)
    # agent -> operator, retained netval.model.beat.Beat (QoS 0): the standing report holds
    BEAT = "beat"
    ENDPOINT = "endpoint"  # agent -> operator, retained east-west responder announcement
    ASSIGNMENT = "assignment"  # operator -> agent, retained (model.peer_assignment)
    # NetworkLoadTest (netval.model.loadplan). Under the node's own level like the others, so
    # the per-node ACL pattern covers them: a node reads only its own plan, publishes only
    # its own results.
    LOAD_PLAN = "loadplan"  # operator -> agent, retained LoadPlan/LoadAbort (QoS 1)
    LOAD_RESULT = "loadresult"  # agent -> operator, LoadResult (QoS 1, not retained)


# What each side of a node's identity may do with the load-test topics (the ACL seam for
# `netval.operator.identity.acl.node_acls`): the node subscribes to its LOAD_PLAN and
# publishes its LOAD_RESULT, the operator the other way round.
NODE_READS_LOAD: Final = TopicKind.LOAD_PLAN
NODE_WRITES_LOAD: Final = TopicKind.LOAD_RESULT


def check_topic_level(value: str, what: str = "topic level") -> str:
    """Return `value` if it is one safe MQTT topic level, else raise ValueError.

    Safe: non-empty, at most 253 characters, no `/` (level separator), no `+` or `#`
    (wildcards: a publisher may not use them, a subscriber would match too much), no NUL,
    not starting with `$` (reserved for broker topics such as `$SYS`).
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > _MAX_LEVEL:
        raise ValueError(f"{what} {value[:40]!r}... is longer than {_MAX_LEVEL} characters")
    bad = sorted({c for c in value if c in "/+#\0"})
    if bad:
        raise ValueError(
            f"{what} {value!r} contains {bad!r}; '/', '+', '#' and NUL are not allowed"
        )
    if value.startswith("$"):
        raise ValueError(f"{what} {value!r} must not start with '$'")
    return value


def topic(validation: str, node: str, kind: TopicKind) -> str:
    check_topic_level(validation, "validation name")
    check_topic_level(node, "node name")
    return f"{TOPIC_ROOT}/{validation}/{node}/{kind.value}"


def subscription(kind: TopicKind, validation: str | None = None) -> str:
    """Filter for one kind across all nodes (and all validations unless one is given)."""
    return f"{TOPIC_ROOT}/{validation or '+'}/+/{kind.value}"


@dataclass(frozen=True, slots=True)
class ParsedTopic:
    validation: str
    node: str
    kind: TopicKind


def parse_topic(name: str) -> ParsedTopic | None:
    parts = name.split("/")
    if len(parts) != 5 or f"{parts[0]}/{parts[1]}" != TOPIC_ROOT:
        return None
    _, _, validation, node, kind = parts
    if not validation or not node or kind not in TopicKind.__members__.values():
        return None
    return ParsedTopic(validation, node, TopicKind(kind))


def topic_prefix(validation: str, node: str) -> str:
    """``netval/v1/<validation>/<node>`` after checking both levels."""
    return (
        f"{TOPIC_ROOT}/{check_topic_level(validation, 'validation name')}"
        f"/{check_topic_level(node, 'node name')}"
    )
