"""What a node's MQTT identity may do, as dynamic-security commands. Pure: no I/O.

Mosquitto 2.0's dynamic security plugin does not substitute `%u`/`%c` in role ACL topics
(checked on 2.0.11: a role ACL `netval/v1/+/%u/report` matches nothing), so each node gets
its own role whose topics name the node literally. Client and role names carry a prefix with
a `:`, which neither a node name (DNS subdomain) nor a password_file user (`:` separates the
hash) can contain: a node can never take the name of the operator's own login.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

from netval.model.topics import TOPIC_ROOT, TopicKind, check_topic_level

CLIENT_PREFIX: Final = "netval-node:"
ROLE_PREFIX: Final = "netval-node:"
EXPIRES_PREFIX: Final = "expires="  # in the client's textdescription: survives operator restarts

# Nothing is allowed unless a role says so. The operator's own login lives in the broker's
# password_file and acl_file: the plugin defers those clients to the acl_file.
DEFAULT_ACL_ACCESS: Final[dict[str, bool]] = {
    "publishClientSend": False,
    "publishClientReceive": False,
    "subscribe": False,
    "unsubscribe": True,
}

Command = dict[str, Any]


def client_name(node: str) -> str:
    return CLIENT_PREFIX + check_topic_level(node, "node name")


def role_name(node: str) -> str:
    return ROLE_PREFIX + check_topic_level(node, "node name")


def node_of_client(username: str) -> str | None:
    return username[len(CLIENT_PREFIX) :] if username.startswith(CLIENT_PREFIX) else None


def node_acls(node: str, validations: Iterable[str]) -> list[dict[str, Any]]:
    """In each validation that targets it, a node writes its own report, state (its will
    included), beat, endpoint and load-test results, and reads its own assignment (which
    carries its peers' endpoints: issue 24) and its own load-test plan. Nothing
    in a validation that does not target it (no `+` in the validation level): a node can
    neither fill a validation it is not part of with reports nor read its endpoints."""
    check_topic_level(node, "node name")
    acls: list[dict[str, Any]] = []
    for validation in sorted(set(validations)):
        own = f"{TOPIC_ROOT}/{check_topic_level(validation, 'validation name')}/{node}"
        acls += [
            {"acltype": "publishClientSend", "topic": f"{own}/{kind.value}", "allow": True}
            for kind in (
                TopicKind.REPORT,
                TopicKind.STATE,
                TopicKind.BEAT,  # its beats (issue 23), retained like the report
                TopicKind.ENDPOINT,
                TopicKind.LOAD_RESULT,  # NetworkLoadTest: its own results only
            )
        ]
        for read in (
            f"{own}/{TopicKind.ASSIGNMENT.value}",
            f"{own}/{TopicKind.LOAD_PLAN.value}",  # and its own load-test plan
        ):
            acls += [
                {"acltype": "subscribePattern", "topic": read, "allow": True},
                {"acltype": "publishClientReceive", "topic": read, "allow": True},
            ]
    return acls


def validations_in(acls: Iterable[Any]) -> frozenset[str]:
    """The validations a role's ACLs (as `getRole`/`listRoles` return them) cover."""
    found = set()
    prefix = TOPIC_ROOT + "/"
    for entry in acls:
        topic = entry.get("topic") if isinstance(entry, dict) else None
        if isinstance(topic, str) and topic.startswith(prefix):
            validation = topic[len(prefix) :].split("/", 1)[0]
            if validation != "+":
                found.add(validation)
    return frozenset(found)


def expiry_description(expires_at: datetime) -> str:
    return EXPIRES_PREFIX + expires_at.isoformat()


def expiry_of(description: str | None) -> datetime | None:
    if not description or not description.startswith(EXPIRES_PREFIX):
        return None
    try:
        return datetime.fromisoformat(description[len(EXPIRES_PREFIX) :])
    except ValueError:
        return None


def create_role(node: str, validations: Iterable[str] = ()) -> Command:
    return {
        "command": "createRole",
        "rolename": role_name(node),
        "acls": node_acls(node, validations),
    }


def set_role(node: str, validations: Iterable[str]) -> Command:
    """Replace the role's ACLs (Mosquitto 2.0's `modifyRole` takes the whole list)."""
    return {
        "command": "modifyRole",
        "rolename": role_name(node),
        "acls": node_acls(node, validations),
    }


def create_client(username: str, node: str, password: str, expires_at: datetime) -> Command:
    """The client is bound to the client id equal to its user name: Mosquitto ends a session
    when another connection takes its client id, so an unbound credential could end another
    node's session (and fire its `offline` will)."""
    return {
        "command": "createClient",
        "username": username,
        "clientid": username,
        "password": password,
        "textdescription": expiry_description(expires_at),
        "roles": [{"rolename": role_name(node)}],
    }


def rotate_client(username: str, node: str, password: str, expires_at: datetime) -> list[Command]:
    """A new password (the plugin disconnects the client's current connection), its expiry
    and the node's role (again, in case the client was changed by hand), in one command: the
    plugin rewrites its whole state file after every command, which dominates at scale
    (bench/enrollment.py)."""
    return [
        {"command": "modifyClient", "username": username, "password": password,
         "clientid": username,
         "roles": [{"rolename": role_name(node)}],
         "textdescription": expiry_description(expires_at)},
    ]  # fmt: skip


def delete_clients(usernames: list[str]) -> list[Command]:
    """Deleting a client disconnects it at once."""
    return [{"command": "deleteClient", "username": n} for n in usernames]


def delete_role(node: str) -> Command:
    return {"command": "deleteRole", "rolename": role_name(node)}


def set_default_access() -> list[Command]:
    return [
        {"command": "setDefaultACLAccess",
         "acls": [{"acltype": k, "allow": v} for k, v in DEFAULT_ACL_ACCESS.items()]},
    ]  # fmt: skip
