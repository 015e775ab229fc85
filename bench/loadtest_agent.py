"""What one node's load-test flow reaches, and what it costs, engine by engine, side by side:
the home-made Python flow the agent used to send (`send_flow` into the responder's sink, the
code of `--before`, main's tree by default, read-only) and iperf3 with 1, 4 and 8 parallel
streams (what the agent runs now), over one unshaped veth pair between two network
namespaces: nothing but the hosts' CPUs limits them.

    python bench/loadtest_agent.py [--seconds 5] [--runs 3] [--before /work/main/src]

Needs root (ip netns) and iperf3. Each flow runs `--seconds` measured after a 2 s warm-up
(iperf3 -O 2; the Python flow counts acknowledged bytes from the end of its warm-up), one
at a time. Figures: Gbit/s (receiver-acknowledged, 10^9 bit/s) and the CPU of the sending
and the receiving process over the measured part (utime + stime from /proc/<pid>/stat, the
same for every engine), in % of one core and % of a core per Gbit/s. Medians of RUNS runs.
The machine, its load and the kernel set the absolute figures; the ratios between engines
in one run are what this measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from netns import Namespace, namespace  # noqa: E402  (the tests' netns helper)

A_ADDR, B_ADDR = "10.77.0.1", "10.77.0.2"
PORT = 7599
TICKS = os.sysconf("SC_CLK_TCK")

# The old agent's flow and sink, run from the `--before` tree (PYTHONPATH): the sink admits
# every load flow; the sender prints its measured bytes and interval as JSON.
OLD_SINK = textwrap.dedent(
    """
    import asyncio, sys
    from netval.agent.peers.responder import PeerResponder

    async def main():
        responder = PeerResponder(sys.argv[1], 0)
        responder.load_gate = lambda source, token: 3600.0
        await responder.start()
        print(responder.tcp_port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await responder.close()

    asyncio.run(main())
    """
)
OLD_SENDER = textwrap.dedent(
    """
    import json, sys, threading, time
    from netval.agent.loadtest.flows import send_flow
    from netval.agent.peers.wire import load_token

    address, port, source, start, warmup, seconds = sys.argv[1:7]
    start, warmup, seconds = float(start), float(warmup), float(seconds)
    out = send_flow(address, int(port), source=source, token=load_token("bench", "w"),
                    start=start, measure_start=start + warmup, end=start + warmup + seconds,
                    cap_mbps=0.0, halt=threading.Event())
    print(json.dumps({"bytes": out.bytes, "start": out.start, "end": out.end,
                      "error": out.error}), flush=True)
    """
)


@dataclass(frozen=True)
class Sample:
    gbps: float
    sender_cpu: float  # % of one core over the measured part
    receiver_cpu: float


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _sample_cpu(pids: tuple[int, int], at: float) -> tuple[float, float]:
    while time.time() < at:
        time.sleep(0.01)
    return cpu_seconds(pids[0]), cpu_seconds(pids[1])


@contextlib.contextmanager
def veth_pair() -> Iterator[tuple[Namespace, Namespace]]:
    with namespace() as a, namespace() as b:
        subprocess.run(["ip", "-n", a.name, "link", "add", "v0", "type", "veth", "peer", "name",
                        "v0", "netns", b.name], check=True)  # fmt: skip
        for ns, addr in ((a, A_ADDR), (b, B_ADDR)):
            for args in (["addr", "add", f"{addr}/24", "dev", "v0"], ["link", "set", "v0", "up"],
                         ["link", "set", "lo", "up"]):  # fmt: skip
                subprocess.run(["ip", "-n", ns.name, *args], check=True)
        a.wait_operstate("v0", "up")
        yield a, b


def python_flow(a: Namespace, b: Namespace, before: Path, seconds: float) -> Sample:
    env = {**os.environ, "PYTHONPATH": str(before)}
    sink = subprocess.Popen(b.argv([sys.executable, "-c", OLD_SINK, B_ADDR]), env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert sink.stdout is not None
        port = int(sink.stdout.readline())
        start, warmup = time.time() + 1.0, 2.0
        sender = subprocess.Popen(
            a.argv([sys.executable, "-c", OLD_SENDER, B_ADDR, str(port), A_ADDR, str(start),
                    str(warmup), str(seconds)]),
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        # `ip netns exec` execs the program: the pid is the sender's (and the sink's)
        pids = (sender.pid, sink.pid)
        c0 = _sample_cpu(pids, start + warmup)
        c1 = _sample_cpu(pids, start + warmup + seconds)
        out, _ = sender.communicate(timeout=seconds + 30)
        doc = json.loads(out)
        assert doc["error"] is None, doc
        gbps = doc["bytes"] * 8 / (doc["end"] - doc["start"]) / 1e9
        return Sample(gbps, 100 * (c1[0] - c0[0]) / seconds, 100 * (c1[1] - c0[1]) / seconds)
    finally:
        sink.terminate()
        sink.wait(10)


def iperf3_flow(a: Namespace, b: Namespace, streams: int, seconds: float) -> Sample:
    server = subprocess.Popen(b.argv(["iperf3", "-s", "-1", "-B", B_ADDR, "-p", str(PORT)]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(0.3)  # the server listens (a benchmark's pause, not a test's sync)
        warmup = 2
        start = time.time()
        client = subprocess.Popen(
            a.argv(["iperf3", "-c", B_ADDR, "-B", A_ADDR, "-p", str(PORT), "-P", str(streams),
                    "-O", str(warmup), "-t", str(int(seconds)), "-J"]),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        pids = (client.pid, server.pid)
        c0 = _sample_cpu(pids, start + warmup + 0.1)
        c1 = _sample_cpu(pids, start + warmup + 0.1 + seconds - 0.2)
        out, _ = client.communicate(timeout=seconds + 30)
        doc = json.loads(out)
        received = doc["end"]["sum_received"]
        gbps = received["bytes"] * 8 / received["seconds"] / 1e9
        span = seconds - 0.2
        return Sample(gbps, 100 * (c1[0] - c0[0]) / span, 100 * (c1[1] - c0[1]) / span)
    finally:
        server.wait(10)


def report(label: str, samples: list[Sample]) -> None:
    gbps = statistics.median(s.gbps for s in samples)
    send = statistics.median(s.sender_cpu for s in samples)
    recv = statistics.median(s.receiver_cpu for s in samples)
    print(f"| {label} | {gbps:.1f} | {send:.0f} % | {recv:.0f} % | "
          f"{send / max(gbps, 1e-9):.1f} % | {recv / max(gbps, 1e-9):.1f} % |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", type=Path, default=Path("/work/main/src"),
                        help="the tree whose Python flow and sink to measure (read only)")  # fmt: skip
    args = parser.parse_args()
    print(f"one flow over an unshaped veth pair, {args.seconds:g} s measured after 2 s of "
          f"warm-up, medians of {args.runs}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print("| engine | Gbit/s | sender CPU | receiver CPU | sender CPU per Gbit/s | "
          "receiver CPU per Gbit/s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    with veth_pair() as (a, b):
        report("Python flow into the responder's sink (before)",
               [python_flow(a, b, args.before, args.seconds) for _ in range(args.runs)])  # fmt: skip
        for streams in (1, 4, 8):
            report(f"iperf3 -P {streams}",
                   [iperf3_flow(a, b, streams, args.seconds) for _ in range(args.runs)])  # fmt: skip


if __name__ == "__main__":
    main()
