"""iperf3: the arguments of a planned flow's client and server, and what its JSON says.

Client: ``iperf3 -c <peer rail> -B <own rail> -p <port> -P <streams> -O <warm-up>
-t <seconds> -J [-b <cap per stream>] [--dscp <dscp>]``: `-O` omits the warm-up (TCP slow
start) from the end summary, so `end.sum_received` covers the measured seconds only, as the
receiver counted them. Server: ``iperf3 -s -1 -B <own rail> -p <port>``: one test, on the rail
address only, started by the receiver's own plan shortly before its window and killed at
the window's end.

Parsing never trusts the output: it is bounded (engine_process), must be a JSON object,
and every figure used is checked to be a finite non-negative number; anything else is an
`Iperf3Error` (the flow's error), never an exception out of the agent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

MAX_JSON_DEPTH: Final = 64


class Iperf3Error(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Iperf3Outcome:
    bytes: int  # received by the server in the measured seconds
    seconds: float
    version: str | None
    cpu_percent: float | None  # the client's (host_total)
    remote_cpu_percent: float | None  # the server's (remote_total)
    retransmits: int | None


def client_argv(
    binary: str,
    *,
    peer: str,
    source: str,
    port: int,
    streams: int,
    warmup_seconds: float,
    seconds: float,
    cap_mbps: float = 0.0,
    dscp: int | None = None,
) -> list[str]:
    argv = [
        binary, "-c", peer, "-B", source, "-p", str(port), "-P", str(streams),
        "-O", _secs(warmup_seconds), "-t", _secs(seconds), "-J",
    ]  # fmt: skip
    if cap_mbps > 0:
        # -b is per stream: the flow's cap shared by its streams
        argv += ["-b", f"{cap_mbps * 1e6 / streams:.0f}"]
    if dscp is not None:
        argv += ["--dscp", str(dscp)]
    return argv


def omitted_seconds(argv: list[str]) -> int:
    """The -O of a client's arguments: the seconds before the measured part."""
    return int(argv[argv.index("-O") + 1]) if "-O" in argv else 0


def server_argv(binary: str, *, address: str, port: int) -> list[str]:
    # --forceflush: who connected is on stdout even when the server is killed
    return [binary, "-s", "-1", "-B", address, "-p", str(port), "--forceflush"]


def _secs(value: float) -> str:
    """iperf3 takes whole seconds for -t (and -O): rounded up, at least 1 for -t."""
    return str(max(0, math.ceil(value - 1e-9)))


def _depth(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _number(doc: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    if isinstance(doc, bool) or not isinstance(doc, int | float):
        return None
    try:
        value = float(doc)
    except OverflowError:  # an integer beyond any float: not a figure iperf3 writes
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _percent(doc: Any, *path: str) -> float | None:
    value = _number(doc, *path)
    return None if value is None or value > 100_000 else round(value, 2)


def parse_client(output: bytes) -> Iperf3Outcome:
    """The outcome of an `iperf3 -c ... -J` run, or Iperf3Error saying what is wrong."""
    try:
        text = output.decode("utf-8", errors="replace")
    except Exception:  # pragma: no cover - decode with replace does not raise
        raise Iperf3Error("iperf3 output is not text") from None
    if not text.strip():
        raise Iperf3Error("iperf3 printed nothing")
    if _depth(text) > MAX_JSON_DEPTH:
        raise Iperf3Error("iperf3 output nests too deep to be iperf3's")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise Iperf3Error(f"iperf3 output is not JSON: {text.strip()[:120]!r}") from None
    if not isinstance(doc, dict):
        raise Iperf3Error("iperf3 output is not a JSON object")
    error = doc.get("error")
    if isinstance(error, str) and error:
        raise Iperf3Error(f"iperf3: {error[:200]}")
    start = doc.get("start")
    version_text = start.get("version") if isinstance(start, dict) else None
    version = None
    if isinstance(version_text, str):
        parts = version_text.split()
        version = parts[-1][:32] if parts else None
    received = _number(doc, "end", "sum_received", "bytes")
    seconds = _number(doc, "end", "sum_received", "seconds")
    if received is None or seconds is None or seconds <= 0:
        raise Iperf3Error("iperf3 output has no end.sum_received bytes and seconds")
    if received > 2**62:
        raise Iperf3Error(f"iperf3 reports an impossible {received:g} bytes")
    retransmits = _number(doc, "end", "sum_sent", "retransmits")
    return Iperf3Outcome(
        bytes=int(received),
        seconds=seconds,
        version=version,
        cpu_percent=_percent(doc, "end", "cpu_utilization_percent", "host_total"),
        remote_cpu_percent=_percent(doc, "end", "cpu_utilization_percent", "remote_total"),
        retransmits=int(retransmits) if retransmits is not None and retransmits < 2**62 else None,
    )


def refused_connection(output: bytes, stderr: bytes) -> bool:
    """Did the client fail because the server was not listening (yet)? Then it may try
    again within its warm-up."""
    text = (output + stderr)[:4096].lower()
    return b"connection refused" in text or b"unable to connect" in text
