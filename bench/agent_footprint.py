"""Steady-state memory and CPU of `netval agent` at 10 s and 30 s intervals.

Run from the repository root (mosquitto must be installed; root is not needed):

    python bench/agent_footprint.py                # ~4.5 min: 240 s windows, agents concurrent
    python bench/agent_footprint.py --seconds 60   # a quick look

It starts a Mosquitto broker on a free loopback port (password auth, tests/mosquitto.py) and
one `netval agent` process per interval, exactly as the DaemonSet runs it: the console script
with NETVAL_CONFIG (judging `lo` through link.interfaces and mtu.interfaces, interfaceMTU
65536), NETVAL_NODE_NAME, NETVAL_MQTT_URL, NETVAL_MQTT_USERNAME, NETVAL_MQTT_PASSWORD_FILE and
NETVAL_METRICS_ADDR=off, and no OTEL_* variables (no exporter, as in a default install). A
subscriber in this process timestamps every report.

Warm-up: an agent's first cycle comes at a random point of its first interval (start jitter);
the window opens 1 s after that first report arrives, so imports, the MQTT connect and the
first cycle are all behind it. The window is --seconds rounded up to whole intervals, so it
holds exactly that many cycles whatever the phase. Every second it samples VmRSS (and
RssAnon/RssFile) from /proc/PID/status; CPU is utime+stime from /proc/PID/stat (all threads)
at the window's ends, as a percentage of one core over the window.

Both agents run at the same time by default, which halves the wall time without distorting
the figures: CPU time is charged to the process that runs (two mostly idle processes on 2+
cores only ever delay each other, which changes latency, not CPU-seconds), RSS is per process,
and the shared broker and subscriber run outside the measured processes. --sequential runs
them one after the other to check that claim.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiomqtt
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import mosquitto  # tests/mosquitto.py: the broker the tests use

VALIDATION: Final = "footprint"
DEFAULT_INTERVALS: Final = (10, 30)
DEFAULT_SECONDS: Final = 240.0
SETTLE_SECONDS: Final = 1.0  # after the first report: its publish and bookkeeping are done
SAMPLE_EVERY: Final = 1.0
FIRST_REPORT_SLACK: Final = 30.0  # start-up budget on top of the first interval's jitter
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
MIB: Final = 1024 * 1024

TARGET_RSS_MIB: Final = 60.0
TARGET_CPU_PERCENT: Final = 1.0
TARGET_CPU_INTERVAL: Final = 30
ANCHORS: Final = (
    "NVSentinel NIC monitor requests 100m CPU (10 % of a core) / 128 MiB; "
    "Goldpinger runs in ~80 MiB"
)


def netval_script() -> str:
    """The `netval` console script of this interpreter (not a pyenv shim)."""
    candidate = Path(sysconfig.get_path("scripts")) / "netval"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("netval")
    if found is None:
        sys.exit("the netval console script is not installed (pip install -e .)")
    return found


# -- /proc --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Memory:
    rss_kib: int
    anon_kib: int
    file_kib: int
    hwm_kib: int
    threads: int


def read_memory(pid: int) -> Memory:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads"):
            fields[key] = int(value.split()[0])
    return Memory(
        fields["VmRSS"], fields["RssAnon"], fields["RssFile"], fields["VmHWM"], fields["Threads"]
    )


def read_cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime + stime of all threads, cutime + cstime of waited-for children), in ticks."""
    after_comm = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields 14-17 of proc_pid_stat(5); after_comm[0] is field 3 (state)
    utime, stime, cutime, cstime = (int(v) for v in after_comm[11:15])
    return utime + stime, cutime + cstime


# -- one agent ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Agent:
    interval: int
    node: str
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    first_report: asyncio.Event = field(default_factory=asyncio.Event)
    reports: list[float] = field(default_factory=list)  # monotonic arrival times

    @property
    def log_file(self) -> Path:
        return self.workdir / "agent.log"

    def start(self, broker: mosquitto.MosquittoBroker) -> None:
        self.workdir.mkdir(parents=True)
        config = self.workdir / "agent.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "validation": VALIDATION,
                    "generation": 1,
                    "spec": {
                        "interval": f"{self.interval}s",
                        "checks": {
                            "link": {"interfaces": ["lo"]},
                            "mtu": {"interfaces": ["lo"], "interfaceMTU": 65536},
                        },
                    },
                }
            )
        )
        password = self.workdir / "mqtt-password"
        password.write_text(broker.password + "\n")
        password.chmod(0o600)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "NETVAL_CONFIG": str(config),
            "NETVAL_NODE_NAME": self.node,
            "NETVAL_MQTT_URL": f"mqtt://{broker.host}:{broker.port}",
            "NETVAL_MQTT_USERNAME": broker.username,
            "NETVAL_MQTT_PASSWORD_FILE": str(password),
            "NETVAL_METRICS_ADDR": "off",
        }
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen(
                [netval_script(), "agent"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def alive(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = self.log_file.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"agent {self.node} exited with {self.proc.returncode}:\n{log}")
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass(frozen=True, slots=True)
class Result:
    interval: int
    window: float
    cycles: int
    reports: int
    rss_median_mib: float
    rss_max_mib: float
    anon_median_mib: float
    file_median_mib: float
    hwm_mib: float
    threads: int
    cpu_percent: float
    cpu_ms_per_cycle: float
    child_ticks: int


async def measure(agent: Agent, seconds: float) -> Result:
    pid = agent.alive()
    try:
        await asyncio.wait_for(agent.first_report.wait(), agent.interval + FIRST_REPORT_SLACK)
    except TimeoutError:
        agent.alive()
        raise RuntimeError(
            f"no report from {agent.node} within {agent.interval + FIRST_REPORT_SLACK:g} s:\n"
            + agent.log_file.read_text(errors="replace")[-3000:]
        ) from None
    await asyncio.sleep(SETTLE_SECONDS)
    cycles = math.ceil(seconds / agent.interval - 1e-9)
    window = cycles * agent.interval
    agent.alive()
    started = time.monotonic()
    ticks0, child0 = read_cpu_ticks(pid)
    samples = [read_memory(pid)]
    end = started + window
    while (now := time.monotonic()) < end:
        await asyncio.sleep(min(SAMPLE_EVERY, end - now))
        agent.alive()
        samples.append(read_memory(pid))
    ticks1, child1 = read_cpu_ticks(pid)
    elapsed = time.monotonic() - started
    cpu_seconds = (ticks1 - ticks0) / CLK_TCK
    rss = [s.rss_kib / 1024 for s in samples]
    reports = sum(1 for t in agent.reports if started <= t < started + elapsed)
    return Result(
        interval=agent.interval,
        window=elapsed,
        cycles=cycles,
        reports=reports,
        rss_median_mib=statistics.median(rss),
        rss_max_mib=max(rss),
        anon_median_mib=statistics.median(s.anon_kib / 1024 for s in samples),
        file_median_mib=statistics.median(s.file_kib / 1024 for s in samples),
        hwm_mib=samples[-1].hwm_kib / 1024,
        threads=samples[-1].threads,
        cpu_percent=100.0 * cpu_seconds / elapsed,
        cpu_ms_per_cycle=1000.0 * cpu_seconds / max(reports, 1),
        child_ticks=child1 - child0,
    )


async def listen(
    broker: mosquitto.MosquittoBroker, agents: dict[str, Agent], ready: asyncio.Event
) -> None:
    async with aiomqtt.Client(
        broker.host,
        broker.port,
        username=broker.username,
        password=broker.password,
        protocol=aiomqtt.ProtocolVersion.V5,
        identifier="netval-footprint-bench",
    ) as client:
        await client.subscribe(f"netval/v1/{VALIDATION}/+/report", qos=1)
        ready.set()
        async for message in client.messages:
            node = str(message.topic).split("/")[3]
            agent = agents.get(node)
            if agent is not None and not message.retain:
                agent.reports.append(time.monotonic())
                agent.first_report.set()


async def run(intervals: list[int], seconds: float, *, sequential: bool) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="netval-footprint-") as tmp:
        workdir = Path(tmp)
        (workdir / "broker").mkdir()
        broker = mosquitto.MosquittoBroker(workdir / "broker")
        broker.start()
        agents = {
            f"bench-{i}s": Agent(i, f"bench-{i}s", workdir / f"agent-{i}s") for i in intervals
        }
        ready = asyncio.Event()
        listener = asyncio.create_task(listen(broker, agents, ready))
        try:
            await asyncio.wait_for(ready.wait(), 10)
            if sequential:
                results = []
                for agent in agents.values():
                    agent.start(broker)
                    try:
                        results.append(await measure(agent, seconds))
                    finally:
                        agent.stop()
                return results
            for agent in agents.values():
                agent.start(broker)
            return list(await asyncio.gather(*(measure(a, seconds) for a in agents.values())))
        finally:
            for agent in agents.values():
                agent.stop()
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await listener
            broker.stop()


# -- report -------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render(results: list[Result], argv: list[str], *, sequential: bool) -> str:
    header = (
        f"{'interval':>8}  {'window':>7}  {'reports':>7}  {'RSS median':>10}  {'RSS max':>8}  "
        f"{'anon/file':>11}  {'CPU avg':>9}  {'CPU/cycle':>9}  "
        f"{f'RSS<{TARGET_RSS_MIB:g}MiB':>10}  {f'CPU<{TARGET_CPU_PERCENT:g}%@{TARGET_CPU_INTERVAL}s':>11}"
    )
    lines = [
        "netval agent steady-state footprint "
        f"({'one agent at a time' if sequential else 'agents run concurrently'}; "
        "lo judged by link + mtu; Mosquitto on loopback; no OTLP exporter, metrics off)",
        f"host: {platform.python_implementation()} {platform.python_version()}, "
        f"Linux {platform.release()}, {os.cpu_count()} CPUs",
        "",
        header,
    ]
    for r in results:
        cpu_verdict = (
            verdict(r.cpu_percent < TARGET_CPU_PERCENT)
            if r.interval == TARGET_CPU_INTERVAL
            else "-"
        )
        reports = f"{r.reports}/{r.cycles}"
        lines.append(
            f"{f'{r.interval} s':>8}  {f'{r.window:.0f} s':>7}  {reports:>7}  "
            f"{f'{r.rss_median_mib:.1f} MiB':>10}  {f'{r.rss_max_mib:.1f} MiB':>8}  "
            f"{f'{r.anon_median_mib:.0f}/{r.file_median_mib:.0f} MiB':>11}  "
            f"{f'{r.cpu_percent:.3f} %':>9}  {f'{r.cpu_ms_per_cycle:.1f} ms':>9}  "
            f"{verdict(r.rss_max_mib < TARGET_RSS_MIB):>10}  {cpu_verdict:>11}"
        )
    lines += [
        "",
        f"targets: RSS < {TARGET_RSS_MIB:g} MiB (steady max, every interval); average CPU < "
        f"{TARGET_CPU_PERCENT:g} % of one core at {TARGET_CPU_INTERVAL} s",
        f"anchors: {ANCHORS}",
        "CPU/cycle = CPU time in the window / reports in it (idle work included); "
        "peak RSS incl. start-up (VmHWM): "
        + ", ".join(f"{r.hwm_mib:.1f} MiB @ {r.interval} s" for r in results)
        + f"; threads: {', '.join(str(r.threads) for r in results)}",
        f"command: {shlex.join(['python', 'bench/agent_footprint.py', *argv])}",
    ]
    if any(r.child_ticks for r in results):
        lines.append("note: the agent ran child processes (their CPU is not included above)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help=f"measured window per interval, rounded up to whole intervals "
        f"(default {DEFAULT_SECONDS:g})",
    )
    parser.add_argument(
        "--intervals",
        default=",".join(map(str, DEFAULT_INTERVALS)),
        help="comma-separated probe intervals in seconds, each >= 5 (default 10,30)",
    )
    parser.add_argument(
        "--sequential", action="store_true", help="one agent at a time (about twice as long)"
    )
    args_list = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(args_list)
    intervals = [int(v) for v in args.intervals.split(",") if v.strip()]
    if not intervals or min(intervals) < 5 or len(set(intervals)) != len(intervals):
        parser.error("--intervals: distinct whole seconds, each at least 5")
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    if not mosquitto.available():
        sys.exit(mosquitto.MISSING_REASON)
    results = asyncio.run(run(intervals, args.seconds, sequential=args.sequential))
    print(render(results, args_list, sequential=args.sequential))
    return 0


if __name__ == "__main__":
    sys.exit(main())
