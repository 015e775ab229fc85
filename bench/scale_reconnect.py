"""The broker-restart half of bench/scale_client.py: a lost node reconnects as the agent does
(`netval.infra.mqtt_client.ReconnectRule`, the agent publisher's policy), and what the fleet
did to come back is counted."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Final

# the agent publisher's reconnect policy (netval.agent.publish: backoff_base, backoff_cap,
# _STABLE_AFTER)
AGENT_BACKOFF: Final = (0.5, 30.0, 10.0)
CREDENTIAL_REFUSALS: Final = frozenset({0x86, 0x87})


class ConnackRefused(ConnectionError):
    def __init__(self, code: int) -> None:
        super().__init__(f"CONNACK {code:#04x}")
        self.code = code


def agent_rule() -> Any:
    """The agent publisher's rule; a CONNACK refusing the credential is what would make the
    agent enroll again (netval.agent.publish, netval.infra.mqtt_client.credential_refused)."""
    from netval.infra.mqtt_client import ReconnectPolicy, ReconnectRule

    return ReconnectRule(
        ReconnectPolicy(*AGENT_BACKOFF),
        refused=lambda e: isinstance(e, ConnackRefused) and e.code in CREDENTIAL_REFUSALS,
    )


@dataclass
class RestartStats:
    """Since the `reconnect` command: what the fleet did to come back."""

    lost_nodes: int = 0  # connections lost (each starts a reconnect loop)
    attempts: int = 0  # connects tried (CONNECT sent or TCP/TLS failed)
    would_reenroll: int = 0  # CONNACK refusals of the credential: the agent would enroll
    errors: dict[str, int] = field(default_factory=dict)
    back: dict[int, float] = field(default_factory=dict)  # node -> wall time reconnected

    def summary(self) -> dict[str, Any]:
        return {"lost_nodes": self.lost_nodes, "attempts": self.attempts,
                "would_reenroll": self.would_reenroll, "errors": self.errors,
                "back": len(self.back), "last_back": max(self.back.values(), default=None)}  # fmt: skip


async def reconnect_one(fleet: Any, i: int, error: BaseException | None) -> None:
    """The agent's loop: wait the rule's delay, connect; again until it holds."""
    rs = fleet.restart
    rs.lost_nodes += 1
    rule = fleet.rules[i]
    while fleet.reconnect:
        end = rule.ended(error if error is not None else ConnectionError("lost"))
        if end.refused:
            rs.would_reenroll += 1
        await asyncio.sleep(end.delay)
        assert fleet.gate is not None
        async with fleet.gate:
            rs.attempts += 1
            try:
                node = await fleet.attempt(i)
            except (OSError, TimeoutError, ConnectionError) as exc:
                key = type(exc).__name__ + (
                    f" errno {exc.errno}" if isinstance(exc, OSError) and exc.errno else ""
                )
                rs.errors[key] = rs.errors.get(key, 0) + 1
                error = exc
                continue
        fleet.up(i, node)
        fleet.full_next.add(i)
        rs.back[i] = time.time()
        return
