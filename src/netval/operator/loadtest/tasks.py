"""Every node's plan for one stage: its tasks, and the addresses of the nodes it meets. Pure.

Built when the stage is published, from the stage's windows (`RunPlan.windows_of`):

- idle window: per pair a latency probe under no load: the UDP echo, or `ib_write_lat`
  (with its server on the receiver) when the pair's first rail runs perftest;
- load window (intra, cross): per pair and per rail both ends have, a flow (`FlowTask`,
  the sender runs the engine's client) and its server (`ServeTask`, on the receiver, from
  `SERVE_LEAD_SECONDS` before the flow to `SERVE_TAIL_SECONDS` after it); the receiver's
  servers of a window and rail take ports `port`, `port + 1`, ... (one per flow it
  receives), latency servers `port + 16`, ...; a loaded latency probe per pair on the
  first rail;
- storage windows: per reader its read, with its part of the readers for a byte range.

`peers` gives each node the responder endpoint and rail addresses of every node it meets in
the stage (an agent knows only its own epoch's peer set); a node without an announced
endpoint is left out (its flows and probes fail and are counted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import timedelta

from netval.model.loadplan import (
    SERVE_LEAD_SECONDS,
    SERVE_TAIL_SECONDS,
    Engine,
    FlowTask,
    LatencyEngine,
    LatencyTask,
    LoadPlan,
    PeerAddress,
    ServeTask,
    StorageTask,
    Task,
)
from netval.model.loadtest import MAX_FANOUT
from netval.operator.ingest.peer_sets import Address, AnnouncedRails
from netval.operator.loadtest.plan import ECHO_INTERVAL_MS, RunPlan, Stage, Window, WindowKind
from netval.operator.loadtest.rails import addresses, common_rails, rail_engine

LAT_PORT_OFFSET = MAX_FANOUT  # latency servers after the bandwidth servers' ports


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def _latency(
    plan: RunPlan, w: Window, a: str, b: str, *, loaded: bool, lat_ports: Counter[str]
) -> Iterator[tuple[str, Task]]:
    """The latency probe of pair (a, b) in window `w`, and its server when perftest runs it."""
    ra, rb = plan.rails_of(a), plan.rails_of(b)
    start, seconds = (w.measure_start, w.measured_seconds)
    perftest = bool(ra.mask & rb.mask & 1) and (
        rail_engine(plan.settings.engine, ra, rb, 0) is Engine.PERFTEST
    )
    if not perftest:
        yield a, LatencyTask(window=w.id, peer=b, start=start, seconds=seconds,
                             interval_ms=ECHO_INTERVAL_MS, loaded=loaded)  # fmt: skip
        return
    port = plan.settings.port + LAT_PORT_OFFSET + lat_ports[b]
    lat_ports[b] += 1
    yield a, LatencyTask(window=w.id, peer=b, engine=LatencyEngine.PERFTEST, port=port,
                         start=start, seconds=seconds, loaded=loaded)  # fmt: skip
    yield b, ServeTask(
        window=w.id, peer=a, engine=Engine.PERFTEST, test="lat", port=port,
        start=start - _s(SERVE_LEAD_SECONDS), warmup_seconds=SERVE_LEAD_SECONDS,
        seconds=SERVE_LEAD_SECONDS + seconds + SERVE_TAIL_SECONDS, client_seconds=seconds,
        dscp=plan.settings.dscp,
    )  # fmt: skip


def _flows(plan: RunPlan, w: Window) -> Iterator[tuple[str, Task]]:
    settings = plan.settings
    warmup = (w.measure_start - w.start).total_seconds()
    measured = w.measured_seconds
    ports: Counter[tuple[str, int]] = Counter()
    for a, b in w.flows:
        ra, rb = plan.rails_of(a), plan.rails_of(b)
        for rail in common_rails(ra, rb):
            engine = rail_engine(settings.engine, ra, rb, rail)
            port = settings.port + ports[(b, rail)]
            ports[(b, rail)] += 1
            yield a, FlowTask(
                window=w.id, peer=b, rail=rail, engine=engine, port=port,
                streams=settings.streams, dscp=settings.dscp, start=w.start,
                warmup_seconds=warmup, seconds=measured,
            )  # fmt: skip
            # perftest runs a warm-up's length past the measured part (its trailing margin)
            tail = SERVE_TAIL_SECONDS + (warmup if engine is Engine.PERFTEST else 0.0)
            yield b, ServeTask(
                window=w.id, peer=a, rail=rail, engine=engine, port=port,
                streams=settings.streams, dscp=settings.dscp,
                start=w.start - _s(SERVE_LEAD_SECONDS),
                warmup_seconds=SERVE_LEAD_SECONDS + warmup,
                seconds=SERVE_LEAD_SECONDS + warmup + measured + tail, client_seconds=measured,
            )  # fmt: skip


def window_tasks(plan: RunPlan, w: Window) -> Iterator[tuple[str, Task]]:
    """(node, task) of every task of window `w`."""
    if w.kind is WindowKind.IDLE:
        lat_ports: Counter[str] = Counter()
        for a, b in w.flows:
            yield from _latency(plan, w, a, b, loaded=False, lat_ports=lat_ports)
    elif w.kind in (WindowKind.INTRA, WindowKind.CROSS):
        yield from _flows(plan, w)
        lat_ports = Counter()
        for a, b in w.flows:
            yield from _latency(plan, w, a, b, loaded=True, lat_ports=lat_ports)
    else:
        warmup = (w.measure_start - w.start).total_seconds()
        readers = len(w.flows)
        for i, (node, endpoint) in enumerate(w.flows):
            yield node, StorageTask(
                window=w.id, endpoint=endpoint, start=w.start, warmup_seconds=warmup,
                seconds=w.measured_seconds, part=i, parts=readers,
            )  # fmt: skip


def build_plans(
    plan: RunPlan,
    stage: Stage,
    *,
    term: int,
    endpoints: Mapping[str, Address] | None = None,
    announced: Mapping[str, AnnouncedRails] | None = None,
) -> dict[str, LoadPlan]:
    """Every node's plan for one stage (see the module docstring). `endpoints`: node ->
    its announced responder (address, port); `announced`: node -> its announced rails."""
    tasks: dict[str, list[Task]] = {}
    partners: dict[str, set[str]] = {}
    for w in plan.windows_of(stage):
        for node, task in window_tasks(plan, w):
            tasks.setdefault(node, []).append(task)
        if w.kind in (WindowKind.IDLE, WindowKind.INTRA, WindowKind.CROSS):
            for a, b in w.flows:
                partners.setdefault(a, set()).add(b)
                partners.setdefault(b, set()).add(a)
    known = endpoints or {}
    rails = announced or {}
    interfaces = list(plan.settings.interfaces)

    def where(peer: str) -> PeerAddress | None:
        endpoint = known.get(peer)
        if endpoint is None:
            return None
        found = addresses(interfaces, rails.get(peer), endpoint)
        return PeerAddress.model_validate(
            {"address": endpoint[0], "port": endpoint[1],
             "rails": [r[0] if r is not None else None for r in found]}
        )  # fmt: skip

    cache: dict[str, PeerAddress | None] = {}
    out: dict[str, LoadPlan] = {}
    for node, node_tasks in tasks.items():
        peers: dict[str, PeerAddress] = {}
        for peer in sorted(partners.get(node, ())):
            if peer not in cache:
                cache[peer] = where(peer)
            found = cache[peer]
            if found is not None:
                peers[peer] = found
        out[node] = LoadPlan(
            term=term,
            run=plan.run_id,
            stage=stage.index,
            validation=plan.settings.validation,
            node=node,
            issued_at=stage.issued_at,
            deadline=stage.deadline,
            max_rate_mbps=plan.settings.max_rate_mbps,
            interfaces=interfaces,
            tasks=node_tasks,
            peers=peers,
        )
    return out
