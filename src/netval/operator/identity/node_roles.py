"""Each node's MQTT role covers the validations that target it, and only those (the leader's
duty; docs/operations.md "Per-node MQTT identity").

The runtime hands over which validations target which node whenever targeting changed (once
per status window, `OperatorRuntime.refresh_targets`); this keeps the broker's roles in step:
one `modifyRole` per node whose set changed, never per report, sent in requests of
`BATCH` commands. The plugin rewrites its whole state file after every command, so a change
that touches every node (a new validation over the whole fleet) costs the broker time
proportional to nodes x fleet size: measured 18 ms per command at 1,000 nodes
(bench/enrollment.py), so minutes at 10,000; an ordinary change (a node relabelled, added
or removed) costs one command.

What the broker holds is read back (`listRoles`, one command) when a term starts and after
each reconnect of the admin connection, and only the differences are sent: a broker restart
that kept its state costs nothing, a new broker pod (roles gone) gets them again. A role the
broker does not have yet is created with its ACLs (`createRole`); the enrollment of a node's
first agent creates it too (with what this replica knows, nothing on a standby), and
whichever comes second is a modify.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Final

from netval.operator.identity import acl
from netval.operator.identity.dynsec import DynsecAdmin, DynsecError

log = logging.getLogger("netval.operator.identity")

BATCH: Final = 200  # commands per request: one response message stays well under 1 MiB
PAGE: Final = 500  # roles per listRoles answer
MISSING: Final = ("not found", "does not exist")  # the plugin's words for an unknown role
RETRY_SECONDS: Final = 5.0

NodeValidations = Mapping[str, frozenset[str]]


def role_changes(desired: NodeValidations, applied: NodeValidations) -> dict[str, frozenset[str]]:
    """The nodes whose role must change, with what it must cover. Pure. A node no validation
    targets any more keeps its role (its agents may still run a while) with no topics."""
    changes = {n: v for n, v in desired.items() if applied.get(n) != v}
    for node, validations in applied.items():
        if node not in desired and validations:
            changes[node] = frozenset()
    return changes


class NodeRoleSync:
    def __init__(self, admin: DynsecAdmin, *, retry: float = RETRY_SECONDS) -> None:
        self.admin = admin
        self.retry = retry
        self.desired: dict[str, frozenset[str]] = {}
        self.applied: dict[str, frozenset[str]] = {}
        self._wake = asyncio.Event()
        self._read_for = -1  # admin.connects when the broker's roles were last read
        self.commands = 0  # role commands sent (created or modified)
        self.synced = asyncio.Event()  # set when applied == desired (tests, metrics)

    def validations_of(self, node: str) -> frozenset[str]:
        return self.desired.get(node, frozenset())

    def update(self, targets: NodeValidations) -> None:
        """The validations that target each node, as the store knows them now."""
        self.desired = {n: frozenset(v) for n, v in targets.items() if v}
        self.synced.clear()
        self._wake.set()

    def restart(self) -> None:
        """A new term: read the broker's roles again before sending anything."""
        self._read_for = -1
        self.synced.clear()

    def forget(self, node: str) -> None:
        """The node's role was deleted (revocation)."""
        self.applied.pop(node, None)

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                if self.admin.connected or await self.admin.wait_connected(self.retry):
                    await self.sync_once()
            except DynsecError as exc:
                log.warning("cannot update the nodes' MQTT roles now (retried): %s", exc)
            if self.applied_matches() and self._read_for == self.admin.connects:
                self.synced.set()
            # the next change, or a look at the connection (a reconnect reads the roles
            # again: a new broker pod has none) and a retry of what failed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.retry)

    def applied_matches(self) -> bool:
        return not role_changes(self.desired, self.applied)

    async def sync_once(self) -> None:
        if self._read_for == self.admin.connects and self.applied_matches():
            return  # the usual case: a few ms of dict comparison at 10,000 nodes
        if self._read_for != self.admin.connects:
            connects = self.admin.connects
            self.applied = await self._read_roles()
            self._read_for = connects
        changes = role_changes(self.desired, self.applied)
        items = sorted(changes.items())
        for start in range(0, len(items), BATCH):
            batch = items[start : start + BATCH]
            responses = await self.admin.execute([acl.set_role(n, v) for n, v in batch])
            missing = []
            for (node, validations), response in zip(batch, responses, strict=True):
                error = str(response.get("error") or "")
                if not error:
                    self.applied[node] = validations
                elif any(word in error.lower() for word in MISSING):
                    missing.append((node, validations))
                else:
                    log.warning("modifyRole %s: %s", acl.role_name(node), error)
            self.commands += len(batch)
            if missing:
                created = await self.admin.execute([acl.create_role(n, v) for n, v in missing])
                self.commands += len(missing)
                for (node, validations), response in zip(missing, created, strict=True):
                    if not response.get("error"):
                        self.applied[node] = validations
                    # else: created meanwhile by an enrollment: modified on the next pass
        if changes:
            log.info("updated the MQTT roles of %d node(s)", len(changes))

    async def _read_roles(self) -> dict[str, frozenset[str]]:
        """Every node role the broker holds, with the validations its ACLs cover (paged:
        one answer of 10,000 verbose roles would be megabytes)."""
        found: dict[str, frozenset[str]] = {}
        offset = 0
        while True:
            (response,) = await self.admin.execute(
                [{"command": "listRoles", "verbose": True, "count": PAGE, "offset": offset}]
            )
            if response.get("error"):
                raise DynsecError(f"listRoles: {response['error']}")
            roles: Any = (response.get("data") or {}).get("roles") or []
            roles = roles if isinstance(roles, list) else []
            for role in roles:
                name = role.get("rolename") if isinstance(role, dict) else None
                if not isinstance(name, str) or not name.startswith(acl.ROLE_PREFIX):
                    continue
                node = name[len(acl.ROLE_PREFIX) :]
                if node and not node.startswith("_"):  # "_": the ACL probe's, no Node's
                    found[node] = acl.validations_in(role.get("acls") or [])
            if len(roles) < PAGE:
                return found
            offset += PAGE
