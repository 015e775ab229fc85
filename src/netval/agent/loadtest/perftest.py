"""perftest: the arguments of a planned RDMA flow (`ib_write_bw`) and latency probe
(`ib_write_lat`), client and server, and what their text output says.

Both ends run the same options on their own rail's device; the client adds the server's
rail address. The options come from the validation and the rail:

- `-d <device> -i <port>`: the RDMA port under the rail's netdev;
- `-x <index>` when the validation names its RoCEv2 GID index (`checks.rdma.roceV2GidIndex`),
  else `-R` (RDMA CM resolves the GID of the rail address, as NCCL does with
  NCCL_IB_GID_INDEX unset); InfiniBand ports need neither;
- the class: `--tclass=<dscp << 2>` (or `-T <tos>` with RDMA CM) for the load test's
  `eastWest.dscp`, else the port's `default_roce_tos` (the class RDMA CM gives jobs);
  `-S <sl>`: the first PFC priority on InfiniBand (its service level) or with
  `pfc.trust: pcp` (RoCE's priority then comes from the SL);
- bandwidth: `-q <streams> -D <seconds + 2 x warm-up> -f <warm-up> --report_gbits -F`,
  with `--rate_limit=<Gb/s> --rate_limit_type=SW` for a cap; perftest measures the middle
  `D - 2 x margin` seconds: the window's measured part, after the warm-up (it runs a
  warm-up's length past the window, within the stage's slack);
- latency: `-n <iterations> --latency_gap=<us> -H -F`: every round trip printed ("#, usec"
  then "<i>, <half round trip + gap>"), paced by the gap so the samples spread over the
  window; the gap is spun with the same clock perftest converts with, so it is subtracted
  exactly.

Output is text, parsed defensively: a missing header or data line, an error line, a
number that is not finite is a `PerftestError` (the flow's error). perftest prints "Did not
detect devices" and exits 0 without a device: that is `EngineUnavailable`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Final

from netval.agent.loadtest.engines import EngineUnavailable
from netval.model.loadplan import latency_bucket

MAX_LAT_ITERATIONS: Final = 100_000
LAT_GAP_US: Final = 500  # between posts on each side: a round trip every ~1 ms
MIN_LAT_ITERATIONS: Final = 5  # perftest's own minimum
_NUMBER: Final = r"[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_BW_HEADER: Final = re.compile(r"BW average\[(Gb/sec|MB/sec|MiB/sec)\]")
_LAT_HEADER: Final = re.compile(r"t_min\[usec\].*t_typical\[usec\]")
_SAMPLE: Final = re.compile(rf"^\s*(\d+),\s*({_NUMBER})\s*$")
_NO_DEVICE: Final = ("did not detect devices", "unable to find the infiniband/roce device")
_ERRORS: Final = ("couldn't", "unable to", "failed", "error", "invalid", "not supported")


class PerftestError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RdmaRail:
    """What perftest needs of a rail (from the agent's sample and the validation)."""

    device: str
    port: int
    infiniband: bool
    gid_index: int | None  # None: RDMA CM (-R) on RoCE
    tos: int | None  # the port's default_roce_tos
    sl: int | None


@dataclass(frozen=True, slots=True)
class BandwidthOutcome:
    mbps: float  # the average, Mbit/s (10^6)
    msg_bytes: int
    iterations: int


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """The summary line of an iteration-mode latency test (microseconds, one way)."""

    bytes: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float
    p99: float
    p999: float


def _common(rail: RdmaRail, tcp_port: int, dscp: int | None) -> list[str]:
    argv = ["-d", rail.device, "-i", str(rail.port), "-p", str(tcp_port), "-F"]
    cm = not rail.infiniband and rail.gid_index is None
    if not rail.infiniband and rail.gid_index is not None:
        argv += ["-x", str(rail.gid_index)]
    if cm:
        argv.append("-R")
    tos = dscp << 2 if dscp is not None else rail.tos
    if tos is not None:
        argv += ["-T", str(tos)] if cm else [f"--tclass={tos}"]
    if rail.sl is not None:
        argv += ["-S", str(rail.sl)]
    return argv


def duration_and_margin(warmup_seconds: float, seconds: float) -> tuple[int, int]:
    """(-D, -f): perftest measures from `margin` to `duration - margin` (whole seconds), so
    the margin is the warm-up and the run goes on for as long after the measured part."""
    margin = max(1, round(warmup_seconds))
    return math.ceil(seconds) + 2 * margin, margin


def bw_argv(
    binary: str,
    rail: RdmaRail,
    *,
    tcp_port: int,
    streams: int,
    warmup_seconds: float,
    seconds: float,
    cap_mbps: float = 0.0,
    dscp: int | None = None,
    server: str | None = None,
    source: str | None = None,
) -> list[str]:
    """`ib_write_bw`: the server's arguments (`server` None) or the client's."""
    duration, margin = duration_and_margin(warmup_seconds, seconds)
    argv = [binary, *_common(rail, tcp_port, dscp), "-q", str(streams), "-D", str(duration),
            "-f", str(margin), "--report_gbits"]  # fmt: skip
    if cap_mbps > 0:
        argv += [f"--rate_limit={cap_mbps / 1000:.3f}", "--rate_limit_type=SW"]
    if server is not None:
        if source is not None and "-R" in argv:
            argv.append(f"--source_ip={source}")
        argv.append(server)
    return argv


def lat_iterations(seconds: float) -> tuple[int, int]:
    """(-n, --latency_gap): round trips that fit in 80 % of the window at the pace."""
    per_trip = 2 * LAT_GAP_US / 1e6
    iterations = math.floor(0.8 * seconds / per_trip)
    return max(MIN_LAT_ITERATIONS, min(MAX_LAT_ITERATIONS, iterations)), LAT_GAP_US


def lat_argv(
    binary: str,
    rail: RdmaRail,
    *,
    tcp_port: int,
    seconds: float,
    dscp: int | None = None,
    server: str | None = None,
    source: str | None = None,
) -> list[str]:
    iterations, gap = lat_iterations(seconds)
    argv = [binary, *_common(rail, tcp_port, dscp), "-n", str(iterations),
            f"--latency_gap={gap}", "-H"]  # fmt: skip
    if server is not None:
        if source is not None and "-R" in argv:
            argv.append(f"--source_ip={source}")
        argv.append(server)
    return argv


def _check_device(text: str) -> None:
    lowered = text.lower()
    if any(marker in lowered for marker in _NO_DEVICE):
        raise EngineUnavailable('perftest found no RDMA device ("Did not detect devices")')


def _error_line(text: str) -> str:
    for line in text.splitlines():
        if any(word in line.lower() for word in _ERRORS):
            return line.strip()[:200]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def parse_bw(output: bytes) -> BandwidthOutcome:
    """The average of an `ib_write_bw` run, or PerftestError / EngineUnavailable."""
    text = output.decode("utf-8", errors="replace")
    _check_device(text)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        header = _BW_HEADER.search(line)
        if header is None:
            continue
        for data in lines[i + 1 :]:
            fields = data.split()
            if len(fields) < 4 or not fields[0].isdigit():
                continue
            try:
                msg, iters, average = int(fields[0]), int(fields[1]), float(fields[3])
            except ValueError:
                continue
            if not math.isfinite(average) or average < 0 or msg > 2**40 or iters > 2**62:
                raise PerftestError(f"perftest reports an impossible average {fields[3]!r}")
            unit = header.group(1)
            # perftest's Gb is 10^9 bit; its MB (MiB since 6.x) is 2^20 bytes
            mbps = average * 1000 if unit == "Gb/sec" else average * 1.048576 * 8
            if mbps > 1e7:
                raise PerftestError(f"perftest reports an impossible {average:g} {unit}")
            return BandwidthOutcome(mbps=mbps, msg_bytes=msg, iterations=iters)
        break
    raise PerftestError(f"ib_write_bw printed no result: {_error_line(text)}")


def parse_lat_summary(output: bytes) -> LatencySummary:
    """The summary line of an iteration-mode latency run (`ib_*_lat -n ...`)."""
    text = output.decode("utf-8", errors="replace")
    _check_device(text)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not _LAT_HEADER.search(line):
            continue
        for data in lines[i + 1 :]:
            fields = data.split()
            if len(fields) < 9 or not fields[0].isdigit():
                continue
            try:
                values = [float(f) for f in fields[2:9]]
                summary = LatencySummary(int(fields[0]), int(fields[1]), *values)
            except ValueError:
                continue
            if not all(math.isfinite(v) and v >= 0 for v in values):
                raise PerftestError("perftest reports a latency that is not a number")
            return summary
        break
    raise PerftestError(f"the latency test printed no result: {_error_line(text)}")


def parse_lat_histogram(output: bytes, gap_us: float) -> Counter[int]:
    """Round trips of an `ib_write_lat -H --latency_gap=<gap_us>` run as 1%-wide buckets
    (`latency_bucket`, ms): each printed sample is half a round trip plus the gap."""
    text = output.decode("utf-8", errors="replace")
    _check_device(text)
    lines = text.splitlines()
    try:
        begin = next(i for i, line in enumerate(lines) if line.strip().startswith("#, usec"))
    except StopIteration:
        raise PerftestError(f"the latency test printed no samples: {_error_line(text)}") from None
    buckets: Counter[int] = Counter()
    for line in lines[begin + 1 :]:
        sample = _SAMPLE.match(line)
        if sample is None:
            break
        half = float(sample.group(2)) - gap_us
        if not math.isfinite(half):
            raise PerftestError("perftest printed a sample that is not a number")
        buckets[latency_bucket(2 * half / 1000)] += 1
    if not buckets:
        raise PerftestError("the latency test printed no samples")
    return buckets
