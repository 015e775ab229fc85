"""When the operator itself could not hear: its broker connection (one per shard) was down.

A broker restart cuts every agent of that broker and the operator at once; the agents come
back over their reconnect backoff, a few at a time, each batch below the breaker's cap, so
without a grace every late one would flip healthy -> unknown -> healthy. After the
operator's session on a shard comes back at `reconnected_at`, a node of that shard whose
last report (or beat) is older than that instant is judged as if last heard at
`reconnected_at + grace` (the agents' backoff ceiling). The grace ends for a node as soon as
it is heard again: a report received after the reconnect counts from itself, so a node that
reported after a broker restart and then went silent is stale by the normal rule. A
reconnect of one shard gives its nodes the grace, never another shard's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from netval.model.shards import shard_of

# node -> shard, remembered (a hash per lookup otherwise); past this many it starts over
MAX_REMEMBERED: Final = 200_000


@dataclass(frozen=True, slots=True)
class Spell:
    reconnected_at: datetime  # the operator's session on the shard came back
    floor: datetime  # reconnected_at + the agents' backoff ceiling


@dataclass(slots=True)
class Deafness:
    """Per shard, the last time the operator's session came back (one shared by every
    validation of a store)."""

    shards: int = 1
    spells: dict[int, Spell] = field(default_factory=dict)
    _shard: dict[str, int] = field(default_factory=dict)

    def note(self, shard: int, reconnected_at: datetime, floor: datetime) -> None:
        """The session of `shard` came back; an older reconnect never replaces a newer."""
        have = self.spells.get(shard)
        if have is None or have.reconnected_at < reconnected_at:
            self.spells[shard] = Spell(reconnected_at, floor)

    def shard(self, node: str) -> int:
        if self.shards <= 1:
            return 0
        found = self._shard.get(node)
        if found is None:
            if len(self._shard) >= MAX_REMEMBERED:
                self._shard.clear()
            found = self._shard[node] = shard_of(node, self.shards)
        return found

    def heard_at(self, node: str, reported_at: datetime) -> datetime:
        """What `node`'s silence is measured from, given its last report's time."""
        if not self.spells:
            return reported_at
        spell = self.spells.get(self.shard(node))
        if spell is None or reported_at >= spell.reconnected_at:
            return reported_at  # heard since the reconnect: the normal rule
        return max(reported_at, spell.floor)


__all__ = ["Deafness", "Spell"]
