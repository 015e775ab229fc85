"""What sending a load-test flow costs an agent: CPU of the sending process while one
planned flow (`netval.agent.loadtest.flows.send_flow`, the code the agent runs) sends at its
cap, and uncapped, over loopback to a real peer sink in another process.

    python bench/loadtest_agent.py [--seconds 5] [--caps 1000 0] [--runs 3]

The sink (`PeerResponder` with a gate that admits every load flow) runs in a child process,
so the figure is the sender's alone: CPU seconds (user + system, `time.process_time` of
this process: the flow's thread) per second of sending, and the rate the flow reached
(acknowledged bytes over the measured part, after a 1 s warm-up). Medians of RUNS runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap
import threading
import time

from netval.agent.loadtest.flows import send_flow
from netval.agent.peers.wire import load_token

SINK = textwrap.dedent(
    """
    import asyncio, sys
    from netval.agent.peers.responder import PeerResponder

    async def main():
        responder = PeerResponder("127.0.0.1", 0)
        responder.load_gate = lambda source, token: 3600.0
        await responder.start()
        print(responder.tcp_port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await responder.close()

    asyncio.run(main())
    """
)


def one(port: int, seconds: float, cap: float) -> tuple[float, float]:
    """(CPU seconds per second of sending, Mbit/s reached)."""
    start = time.time() + 0.2
    cpu0, wall0 = time.process_time(), time.monotonic()
    outcome = send_flow(
        "127.0.0.1", port, source=None, token=load_token("bench", "w"), start=start,
        measure_start=start + 1.0, end=start + 1.0 + seconds, cap_mbps=cap,
        halt=threading.Event(),
    )  # fmt: skip
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0 - 0.2
    assert outcome.error is None, outcome
    mbps = outcome.bytes * 8 / (outcome.end - outcome.start) / 1e6
    return cpu / wall, mbps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--caps", type=float, nargs="+", default=[1000.0, 0.0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert sink.stdout is not None
        port = int(sink.stdout.readline())
        print(f"one flow over loopback, {args.seconds:g} s measured after 1 s warm-up, "
              f"medians of {args.runs}")  # fmt: skip
        for cap in args.caps:
            runs = [one(port, args.seconds, cap) for _ in range(args.runs)]
            cpu = statistics.median(r[0] for r in runs)
            mbps = statistics.median(r[1] for r in runs)
            label = f"cap {cap:g} Mbit/s" if cap else "uncapped"
            print(f"{label:>20}: {mbps:8.0f} Mbit/s, sender CPU {100 * cpu:5.1f} % of a core "
                  f"({100 * cpu / max(mbps / 1000, 1e-9):.1f} % per Gbit/s)")  # fmt: skip
    finally:
        sink.terminate()
        sink.wait(5)


if __name__ == "__main__":
    main()
