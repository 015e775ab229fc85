"""Which peers a cycle's own results say are fine: latency and loss passed, path MTU did not
fail (a failed throughput sample to such a peer stops counting:
`netval.agent.peers.throughput_samples`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult

_PATH_CHECKS: Final = frozenset({CheckId.PEER_LATENCY, CheckId.PEER_LOSS, CheckId.PEER_PATH_MTU})


def fine_paths(results: Iterable[CheckResult]) -> set[str]:
    """Peers whose latency and loss passed and whose path MTU did not fail, this cycle."""
    passed: dict[str, set[CheckId]] = {}
    bad: set[str] = set()
    for r in results:
        if r.check not in _PATH_CHECKS:
            continue
        if r.status.is_bad:
            bad.add(r.subject)
        elif r.status is Status.PASS:
            passed.setdefault(r.subject, set()).add(r.check)
    need = {CheckId.PEER_LATENCY, CheckId.PEER_LOSS}
    return {p for p, checks in passed.items() if need <= checks and p not in bad}
