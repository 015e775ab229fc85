"""A planned flow (`FlowTask`) and its server (`ServeTask`) as engine runs.

A flow is the engine's client on the sender's rail; its server runs on the receiver's rail,
started by the receiver's own plan `SERVE_LEAD` before the flow and killed at its end. The
sender's result is the receiver's count of the measured seconds (iperf3's sum_received,
perftest's average), the sender engine's CPU (its own report and its demand from
schedstat) and the TCP retransmits; the receiver reports its server's CPU demand and who
connected (a server taken by another client than the planned sender says so).

Nothing here raises for what the network, the engine or its output does: every failure is
the result's `error`. An engine the node lacks is `EngineUnavailable`; the executor names
it once in the node's result.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from netval.agent.loadtest import iperf3, perftest
from netval.agent.loadtest.engine_process import EngineRun, run_engine
from netval.agent.loadtest.engines import (
    IB_WRITE_BW,
    IB_WRITE_LAT,
    IPERF3,
    EngineUnavailable,
    Versions,
    find_binary,
    rdma_device_ready,
)
from netval.agent.loadtest.rails import Rail, service_level
from netval.model.loadplan import (
    SERVE_LEAD_SECONDS,
    SERVE_TAIL_SECONDS,
    Engine,
    FlowResult,
    FlowTask,
    LatencyResult,
    ServeResult,
    ServeTask,
)
from netval.model.snapshot import Transport
from netval.model.spec import Checks

# after its planned end: the engine's closing exchange (iperf3's results travel over the
# control connection, behind whatever the loaded fabric still queues: seconds, not ms)
KILL_SLACK_SECONDS: Final = SERVE_TAIL_SECONDS - 0.5  # the server outlives its client
RETRY_SECONDS: Final = 0.2  # between attempts while the server is not up yet
_ACCEPTED: Final = re.compile(rb"Accepted connection from ([0-9a-fA-F:.]+)")


@dataclass(frozen=True, slots=True)
class Context:
    """What a flow needs besides its task: this node's rail, the peer's rail address, the
    validation's checks (GID index, PFC), the per-flow cap, the engine versions."""

    rail: Rail | None
    peer_address: str | None
    checks: Checks
    cap_mbps: float
    versions: Versions
    which: Callable[[str], str | None] | None = None


@dataclass(frozen=True, slots=True)
class Ran:
    """A flow's result with the engine that ran it (name, version) or what was missing."""

    result: FlowResult | ServeResult | LatencyResult
    engine: tuple[str, str] | None = None
    unavailable: str | None = None


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _failed(task: FlowTask, error: str, rail: Rail | None) -> FlowResult:
    begin = task.start.timestamp() + task.warmup_seconds
    return FlowResult(
        window=task.window, peer=task.peer, rail=task.rail, bytes=0, start=_at(begin),
        end=_at(begin + task.seconds), error=error[:256], streams=task.streams,
        port_mbps=rail.port_mbps if rail is not None else None,
    )  # fmt: skip


def rdma_rail(rail: Rail, checks: Checks) -> perftest.RdmaRail:
    """EngineUnavailable unless `rail` has an RDMA port perftest can open."""
    if rail.port is None or rail.transport not in (Transport.ROCE, Transport.INFINIBAND):
        raise EngineUnavailable(f"perftest: rail {rail.name} has no RoCE or InfiniBand port")
    rdma_device_ready(rail.port.device)
    return perftest.RdmaRail(
        device=rail.port.device,
        port=rail.port.port,
        infiniband=rail.transport is Transport.INFINIBAND,
        gid_index=checks.rdma.ro_ce_v2_gid_index,
        tos=rail.port.default_roce_tos,
        sl=service_level(rail, checks.pfc),
    )


def _stop_reason(run: EngineRun) -> str | None:
    if run.killed == "stopped":
        return "stopped early"
    if run.killed == "deadline":
        return "killed at its deadline"
    return None


async def run_flow(task: FlowTask, ctx: Context, halt: asyncio.Event) -> Ran:
    """The sender's side of one flow (see the module docstring)."""
    rail = ctx.rail
    if rail is None or rail.address is None:
        return Ran(_failed(task, f"this node has no address on rail {task.rail}", rail))
    if ctx.peer_address is None:
        return Ran(_failed(task, f"{task.peer} announced no address on rail {task.rail}", rail))
    try:
        if task.engine is Engine.PERFTEST:
            return await _perftest_flow(task, ctx, rail, ctx.peer_address, halt)
        return await _iperf3_flow(task, ctx, rail, ctx.peer_address, halt)
    except EngineUnavailable as exc:
        return Ran(_failed(task, f"EngineUnavailable: {exc.what}", rail), unavailable=exc.what)


async def _iperf3_flow(
    task: FlowTask, ctx: Context, rail: Rail, peer: str, halt: asyncio.Event
) -> Ran:
    binary = find_binary(IPERF3, ctx.which)
    version = await ctx.versions.of(binary)
    start = task.start.timestamp()
    measure = start + task.warmup_seconds
    deadline = measure + task.seconds + KILL_SLACK_SECONDS
    attempt_at = start
    while True:
        # a late server (its agent a moment behind) refuses the first connection: try
        # again within the warm-up, the omitted seconds shortened so the end stays put
        warmup = max(0.0, measure - max(attempt_at, time.time()))
        argv = iperf3.client_argv(
            binary, peer=peer, source=rail.address or "", port=task.port, streams=task.streams,
            warmup_seconds=warmup, seconds=task.seconds, cap_mbps=ctx.cap_mbps, dscp=task.dscp,
        )  # fmt: skip
        run = await run_engine(
            argv, start_at=attempt_at, deadline=deadline, halt=halt, measure_from=measure
        )
        retry_by = start + task.warmup_seconds * 0.75
        if (
            run.error is None
            and run.killed is None
            and iperf3.refused_connection(run.stdout, run.stderr)
            and time.time() + RETRY_SECONDS < retry_by
        ):
            attempt_at = time.time() + RETRY_SECONDS
            continue
        break
    engine = (IPERF3, version)
    if run.error is not None:
        return Ran(_failed(task, run.error, rail), engine)
    try:
        outcome = iperf3.parse_client(run.stdout)
    except iperf3.Iperf3Error as exc:
        why = _stop_reason(run) or str(exc)
        return Ran(_failed(task, why, rail), engine)
    # the measured part began when the omitted seconds (-O, whole seconds) ended after the
    # client started; not counted back from its exit, which waits for the results exchange
    begin = run.started + iperf3.omitted_seconds(argv)
    return Ran(
        FlowResult(
            window=task.window, peer=task.peer, rail=task.rail, bytes=outcome.bytes,
            start=_at(begin), end=_at(begin + outcome.seconds), error=_stop_reason(run),
            streams=task.streams, port_mbps=rail.port_mbps, cpu_percent=outcome.cpu_percent,
            remote_cpu_percent=outcome.remote_cpu_percent,
            cpu_demand_percent=run.cpu_demand_percent, retransmits=outcome.retransmits,
        ),
        engine,
    )  # fmt: skip


async def _perftest_flow(
    task: FlowTask, ctx: Context, rail: Rail, peer: str, halt: asyncio.Event
) -> Ran:
    binary = find_binary(IB_WRITE_BW, ctx.which)
    target = rdma_rail(rail, ctx.checks)
    version = await ctx.versions.of(binary)
    start = task.start.timestamp()
    duration, margin = perftest.duration_and_margin(task.warmup_seconds, task.seconds)
    argv = perftest.bw_argv(
        binary, target, tcp_port=task.port, streams=task.streams,
        warmup_seconds=task.warmup_seconds, seconds=task.seconds, cap_mbps=ctx.cap_mbps,
        dscp=task.dscp, server=peer, source=rail.address,
    )  # fmt: skip
    run = await run_engine(
        argv, start_at=start, deadline=start + duration + KILL_SLACK_SECONDS, halt=halt,
        measure_from=start + margin,
    )  # fmt: skip
    engine = ("perftest", version)
    if run.error is not None:
        return Ran(_failed(task, run.error, rail), engine)
    try:
        outcome = perftest.parse_bw(run.stdout + run.stderr)
    except EngineUnavailable as exc:
        return Ran(_failed(task, f"EngineUnavailable: {exc.what}", rail), engine, exc.what)
    except perftest.PerftestError as exc:
        return Ran(_failed(task, _stop_reason(run) or str(exc), rail), engine)
    measured = duration - 2 * margin
    begin = run.started + margin
    return Ran(
        FlowResult(
            window=task.window, peer=task.peer, rail=task.rail,
            bytes=int(outcome.mbps * 1e6 / 8 * measured), start=_at(begin),
            end=_at(begin + measured), error=_stop_reason(run), streams=task.streams,
            port_mbps=rail.port_mbps, cpu_demand_percent=run.cpu_demand_percent,
        ),
        engine,
    )  # fmt: skip


def _served(
    task: ServeTask, rail: Rail | None, error: str | None, demand: float | None
) -> ServeResult:
    return ServeResult(
        window=task.window, peer=task.peer, rail=task.rail,
        port_mbps=rail.port_mbps if rail is not None else None,
        cpu_demand_percent=demand, error=error[:256] if error else None,
    )  # fmt: skip


def _same_address(a: bytes, b: str | None) -> bool:
    if b is None:
        return False
    try:
        return ipaddress.ip_address(a.decode()) == ipaddress.ip_address(b)
    except ValueError:
        return False


async def run_serve(task: ServeTask, ctx: Context, halt: asyncio.Event) -> Ran:
    """The receiver's side: the engine's server on this rail, during the flow's window only."""
    rail = ctx.rail
    if rail is None or rail.address is None:
        return Ran(_served(task, rail, f"this node has no address on rail {task.rail}", None))
    start = task.start.timestamp()
    try:
        if task.engine is Engine.PERFTEST:
            binary = find_binary(IB_WRITE_LAT if task.test == "lat" else IB_WRITE_BW, ctx.which)
            target = rdma_rail(rail, ctx.checks)
            # the client's own warm-up and measured seconds: both ends run the same options
            warmup = max(task.warmup_seconds - SERVE_LEAD_SECONDS, 0.0)
            seconds = task.client_seconds or max(
                task.seconds - task.warmup_seconds - SERVE_TAIL_SECONDS, 1.0
            )
            if task.test == "lat":
                argv = perftest.lat_argv(binary, target, tcp_port=task.port, seconds=seconds,
                                         dscp=task.dscp)  # fmt: skip
            else:
                argv = perftest.bw_argv(
                    binary, target, tcp_port=task.port, streams=task.streams,
                    warmup_seconds=warmup, seconds=seconds, dscp=task.dscp,
                )  # fmt: skip
            name = "perftest"
        else:
            binary = find_binary(IPERF3, ctx.which)
            argv = iperf3.server_argv(binary, address=rail.address, port=task.port)
            name = IPERF3
    except EngineUnavailable as exc:
        return Ran(_served(task, rail, f"EngineUnavailable: {exc.what}", None),
                   unavailable=exc.what)  # fmt: skip
    version = await ctx.versions.of(binary)
    run = await run_engine(
        argv, start_at=start, deadline=task.end.timestamp(), halt=halt,
        measure_from=start + task.warmup_seconds,
    )  # fmt: skip
    error = run.error
    if error is None and name == IPERF3:
        accepted = _ACCEPTED.findall(run.stdout)
        if not accepted:
            error = "the planned sender never connected"
        elif not any(_same_address(a, ctx.peer_address) for a in accepted):
            shown = accepted[0].decode(errors="replace")[:64]
            error = f"a client other than the planned sender ({shown}) took the server"
    elif error is None and run.returncode not in (0, None) and run.killed is None:
        text = (run.stdout + run.stderr).decode(errors="replace").strip().splitlines()
        error = (text[-1] if text else f"exit status {run.returncode}")[:200]
    return Ran(_served(task, rail, error, run.cpu_demand_percent), (name, version))
