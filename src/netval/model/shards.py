"""Which broker shard a node talks to: one pure function the agent and the operator share.

With ``mqtt.shards: N`` (docs/operations.md, "Brokers beyond one process") the chart runs N
independent brokers; every agent connects to exactly one of them and the operator to all.
Both sides must agree on a node's shard without talking to each other, across processes,
Python versions and restarts, so the choice is a keyed-free, stable hash of the node name:

    shard = int.from_bytes(blake2b(node.encode("utf-8"), digest_size=8).digest(), "big") % N

BLAKE2b (hashlib, RFC 7693) with an 8-byte digest, read big-endian, modulo N. Python's
``hash()`` is not used: it is salted per process (PYTHONHASHSEED), so two processes would
disagree. Changing N moves most nodes to another shard (plain modulo, no consistent
hashing): resharding is a restart of every agent, which a changed DaemonSet does anyway.
"""

from __future__ import annotations

import hashlib
from typing import Final

MIN_SHARDS: Final = 1
MAX_SHARDS: Final = 64  # the chart's bound (values.schema.json mqtt.shards)
SHARD_PLACEHOLDER: Final = "{shard}"  # in a shard URL pattern: the shard's index


def shard_of(node: str, shards: int) -> int:
    """The shard (0..shards-1) that `node` publishes to and is subscribed on. Pure."""
    if not MIN_SHARDS <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be {MIN_SHARDS}..{MAX_SHARDS}, got {shards}")
    if shards == 1:
        return 0
    digest = hashlib.blake2b(node.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def shard_url(pattern: str, shard: int) -> str:
    """The URL of `shard` from a pattern naming it by ``{shard}`` (e.g.
    ``mqtts://netval-mqtt-{shard}.netval-system.svc:8883``). Pure; only the placeholder is
    replaced (no str.format: a URL may hold other braces, e.g. an IPv6 literal's never, but
    a user's pattern is not code)."""
    if SHARD_PLACEHOLDER not in pattern:
        raise ValueError(f"the shard URL pattern {pattern!r} has no {SHARD_PLACEHOLDER}")
    return pattern.replace(SHARD_PLACEHOLDER, str(shard))
