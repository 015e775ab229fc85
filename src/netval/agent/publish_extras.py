"""What the agent's MQTT connection carries besides its report and beat: retained payloads
(e.g. ``endpoint``) and one-shot messages (e.g. ``loadresult``), each under the node's own
topic prefix. `netval.agent.publish.ReportPublisher` owns the connection and flushes these
after the report; this module holds what waits and how it is sent.

- Retained: the latest payload per suffix is kept and published again on every connect,
  since a broker restarted without persistence forgets retained messages.
- One-shot: QoS 1, not retained, at most `MAX_QUEUED_MESSAGES` wait across an outage (the
  oldest is dropped), each removed only once the broker acknowledged it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

import aiomqtt
from aiomqtt import MqttError

from netval.infra.mqtt_client import PublishRefused
from netval.model.topics import TopicKind, check_topic_level

# the publisher's own topics: nobody else may publish there
RESERVED_SUFFIXES: Final = frozenset(
    {TopicKind.REPORT.value, TopicKind.STATE.value, TopicKind.BEAT.value}
)
MAX_QUEUED_MESSAGES: Final = 16


def _checked(topic_suffix: str) -> str:
    check_topic_level(topic_suffix, "topic suffix")
    if topic_suffix in RESERVED_SUFFIXES:
        raise ValueError(f"topic suffix {topic_suffix!r} is reserved")
    return topic_suffix


class ExtraTopics:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._retained: dict[str, bytes] = {}  # suffix -> latest payload
        self._retained_dirty: set[str] = set()
        self._messages: deque[tuple[str, bytes]] = deque(maxlen=MAX_QUEUED_MESSAGES)

    def retain(self, topic_suffix: str, payload: bytes) -> None:
        self._retained[_checked(topic_suffix)] = bytes(payload)
        self._retained_dirty.add(topic_suffix)

    def send_once(self, topic_suffix: str, payload: bytes) -> None:
        self._messages.append((_checked(topic_suffix), bytes(payload)))

    def connected(self) -> None:
        """A new session: every retained payload goes out again."""
        self._retained_dirty = set(self._retained)

    async def flush(
        self, client: aiomqtt.Client, on_refused: Callable[[PublishRefused], None]
    ) -> None:
        """Send what waits; an error leaves the unsent ones waiting and is raised (the
        session ends and the publisher reconnects)."""
        while self._messages:
            suffix, payload = self._messages[0]
            try:
                await client.publish(f"{self.prefix}/{suffix}", payload, qos=1, retain=False)
            except MqttError as exc:
                if isinstance(exc, PublishRefused):
                    on_refused(exc)
                raise
            self._messages.popleft()
        while self._retained_dirty:
            suffix = self._retained_dirty.pop()
            try:
                await client.publish(
                    f"{self.prefix}/{suffix}", self._retained[suffix], qos=1, retain=True
                )
            except MqttError as exc:
                if isinstance(exc, PublishRefused):
                    on_refused(exc)
                self._retained_dirty.add(suffix)
                raise
