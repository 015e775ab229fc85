"""One engine run (iperf3, perftest) as a bounded child process.

- It starts at an absolute time (agent clock) and is killed at its hard deadline, or at once
  when the plan is aborted (`halt`): SIGTERM to its process group, SIGKILL `KILL_GRACE`
  later. It never outlives its window.
- It gets a minimal environment (`PATH`, `LC_ALL=C`): nothing of the agent's (MQTT
  credentials, tokens) reaches it, and its output is in the C locale the parsers expect.
- Its output is read whole up to `MAX_OUTPUT_BYTES` per stream (a perftest latency
  histogram of 300,000 round trips is ~5 MB); beyond that it is dropped and the run says so.
- Its CPU demand is sampled from `/proc/<pid>/task/*/schedstat` (time on a CPU plus time
  ready but waiting for one, every thread): from the first sample at or after
  `measure_from` to the last before it exits. Demand near 100 % of a core means the host
  set the pace: the engine was running or waiting to run all the time. An engine that
  waits on the network sleeps, and its demand stays low.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MAX_OUTPUT_BYTES: Final = 16 << 20
KILL_GRACE: Final = 0.5  # SIGTERM to SIGKILL
POLL_SECONDS: Final = 0.1  # how often the deadline, the halt and the CPU are looked at
_ENV_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
_PROC: Final = Path("/proc")


@dataclass(frozen=True, slots=True)
class EngineRun:
    returncode: int | None  # None: it never started
    stdout: bytes
    stderr: bytes
    started: float  # epoch seconds (agent clock)
    ended: float
    killed: str | None = None  # "deadline", "stopped": why it was killed
    cpu_demand_percent: float | None = None
    truncated: bool = False
    error: str | None = None  # it could not start


def cpu_time_ns(pid: int, proc: Path = _PROC) -> int | None:
    """On-CPU plus runqueue-wait nanoseconds of every thread of `pid`; None if unreadable."""
    total = 0
    read = False
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
            total += int(fields[0]) + int(fields[1])
            read = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total if read else None


class _Demand:
    """CPU demand between the first sample at or after `measure_from` and the last one."""

    def __init__(self, measure_from: float | None) -> None:
        self.measure_from = measure_from
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None

    def sample(self, pid: int) -> None:
        now = time.time()
        if self.measure_from is None or now < self.measure_from:
            return
        ns = cpu_time_ns(pid)
        if ns is None:
            return
        if self.first is None:
            self.first = (now, ns)
        # a thread that ended takes its time out of the sum: keep the counter monotonic
        if self.last is None or ns >= self.last[1]:
            self.last = (now, ns)

    def percent(self) -> float | None:
        if self.first is None or self.last is None:
            return None
        elapsed = self.last[0] - self.first[0]
        if elapsed < 0.5:  # too short to say anything
            return None
        used = max(0, self.last[1] - self.first[1])
        return min(round(100 * used / 1e9 / elapsed, 1), 100_000.0)


async def _read(stream: asyncio.StreamReader | None, into: bytearray) -> bool:
    """Read `stream` to its end into `into` (at most MAX_OUTPUT_BYTES); True if cut."""
    cut = False
    if stream is None:
        return cut
    while chunk := await stream.read(1 << 16):
        room = MAX_OUTPUT_BYTES - len(into)
        if room > 0:
            into += chunk[:room]
        cut = cut or len(chunk) > room
    return cut


def _signal_group(process: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


async def run_engine(
    argv: Sequence[str],
    *,
    start_at: float,
    deadline: float,
    halt: asyncio.Event,
    measure_from: float | None = None,
) -> EngineRun:
    """Run `argv` from `start_at` until it exits, `deadline` passes or `halt` is set (epoch
    seconds); never raises for the child's failures (they are the run's fields)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(halt.wait(), max(0.0, start_at - time.time()))
    now = time.time()
    if halt.is_set() or now >= deadline:
        why = "stopped before it started" if halt.is_set() else "its deadline passed first"
        return EngineRun(None, b"", b"", now, now, error=why)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": _ENV_PATH, "LC_ALL": "C"},
            start_new_session=True,  # its own process group: killed with its children
        )
    except OSError as exc:
        now = time.time()
        why = f"cannot start {argv[0]}: {exc.strerror or exc}"
        return EngineRun(None, b"", b"", now, now, error=why)
    started = time.time()
    out, err = bytearray(), bytearray()
    readers = asyncio.gather(_read(process.stdout, out), _read(process.stderr, err))
    demand = _Demand(measure_from)
    killed: str | None = None
    waiter = asyncio.ensure_future(process.wait())
    try:
        while not waiter.done():
            demand.sample(process.pid)
            if killed is None and (halt.is_set() or time.time() >= deadline):
                killed = "stopped" if halt.is_set() else "deadline"
                _signal_group(process, signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiter), KILL_GRACE)
                _signal_group(process, signal.SIGKILL)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), POLL_SECONDS)
    finally:
        ended = time.time()
        if killed is None and halt.is_set():
            killed = "stopped"  # it ended by itself as the plan stopped (its peer killed)
        if not waiter.done():  # cancelled: never leave the child behind
            _signal_group(process, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(waiter), KILL_GRACE)
        # a grandchild holding the pipes must not hold us: the group was killed, read briefly
        try:
            cut_out, cut_err = await asyncio.wait_for(readers, KILL_GRACE * 4)
        except TimeoutError:
            cut_out = cut_err = True
    return EngineRun(
        returncode=process.returncode,
        stdout=bytes(out),
        stderr=bytes(err),
        started=started,
        ended=ended,
        killed=killed,
        cpu_demand_percent=demand.percent(),
        truncated=cut_out or cut_err,
    )
