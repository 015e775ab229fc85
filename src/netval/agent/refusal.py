"""Which failed MQTT connects mean "the broker refuses this credential". Pure: no I/O.

Only a CONNACK that says so (`netval.infra.mqtt_client.credential_refused`, the refusal
hook of every MQTT connection's `ReconnectRule`): MQTT v5 reason codes 0x86 (bad user name
or password) and 0x87 (not authorized), MQTT 3.1.1 return codes 4 and 5, or a TLS alert
about this client's certificate (expired, unknown CA, none given). Everything else
(DNS, TCP refused, TLS, a timeout, a broker that is restarting, "server unavailable") says
nothing about the credential, and enrolling again then would only rotate a credential that
still works (docs/operations.md, "Per-node MQTT identity").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from netval.infra.mqtt_client import V5_REFUSALS, credential_refused

__all__ = ["PUBLISH_REFUSAL_GRACE", "PublishRefusals", "credential_refused"]

PUBLISH_REFUSAL_GRACE: Final = 300.0  # seconds of refused publishes before a new credential

# What the broker knows the agent by: (user name, password, client certificate PEM)
Login = tuple[str | None, str | None, bytes | None]


class PublishRefusals:
    """When publishes the broker refuses (PUBACK >= 0x80) ask for a new credential.

    Every refusal is counted (`refusals`). Not authorized (0x87) or a bad user name or
    password (0x86) counts as a credential refusal, and `asks(login)` says so, only after
    `grace` seconds (default 5 min) of such refusals without a publish taken, and once until
    one is taken: with certificates the broker's pattern ACL follows the identity itself, so
    a refused publish means a broker whose ACLs do not match netval's (an external broker
    being reconfigured), which a new certificate of the same identity does not change; the
    grace keeps a misconfigured broker from turning into an enrollment storm.
    """

    def __init__(
        self, grace: float = PUBLISH_REFUSAL_GRACE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.grace = grace
        self.clock = clock
        self.refusals = 0
        self.credential_refusals = 0  # grace passed: counts as a refused CONNACK
        self._since: float | None = None  # first credential refusal since a publish taken
        self._asked = False
        self._login: Login | None = None

    def refused(self, reason: int, login: Login) -> None:
        self.refusals += 1
        if reason not in V5_REFUSALS:
            return
        now = self.clock()
        if self._since is None:
            self._since = now
        if now - self._since >= self.grace and not self._asked:
            self._asked = True
            self.credential_refusals += 1
            self._login = login

    def taken(self) -> None:
        self._since, self._asked, self._login = None, False, None

    def asks(self, login: Login) -> bool:
        """A new credential is due for `login`."""
        return self._login is not None and self._login == login
