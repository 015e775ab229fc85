"""Targeted re-probes: the paths that tell a failing peer's candidates apart, probed first.

When a cycle's own results show a *suspect* (a peer whose latency, loss or path-MTU result
failed or erred, or whose throughput sample failed), the failing path P -> S has three
candidate culprits: S's side (its node, port or cable), the fabric between P's and S's
domains (an uplink, a spine), and P's own side. The next cycle probes, besides its regular
selection (`netval.model.peer_selection`):

- **S again**: a failure seen twice is not a lost burst; a pass clears S;
- **a witness in S's domain** (another member of it): S failing while the witness passes
  points at S's side; both failing at the shared part (S's domain's uplink) or P's side;
- **a witness in P's own domain**, when S is in another one: it passing clears P's own port,
  so a cross-domain failure lies between the domains; it failing too points at P.

A regular target of the cycle serves as a witness when it is one (no extra probe); witnesses
rotate with the cycle among the assigned members, so a witness that is itself bad does not
blind the next cycles. Bound: the results to S, a witness of S's domain and one of P's own
sit side by side in the report of the first cycle after the failure (one cycle) while S
keeps failing, provided P's peer set has such members (a domain of one node has no witness).
Cost: at most 3 probes per suspect, at most `MAX_SUSPECTS` suspects (the most recent
failures) per cycle. A suspect whose latency, loss and path-MTU results pass is cleared;
one not failing for `FORGET_CYCLES` cycles (e.g. no longer assigned) is forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from netval.model.ids import CheckId, Status
from netval.model.peer_selection import UNASSIGNED, hash_order
from netval.model.results import CheckResult

MAX_SUSPECTS: Final = 4
FORGET_CYCLES: Final = 3
_PATH_CHECKS: Final = frozenset({CheckId.PEER_LATENCY, CheckId.PEER_LOSS, CheckId.PEER_PATH_MTU})
_ALL_CHECKS: Final = _PATH_CHECKS | {CheckId.PEER_THROUGHPUT}


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


class Suspects:
    def __init__(self, me: str) -> None:
        self.me = me
        self._last_failed: dict[str, int] = {}  # suspect -> the last cycle it failed in

    @property
    def suspects(self) -> list[str]:
        """The most recent failures first, at most MAX_SUSPECTS."""
        ranked = sorted(self._last_failed, key=lambda p: (-self._last_failed[p], p))
        return ranked[:MAX_SUSPECTS]

    def observe(self, cycle: int, results: Iterable[CheckResult]) -> None:
        """One cycle's peer results (throughput samples included)."""
        results = list(results)
        for r in results:
            if r.check in _ALL_CHECKS and r.status.is_bad and r.subject != self.me:
                self._last_failed[r.subject] = cycle
        for peer in fine_paths(results):
            if self._last_failed.get(peer) != cycle:
                self._last_failed.pop(peer, None)
        for peer in [p for p, c in self._last_failed.items() if cycle - c > FORGET_CYCLES]:
            del self._last_failed[peer]

    def targets(
        self,
        cycle: int,
        regular: list[str],
        domains: Mapping[str, str | None],
        my_domain: str | None,
    ) -> list[str]:
        """The extra peers to probe this cycle (not in `regular`); `domains`: the assigned
        peers (node -> domain)."""
        members: dict[str, list[str]] = {}
        for node, domain in domains.items():
            if node != self.me:
                members.setdefault(domain or UNASSIGNED, []).append(node)
        members = {d: hash_order(m, d) for d, m in members.items()}
        chosen = set(regular)
        extra: list[str] = []

        def add(node: str) -> None:
            if node not in chosen:
                chosen.add(node)
                extra.append(node)

        def witness(domain: str, besides: str) -> None:
            pool = [m for m in members.get(domain, []) if m != besides]
            if not pool or any(m in chosen for m in pool):
                return  # none to be had, or a target of this cycle serves
            add(pool[cycle % len(pool)])

        mine = my_domain or UNASSIGNED
        for suspect in self.suspects:
            if suspect not in domains:
                continue  # no longer assigned
            add(suspect)
            theirs = domains[suspect] or UNASSIGNED
            witness(theirs, suspect)
            if theirs != mine:
                witness(mine, suspect)
        return extra
