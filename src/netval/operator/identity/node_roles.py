"""Each node's MQTT role covers the validations that target it, and only those (the leader's
duty; docs/operations.md "Per-node MQTT identity").

The runtime hands over which validations target which node whenever targeting changed (once
per status window, `OperatorRuntime.refresh_targets`); this keeps the broker's roles in step:
one `modifyRole` per node whose set changed, never per report, sent in requests of
`BATCH` commands; a validation is added at once and taken away after `NARROW_AFTER` (see
`role_changes`); nothing is sent before this term's runtime said what targets what. The plugin rewrites its whole state file after every command, so a change
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
import time
from collections.abc import Mapping
from typing import Any, Final

from netval.operator.identity import acl
from netval.operator.identity.dynsec import DynsecAdmin, DynsecError

log = logging.getLogger("netval.operator.identity")

BATCH: Final = 200  # commands per request: one response message stays well under 1 MiB
PAGE: Final = 500  # roles per listRoles answer
MISSING: Final = ("not found", "does not exist")  # the plugin's words for an unknown role
RETRY_SECONDS: Final = 5.0
NARROW_AFTER: Final = 60.0  # seconds a validation no longer targets a node before it goes

NodeValidations = Mapping[str, frozenset[str]]


def role_changes(
    desired: NodeValidations,
    applied: NodeValidations,
    narrowing_since: dict[str, float],
    now: float,
    hold: float,
) -> dict[str, frozenset[str]]:
    """The nodes whose role must change, with what it must cover now. A validation is added
    at once; one is taken away only after `hold` seconds of not targeting the node (noted
    in `narrowing_since`, which this updates): a term's first view of targeting may be
    partial (Nodes still being listed), and narrowing a role on it would refuse healthy
    agents. A node no validation targets keeps its role (its agents may still run a while)
    with no topics."""
    changes: dict[str, frozenset[str]] = {}
    for node in set(desired) | set(applied):
        want = desired.get(node, frozenset())
        have = applied.get(node, frozenset())
        if have - want:
            since = narrowing_since.setdefault(node, now)
            if now - since < hold:
                want = want | have
        else:
            narrowing_since.pop(node, None)
        if want != have:
            changes[node] = want
    return changes


class NodeRoleSync:
    def __init__(
        self, admin: DynsecAdmin, *, retry: float = RETRY_SECONDS, hold: float = NARROW_AFTER
    ) -> None:
        self.admin = admin
        self.retry = retry
        self.hold = hold
        self._narrowing: dict[str, float] = {}  # node -> monotonic, see role_changes
        self._have_targets = False  # this term's runtime said what targets what
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
        self._have_targets = True
        self.synced.clear()
        self._wake.set()

    def restart(self) -> None:
        """A new term: read the broker's roles again before sending anything."""
        self._read_for = -1
        self._have_targets = False
        self.synced.clear()

    def forget(self, node: str) -> None:
        """The node's role was deleted (revocation)."""
        self.applied.pop(node, None)

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                if self._have_targets and (
                    self.admin.connected or await self.admin.wait_connected(self.retry)
                ):
                    await self.sync_once()
            except DynsecError as exc:
                log.warning("cannot update the nodes' MQTT roles now (retried): %s", exc)
            if self._have_targets and self._read_for == self.admin.connects and not self._changes():
                self.synced.set()
            # the next change, or a look at the connection (a reconnect reads the roles
            # again: a new broker pod has none) and a retry of what failed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.retry)

    def _changes(self) -> dict[str, frozenset[str]]:
        return role_changes(
            self.desired, self.applied, self._narrowing, time.monotonic(), self.hold
        )

    async def sync_once(self) -> None:
        if self._read_for == self.admin.connects and not self._changes():
            return  # the usual case: a few ms of dict comparison at 10,000 nodes
        if self._read_for != self.admin.connects:
            connects = self.admin.connects
            self.applied = await self._read_roles()
            self._read_for = connects
        changes = self._changes()
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
