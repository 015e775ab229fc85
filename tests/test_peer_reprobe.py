"""Targeted re-probes (`netval.agent.peers.reprobe`), issue 33.

- the cycle after a peer fails holds, side by side, a result to it, to another member of its
  domain and to a member of the prober's own domain (the bound: one cycle), over random
  fabrics, at most 3 extra probes per suspect;
- through a real `PeerService` on loopback: a dead peer that the regular rotation would
  leave alone for cycles is probed again in the next cycle, with a witness;
"""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

import mosquitto
from netval.agent.peers.reprobe import FORGET_CYCLES, MAX_SUSPECTS, Suspects
from netval.agent.peers.service import PeerService
from netval.model.ids import CheckId, Status
from netval.model.peer_selection import peers_for_cycle, plan_peers
from netval.model.results import CheckResult
from test_peer_probe import FAST, assignment, service, spec


def res(check: CheckId, peer: str, status: Status = Status.PASS, msg: str = "m") -> CheckResult:
    return CheckResult(check=check, subject=peer, status=status, message=msg)


def echoes(peer: str, status: Status = Status.PASS) -> list[CheckResult]:
    checks = (CheckId.PEER_LATENCY, CheckId.PEER_LOSS, CheckId.PEER_PATH_MTU)
    return [res(c, peer, status) for c in checks]


@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    picks=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
    cycle=st.integers(0, 10**6),
    samples=st.integers(1, 3),
)
def test_the_next_cycle_holds_the_separating_evidence_within_bounded_cost(
    sizes: list[int], picks: tuple[int, int], cycle: int, samples: int
) -> None:
    domains = {f"n{d}-{i}": f"d{d}" for d, size in enumerate(sizes) for i in range(size)}
    names = sorted(domains)
    me = names[picks[0] % len(names)]
    others = [n for n in names if n != me]
    if not others:
        return
    suspect = others[picks[1] % len(others)]
    table = {n: d for n, d in domains.items() if n != me}
    suspects = Suspects(me)
    suspects.observe(cycle, [res(CheckId.PEER_LOSS, suspect, Status.FAIL)])
    regular = peers_for_cycle(plan_peers(me, domains[me], table), samples, cycle + 1)
    extra = suspects.targets(cycle + 1, regular, table, domains[me])
    probed = set(regular) | set(extra)
    assert not set(extra) & set(regular) and me not in probed
    assert len(extra) <= 3
    assert suspect in probed
    theirs = [n for n in others if domains[n] == domains[suspect] and n != suspect]
    if theirs:
        assert probed & set(theirs)
    own = [n for n in others if domains[n] == domains[me] and n != suspect]
    if domains[suspect] != domains[me] and own:
        assert probed & set(own)


def test_suspects_are_the_latest_failures_cleared_by_a_pass_and_forgotten() -> None:
    s = Suspects("me")
    for i in range(MAX_SUSPECTS + 2):
        s.observe(i, echoes(f"p{i}", Status.FAIL))
    assert s.suspects == [f"p{i}" for i in range(MAX_SUSPECTS + 1, 1, -1)]
    s.observe(10, echoes("p5"))  # passes again: cleared
    assert "p5" not in s.suspects
    s.observe(10, [res(CheckId.PEER_THROUGHPUT, "t", Status.FAIL)])  # a failed sample too
    assert s.suspects[0] == "t"
    s.observe(10 + FORGET_CYCLES + 1, [])
    assert s.suspects == []


def test_a_dead_peer_is_probed_again_in_the_next_cycle_with_a_witness() -> None:
    """Three peers in another rack, one probed per cycle (samplesPerDomain 1): the regular
    rotation reaches a dead one every third cycle; after its failure it is probed in the
    next cycle too, next to a live member of its rack."""
    port = mosquitto.free_port()
    me = PeerService(
        validation="v", node="me", spec=spec(port, interface="lo", samplesPerDomain=1),
        settings=FAST, resolve=lambda _ifname: "127.0.0.1",
    )  # fmt: skip
    others = [service(n, f"127.0.0.{i}", port) for i, n in ((2, "b1"), (3, "b2"))]
    dead = mosquitto.free_port()  # b3's responder is not running: no answer at all

    async def scenario() -> list[set[str]]:
        await me.start(lambda _s, _p: None)
        for o in others:
            await o.start(lambda _s, _p: None)
        members = [(o.node, o.address or "", port) for o in others] + [("b3", "127.0.0.4", dead)]
        me.handle("netval/v1/v/me/assignment", assignment("rack-a", {"rack-b": members}))
        probed: list[set[str]] = []
        for cycle in range(6):
            results = await me.probe_cycle(cycle)
            probed.append({r.subject for r in results if r.check is CheckId.PEER_LATENCY})
            if "b3" in probed[-1] and len(probed) > 1 and "b3" in probed[-2]:
                break
        for svc in [me, *others]:
            await svc.close()
        return probed

    probed = asyncio.run(scenario())
    first = next(i for i, p in enumerate(probed) if "b3" in p)
    assert first + 1 < len(probed), probed
    assert "b3" in probed[first + 1] and probed[first + 1] & {"b1", "b2"}, probed
