"""East-west peer probing at 100 and 1,000 nodes: selection, real loopback probes, matrix cost.

    python bench/peer_scale.py [--probers 10] [--interval 30]

Two fabrics: 100 nodes in 4 domains and 1,000 nodes in 16 domains (nodes dealt round robin,
so 25 per domain, and 62-63 per domain), samplesPerDomain 2, the agent's default
`ProbeSettings` (50 echoes of 64 bytes per peer, 2 DF copies of the path-MTU probe) and a
fabric MTU of 9000. Every simulated node has its own loopback address 127.10.x.y (Linux
routes all of 127.0.0.0/8 to lo), the way agents bind their own fabric address. Runs in
about a minute on 2 cores.

(Since issue 24 an agent selects within the peer set its assignment carries: its own domain
and 7 others, `netval.operator.ingest.peer_sets`; at 4 and 16 domains below that is every
domain at 100 nodes and 8 of 16 per epoch at 1,000. The selection here runs over the whole
table, as before: per-cycle figures for up to 8 domains; bench/peer_endpoints.py measures
the peer sets.)

1. Selection (pure `netval.model.peer_selection`, every node of the fabric): the plan each
   agent computes, then cycles simulated from cycle 0 until every ordered pair (a probed b)
   has been probed: peers and probe datagrams per node per cycle, probers per target per
   cycle (mean / max over all cycles), the cycles until full coverage (against the
   documented bound ceil(largest member list / samples)) and their wall time at the agent
   interval; the throughput slots: rotation length, concurrent samples per slot, samples
   per target per slot, and how often a node sends one.
2. Real sockets: real `PeerResponder`s (UDP echo + TCP sink) on distinct 127.10.x.y
   addresses, all of them in one child process, and one probe cycle (`probe_peer` on the
   selected peers, at most `MAX_CONCURRENT_PEERS` at once, as `PeerService.probe_cycle`)
   from each of a sample of probers, one prober after another (each alone, as an agent runs
   its cycle on its own node: the wall time is one agent's cycle). The child's CPU time
   over the cycles divided by the datagrams its responders handled is the responder's cost
   per datagram; the prober's CPU is the parent's `process_time` over its cycle.
   At 100 nodes every node has a real responder. At 1,000 nodes only the nodes the sampled
   probers select get one (the union of their targets, ~30 % of the fabric): a responder
   nobody probes costs nothing (no timers, two idle sockets) and a real node runs one
   responder, not 1,000, so starting the rest would only measure the bench. The probers'
   selection still runs over the whole 1,000-node table.
   One prober at a time means a responder mostly wakes up once per datagram: the figure is
   the unbatched (worst) case.
3. Operator matrix: the peer results of every node's latest report, shaped as agents
   report them (3 results per peer probed this cycle, with the probe's observed keys, plus
   the throughput samples the agent still carries: its samples of the last
   max(4 rotations, 20) slots, at most 16), with one lossy node (10 % loss to and from it)
   and one oversubscribed domain pair (cross 1/4 of intra), fed to `east_west(...)` as the
   operator does; median wall time of several runs, what that costs when the status is
   recomputed every status window (the operator's default, while reports keep arriving),
   and the summary's JSON size (as in the status patch: by alias, without nulls).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import multiprocessing as mp
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from netval.agent.peers.echo import probe_peer
from netval.agent.peers.responder import PeerResponder
from netval.agent.peers.service import (
    MAX_CONCURRENT_PEERS,
    MIN_SLOT_SECONDS,
    MIN_TTL_SLOTS,
    THROUGHPUT_KEEP,
    TTL_ROTATIONS,
)
from netval.agent.peers.session import IPV4_UDP_OVERHEAD
from netval.agent.peers.target import PeerTarget, ProbeSettings
from netval.agent.peers.wire import UDP_HEADER
from netval.model.ids import CheckId, Status
from netval.model.peer_selection import (
    PeerPlan,
    peers_for_cycle,
    plan_peers,
    rotation_length,
    throughput_schedule,
)
from netval.model.results import CheckResult
from netval.model.spec import PeerChecks
from netval.operator.settings import DEFAULT_STATUS_WINDOW
from netval.operator.state.east_west_matrix import east_west

SCALES = ((100, 4), (1000, 16))  # (nodes, domains)
SAMPLES = 2  # samplesPerDomain (the default)
MTU = 9000  # checks.mtu.interfaceMTU (the default)
CYCLE = 7  # the cycle number of the real probe run (any works)
HOST_TIMEOUT = 60.0  # seconds to wait for the responder process to answer
PHASE_TIMEOUT = 120.0  # bound on one scale's real probe phase


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the fabric ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fabric:
    nodes: list[str]
    domain: dict[str, str | None]
    address: dict[str, str]

    @property
    def domains(self) -> int:
        return len(set(self.domain.values()))


def make_fabric(n: int, d: int) -> Fabric:
    nodes = [f"gpu-{i:04d}" for i in range(n)]
    return Fabric(
        nodes=nodes,
        domain={node: f"rack-{i % d:02d}" for i, node in enumerate(nodes)},
        # distinct loopback addresses, one per node (up to 200 x 256 of them)
        address={node: f"127.10.{i // 200}.{i % 200 + 1}" for i, node in enumerate(nodes)},
    )


def datagrams_per_peer(settings: ProbeSettings) -> int:
    """Datagrams one peer costs per cycle when its path MTU passes at once."""
    return settings.count + settings.mtu_tries


def ip_bytes_per_peer(settings: ProbeSettings, mtu: int) -> int:
    return settings.count * (settings.echo_size + IPV4_UDP_OVERHEAD) + settings.mtu_tries * mtu


# -- 1. selection -------------------------------------------------------------------------


@dataclass
class Selection:
    nodes: int
    domains: int
    plans: dict[str, PeerPlan]
    plan_us: float  # median plan_peers per agent
    select_us: float  # mean peers_for_cycle per agent and cycle
    peers_min: int
    peers_mean: float
    peers_max: int
    probers_mean: float  # per target per cycle
    probers_max: int
    probers_min: int
    bound: int  # documented coverage cycles (max over nodes)
    cycles_either: int | None  # every unordered pair probed in at least one direction
    cycles_both: int | None  # every ordered pair probed
    rotation: int
    slot_seconds: float
    concurrent_max: int  # throughput samples at once, fabric-wide
    per_target_max: int  # throughput samples to one target in one slot
    cross_pairs: int  # unordered cross-domain pairs sampled in the first rotation
    cross_pairs_all: int
    slots_between: float  # mean slots between two samples sent by one node


def simulate_selection(fab: Fabric, samples: int, interval: float) -> Selection:
    n = len(fab.nodes)
    index = {node: i for i, node in enumerate(fab.nodes)}
    plans: dict[str, PeerPlan] = {}
    plan_times: list[float] = []
    for node in fab.nodes:
        t = time.perf_counter()
        plans[node] = plan_peers(node, fab.domain[node], fab.domain)
        plan_times.append(time.perf_counter() - t)
    bound = max(math.ceil(p.largest / samples) for p in plans.values())

    ordered = bytearray(n * n)
    unordered = bytearray(n * n)
    need_ordered, need_unordered = n * (n - 1), n * (n - 1) // 2
    got_ordered = got_unordered = 0
    cycles_either: int | None = None
    cycles_both: int | None = None
    peer_counts: list[int] = []
    probers_max, probers_min = 0, n
    select_time = 0.0
    cap = 4 * bound + 16  # bounded: far beyond the documented coverage
    cycle = 0
    while cycle < cap and cycles_both is None:
        t = time.perf_counter()
        chosen = [peers_for_cycle(plans[node], samples, cycle) for node in fab.nodes]
        select_time += time.perf_counter() - t
        incoming = [0] * n
        for i, peers in enumerate(chosen):
            peer_counts.append(len(peers))
            for peer in peers:
                j = index[peer]
                incoming[j] += 1
                if not ordered[i * n + j]:
                    ordered[i * n + j] = 1
                    got_ordered += 1
                u = min(i, j) * n + max(i, j)
                if not unordered[u]:
                    unordered[u] = 1
                    got_unordered += 1
        probers_max = max(probers_max, max(incoming))
        probers_min = min(probers_min, min(incoming))
        cycle += 1
        if cycles_either is None and got_unordered == need_unordered:
            cycles_either = cycle
        if got_ordered == need_ordered:
            cycles_both = cycle

    # throughput slots over four rotations
    m = rotation_length(fab.domains)
    slots = 4 * m
    concurrent: list[int] = []
    per_target_max = 0
    cross: set[frozenset[str | None]] = set()
    for slot in range(slots):
        pairs = throughput_schedule(fab.domain, slot)
        concurrent.append(len(pairs))
        hits = Counter(p.target for p in pairs)
        per_target_max = max(per_target_max, max(hits.values(), default=0))
        if slot < m:
            cross |= {frozenset((p.prober_domain, p.target_domain)) for p in pairs if p.cross}
    d = fab.domains
    return Selection(
        nodes=n,
        domains=d,
        plans=plans,
        plan_us=statistics.median(plan_times) * 1e6,
        select_us=select_time / (cycle * n) * 1e6,
        peers_min=min(peer_counts),
        peers_mean=statistics.fmean(peer_counts),
        peers_max=max(peer_counts),
        probers_mean=statistics.fmean(peer_counts),  # every probe has one target
        probers_max=probers_max,
        probers_min=probers_min,
        bound=bound,
        cycles_either=cycles_either,
        cycles_both=cycles_both,
        rotation=m,
        slot_seconds=max(interval, MIN_SLOT_SECONDS),
        concurrent_max=max(concurrent),
        per_target_max=per_target_max,
        cross_pairs=len(cross),
        cross_pairs_all=d * (d - 1) // 2,
        slots_between=n * slots / max(1, sum(concurrent)),
    )


# -- 2. real sockets: the responder host (child process) ----------------------------------


def responder_host(conn: Connection) -> None:
    """Child process: runs PeerResponders on request; answers counters and its CPU time."""
    asyncio.run(_host(conn))


def _counters(responders: Sequence[PeerResponder]) -> dict[str, float]:
    stats = [r.stats for r in responders]
    return {
        "cpu": time.process_time(),
        "datagrams": sum(
            s.udp_replies + s.udp_rate_limited + s.udp_malformed + s.udp_send_failures
            for s in stats
        ),
        "replies": sum(s.udp_replies for s in stats),
        "limited": sum(s.udp_rate_limited for s in stats),
    }


async def _host(conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def readable() -> None:
        try:
            inbox.put_nowait(conn.recv())
        except (EOFError, OSError):  # the parent is gone
            loop.remove_reader(conn.fileno())
            inbox.put_nowait(("exit", None))

    loop.add_reader(conn.fileno(), readable)
    responders: list[PeerResponder] = []
    try:
        while True:
            command, arg = await inbox.get()
            if command == "start":
                port = 0  # the first picks a free port; the others share it, as peers.port
                endpoints: dict[str, tuple[str, int]] = {}
                for node, address in arg:
                    responder = PeerResponder(address, port)
                    try:
                        await responder.start()
                    except OSError:  # that port is taken on this address: any port will do
                        await responder.close()
                        responder = PeerResponder(address, 0)
                        await responder.start()
                    port = port or responder.udp_port
                    responders.append(responder)
                    endpoints[node] = (address, responder.udp_port)
                conn.send(endpoints)
            elif command == "mark":
                conn.send(_counters(responders))
            elif command == "stop":
                for responder in responders:
                    await responder.close()
                responders.clear()
                conn.send(True)
            else:
                return
    finally:
        for responder in responders:
            await responder.close()


def ask(host: Connection, command: str, arg: Any = None) -> Any:
    host.send((command, arg))
    if not host.poll(HOST_TIMEOUT):
        raise RuntimeError(f"the responder process did not answer {command!r}")
    return host.recv()


# -- 2. real sockets: the probers (this process) ------------------------------------------


@dataclass
class ProberCycle:
    peers: int
    wall: float
    cpu: float
    datagrams: int  # handled by the responders: echoes + DF probes this prober sent
    replies: int
    echoes_sent: int
    echoes_received: int
    not_pass: int
    responder_cpu: float
    limited: int
    p50_ms: list[float] = field(default_factory=list)


async def agent_cycle(
    source: str, targets: list[PeerTarget], settings: ProbeSettings, checks: PeerChecks
) -> list[CheckResult]:
    """What `PeerService.probe_cycle` does with its targets."""
    limit = asyncio.Semaphore(MAX_CONCURRENT_PEERS)

    async def one(target: PeerTarget) -> list[CheckResult]:
        async with limit:
            return await probe_peer(
                target, checks=checks, mtu=MTU, source=source, settings=settings
            )

    per_peer = await asyncio.gather(*(one(t) for t in targets))
    return [r for results in per_peer for r in results]


async def probe_phase(
    fab: Fabric,
    plans: dict[str, PeerPlan],
    probers: list[str],
    endpoints: dict[str, tuple[str, int]],
    host: Connection,
    settings: ProbeSettings,
) -> list[ProberCycle]:
    checks = PeerChecks(enabled=True)
    out: list[ProberCycle] = []
    for me in probers:
        names = peers_for_cycle(plans[me], SAMPLES, CYCLE)
        targets = [PeerTarget(p, *endpoints[p], fab.domain[p]) for p in names]
        before = ask(host, "mark")
        cpu0, t0 = time.process_time(), time.perf_counter()
        results = await agent_cycle(fab.address[me], targets, settings, checks)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        await asyncio.sleep(0.02)  # let the last replies' bookkeeping settle in the child
        after = ask(host, "mark")
        cycle = ProberCycle(
            peers=len(targets),
            wall=wall,
            cpu=cpu,
            datagrams=int(after["datagrams"] - before["datagrams"]),
            replies=int(after["replies"] - before["replies"]),
            echoes_sent=0,
            echoes_received=0,
            not_pass=sum(r.status is not Status.PASS for r in results),
            responder_cpu=after["cpu"] - before["cpu"],
            limited=int(after["limited"] - before["limited"]),
        )
        for r in results:
            if r.check is CheckId.PEER_LOSS:
                cycle.echoes_sent += int(r.observed.get("sent", 0))  # type: ignore[arg-type]
                cycle.echoes_received += int(r.observed.get("received", 0))  # type: ignore[arg-type]
            elif r.check is CheckId.PEER_LATENCY and r.status is Status.PASS:
                cycle.p50_ms.append(float(r.observed["p50Ms"]))  # type: ignore[arg-type]
        out.append(cycle)
    return out


@dataclass
class RealRun:
    nodes: int
    responders: int
    probers: int
    cycles: list[ProberCycle]

    def summary(self) -> dict[str, float]:
        c = self.cycles
        datagrams = sum(x.datagrams for x in c)
        return {
            "peers": statistics.fmean(x.peers for x in c),
            "echoes": statistics.fmean(x.echoes_sent for x in c),
            "sent": statistics.fmean(x.datagrams for x in c),
            "replies": statistics.fmean(x.replies for x in c),
            "wall_p50": statistics.median(x.wall for x in c),
            "wall_max": max(x.wall for x in c),
            "cpu_p50": statistics.median(x.cpu for x in c),
            "resp_us": sum(x.responder_cpu for x in c) / max(1, datagrams) * 1e6,
            "prober_us": sum(x.cpu for x in c) / max(1, datagrams) * 1e6,
            "rtt_p50": statistics.median([v for x in c for v in x.p50_ms] or [math.nan]),
            "not_pass": sum(x.not_pass for x in c),
            "lost": sum(x.echoes_sent - x.echoes_received for x in c),
            "limited": sum(x.limited for x in c),
        }


def real_sockets(
    fab: Fabric,
    plans: dict[str, PeerPlan],
    host: Connection,
    probers: int,
    full_responders: int,
    settings: ProbeSettings,
    seed: int,
) -> RealRun:
    sample = sorted(random.Random(seed).sample(fab.nodes, min(probers, len(fab.nodes))))
    if len(fab.nodes) <= full_responders:
        served = list(fab.nodes)
    else:  # the nodes the sampled probers select this cycle (see the module docstring)
        wanted = {p for me in sample for p in peers_for_cycle(plans[me], SAMPLES, CYCLE)}
        served = [n for n in fab.nodes if n in wanted]
    endpoints: dict[str, tuple[str, int]] = ask(
        host, "start", [(n, fab.address[n]) for n in served]
    )
    try:
        cycles = asyncio.run(
            asyncio.wait_for(
                probe_phase(fab, plans, sample, endpoints, host, settings), PHASE_TIMEOUT
            )
        )
    finally:
        ask(host, "stop")
    return RealRun(len(fab.nodes), len(served), len(sample), cycles)


# -- 3. operator matrix -------------------------------------------------------------------


def _latency(peer: str, domain: str | None, address: str, rng: random.Random) -> CheckResult:
    p50 = 0.018 + rng.random() * 0.01
    p99, jit = p50 * 2.5, p50 * 0.2
    return CheckResult(
        check=CheckId.PEER_LATENCY,
        subject=peer,
        status=Status.PASS,
        message=(
            f"round trip to {peer}: p50 {p50:.3f} ms, p99 {p99:.3f} ms, jitter {jit:.3f} ms "
            "over 50 echoes; p50 within the maximum of 1 ms"
        ),
        observed={
            "domain": domain,
            "address": address,
            "p50Ms": round(p50, 4),
            "p99Ms": round(p99, 4),
            "jitterMs": round(jit, 4),
            "minMs": round(p50 * 0.8, 4),
            "maxMs": round(p99 * 1.5, 4),
            "samples": 50,
        },
        expected={"maxLatencyMs": 1.0},
    )


def _loss(peer: str, domain: str | None, address: str, lost: int) -> CheckResult:
    percent = 100.0 * lost / 50
    bad = percent > 0.1
    return CheckResult(
        check=CheckId.PEER_LOSS,
        subject=peer,
        status=Status.FAIL if bad else Status.PASS,
        message=(
            f"{lost} of 50 echoes to {peer} lost ({percent:.2f}%); "
            f"{'above' if bad else 'within'} the maximum of 0.1%"
        ),
        observed={
            "domain": domain,
            "address": address,
            "lossPercent": percent,
            "sent": 50,
            "received": 50 - lost,
        },
        expected={"maxLossPercent": 0.1},
    )


def _path_mtu(peer: str, domain: str | None, address: str) -> CheckResult:
    return CheckResult(
        check=CheckId.PEER_PATH_MTU,
        subject=peer,
        status=Status.PASS,
        message=f"a {MTU}-byte DF packet reached {peer} and was acknowledged",
        observed={"domain": domain, "address": address, "pathMTU": MTU, "method": "echo"},
        expected={"pathMTU": MTU},
    )


def _throughput(
    peer: str, domain: str | None, address: str, mbps: float, age: float
) -> CheckResult:
    seconds = 1.0
    nbytes = int(mbps * 1e6 / 8 * seconds)
    observed: dict[str, Any] = {
        "domain": domain,
        "address": address,
        "mbps": round(mbps, 3),
        "bytes": nbytes,
        "seconds": seconds,
    }
    message = (
        f"{mbps:.1f} Mbit/s to {peer} ({nbytes} bytes in {seconds:.3f} s, one TCP stream; "
        "judged as a cross/intra-domain ratio by the operator)"
    )
    if age > 0:
        observed["ageSeconds"] = round(age, 1)
        message += f" (measured {age:.0f} s ago)"
    return CheckResult(
        check=CheckId.PEER_THROUGHPUT,
        subject=peer,
        status=Status.PASS,
        message=message,
        observed=observed,
        expected={"minThroughputRatio": 0.5},
    )


def agent_peer_results(
    fab: Fabric, plans: dict[str, PeerPlan], slot_seconds: float, seed: int
) -> tuple[dict[str, tuple[CheckResult, ...]], str, tuple[str, str]]:
    """Every node's peer.* results of its latest report (see the module docstring)."""
    rng = random.Random(seed)
    lossy = fab.nodes[len(fab.nodes) // 3]
    slow = ("rack-00", "rack-01")
    out: dict[str, list[CheckResult]] = {}
    for me in fab.nodes:
        results: list[CheckResult] = []
        for peer in peers_for_cycle(plans[me], SAMPLES, CYCLE):
            dom, addr = fab.domain[peer], fab.address[peer]
            lost = 5 if lossy in (me, peer) else 0
            results += [
                _latency(peer, dom, addr, rng),
                _loss(peer, dom, addr, lost),
                _path_mtu(peer, dom, addr),
            ]
        out[me] = results
    # throughput: the samples each agent still carries at report time
    m = rotation_length(fab.domains)
    ttl = max(TTL_ROTATIONS * m, MIN_TTL_SLOTS)
    now = 1000 * m + 3
    carried: dict[str, dict[str, CheckResult]] = {n: {} for n in fab.nodes}
    for slot in range(now - ttl, now):
        for pair in throughput_schedule(fab.domain, slot):
            if not pair.cross:
                mbps = 400.0
            elif {pair.prober_domain, pair.target_domain} == set(slow):
                mbps = 100.0
            else:
                mbps = 380.0
            mbps *= 1 + (rng.random() - 0.5) * 0.1
            kept = carried[pair.prober]
            kept.pop(pair.target, None)
            kept[pair.target] = _throughput(
                pair.target,
                pair.target_domain,
                fab.address[pair.target],
                mbps,
                (now - slot) * slot_seconds,
            )
            while len(kept) > THROUGHPUT_KEEP:
                kept.pop(next(iter(kept)))
    for node, kept in carried.items():
        out[node] += list(reversed(kept.values()))
    return {n: tuple(rs) for n, rs in out.items()}, lossy, slow


@dataclass
class MatrixCost:
    nodes: int
    results: int
    per_report: int  # peer results in one report (median)
    per_report_bytes: int  # their JSON size
    build_s: float
    median_ms: float
    max_ms: float
    rounds: int
    cells: int
    omitted: int
    flagged: int
    suspects: list[str]
    lossy: str
    summary_bytes: int


def matrix_cost(
    fab: Fabric, plans: dict[str, PeerPlan], slot_seconds: float, rounds: int, seed: int
) -> MatrixCost:
    t = time.perf_counter()
    by_node, lossy, _slow = agent_peer_results(fab, plans, slot_seconds, seed)
    build = time.perf_counter() - t
    times: list[float] = []
    summary = None
    for _ in range(rounds):
        t = time.perf_counter()
        summary = east_west(by_node, fab.domain, min_throughput_ratio=0.5)
        times.append(time.perf_counter() - t)
    assert summary is not None
    counts = sorted(len(rs) for rs in by_node.values())
    median_node = next(n for n, rs in by_node.items() if len(rs) == counts[len(counts) // 2])
    report_bytes = len(
        json.dumps([r.model_dump(mode="json") for r in by_node[median_node]], separators=(",", ":"))
    )
    return MatrixCost(
        nodes=len(fab.nodes),
        results=sum(counts),
        per_report=counts[len(counts) // 2],
        per_report_bytes=report_bytes,
        build_s=build,
        median_ms=statistics.median(times) * 1e3,
        max_ms=max(times) * 1e3,
        rounds=rounds,
        cells=len(summary.cells),
        omitted=summary.omitted_cells,
        flagged=len(summary.flagged),
        suspects=[s.node for s in summary.suspects],
        lossy=lossy,
        summary_bytes=len(summary.model_dump_json(by_alias=True, exclude_none=True)),
    )


# -- output ---------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def print_tables(
    args: argparse.Namespace,
    settings: ProbeSettings,
    selections: list[Selection],
    runs: list[RealRun],
    matrices: list[MatrixCost],
    total: float,
) -> None:
    per_peer = datagrams_per_peer(settings)
    print(f"command: {shlex.join(['python', *sys.argv])}")
    print(
        f"samplesPerDomain {SAMPLES}, {settings.count} echoes of {settings.echo_size} B + "
        f"{settings.mtu_tries} DF probes of {MTU} B per peer, interval {args.interval:g} s, "
        f"MAX_CONCURRENT_PEERS {MAX_CONCURRENT_PEERS}; total run {total:.0f} s"
    )
    print()
    print("Selection (pure, every node):")
    print(
        "| nodes | domains | peers / node / cycle | probe datagrams / node / cycle "
        "| IP bytes / node / cycle | probers per target per cycle (mean / max) "
        "| cycles to cover all pairs (bound) | coverage time | plan / select per agent |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in selections:
        peers = (
            f"{s.peers_mean:g}"
            if s.peers_min == s.peers_max
            else f"{s.peers_mean:.1f} ({s.peers_min}-{s.peers_max})"
        )
        both = s.cycles_both if s.cycles_both is not None else f"> {4 * s.bound + 16}"
        either = s.cycles_either if s.cycles_either is not None else "-"
        coverage = _duration(s.cycles_both * args.interval) if s.cycles_both else "-"
        print(
            f"| {s.nodes:,} | {s.domains} | {peers} | {s.peers_mean * per_peer:,.0f} "
            f"({s.peers_mean * settings.count:,.0f} echoes) "
            f"| {s.peers_mean * ip_bytes_per_peer(settings, MTU) / 1024:,.0f} KiB "
            f"| {s.probers_mean:.0f} / {s.probers_max} "
            f"| {both} ({s.bound}); one direction: {either} | {coverage} "
            f"| {s.plan_us / 1e3:.2f} ms / {s.select_us:.1f} us |"
        )
    print()
    print("Throughput slots (slot = interval):")
    print(
        "| nodes | domains | rotation | rotation time | cross pairs per rotation "
        "| samples at once (max) | samples per target per slot (max) | one sample per node every |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in selections:
        print(
            f"| {s.nodes:,} | {s.domains} | {s.rotation} slots "
            f"| {_duration(s.rotation * s.slot_seconds)} "
            f"| {s.cross_pairs} of {s.cross_pairs_all} | {s.concurrent_max} | {s.per_target_max} "
            f"| {s.slots_between:.0f} slots ({_duration(s.slots_between * s.slot_seconds)}) |"
        )
    print()
    print("Real sockets (one probe cycle per sampled prober, loopback, responders in one process):")
    print(
        "| nodes | real responders | probers | peers / cycle | datagrams sent / cycle "
        "| replies | cycle wall p50 (max) | prober CPU / cycle | responder CPU / datagram "
        "| responder CPU / node / cycle | RTT p50 | not pass |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        r = run.summary()
        print(
            f"| {run.nodes:,} | {run.responders} | {run.probers} | {r['peers']:g} "
            f"| {r['sent']:,.0f} ({r['echoes']:,.0f} echoes) | {r['replies']:,.0f} "
            f"| {r['wall_p50']:.2f} s ({r['wall_max']:.2f}) | {r['cpu_p50'] * 1e3:.0f} ms "
            f"| {r['resp_us']:.1f} us | {r['resp_us'] * r['sent'] / 1e3:.1f} ms "
            f"| {r['rtt_p50'] * 1e3:.1f} us | {r['not_pass']:.0f} |"
        )
    print()
    print("Operator matrix (east_west over every node's latest peer results):")
    print(
        "| nodes | peer results in | per report | east_west p50 (max) | cells shown / omitted "
        f"| CPU at one run per {DEFAULT_STATUS_WINDOW:g} s status window "
        "| flagged | suspects | summary JSON |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in matrices:
        suspect = "lossy node" if m.suspects == [m.lossy] else ", ".join(m.suspects) or "none"
        print(
            f"| {m.nodes:,} | {m.results:,} | {m.per_report} ({m.per_report_bytes / 1024:.1f} KiB) "
            f"| {m.median_ms:.1f} ms ({m.max_ms:.1f}, {m.rounds} runs) "
            f"| {m.cells} / {m.omitted} "
            f"| {m.median_ms / 1e3 / DEFAULT_STATUS_WINDOW * 100:.1f} % of a core "
            f"| {m.flagged} | {suspect} "
            f"| {m.summary_bytes / 1024:.1f} KiB |"
        )
    lost = sum(run.summary()["lost"] for run in runs)
    limited = sum(run.summary()["limited"] for run in runs)
    print()
    print(
        f"checks: echoes lost on loopback {lost:.0f}, rate-limited {limited:.0f}; "
        f"prober CPU / datagram "
        + ", ".join(f"{run.summary()['prober_us']:.1f} us ({run.nodes:,})" for run in runs)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probers", type=int, default=10, help="sampled probers per scale")
    parser.add_argument(
        "--full-responders",
        type=int,
        default=100,
        help="up to this many nodes every node gets a real responder",
    )
    parser.add_argument("--interval", type=float, default=30.0, help="agent interval, seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--matrix-baseline",
        metavar="GIT_REV",
        help="also time east_west as of this git revision, alternating with the current one "
        "on the same inputs (before/after of an aggregation change), and check equal output",
    )
    args = parser.parse_args()
    if args.probers < 1 or args.interval < MIN_SLOT_SECONDS:
        parser.error(f"--probers >= 1 and --interval >= {MIN_SLOT_SECONDS:g} are required")
    settings = ProbeSettings()
    assert settings.echo_size >= UDP_HEADER.size
    started = time.perf_counter()

    fabrics = [make_fabric(n, d) for n, d in SCALES]
    selections: list[Selection] = []
    for fab in fabrics:
        log(f"selection: {len(fab.nodes)} nodes, {fab.domains} domains")
        selections.append(simulate_selection(fab, SAMPLES, args.interval))

    runs: list[RealRun] = []
    ctx = mp.get_context("spawn")
    host, child_end = ctx.Pipe()
    child = ctx.Process(target=responder_host, args=(child_end,), daemon=True)
    child.start()
    try:
        for fab, sel in zip(fabrics, selections, strict=True):
            log(f"real sockets: {len(fab.nodes)} nodes, {args.probers} probers")
            runs.append(
                real_sockets(
                    fab, sel.plans, host, args.probers, args.full_responders, settings, args.seed
                )
            )
        host.send(("exit", None))
    finally:
        child.join(10)
        if child.is_alive():
            child.terminate()
            child.join(5)
        with contextlib.suppress(OSError):
            host.close()

    matrices: list[MatrixCost] = []
    for fab, sel in zip(fabrics, selections, strict=True):
        log(f"operator matrix: {len(fab.nodes)} nodes")
        rounds = 15 if len(fab.nodes) <= 100 else 7
        matrices.append(matrix_cost(fab, sel.plans, sel.slot_seconds, rounds, args.seed))

    print_tables(args, settings, selections, runs, matrices, time.perf_counter() - started)
    if args.matrix_baseline:
        compare_matrix(args.matrix_baseline, fabrics, selections, args.seed)


def load_baseline(rev: str) -> Any:
    """`netval.operator.state.east_west_matrix` as of git revision `rev` (before the layout
    of issue 10: `netval.operator.east_west`), as a separate module."""
    for path in ("state/east_west_matrix.py", "east_west.py"):
        found = subprocess.run(
            ["git", "show", f"{rev}:src/netval/operator/{path}"], capture_output=True, text=True
        )  # fmt: skip
        if found.returncode == 0:
            break
    found.check_returncode()
    source = found.stdout
    spec = importlib.util.spec_from_loader("east_west_baseline", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pydantic look their module up
    exec(compile(source, f"{rev}:east_west.py", "exec"), module.__dict__)
    return module


def compare_matrix(rev: str, fabrics: list[Fabric], selections: list[Selection], seed: int) -> None:
    baseline = load_baseline(rev)
    print(f"\nOperator matrix, {rev} vs this tree (alternating on the same inputs, medians):")
    print("| nodes | baseline | now | speed-up | same output |")
    print("|---:|---:|---:|---:|---|")
    for fab, sel in zip(fabrics, selections, strict=True):
        by_node, _, _ = agent_peer_results(fab, sel.plans, sel.slot_seconds, seed)
        rounds = 15 if len(fab.nodes) <= 100 else 7
        old_t: list[float] = []
        new_t: list[float] = []
        for _ in range(rounds):
            for fn, into in ((baseline.east_west, old_t), (east_west, new_t)):
                t = time.perf_counter()
                out = fn(by_node, fab.domain, min_throughput_ratio=0.5)
                into.append(time.perf_counter() - t)
        old_out = baseline.east_west(by_node, fab.domain, min_throughput_ratio=0.5)
        same = json.dumps(old_out.model_dump(mode="json"), sort_keys=True) == json.dumps(
            out.model_dump(mode="json"), sort_keys=True
        )
        o, n = statistics.median(old_t) * 1e3, statistics.median(new_t) * 1e3
        print(f"| {len(fab.nodes):,} | {o:.1f} ms | {n:.1f} ms | {o / n:.1f}x | {same} |")


if __name__ == "__main__":
    main()
