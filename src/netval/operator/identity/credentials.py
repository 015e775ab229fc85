"""Issue, rotate, expire and revoke per-node MQTT credentials in the dynamic security plugin.

One client per agent pod (`netval-node:<node>:<pod>`), all with the node's role: two
validations put two agent pods on one node, and one client per node would have each
enrollment kick the other pod off. The expiry is written into the client's
`textdescription`, so a restarted operator still expires what its predecessor issued.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from netval.operator.identity import acl
from netval.operator.identity.dynsec import DynsecAdmin, DynsecError

log = logging.getLogger("netval.operator.identity")

PASSWORD_BYTES: Final = 32
DEFAULT_LIFETIME: Final = timedelta(hours=24)
ALREADY_EXISTS: Final = "already exists"
NOT_FOUND: Final = "not found"


@dataclass(frozen=True, slots=True)
class IssuedCredential:
    username: str
    password: str = field(repr=False)
    expires_at: datetime

    @property
    def client_id(self) -> str:
        return self.username  # the broker accepts this credential with this client id only

    def to_json(self) -> dict[str, str]:
        return {
            "username": self.username,
            "clientId": self.client_id,
            "password": self.password,
            "expiresAt": self.expires_at.isoformat().replace("+00:00", "Z"),
        }


def pod_client_name(node: str, pod: str) -> str:
    return f"{acl.client_name(node)}:{pod}"


def node_prefix(node: str) -> str:
    return f"{acl.client_name(node)}:"


def _error(response: dict[str, Any]) -> str | None:
    error = response.get("error")
    return str(error) if error else None


class CredentialIssuer:
    def __init__(
        self,
        admin: DynsecAdmin,
        *,
        lifetime: timedelta = DEFAULT_LIFETIME,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        validations_of: Callable[[str], Iterable[str]] = lambda node: (),
    ) -> None:
        self.admin = admin
        # what a node's role covers when its first enrollment creates it (the leader's
        # NodeRoleSync knows; a standby creates it empty and the leader fills it in)
        self.validations_of = validations_of
        self.lifetime = lifetime
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self.issued = 0
        self.revoked = 0
        self.expired = 0

    async def prepare(self) -> None:
        """Deny by default for every client the plugin knows (idempotent; the chart's
        initial file says the same, this covers a file written by hand)."""
        await self._checked(acl.set_default_access())

    async def issue(self, node: str, pod: str) -> IssuedCredential:
        """A fresh password for the pod's client; the old one stops working at once (the
        plugin disconnects a client whose password changes)."""
        username = pod_client_name(node, pod)
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        expires_at = (self.clock() + self.lifetime).replace(microsecond=0)
        async with self._locks.setdefault(username, asyncio.Lock()):
            role, client = await self.admin.execute(
                [
                    acl.create_role(node, self.validations_of(node)),
                    acl.create_client(username, node, password, expires_at),
                ]
            )
            for response in (role, client):
                error = _error(response)
                if error is not None and ALREADY_EXISTS not in error.lower():
                    raise DynsecError(f"{response.get('command')}: {error}")
            if _error(client) is not None:  # the pod enrolled before: rotate
                await self._checked(
                    acl.rotate_client(username, node, password, expires_at),
                    tolerate=ALREADY_EXISTS,
                )
        self.issued += 1
        return IssuedCredential(username, password, expires_at)

    async def revoke_node(self, node: str) -> list[str]:
        """Delete every client of `node` (each is disconnected at once) and its role."""
        prefix = node_prefix(node)
        names = [n for n in await self._usernames() if n.startswith(prefix)]
        await self._checked([*acl.delete_clients(names), acl.delete_role(node)], tolerate=NOT_FOUND)
        self.revoked += len(names)
        if names:
            log.info("revoked the MQTT identity of node %s (%d clients)", node, len(names))
        return names

    async def enrolled(self) -> dict[str, tuple[str, str]]:
        """Every per-pod client: username -> (node, pod)."""
        found: dict[str, tuple[str, str]] = {}
        for username in await self._usernames():
            rest = acl.node_of_client(username)
            node, sep, pod = (rest or "").partition(":")
            if node and sep and pod:
                found[username] = (node, pod)
        return found

    async def revoke_clients(self, usernames: list[str]) -> None:
        """Delete these clients (each is disconnected at once); their nodes' roles stay."""
        if usernames:
            await self._checked(acl.delete_clients(usernames), tolerate=NOT_FOUND)
            self.revoked += len(usernames)

    async def expire(self) -> list[str]:
        """Delete the clients whose credential expired (an agent that stopped renewing)."""
        now = self.clock()
        (response,) = await self._checked([{"command": "listClients", "verbose": True}])
        clients = (response.get("data") or {}).get("clients") or []
        gone = []
        for client in clients:
            name = str(client.get("username", ""))
            expires = acl.expiry_of(client.get("textdescription"))
            if acl.node_of_client(name) is not None and expires is not None and expires <= now:
                gone.append(name)
        if gone:
            await self._checked(acl.delete_clients(gone), tolerate=NOT_FOUND)
            self.expired += len(gone)
            log.info("expired %d MQTT credentials", len(gone))
        return gone

    async def _usernames(self) -> list[str]:
        (response,) = await self._checked([{"command": "listClients"}])
        return [str(n) for n in (response.get("data") or {}).get("clients") or []]

    async def _checked(
        self, commands: list[acl.Command], *, tolerate: str | None = None
    ) -> list[dict[str, Any]]:
        responses = await self.admin.execute(commands)
        for response in responses:
            error = _error(response)
            if error is not None and (tolerate is None or tolerate not in error.lower()):
                raise DynsecError(f"{response.get('command')}: {error}")
        return responses
