"""When each agent reads a storage endpoint for `storage.throughput` (pure: no I/O, no clock).

A throughput read loads the storage (up to 64 MiB per reader), so the fleet shares a budget:
per endpoint, at most `checks.storage.maxConcurrentProbes` (``N``) readers at once.

Positions (computed by the operator, `fleet_positions`)
    The operator puts the targeted nodes of a validation in one hash order (blake2b of the
    validation and the node name) and tells every agent its ``position`` in it and the count
    ``of`` nodes, in the retained ``assignment`` message (docs/architecture.md "MQTT"). An
    agent cannot count the fleet itself: its config names no nodes, and peer announcements
    exist only with ``peers.enabled``.

Slots (computed by each agent, `reads_in`)
    Wall-clock slots of `SLOT_SECONDS` aligned on the Unix epoch (slot ``s`` starts at
    ``s x SLOT_SECONDS``), the same on every agent whatever its start time or cycle count.
    A period has ``P = max(ceil(of / N), min_slots)`` slots (``min_slots`` keeps the old
    spacing of `throughputEveryCycles` cycles for small fleets). Endpoint ``e`` is read in
    slot ``s`` by the nodes whose ``position = (s + offset(e)) mod P``, ``offset`` a hash of
    the endpoint name (so one node's endpoints are not all read in the same slot). Hence:

    - per endpoint and slot, at most ``ceil(of / P) <= N`` readers (positions are distinct);
    - every node reads every endpoint exactly once per period of ``P`` slots;
    - a read starts `SLOT_GUARD_SECONDS` after its slot begins and is cut off that long before
      it ends, so reads of neighbouring slots never overlap while the agents' clocks differ
      by less than ``2 x SLOT_GUARD_SECONDS`` (2 s; NTP keeps them within milliseconds).

    When the targeted nodes change, the operator republishes every assignment; positions
    shift. While the new assignments arrive (well under a slot, but a boundary may fall
    inside: at most two slots), some agents may still act on the old schedule and others on
    the new one, each of which has at most ``N`` readers: at most ``2 x N`` then, ``N`` again
    once all have arrived. A node without an assignment (the operator has not seen it yet)
    does not read.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "MAX_FLEET",
    "SLOT_GUARD_SECONDS",
    "SLOT_SECONDS",
    "StorageAssignment",
    "StorageSlot",
    "endpoint_offset",
    "fleet_positions",
    "min_period_slots",
    "next_read_slot",
    "period_slots",
    "reads_in",
    "slot_start",
]

# A read is bounded by the request phase (5 s) and THROUGHPUT_MAX_SECONDS (10 s): it fits
# between the guards of one slot.
SLOT_SECONDS: Final = 20.0
SLOT_GUARD_SECONDS: Final = 1.0
MAX_FLEET: Final = 1_000_000


class StorageSlot(BaseModel):
    """This node's place in the storage schedule of its validation (from the operator)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    position: Annotated[int, Field(ge=0, lt=MAX_FLEET)]
    of: Annotated[int, Field(ge=1, le=MAX_FLEET)]

    @model_validator(mode="after")
    def _inside(self) -> StorageSlot:
        if self.position >= self.of:
            raise ValueError(f"position {self.position} is not below of={self.of}")
        return self


class StorageAssignment(BaseModel):
    """The storage part of the operator's retained ``assignment`` message (untrusted input
    on the agent; other keys belong to other readers)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    storage: StorageSlot | None = None


def _hash(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest(), "big")


def fleet_positions(nodes: Iterable[str], salt: str) -> dict[str, StorageSlot]:
    """Every node's slot: its rank in a hash order of `nodes` (salted by the validation)."""
    ordered = sorted(set(nodes), key=lambda n: (_hash(salt, n), n))
    return {node: StorageSlot(position=i, of=len(ordered)) for i, node in enumerate(ordered)}


def min_period_slots(every_cycles: int, interval_seconds: float, slot_seconds: float) -> int:
    """Slots of at least `every_cycles` agent intervals (a small fleet reads no more often)."""
    if slot_seconds <= 0:
        raise ValueError("slot_seconds must be positive")
    return max(1, math.ceil(every_cycles * interval_seconds / slot_seconds))


def period_slots(of: int, max_readers: int, min_slots: int = 1) -> int:
    """Slots in which every node reads each endpoint once, at most `max_readers` per slot."""
    if of < 1 or max_readers < 1:
        raise ValueError("of and max_readers must be at least 1")
    return max(math.ceil(of / max_readers), min_slots, 1)


def endpoint_offset(endpoint: str, period: int) -> int:
    return _hash("endpoint", endpoint) % period


def reads_in(position: int, period: int, endpoint: str, slot: int) -> bool:
    """Whether the node at `position` reads `endpoint` in `slot`."""
    return (slot + endpoint_offset(endpoint, period)) % period == position % period


def next_read_slot(position: int, period: int, endpoint: str, from_slot: int) -> int:
    """The first slot at or after `from_slot` in which `position` reads `endpoint`."""
    target = (position - endpoint_offset(endpoint, period)) % period
    return from_slot + (target - from_slot) % period


def slot_start(slot: int, slot_seconds: float = SLOT_SECONDS) -> float:
    return slot * slot_seconds
