"""Leader-election settings, from the environment (docs/architecture.md lists them).

The defaults are controller-runtime's shortened by a third (its 15 s lease, 10 s renew
deadline, 2 s retry -> 10 s, 7 s, 2 s): a dead leader's Lease expires 10 s after its last
renewal, so a standby (which retries every 2-2.4 s) leads 10-13 s after a SIGKILL; a live
leader that cannot renew sends no write after 7 s, and each write it sends is bounded to
land within the 3 s left before another replica may take the Lease (`fence`)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from netval.operator.leadership.fence import WRITE_MARGIN

ENV_LEASE_NAME: Final = "NETVAL_LEASE_NAME"
ENV_LEASE_NAMESPACE: Final = "NETVAL_LEASE_NAMESPACE"
ENV_LEASE_DURATION: Final = "NETVAL_LEASE_DURATION_SECONDS"
ENV_RENEW_DEADLINE: Final = "NETVAL_LEASE_RENEW_DEADLINE_SECONDS"
ENV_RETRY_PERIOD: Final = "NETVAL_LEASE_RETRY_PERIOD_SECONDS"

DEFAULT_LEASE_NAME: Final = "netval-operator"
DEFAULT_LEASE_DURATION: Final = 10.0
DEFAULT_RENEW_DEADLINE: Final = 7.0
DEFAULT_RETRY_PERIOD: Final = 2.0


class ElectionConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ElectionSettings:
    lease_name: str
    namespace: str
    identity: str  # holderIdentity: pod name plus a random suffix (a restart is a new holder)
    lease_duration: float  # seconds a Lease not renewed stays held
    renew_deadline: float  # seconds the leader keeps trying to renew before it stops
    retry_period: float  # seconds between attempts to acquire or renew

    @property
    def request_timeout(self) -> float:
        """Per Lease call: half the renew deadline, so a slow API server still gets two tries
        before the leader gives up (each renewal is also bounded by what is left of it)."""
        return max(self.retry_period, self.renew_deadline / 2)

    @property
    def stop_grace(self) -> float:
        """How long a term may take to stop once it was asked to (a clean stop; without
        `on_lost`, a lost Lease): what remains of the lease after the renew deadline, less one
        retry period for clock drift."""
        return max(0.5, self.lease_duration - self.renew_deadline - self.retry_period)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ElectionConfigError(f"{name}: not a number: {text!r}") from None
    if not 0.1 <= value <= 600:
        raise ElectionConfigError(f"{name}: must be between 0.1 and 600 seconds, got {value}")
    return value


def election_settings_from_env(
    default_namespace: str, env: Mapping[str, str] = os.environ
) -> ElectionSettings:
    duration = _seconds(env, ENV_LEASE_DURATION, DEFAULT_LEASE_DURATION)
    deadline = _seconds(env, ENV_RENEW_DEADLINE, DEFAULT_RENEW_DEADLINE)
    retry = _seconds(env, ENV_RETRY_PERIOD, DEFAULT_RETRY_PERIOD)
    # client-go's rules: a leader must give up before its Lease could be taken, and retry
    # often enough to renew within its deadline.
    # and the fence's: a write sent at the renew deadline still has time to land
    if not deadline + WRITE_MARGIN < duration:
        raise ElectionConfigError(
            f"{ENV_RENEW_DEADLINE} ({deadline}) must be more than {WRITE_MARGIN:g} s less than "
            f"{ENV_LEASE_DURATION} ({duration})"
        )
    if not retry * 1.2 < deadline:
        raise ElectionConfigError(
            f"{ENV_RETRY_PERIOD} ({retry}) must be less than {ENV_RENEW_DEADLINE} ({deadline}) / 1.2"
        )
    return ElectionSettings(
        lease_name=env.get(ENV_LEASE_NAME, "").strip() or DEFAULT_LEASE_NAME,
        namespace=env.get(ENV_LEASE_NAMESPACE, "").strip() or default_namespace,
        identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}",
        lease_duration=duration,
        renew_deadline=deadline,
        retry_period=retry,
    )
