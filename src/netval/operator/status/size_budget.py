"""The status stays under 64 KiB at any fleet size (issue 23), pure.

Every section is bounded on its own (failures 50, consistency 128 keys x `maxOutliersPerKey`
named outliers, east-west 136 cells, topology's listed domains and disagreements), but the
bounds add up past what an object in etcd should carry: a 100,000-node fleet whose every node
fails, disagrees on its facts and its LLDP neighbours and loses packets to peers in other
domains reaches ~300 KiB with `maxOutliersPerKey: 100` (tests/test_status_size.py). So once the status is computed, while
its JSON is over `STATUS_BUDGET`, the longest *lists of names* are halved, least useful first;
every count stays exact (what is cut is added to the section's `more*`/`omitted*` counter):

1. consistency: named outliers per key (`moreOutliers`), then the keys (`moreKeys`) and
   violations (`moreViolations`);
2. eastWest: cells (`omittedCells`, the worst kept: they are sorted worst first), flagged
   pairs, suspect nodes and suspect links;
3. topology: domains listed per level, listed disagreements and conflicts (their counts are
   `disagreements`/`conflicts`), domain pairs (`omittedPairs`);
4. failures (`nodes.failing` and `checks` still count every node).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

from netval.model.status import NetworkValidationStatus

# Under the 64 KiB promise with room for the patch's envelope and the conditions' growth.
STATUS_BUDGET: Final = 60 * 1024


def status_bytes(status: NetworkValidationStatus) -> int:
    return len(json.dumps(status.to_patch()))


Step = Callable[[NetworkValidationStatus], NetworkValidationStatus | None]


def _outliers(s: NetworkValidationStatus) -> NetworkValidationStatus | None:
    c = s.consistency
    if c is None or not any(k.outliers for k in c.keys):
        return None
    keep = max(len(k.outliers) for k in c.keys) // 2
    keys = [
        k.model_copy(
            update={
                "outliers": k.outliers[:keep],
                "more_outliers": k.more_outliers + max(0, len(k.outliers) - keep),
            }
        )
        for k in c.keys
    ]
    return s.model_copy(update={"consistency": c.model_copy(update={"keys": keys})})


def _consistency_rows(s: NetworkValidationStatus) -> NetworkValidationStatus | None:
    c = s.consistency
    if c is None or (not c.keys and not c.violations):
        return None
    keys, violations = c.keys[: len(c.keys) // 2], c.violations[: len(c.violations) // 2]
    update = {
        "keys": keys,
        "more_keys": c.more_keys + len(c.keys) - len(keys),
        "violations": violations,
        "more_violations": c.more_violations + len(c.violations) - len(violations),
    }
    return s.model_copy(update={"consistency": c.model_copy(update=update)})


def _east_west(s: NetworkValidationStatus) -> NetworkValidationStatus | None:
    e = s.east_west
    if e is None or not (e.cells or e.flagged or e.suspects or e.link_suspects):
        return None
    cells = e.cells[: len(e.cells) // 2]
    update = {
        "cells": cells,
        "omitted_cells": e.omitted_cells + len(e.cells) - len(cells),
        "flagged": e.flagged[: len(e.flagged) // 2],
        "suspects": e.suspects[: len(e.suspects) // 2],
        "link_suspects": e.link_suspects[: len(e.link_suspects) // 2],
    }
    return s.model_copy(update={"east_west": e.model_copy(update=update)})


def _topology(s: NetworkValidationStatus) -> NetworkValidationStatus | None:
    t = s.topology
    if t is None or not (
        any(lv.listed for lv in t.levels)
        or t.listed_disagreements
        or t.listed_conflicts
        or t.domain_pairs
    ):
        return None
    pairs = t.domain_pairs[: len(t.domain_pairs) // 2]
    update = {
        "levels": [
            lv.model_copy(update={"listed": lv.listed[: len(lv.listed) // 2]}) for lv in t.levels
        ],
        "listed_disagreements": t.listed_disagreements[: len(t.listed_disagreements) // 2],
        "listed_conflicts": t.listed_conflicts[: len(t.listed_conflicts) // 2],
        "domain_pairs": pairs,
        "omitted_pairs": t.omitted_pairs + len(t.domain_pairs) - len(pairs),
    }
    return s.model_copy(update={"topology": t.model_copy(update=update)})


def _failures(s: NetworkValidationStatus) -> NetworkValidationStatus | None:
    if not s.failures:
        return None
    return s.model_copy(update={"failures": s.failures[: len(s.failures) // 2]})


STEPS: Final[tuple[Step, ...]] = (_outliers, _consistency_rows, _east_west, _topology, _failures)


def fit_status(
    status: NetworkValidationStatus, budget: int = STATUS_BUDGET
) -> NetworkValidationStatus:
    """`status`, its name lists halved (in `STEPS` order) until its JSON is within `budget`.
    Each step shortens a list or returns None, so this ends."""
    for step in STEPS:
        while status_bytes(status) > budget and (smaller := step(status)) is not None:
            status = smaller
    return status
