"""The operator's admin connection to Mosquitto's dynamic security plugin.

Commands go to `$CONTROL/dynamic-security/v1` as `{"commands": [...]}`; the plugin answers
on `.../response` with one `{"responses": [...]}` per request, each response carrying the
command's `correlationData`. One connection task owns the MQTT client: it reconnects by the
rule of every MQTT connection (`infra.mqtt_client.reconnect_loop`), and a request in flight when the connection drops fails with `DynsecError` (the
caller decides whether to retry; enrollment answers 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
from typing import Any, Final

import aiomqtt
from aiomqtt import MqttError

from netval.infra.mqtt_client import (
    ReconnectPolicy,
    ReconnectRule,
    SessionEnd,
    make_client,
    reconnect_loop,
)
from netval.infra.mqtt_settings import MqttSettings
from netval.infra.task_stop import cancel_and_wait
from netval.operator.identity.acl import Command

log = logging.getLogger("netval.operator.identity")

CONTROL_TOPIC: Final = "$CONTROL/dynamic-security/v1"
# The plugin works through requests one at a time (and rewrites its state file after each
# command): more in flight only queues them in the broker, and aiomqtt warns past 10.
MAX_IN_FLIGHT: Final = 8
RESPONSE_TOPIC: Final = f"{CONTROL_TOPIC}/response"


class DynsecError(RuntimeError):
    """The plugin could not be reached or did not answer in time."""


class DynsecAdmin:
    def __init__(
        self,
        settings: MqttSettings,
        *,
        timeout: float = 10.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 15.0,
    ) -> None:
        self.settings = settings
        self.timeout = timeout
        self._reconnect = ReconnectRule(ReconnectPolicy(backoff_base, backoff_cap))
        self._client: aiomqtt.Client | None = None
        self._ready = asyncio.Event()
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        # Other replicas read the same response topic: keys unique to this connection.
        self._nonce = secrets.token_hex(4)
        self._task: asyncio.Task[None] | None = None
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.connects = 0  # sessions established (a reconnect after a broker restart counts)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="netval-dynsec-admin")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        self._fail_pending("stopped")

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    async def wait_connected(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), seconds)
        return self._ready.is_set()

    async def execute(self, commands: list[Command]) -> list[dict[str, Any]]:
        """Send `commands` in one request; their responses in the same order (a response
        with an `error` key is the plugin's refusal, e.g. "Client already exists")."""
        async with self._in_flight:
            return await self._execute(commands)

    async def _execute(self, commands: list[Command]) -> list[dict[str, Any]]:
        if not await self.wait_connected(self.timeout):
            raise DynsecError(f"not connected to the broker at {self.settings.url}")
        client = self._client
        assert client is not None
        loop = asyncio.get_running_loop()
        batch = next(self._ids)
        keys = [f"{self._nonce}.{batch}.{i}" for i in range(len(commands))]
        futures = [loop.create_future() for _ in keys]
        self._pending.update(zip(keys, futures, strict=True))
        body = {
            "commands": [{**c, "correlationData": k} for c, k in zip(commands, keys, strict=True)]
        }
        try:
            await client.publish(CONTROL_TOPIC, json.dumps(body).encode(), qos=1)
            async with asyncio.timeout(self.timeout):
                return list(await asyncio.gather(*futures))
        except (MqttError, TimeoutError) as exc:
            raise DynsecError(f"dynamic security request failed: {exc or 'timed out'}") from None
        finally:
            for key in keys:
                self._pending.pop(key, None)

    # -- the connection task ----------------------------------------------------------------

    async def _run(self) -> None:
        await reconnect_loop(self._session, self._reconnect, on_end=self._ended)

    def _ended(self, end: SessionEnd) -> None:
        # said once per outage: after a session, or the first failed connect in a row
        level = logging.WARNING if end.connected or end.failures == 1 else logging.DEBUG
        if end.refused:
            log.error("dynamic security admin %s: the broker refuses the operator's "
                      "credential: %s", self.settings.url, end.error)  # fmt: skip
        elif end.error is not None and not isinstance(end.error, MqttError):
            log.error("dynamic security admin: unexpected error", exc_info=end.error)
        else:
            log.log(level, "dynamic security admin %s: %s", self.settings.url,
                    end.error or "session ended")  # fmt: skip

    async def _session(self) -> None:
        s = self.settings
        try:
            async with make_client(s, keepalive=30, tls_context=s.ssl_context()) as client:
                await client.subscribe(RESPONSE_TOPIC, qos=1)
                self._client = client
                self.connects += 1
                self._reconnect.connected()
                self._ready.set()
                log.info("dynamic security admin connected to %s", s.url)
                async for message in client.messages:
                    self._on_response(message.payload)
        finally:
            self._ready.clear()
            self._client = None
            self._fail_pending("connection lost")

    def _on_response(self, payload: Any) -> None:
        try:
            doc = json.loads(payload if isinstance(payload, bytes | str) else b"")
            responses = doc.get("responses") if isinstance(doc, dict) else None
        except (ValueError, UnicodeDecodeError):
            responses = None
        if not isinstance(responses, list):
            log.warning("dynamic security admin: unreadable response ignored")
            return
        for response in responses:
            if not isinstance(response, dict):
                continue
            future = self._pending.get(str(response.get("correlationData")))
            if future is not None and not future.done():
                future.set_result(response)

    def _fail_pending(self, why: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(DynsecError(f"dynamic security request failed: {why}"))
