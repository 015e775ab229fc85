"""What taking the sample off the event loop costs: a direct `LiveCollector.sample()` vs the
same call through `BoundedSampler` (one hop to the collector thread and back), and the event
loop's worst stall while a read blocks for 2 s either way.

Run from the repository root (reads this host's /sys; `lo` is the judged interface):

    python bench/sampler_overhead.py [--rounds 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from netval.agent.collect.live import LiveCollector
from netval.agent.sampling import BoundedSampler
from netval.model.snapshot import Sample


class Blocking:
    """A read that blocks for `seconds` (a wedged firmware counter)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def sample(self) -> Sample:
        threading.Event().wait(self.seconds)
        return Sample(netdevs={}, rdma={})


async def loop_stall(run: object, seconds: float) -> float:
    """Worst gap between 10 ms ticks of the event loop while `run` runs."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last - 0.01)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    await run  # type: ignore[misc]
    done.set()
    await task
    return max(gaps)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    with LiveCollector(interfaces=["lo"]) as collector:
        sampler = BoundedSampler(collector, deadline=5)
        direct, bounded = [], []
        for _ in range(args.rounds):  # interleaved, so both see the same machine state
            t0 = time.perf_counter()
            collector.sample()
            direct.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await sampler.sample()
            bounded.append(time.perf_counter() - t0)
        sampler.close()
    d, b = statistics.median(direct) * 1e6, statistics.median(bounded) * 1e6
    print(f"sample of lo, {args.rounds} rounds (median)")
    print(f"  direct call on the loop        {d:8.1f} us")
    print(f"  through BoundedSampler         {b:8.1f} us   (+{b - d:.1f} us, x{b / d:.2f})")

    async def direct_block() -> None:
        Blocking(2.0).sample()

    blocked = BoundedSampler(Blocking(2.0), deadline=0.5)
    on_loop = await loop_stall(direct_block(), 2.0)
    off_loop = await loop_stall(blocked.sample(), 2.0)
    print("a read blocking 2 s: worst event-loop stall")
    print(f"  direct call on the loop        {on_loop * 1e3:8.1f} ms")
    print(f"  through BoundedSampler         {off_loop * 1e3:8.1f} ms   (report after 0.5 s)")


if __name__ == "__main__":
    asyncio.run(main())
