"""Per-node MQTT identity over N broker shards (``mqtt.shards``, docs/operations.md "Brokers
beyond one process"): one dynamic security admin connection, credential issuer and role sync
per shard, behind the interfaces `IdentityService` uses of one.

A node's credential and role live on the node's own shard (`netval.model.shards.shard_of`):
its agent connects there and nowhere else. A per-pod client name carries its node
(`netval-node:<node>:<pod>`), so revoking clients by name is routed the same way. A shard
whose admin connection is down fails only its nodes' enrollments (the server answers 503 and
the agent retries); the sweep goes on for the others (`prepare` and `expire` try every
connected shard and raise the first failure after the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from netval.infra.task_stop import cancel_and_wait
from netval.model.shards import shard_of
from netval.operator.identity import acl
from netval.operator.identity.credentials import CredentialIssuer, IssuedCredential
from netval.operator.identity.dynsec import DynsecAdmin, DynsecError
from netval.operator.identity.node_roles import NodeRoleSync, NodeValidations


class ShardedAdmin:
    """N admin connections seen as one: connected while any is; `connects` counts them all
    (a reconnect of any shard changes it: the sweep then prepares that shard)."""

    def __init__(self, admins: Sequence[DynsecAdmin]) -> None:
        self.shards = list(admins)

    def start(self) -> None:
        for admin in self.shards:
            admin.start()

    async def stop(self) -> None:
        for admin in self.shards:
            await admin.stop()

    @property
    def connected(self) -> bool:
        return any(a.connected for a in self.shards)

    @property
    def connects(self) -> int:
        return sum(a.connects for a in self.shards)

    @property
    def shards_down(self) -> list[int]:
        return [i for i, a in enumerate(self.shards) if not a.connected]

    async def wait_connected(self, seconds: float) -> bool:
        waits = [asyncio.create_task(a.wait_connected(seconds)) for a in self.shards]
        try:
            for done in asyncio.as_completed(waits):
                if await done:
                    return True
            return False
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


def _node_of_username(username: str) -> str | None:
    rest = acl.node_of_client(username)
    node, sep, _pod = (rest or "").partition(":")
    return node if node and sep else None


class ShardedIssuer:
    """`CredentialIssuer`'s interface over one issuer per shard, routed by node."""

    def __init__(self, admins: ShardedAdmin, issuers: Sequence[CredentialIssuer]) -> None:
        self.admins = admins
        self.shards = list(issuers)
        self._prepared_for = [-1] * len(self.shards)  # each admin's connects when prepared

    def of(self, node: str) -> CredentialIssuer:
        return self.shards[shard_of(node, len(self.shards))]

    @property
    def issued(self) -> int:
        return sum(i.issued for i in self.shards)

    @property
    def revoked(self) -> int:
        return sum(i.revoked for i in self.shards)

    @property
    def expired(self) -> int:
        return sum(i.expired for i in self.shards)

    async def issue(self, node: str, pod: str) -> IssuedCredential:
        return await self.of(node).issue(node, pod)

    async def revoke_node(self, node: str) -> list[str]:
        return await self.of(node).revoke_node(node)

    async def prepare(self) -> None:
        """Deny by default on each connected shard not prepared since it (re)connected."""
        failures: list[DynsecError] = []
        for i, (admin, issuer) in enumerate(zip(self.admins.shards, self.shards, strict=True)):
            connects = admin.connects
            if not admin.connected or self._prepared_for[i] == connects:
                continue
            try:
                await issuer.prepare()
                self._prepared_for[i] = connects
            except DynsecError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    async def expire(self) -> list[str]:
        gone: list[str] = []
        failures: list[DynsecError] = []
        for admin, issuer in zip(self.admins.shards, self.shards, strict=True):
            if not admin.connected:
                continue  # its credentials expire when it is back
            try:
                gone += await issuer.expire()
            except DynsecError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]
        return gone

    async def enrolled(self) -> dict[str, tuple[str, str]]:
        """Every per-pod client of the shards that answer (a shard that is down cannot have
        its clients revoked now anyway: they expire)."""
        found: dict[str, tuple[str, str]] = {}
        for admin, issuer in zip(self.admins.shards, self.shards, strict=True):
            if admin.connected:
                with contextlib.suppress(DynsecError):
                    found.update(await issuer.enrolled())
        return found

    async def revoke_clients(self, usernames: list[str]) -> None:
        by_shard: dict[int, list[str]] = {}
        for name in usernames:
            node = _node_of_username(name)
            shards = range(len(self.shards)) if node is None else [shard_of(node, len(self.shards))]
            for i in shards:
                by_shard.setdefault(i, []).append(name)
        for i, names in sorted(by_shard.items()):
            await self.shards[i].revoke_clients(names)


class ShardedRoles:
    """`NodeRoleSync`'s interface over one role sync per shard: each shard holds the roles
    of its own nodes."""

    def __init__(self, syncs: Sequence[NodeRoleSync]) -> None:
        self.shards = list(syncs)

    def of(self, node: str) -> NodeRoleSync:
        return self.shards[shard_of(node, len(self.shards))]

    def validations_of(self, node: str) -> frozenset[str]:
        return self.of(node).validations_of(node)

    def update(self, targets: NodeValidations) -> None:
        parts: list[dict[str, frozenset[str]]] = [{} for _ in self.shards]
        for node, validations in targets.items():
            parts[shard_of(node, len(self.shards))][node] = frozenset(validations)
        for sync, part in zip(self.shards, parts, strict=True):
            sync.update(part)

    def restart(self) -> None:
        for sync in self.shards:
            sync.restart()

    def forget(self, node: str) -> None:
        self.of(node).forget(node)

    async def run(self) -> None:
        tasks = [asyncio.create_task(s.run(), name=f"netval-node-roles-{i}")
                 for i, s in enumerate(self.shards)]  # fmt: skip
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_and_wait(tasks)
