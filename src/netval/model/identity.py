"""The names of MQTT identities, as the identity CA writes them into client certificates and
brokers read them back (docs/architecture.md "Broker identity"). Pure: no I/O.

An agent pod's identity is `<validation>/<node>`: the certificate's common name, which
Mosquitto (`use_identity_as_username`), EMQX (`peer_cert_as_username = cn`) and VerneMQ
(`use_identity_as_username`) take as the user name, so one ACL pattern,
`netval/v1/%u/report`, confines it to its own node's topics of its own validation. Both parts
are Kubernetes names (DNS-1123), which never contain `/`, `+` or `#`, so the name splits one
way only and cannot widen a pattern. RabbitMQ's MQTT plugin turns `/` into `.` before it
matches topic permissions, so the certificate also carries `<validation>.<node>` as a DNS
subject alternative name, which RabbitMQ reads with `ssl_cert_login_from =
subject_alternative_name`.

The operator's own identity has no `/`: no node identity can take its name. Brokers bind
the client id to the identity (Mosquitto `use_username_as_clientid`), so two sessions of one
identity on one broker end each other: the operator holds one session per broker
(`OPERATOR_IDENTITY`); its broker ACL check observes with `OBSERVER_IDENTITY`, which reads
netval's topics and writes only the reserved probe validation's (the chart's ACL), and is
also the identity for a read-only look at the broker (`mosquitto_sub`).
"""

from __future__ import annotations

from typing import Final

from netval.model.topics import check_topic_level

OPERATOR_IDENTITY: Final = "netval-operator"
OBSERVER_IDENTITY: Final = "netval-observer"
SEPARATOR: Final = "/"


def node_identity(validation: str, node: str) -> str:
    """The identity of `validation`'s agent on `node` (ValueError for a bad name)."""
    return f"{check_topic_level(validation, 'validation name')}{SEPARATOR}" + check_topic_level(
        node, "node name"
    )


def parse_node_identity(name: str) -> tuple[str, str] | None:
    """(validation, node) of a node identity, or None for anything else."""
    validation, sep, node = name.partition(SEPARATOR)
    if not sep:
        return None
    try:
        return check_topic_level(validation), check_topic_level(node)
    except ValueError:
        return None


def amqp_identity(validation: str, node: str) -> str:
    """The node identity as RabbitMQ matches it against a routing key (`/` becomes `.`)."""
    return node_identity(validation, node).replace(SEPARATOR, ".")
