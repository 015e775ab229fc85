"""One fingerprint per node, and the cohorts they fall into (pure, in memory).

Facts ride every report but change rarely, so the operator keeps a 16-byte digest per node:
an unchanged fingerprint costs computing the digest of ~1 KiB and one compare; only a change
(a new value, a node joining or leaving) marks the node's cohort for re-judgement, which is
O(nodes in the cohort) (`netval.operator.consistency.fold`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from netval.model.facts import FactKey
from netval.model.ids import Status
from netval.operator.consistency.judge import CohortVerdict, Settings

UNLABELLED: Final = "(unlabelled)"
UNKNOWN_MODEL: Final = "(unknown model)"
# What names the cohort when the PCI id is unreadable (an older snapshot format).
_MODEL_KEYS: Final = (FactKey.NIC_MODEL, FactKey.BOARD_ID, FactKey.RDMA_DRIVER)


@dataclass(slots=True)
class NodeFacts:
    digest: bytes
    cohort: str
    values: dict[str, str]
    since: dict[str, datetime]  # key -> when its current value was first seen


@dataclass(slots=True)
class Fleet:
    """The fingerprints of one validation's nodes and the last verdict of each cohort."""

    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    cohorts: dict[str, set[str]] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)  # cohorts to re-judge
    verdicts: dict[str, CohortVerdict] = field(default_factory=dict)
    settings: Settings = field(default_factory=Settings)
    enabled: bool = True
    outlier: Status = Status.WARN  # the fleet.consistency status of an Outlier
    violation: Status = Status.FAIL
    expires_at: datetime | None = None  # the next rollout end: re-judge everything then


def cohort_of(facts: Mapping[str, str], label_value: str | None) -> str:
    model = next((facts[k] for k in _MODEL_KEYS if k in facts), UNKNOWN_MODEL)
    return model if label_value is None else f"{model} / {label_value}"


def fingerprint(facts: Mapping[str, str], cohort: str) -> bytes:
    # NUL cannot occur in a key or a value (printable ASCII only): the encoding is unambiguous
    text = "\0".join([cohort, *(f"{k}={v}" for k, v in sorted(facts.items()))])
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def observe(
    fleet: Fleet, node: str, facts: Mapping[str, str], label_value: str | None, now: datetime
) -> bool:
    """Fold a node's facts in; True when they changed (its cohort is then marked dirty)."""
    cohort = cohort_of(facts, label_value)
    digest = fingerprint(facts, cohort)
    old = fleet.nodes.get(node)
    if old is not None and old.digest == digest:
        return False
    since = {
        key: old.since[key] if old is not None and old.values.get(key) == value else now
        for key, value in facts.items()
    }
    if old is not None and old.cohort != cohort:
        _leave(fleet, node, old.cohort)
    fleet.nodes[node] = NodeFacts(digest=digest, cohort=cohort, values=dict(facts), since=since)
    fleet.cohorts.setdefault(cohort, set()).add(node)
    fleet.dirty.add(cohort)
    return True


def forget(fleet: Fleet, node: str) -> None:
    old = fleet.nodes.pop(node, None)
    if old is not None:
        _leave(fleet, node, old.cohort)


def touch(fleet: Fleet, node: str) -> None:
    """The node's targeting changed: its cohort's membership (targeted nodes) did too."""
    known = fleet.nodes.get(node)
    if known is not None:
        fleet.dirty.add(known.cohort)


def _leave(fleet: Fleet, node: str, cohort: str) -> None:
    members = fleet.cohorts.get(cohort)
    if members is not None:
        members.discard(node)
        if not members:
            del fleet.cohorts[cohort]
    fleet.dirty.add(cohort)
