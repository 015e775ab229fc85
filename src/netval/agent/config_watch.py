"""Follow the agent config file: the kubelet updates a mounted ConfigMap in place.

A valid new config is applied; an invalid one is logged and counted, and the last good
config stays in force (a bad edit must not blind the fleet). Changing the validation name
needs a restart (it is the agent's MQTT identity) and is refused the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from netval.agent.config import AgentConfig, AgentConfigError, load_agent_config

log = logging.getLogger("netval.agent.config")
POLL_SECONDS: Final = 5.0


class ConfigWatcher:
    def __init__(
        self,
        path: Path,
        current: AgentConfig,
        on_config: Callable[[AgentConfig], None],
        *,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.path = path
        self.current = current
        self.on_config = on_config
        self.poll_seconds = poll_seconds
        self.reloads = 0
        self.failures = 0
        self.last_error: str | None = None
        self._digest = self._read_digest()

    def _read_digest(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None

    def check(self) -> None:
        """One poll: reload when the file's content changed."""
        digest = self._read_digest()
        if digest is None or digest == self._digest:
            return
        self._digest = digest
        try:
            config = load_agent_config(self.path)
            if config.validation != self.current.validation:
                raise AgentConfigError(
                    f"{self.path}: field validation: changed from {self.current.validation!r} "
                    f"to {config.validation!r}; restart the agent to switch validations"
                )
        except AgentConfigError as exc:
            self.failures += 1
            self.last_error = str(exc)
            log.error(
                "config update rejected, keeping generation %d: %s", self.current.generation, exc
            )
            return
        self.last_error = None
        if config == self.current:
            return
        self.reloads += 1
        log.info("config reloaded: generation %d -> %d", self.current.generation, config.generation)
        self.current = config
        self.on_config(config)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            self.check()
