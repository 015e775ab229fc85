"""Operator ingest at scale: N simulated agents -> a real Mosquitto -> the operator's real
MQTT ingest (`ReportIngest`) and aggregation/status writer (`OperatorRuntime`).

Run from the repository root (mosquitto must be installed; root is not needed):

    python bench/ingest.py                          # 1,000 / 5,000 / 10,000 nodes, ~2.5 min
    python bench/ingest.py --nodes 10000 --window 60
    python bench/ingest.py --nodes 10000 --profile  # + cProfile of the operator's window
    python bench/ingest.py --nodes 10000 --transport plaintext tls   # side by side

What runs, per N (each N gets a fresh broker and a fresh operator process):

- Broker: Mosquitto on a free loopback port (tests/mosquitto.py: password auth, no
  persistence) with `max_inflight_messages 100` (QoS 1 messages in flight to each client,
  default 20), `max_queued_messages 200000` and `max_queued_bytes 0` (per-client queue above
  the in-flight ones, default 1000: 20 full intervals of 10,000 nodes, so the broker never
  silently drops a QoS 1 message). The operator's client (paho under aiomqtt) acknowledges a
  message on receipt, so when the operator falls behind the backlog sits in its own aiomqtt
  queue: it shows as latency and in the "behind" column, not as broker drops.
- Operator process (measured alone): `OperatorRuntime` itself, built as `netval operator`
  builds it (settings from the NETVAL_* environment, the default tracer provider: spans made,
  not exported), its own `ReportIngest` subscription and its own `write_loop` (one status
  write round per window, 2 s by default). Kopf and the API server are replaced by a
  `KubeApi`-shaped sink whose `patch_status`/`post_event`/node writes append to in-memory
  lists: API-server latency is NOT part of these figures. The sink fails loudly: a call it
  does not implement raises, and such a call, any warning the operator logs, or a run
  without status patches fails the bench (exit 1, named on stderr) instead of printing
  figures of a run that did not do its work. One NetworkValidation (default
  spec: node labels on, taints off) targets all N nodes (the worst case for status size and
  compute); the node-gating label writes it asks for are counted, by label value. The cost
  of one Node event (`on_node` for an already known node) is timed before the run.
- Publishers: --publishers processes (default 2) with aiomqtt, each simulating N/k agents
  over --connections MQTT connections (default 4). Every agent publishes its retained
  `online` state once, then a retained QoS 1 report every --interval seconds (default 10),
  agents spread evenly over the interval. A report is a real RoCE node's: 40 results (2
  NICs: link, MTU, RDMA, PFC, ECN checks as the bundled healthy-roce snapshot gives them,
  plus one storage endpoint and one peer), ~8.6 KB of JSON, built with netval.model.Report
  / CheckResult; 1 % of nodes fail a check and 1 % warn (--failing-percent). Real agents
  each hold a connection; 10,000 connections are beyond this box, so the broker's
  connection fan-in is not measured.
- Transport (--transport, default plaintext): `tls` runs the same N again with the broker's
  listener on TLS (a test CA and a certificate for localhost made with `cryptography`), the
  operator on `mqtts://localhost` with NETVAL_MQTT_CA_FILE (verification and host name
  checked, as in production) and the publishers on TLS too; each transport gets its own
  fresh broker and operator, one after the other in the same run.
- Latency: each report's startedAt + durationMs is its publish time (wall clock, same
  host); report-to-status latency is the time from that to the status patch that first
  reflects it (the first patch after the operator ingested it).

Timeline: publishers start together at T0; warm-up of one interval (every agent has
reported once); then the steady window (--window, 30 s) over which CPU (getrusage of the
operator process, all threads), reports/s, latencies (of reports published in the window),
patches and status sizes are taken; then a drain of 2 status windows + 1 s so the last
reports of the window reach a patch. RSS: VmRSS sampled each second in the window, VmHWM
(peak since the process started, set-up included) at the end. Publisher and broker CPU are
reported separately: all processes share this machine's cores; "other load" is the CPU that
processes outside the bench used meanwhile (/proc/stat), since it moves latency.

Targets (issue 4): 10,000 nodes with under one core (and keeping up) and under 300 MiB,
status under 64 KiB at any N, at most one status patch per validation per window (one
write round per window, rounds >= one window apart, at most one patch per round).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import itertools
import json
import logging
import math
import os
import pstats
import resource
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import mosquitto  # type: ignore[import-not-found]  # tests/mosquitto.py: the tests' broker
import tls_certs  # type: ignore[import-not-found]  # tests/tls_certs.py: a CA and certificates

VALIDATION: Final = "fabric"
POOL_LABEL: Final = ("netval.io/pool", "bench")
DEFAULT_NODES: Final = (1000, 5000, 10000)
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
MIB: Final = 1024 * 1024
KIB: Final = 1024

TARGET_NODES: Final = 10000
TARGET_CPU_PERCENT: Final = 100.0  # one core
TARGET_RSS_MIB: Final = 300.0
TARGET_STATUS_BYTES: Final = 64 * KIB
TARGET_PATCHES_PER_WINDOW: Final = 1

# Write rounds may start up to this much less than a window apart (asyncio timers may fire
# up to one clock tick early) and still count as one round per window.
WINDOW_TOLERANCE: Final = 0.99
BROKER_SETTINGS: Final = (
    "max_inflight_messages 100",
    "max_queued_messages 200000",
    "max_queued_bytes 0",
)
PLACEHOLDER: Final = datetime(2000, 1, 1, tzinfo=UTC)
DURATION_MS: Final = 14.6
CHILD_TIMEOUT: Final = 120.0


# -- reports --------------------------------------------------------------------------------


def node_name(i: int) -> str:
    return f"gpu-{i:05d}"


def build_report(i: int, n_nodes: int, failing_percent: float) -> Any:
    """Node i's report: 40 results, as a 2-NIC RoCE node with one storage endpoint and one
    peer reports them. Node status: fail for 1 in 100/failing_percent nodes, warn for as many
    others, pass otherwise."""
    from netval.model.ids import CheckId as C
    from netval.model.ids import Status as S
    from netval.model.results import CheckResult, Report

    every = max(1, round(100 / failing_percent)) if failing_percent > 0 else 0
    failing = every > 0 and i % every == 0
    warning = every > 0 and i % every == every // 2 and not failing
    results: list[CheckResult] = []

    def add(check: C, subject: str, message: str, observed: Any, expected: Any) -> None:
        results.append(
            CheckResult(
                check=check,
                subject=subject,
                status=S.PASS,
                message=message,
                observed=observed,
                expected=expected,
            )
        )

    for nic, (netdev, dev) in enumerate((("ens1np0", "mlx5_0"), ("ens2np0", "mlx5_1"))):
        port = f"{dev}/1"
        up = {"carrier": 1, "operstate": "up"}
        add(C.LINK_CARRIER, netdev, "carrier up (operstate up)", up, dict(up))
        add(
            C.LINK_FLAPS,
            netdev,
            "carrier changed 0 times (0 flaps) in 10s",
            {"carrierChanges": 0, "flaps": 0},
            {"maxCarrierChanges": 0},
        )
        add(C.MTU_INTERFACE, netdev, "MTU 9000", {"mtu": 9000}, {"mtu": 9000})
        add(
            C.MTU_ROCE,
            port,
            f"active RoCE MTU 4096 (netdev {netdev} MTU 9000)",
            {"roceMTU": 4096, "interfaceMTU": 9000, "netdev": netdev},
            {"roceMTU": 4096},
        )
        add(
            C.RDMA_DEVICES,
            dev,
            "present (1 port(s), firmware 28.39.1002)",
            {"ports": 1, "fwVer": "28.39.1002", "boardId": "MT_0000000838"},
            {},
        )
        state = {"state": "4: ACTIVE", "physState": "5: LinkUp"}
        add(C.RDMA_PORT_STATE, port, "4: ACTIVE, 5: LinkUp", state, dict(state))
        add(
            C.RDMA_LINK_LAYER,
            port,
            "link layer Ethernet",
            {"linkLayer": "Ethernet"},
            {"linkLayer": "Ethernet"},
        )
        add(
            C.RDMA_RATE,
            port,
            "rate 400 Gb/sec (4X NDR)",
            {"rateGbps": 400.0, "rate": "400 Gb/sec (4X NDR)"},
            {"minRateGbps": 400.0},
        )
        add(
            C.RDMA_GID_ROCE_V2,
            port,
            f"2 RoCE v2 GID(s), e.g. index 1 on {netdev}",
            {"populatedGids": 4, "roceV2Gids": 2, "types": ["IB/RoCE v1", "RoCE v2"]},
            {"roceV2Gids": ">=1"},
        )
        errors = (
            "out_of_sequence",
            "packet_seq_err",
            "local_ack_timeout_err",
            "implied_nak_seq_err",
            "rnr_nak_retry_err",
            "roce_adp_retrans",
        )
        add(
            C.RDMA_ERRORS,
            port,
            "no RDMA transport errors in 10s",
            dict.fromkeys(errors, 0),
            {"maxErrorsPerInterval": 10},
        )
        add(
            C.PFC_PRIORITIES, netdev, "PFC enabled on [3]", {"priorities": [3]}, {"priorities": [3]}
        )
        add(
            C.PFC_TRUST,
            netdev,
            "trust dscp (64 DSCP mapping(s) in the DCB app table)",
            {"trust": "dscp", "dscpMappings": 64},
            {"trust": "dscp"},
        )
        storm = {"tx_pause_storm_warning_events": 0, "tx_pause_storm_error_events": 0}
        add(C.PFC_PAUSE_STORM, netdev, "no pause-storm events in 10s", storm, dict(storm))
        add(
            C.PFC_PAUSE_STORM,
            f"{netdev}/prio3",
            "paused 0.03% (rx, peer asked us) and 0.02% (tx, we asked the peer) of 10s",
            {"rxPausePercent": 0.032, "txPausePercent": 0.019},
            {"warnPausePercent": 5.0, "maxPausePercent": 20.0},
        )
        add(
            C.PFC_DISCARDS,
            netdev,
            "0 discards in 10s",
            {"rx_discards_phy": 0, "tx_discards_phy": 0, "rx_prio3_discards": 0, "total": 0},
            {"maxDiscardsPerInterval": 0},
        )
        for check, what in (
            (C.ECN_NP_ENABLED, "notification point (sends CNPs for marked packets)"),
            (C.ECN_RP_ENABLED, "reaction point (slows down on CNPs)"),
        ):
            add(
                check,
                f"{netdev}/prio3",
                f"ECN {what} enabled",
                {"enabled": True, "enabledPriorities": [3]},
                {"enabled": True, "priorities": [3]},
            )
        add(
            C.ECN_CNP_FLOW,
            port,
            f"{52340 - nic * 4432} marked, 49118 CNPs sent, 61275 handled, 0 ignored in 10s",
            {"ecnMarked": 52340, "cnpSent": 49118, "cnpHandled": 61275, "cnpIgnored": 0},
            {"maxCnpIgnoredPerInterval": 0, "minMarksForCnp": 100},
        )
    add(
        C.STORAGE_REACHABLE,
        "ceph-mon",
        "connected to 10.0.0.10:6789 in 0.4 ms",
        {"connectMs": 0.41},
        {},
    )
    add(
        C.STORAGE_LATENCY,
        "ceph-mon",
        "latency 0.41 ms",
        {"latencyMs": 0.41},
        {"maxLatencyMs": 5.0},
    )
    peer = node_name((i + 1) % n_nodes)
    add(
        C.PEER_LATENCY,
        peer,
        "p50 0.021 ms, p99 0.034 ms",
        {"p50Ms": 0.021, "p99Ms": 0.034, "jitterMs": 0.004},
        {"maxLatencyMs": 1.0},
    )
    add(C.PEER_LOSS, peer, "0.0% loss (0 of 100)", {"lossPercent": 0.0}, {"maxLossPercent": 0.1})
    if failing:  # the second NIC's priority 3 is paused most of the time
        results[31] = results[31].model_copy(
            update={
                "status": S.FAIL,
                "message": "paused 41.20% (rx, peer asked us) of 10s: pause storm",
                "observed": {"rxPausePercent": 41.2, "txPausePercent": 0.02},
            }
        )
    elif warning:
        results[9] = results[9].model_copy(
            update={"status": S.WARN, "message": "7 RDMA transport errors in 10s"}
        )
    status = S.FAIL if failing else S.WARN if warning else S.PASS
    trace_id = f"{i + 1:032x}"
    return Report(
        validation=VALIDATION,
        generation=1,
        node=node_name(i),
        started_at=PLACEHOLDER,
        duration_ms=DURATION_MS,
        status=status,
        results=results,
        traceparent=f"00-{trace_id}-{i + 1:016x}-01",
    )


def split_template(report: Any) -> tuple[bytes, bytes]:
    """The report's JSON cut around its startedAt value, to stamp the publish time in."""
    text: bytes = report.to_json().encode()
    marker = b'"startedAt":"2000-01-01T00:00:00Z"'
    at = text.index(marker) + len(b'"startedAt":"')
    return text[:at], text[at + len(b'2000-01-01T00:00:00Z"') - 1 :]


def stamp(prefix: bytes, suffix: bytes, started: float) -> bytes:
    iso = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return prefix + iso.encode() + suffix


# -- process metrics ------------------------------------------------------------------------


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def machine_busy_seconds() -> float:
    """CPU-seconds all processes of the machine spent busy (/proc/stat, all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


def vm_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


async def sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def read_json_line(stream: asyncio.StreamReader) -> dict[str, Any]:
    line = await stream.readline()
    if not line:
        raise RuntimeError("parent closed stdin")
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


# -- operator process -----------------------------------------------------------------------


@dataclass
class Timeline:
    t0: float = math.inf  # publishers start
    w0: float = math.inf  # steady window opens
    w1: float = math.inf  # steady window closes
    end: float = math.inf  # drain done


class Probe:
    """What the operator process records; fed by the runtime subclass and the kube sink."""

    def __init__(self) -> None:
        self.tl = Timeline()
        self.reports_in_window = 0  # live reports handed to on_report in [w0, w1)
        self.reports_total = 0
        self.retained = 0
        self.pending: list[float] = []  # publish times of reports not yet in a patch
        self.latencies: list[float] = []  # of reports published in [w0, w1)
        self.patches: list[tuple[float, int]] = []  # (wall time, JSON bytes), all
        self.compute_ms: list[float] = []
        self.write_round_ms: list[float] = []
        self.rounds: list[tuple[float, int]] = []  # (wall start, patches of the round)
        self.events = 0
        self.node_writes: Counter[str] = Counter()  # by label value written
        self.other_kube_calls: Counter[str] = Counter()
        self.unknown_calls: Counter[str] = Counter()  # KubeApi methods the stand-in lacks
        self.nodes = 0

    def on_report(self, report: Any, retained: bool) -> None:
        if retained:
            self.retained += 1
            return
        now = time.time()
        self.reports_total += 1
        if self.tl.w0 <= now < self.tl.w1:
            self.reports_in_window += 1
        published = report.started_at.timestamp() + report.duration_ms / 1000
        self.pending.append(published)

    def on_patch(self, name: str, status: dict[str, Any]) -> None:
        now = time.time()
        size = len(json.dumps({"status": status}))  # what the client sends
        self.patches.append((now, size))
        w0, w1 = self.tl.w0, self.tl.w1
        for published in self.pending:
            if w0 <= published < w1:
                self.latencies.append(now - published)
        self.pending.clear()


class RecordingKube:
    """A `KubeApi`-shaped, latency-free stand-in for the API server: what the operator
    writes is recorded in memory. BENCHMARK ONLY: the figures exclude API-server latency.

    It fails loudly: a `KubeApi` method the runtime calls and this class lacks raises
    AttributeError and is recorded (`probe.unknown_calls`), and the bench then exits with
    an error instead of printing figures of a run that did not do its work (an earlier
    version answered None to any name and reported 0 status patches for months)."""

    retries = 0  # KubeApi's retry counter, read by the metrics

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    async def patch_status(self, name: str, status: dict[str, Any]) -> None:
        self.probe.on_patch(name, status)

    async def post_event(
        self, ref: dict[str, Any], *, type: str, reason: str, message: str
    ) -> None:
        self.probe.events += 1

    async def set_node_gating(self, node: str, label: str | None, taint: bool) -> bool:
        self.probe.node_writes[f"{label}{'+taint' if taint else ''}"] += 1
        return True

    async def set_node_label(self, node: str, label: str | None) -> bool:
        self.probe.node_writes[f"{label}"] += 1
        return True

    async def list_validation_names(self) -> list[str]:
        return [VALIDATION]

    async def agent_pod_counts(
        self, namespace: str, label_selector: str, label: str
    ) -> dict[str, tuple[int, int]]:
        self.probe.other_kube_calls["agent_pod_counts"] += 1
        return {}  # no agent DaemonSet status: nothing for the Ready message

    async def list_node_labels(self, keys: frozenset[str]) -> dict[str, dict[str, str]]:
        # the Nodes' metadata listing that fills in the keys the validation references
        self.probe.other_kube_calls["list_node_labels"] += 1
        labels = {k: v for k, v in [POOL_LABEL] if k in keys}
        return {node_name(i): dict(labels) for i in range(self.probe.nodes)}

    async def list_loadtest_specs(self) -> dict[str, dict[str, Any]]:
        self.probe.other_kube_calls["list_loadtest_specs"] += 1
        return {}  # no NetworkLoadTest: no agent gets RDMA privileges

    async def nodes_with_taint(self, key: str) -> dict[str, str]:
        # each term sweeps the load-test reservation taints once at its start: none here
        self.probe.other_kube_calls["nodes_with_taint"] += 1
        return {}

    async def set_node_taint(self, node: str, key: str, value: str | None) -> bool:
        self.probe.node_writes[f"{key}={value}"] += 1
        return True

    async def apply_configmap(self, body: dict[str, Any]) -> None:
        self.probe.other_kube_calls["apply_configmap"] += 1

    async def apply_daemonset(self, body: dict[str, Any]) -> None:
        self.probe.other_kube_calls["apply_daemonset"] += 1

    async def delete_agent_objects(self, namespace: str, name: str) -> None:
        self.probe.other_kube_calls["delete_agent_objects"] += 1

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        self.probe.unknown_calls[name] += 1
        raise AttributeError(f"RecordingKube has no {name!r}: add it to the bench's stand-in")


class ProblemLog(logging.Handler):
    """Warnings and errors the operator logs during a run: a healthy run has none, so any is
    printed and fails the bench (a swallowed exception must not pass for a figure)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "netval.infra.mqtt_client" and "is plaintext MQTT" in record.getMessage():
            return  # the plaintext run asked for it: the bench's loopback broker
        if len(self.records) < 20:
            self.records.append(f"{record.levelname} {record.name}: {record.getMessage()}")


class GcClock:
    """Time spent in the cyclic garbage collector (gc.callbacks), per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections: Counter[int] = Counter()
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1


def make_runtime(cfg: dict[str, Any], probe: Probe, workdir: Path) -> Any:
    from netval.infra.telemetry import make_tracer_provider
    from netval.operator.settings import operator_settings_from_env
    from netval.operator.term_runtime import OperatorRuntime

    def observe(runtime: OperatorRuntime) -> OperatorRuntime:
        """The real runtime; the wrappers only observe (timing and publish times)."""
        on_report, compute, write_due = (
            runtime.on_report, runtime.status.compute, runtime.status.write_due
        )  # fmt: skip

        def observed_report(report: Any, retained: bool) -> None:
            on_report(report, retained)
            probe.on_report(report, retained)

        def timed_compute(name: str, now: datetime) -> Any:
            t = time.perf_counter()
            status = compute(name, now)
            probe.compute_ms.append((time.perf_counter() - t) * 1e3)
            return status

        async def timed_write_due(now: datetime) -> None:
            t, wall, before = time.perf_counter(), time.time(), len(probe.patches)
            await write_due(now)
            probe.write_round_ms.append((time.perf_counter() - t) * 1e3)
            probe.rounds.append((wall, len(probe.patches) - before))

        runtime.ingest.on_report = observed_report
        runtime.status.compute = timed_compute  # type: ignore[method-assign]
        runtime.status.write_due = timed_write_due  # type: ignore[method-assign]
        return runtime

    password_file = workdir / "operator-password"
    password_file.write_text(cfg["password"] + "\n")
    scheme = "mqtts" if cfg.get("ca_file") else "mqtt"
    env = {
        "NETVAL_MQTT_URL": f"{scheme}://{cfg['host']}:{cfg['port']}",
        **({"NETVAL_MQTT_CA_FILE": cfg["ca_file"]} if cfg.get("ca_file") else {}),
        "NETVAL_MQTT_USERNAME": cfg["username"],
        "NETVAL_MQTT_PASSWORD_FILE": str(password_file),
        "NETVAL_STATUS_WINDOW_SECONDS": str(cfg["status_window"]),
    }
    settings = operator_settings_from_env(env)
    provider = make_tracer_provider({}, default_service="netval-operator")  # not exported
    kube: Any = RecordingKube(probe)
    runtime = OperatorRuntime(settings, kube, provider)
    # The worst case, and what "report to status patch" latency needs: every window with a
    # new report writes (in production lastReportTime alone waits for the 5-minute resync).
    runtime.status.resync_seconds = 0.0
    return observe(runtime)


async def operator_main(cfg: dict[str, Any]) -> None:
    from netval.model.spec import NetworkValidationSpec

    probe = Probe()
    problems = ProblemLog()
    logging.getLogger("netval").addHandler(problems)
    gc_clock = GcClock()
    n = cfg["nodes"]
    probe.nodes = n
    workdir = Path(cfg["workdir"])
    runtime = make_runtime(cfg, probe, workdir)

    # What the Node watch and the CR resume tell the runtime at start. Nodes first: with no
    # validation yet, each on_node is O(1); the validation then retargets once.
    labels = dict([POOL_LABEL])
    for i in range(n):
        runtime.store.on_node(node_name(i), labels)
    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": labels, "interval": f"{cfg['interval']:g}s"}
    )
    ref = {
        "apiVersion": "netval.io/v1alpha1",
        "kind": "NetworkValidation",
        "metadata": {"name": VALIDATION, "uid": "00000000-0000-0000-0000-000000000001"},
    }
    runtime.store.upsert_validation(VALIDATION, generation=1, spec=spec, body=ref, status=None)
    runtime.store.agents_applied(VALIDATION)

    # One Node event at steady state (a kubelet status update, a label change by someone
    # else): the runtime retargets every validation over all nodes. Timed here because a
    # real cluster of N nodes sends such events continuously.
    node_event_ms = []
    for i in range(0, n, max(1, n // 50)):
        t = time.perf_counter()
        runtime.store.on_node(node_name(i), labels)
        node_event_ms.append((time.perf_counter() - t) * 1e3)

    stdin = await stdin_reader()
    runtime.start()
    try:
        await asyncio.wait_for(runtime.ingest.synced.wait(), 30)
    except TimeoutError:
        emit({"error": f"operator ingest did not sync: {runtime.ingest.stats.__dict__}"})
        return
    emit({"ready": True, "rss_mib": vm_kib("VmRSS") / KIB})

    msg = await read_json_line(stdin)
    tl = probe.tl
    tl.t0 = msg["t0"]
    tl.w0 = tl.t0 + cfg["warmup"]
    tl.w1 = tl.w0 + cfg["window"]
    tl.end = tl.w1 + 2 * cfg["status_window"] + 1.0

    await sleep_until(tl.w0)
    profiler = cProfile.Profile() if cfg["profile"] else None
    cpu0, wall0, gc0 = cpu_seconds(), time.time(), gc_clock.seconds
    gc_counts0 = Counter(gc_clock.collections)
    if profiler is not None:
        profiler.enable()
    rss_samples = []
    while time.time() < tl.w1:
        rss_samples.append(vm_kib("VmRSS"))
        await asyncio.sleep(min(1.0, max(0.0, tl.w1 - time.time())))
    if profiler is not None:
        profiler.disable()
    cpu1, wall1, gc1 = cpu_seconds(), time.time(), gc_clock.seconds
    gc_counts = gc_clock.collections - gc_counts0
    await sleep_until(tl.end)
    stats = runtime.ingest.stats
    dropped = {str(k): v for k, v in stats.dropped.items()}
    reconnects = stats.reconnects
    await runtime.stop()

    in_window = [t for t, _ in probe.patches if tl.w0 <= t < tl.w1]
    gaps = [b - a for a, b in itertools.pairwise(in_window)]
    # The contract: one write round per window, at most one patch per validation per round.
    rounds = [(t, k) for t, k in probe.rounds if tl.w0 <= t < tl.w1]
    round_gaps = [b[0] - a[0] for a, b in itertools.pairwise(rounds)]
    most_per_round = max((k for _, k in rounds), default=0)
    rounds_too_close = sum(1 for g in round_gaps if g < cfg["status_window"] * WINDOW_TOLERANCE)
    sizes = [s for t, s in probe.patches if tl.w0 <= t < tl.end]
    lat = sorted(probe.latencies)
    profile_text = ""
    if profiler is not None:
        out = io.StringIO()
        ps = pstats.Stats(profiler, stream=out)
        ps.sort_stats("tottime").print_stats(25)
        ps.sort_stats("cumulative").print_stats(30)
        profile_text = out.getvalue()
    emit(
        {
            "result": {
                "cpu_percent": 100 * (cpu1 - cpu0) / (wall1 - wall0),
                "wall": wall1 - wall0,
                "reports_in_window": probe.reports_in_window,
                "reports_total": probe.reports_total,
                "retained": probe.retained,
                "latencies": len(lat),
                "lat_p50": percentile(lat, 0.50),
                "lat_p99": percentile(lat, 0.99),
                "lat_max": lat[-1] if lat else math.nan,
                "patches_in_window": len(in_window),
                "windows": (tl.w1 - tl.w0) / cfg["status_window"],
                "rounds": len(rounds),
                "most_patches_per_round": most_per_round,
                "rounds_too_close": rounds_too_close,
                "min_round_gap": min(round_gaps) if round_gaps else math.nan,
                "min_gap": min(gaps) if gaps else math.nan,
                "status_bytes_max": max(sizes, default=0),
                "status_bytes_last": sizes[-1] if sizes else 0,
                "compute_ms_p50": statistics.median(probe.compute_ms) if probe.compute_ms else 0,
                "compute_ms_max": max(probe.compute_ms, default=0),
                "write_round_ms_p50": statistics.median(probe.write_round_ms)
                if probe.write_round_ms
                else 0,
                "write_round_ms_max": max(probe.write_round_ms, default=0),
                "rss_mib_max": max(rss_samples, default=0) / KIB,
                "rss_mib_end": rss_samples[-1] / KIB if rss_samples else 0,
                "hwm_mib": vm_kib("VmHWM") / KIB,
                "gc_percent": 100 * (gc1 - gc0) / (wall1 - wall0),
                "gc_collections": {str(k): v for k, v in sorted(gc_counts.items())},
                "node_event_ms_p50": statistics.median(node_event_ms),
                "events": probe.events,
                "node_writes": dict(probe.node_writes),
                "other_kube_calls": dict(probe.other_kube_calls),
                "dropped": dropped,
                "reconnects": reconnects,
                "unknown_kube_calls": dict(probe.unknown_calls),
                "problems": problems.records,
                "profile": profile_text,
            }
        }
    )


# -- publisher process ----------------------------------------------------------------------


async def publisher_main(cfg: dict[str, Any]) -> None:
    import aiomqtt
    from aiomqtt import ProtocolVersion

    # aiomqtt warns about "pending publish calls" (QoS 1 publishes awaiting PUBACK): expected
    quiet = logging.getLogger("bench.publisher.mqtt")
    quiet.setLevel(logging.ERROR)
    n, k, index = cfg["nodes"], cfg["publishers"], cfg["index"]
    interval = cfg["interval"]
    mine = list(range(index, n, k))  # interleaved: every process covers the whole interval
    templates = {}
    for i in mine:
        templates[i] = split_template(build_report(i, n, cfg["failing_percent"]))
    topics = {i: f"netval/v1/{VALIDATION}/{node_name(i)}/report" for i in mine}
    stdin = await stdin_reader()

    tls_context = None
    if cfg.get("ca_file"):
        import ssl

        tls_context = ssl.create_default_context(cafile=cfg["ca_file"])
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for c in range(cfg["connections"]):
            client = aiomqtt.Client(
                cfg["host"],
                cfg["port"],
                username=cfg["username"],
                password=cfg["password"],
                identifier=f"bench-agents-{index}-{c}",
                protocol=ProtocolVersion.V5,
                max_inflight_messages=200,
                keepalive=30,
                logger=quiet,
                tls_context=tls_context,
            )
            clients.append(await stack.enter_async_context(client))

        def client_of(j: int) -> aiomqtt.Client:
            return clients[j % len(clients)]

        await asyncio.gather(
            *(
                client_of(j).publish(
                    f"netval/v1/{VALIDATION}/{node_name(i)}/state", b"online", qos=1, retain=True
                )
                for j, i in enumerate(mine)
            )
        )
        emit({"ready": True})
        msg = await read_json_line(stdin)
        t0, w0, w1, stop = msg["t0"], msg["w0"], msg["w1"], msg["stop"]

        inflight: set[asyncio.Task[None]] = set()
        errors: Counter[str] = Counter()
        published_in_window = 0
        late_max = 0.0
        cpu = {}

        async def publish(client: aiomqtt.Client, topic: str, payload: bytes) -> None:
            try:
                await client.publish(topic, payload, qos=1, retain=True, timeout=30)
            except Exception as exc:  # counted and reported, never silent
                errors[type(exc).__name__] += 1

        async def mark(at: float, key: str) -> None:
            await sleep_until(at)
            cpu[key] = (time.time(), cpu_seconds())

        marks = [asyncio.create_task(mark(w0, "w0")), asyncio.create_task(mark(w1, "w1"))]
        step = interval / n
        for cycle in itertools.count():
            base = t0 + cycle * interval
            if base >= stop:
                break
            for j, i in enumerate(mine):
                due = base + i * step
                if due >= stop:
                    break
                now = time.time()
                if due - now > 0.0005:
                    await asyncio.sleep(due - now)
                    now = time.time()
                late_max = max(late_max, now - due)
                prefix, suffix = templates[i]
                payload = stamp(prefix, suffix, now - DURATION_MS / 1000)
                if w0 <= now < w1:
                    published_in_window += 1
                task = asyncio.create_task(publish(client_of(j), topics[i], payload))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
        await asyncio.gather(*marks)
        if inflight:
            await asyncio.wait(inflight, timeout=30)
    (tw0, c0), (tw1, c1) = cpu["w0"], cpu["w1"]
    emit(
        {
            "result": {
                "cpu_percent": 100 * (c1 - c0) / (tw1 - tw0),
                "published_in_window": published_in_window,
                "late_max": late_max,
                "errors": dict(errors),
                "unfinished": len(inflight),
                "payload_bytes": len(stamp(*templates[mine[0]], t0)),
            }
        }
    )


# -- orchestration --------------------------------------------------------------------------


@dataclass
class RunResult:
    nodes: int
    op: dict[str, Any]
    pubs: list[dict[str, Any]]
    broker_cpu_percent: float
    machine_cpu_percent: float  # all processes of the machine, in % of one core
    transport: str = "plaintext"

    @property
    def other_cpu_percent(self) -> float:
        """CPU used outside this bench's processes during the window (other work on the box)."""
        ours = float(self.op["cpu_percent"]) + self.broker_cpu_percent
        ours += sum(float(p["cpu_percent"]) for p in self.pubs)
        return max(0.0, self.machine_cpu_percent - ours)

    @property
    def offered(self) -> float:
        return float(sum(int(p["published_in_window"]) for p in self.pubs))


async def spawn(role: str, cfg: dict[str, Any]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--role",
        role,
        "--child-config",
        json.dumps(cfg),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=64 * MIB,
    )


async def expect(proc: asyncio.subprocess.Process, key: str, within: float) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), within)
    if not line:
        raise RuntimeError(f"child {proc.pid} exited ({await proc.wait()}) before {key!r}")
    msg: dict[str, Any] = json.loads(line)
    if key not in msg:
        raise RuntimeError(f"child {proc.pid}: expected {key!r}, got {msg}")
    return msg


def send(proc: asyncio.subprocess.Process, msg: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(msg) + "\n").encode())


async def run_one(n: int, args: argparse.Namespace, transport: str = "plaintext") -> RunResult:
    with tempfile.TemporaryDirectory(prefix="netval-bench-ingest-") as tmp:
        workdir = Path(tmp)
        tls: tuple[Path, Path, Path] | None = None
        if transport == "tls":
            ca = tls_certs.make_ca(workdir)
            leaf = tls_certs.issue(ca, workdir, "broker", dns_names=("localhost",))
            tls = (ca.cert_file, leaf.cert_file, leaf.key_file)
        broker = mosquitto.MosquittoBroker(workdir, tls=tls)
        with broker.config.open("a") as conf:
            conf.write("\n".join(BROKER_SETTINGS) + "\n")
        broker.start()
        procs: list[asyncio.subprocess.Process] = []
        try:
            assert broker.proc is not None
            base = {
                "host": "localhost" if tls else broker.host,  # the certificate's name
                "ca_file": str(tls[0]) if tls else None,
                "port": broker.port,
                "username": broker.username,
                "password": broker.password,
                "nodes": n,
                "interval": args.interval,
                "failing_percent": args.failing_percent,
            }
            op = await spawn(
                "operator",
                {
                    **base,
                    "workdir": str(workdir),
                    "warmup": args.warmup,
                    "window": args.window,
                    "status_window": args.status_window,
                    "profile": args.profile,
                },
            )
            procs.append(op)
            await expect(op, "ready", CHILD_TIMEOUT)
            pubs = []
            for p in range(args.publishers):
                pubs.append(
                    await spawn(
                        "publisher",
                        {
                            **base,
                            "index": p,
                            "publishers": args.publishers,
                            "connections": args.connections,
                        },
                    )
                )
            procs.extend(pubs)
            for pub in pubs:
                await expect(pub, "ready", CHILD_TIMEOUT)
            t0 = time.time() + 1.0
            w0 = t0 + args.warmup
            w1 = w0 + args.window
            stop = w1 + 2 * args.status_window + 1.0
            send(op, {"t0": t0})
            for pub in pubs:
                send(pub, {"t0": t0, "w0": w0, "w1": w1, "stop": stop})
            await sleep_until(w0)
            b0 = (time.time(), proc_cpu_seconds(broker.proc.pid), machine_busy_seconds())
            await sleep_until(w1)
            b1 = (time.time(), proc_cpu_seconds(broker.proc.pid), machine_busy_seconds())
            budget = stop - time.time() + CHILD_TIMEOUT
            op_result = (await expect(op, "result", budget))["result"]
            pub_results = [(await expect(p, "result", budget))["result"] for p in pubs]
            for proc in procs:
                await proc.wait()
            wall = b1[0] - b0[0]
            return RunResult(
                n,
                op_result,
                pub_results,
                100 * (b1[1] - b0[1]) / wall,
                100 * (b1[2] - b0[2]) / wall,
                transport,
            )
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            broker.stop()


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(results: list[RunResult], args: argparse.Namespace, command: str) -> None:
    print()
    print(f"command: {command}")
    print(
        f"{os.cpu_count()} CPUs; one validation targets all N nodes; reports of 40 results "
        f"({results[0].pubs[0]['payload_bytes']} B JSON) every {args.interval:g} s; status "
        f"window {args.status_window:g} s; steady window {args.window:g} s after "
        f"{args.warmup:g} s warm-up"
    )
    import netval

    print(f"netval imported from {Path(netval.__file__).parent}")
    print(
        "status patches go to an in-memory KubeApi stand-in (no API-server latency); "
        "tracing: spans made, not exported (default install); status size: JSON of the "
        "patch body as the client sends it"
    )
    print(
        f"broker: mosquitto, {', '.join(BROKER_SETTINGS)}; publishers: {args.publishers} "
        f"processes x {args.connections} connections (agent connection fan-in not measured)"
    )
    print()
    print(
        "| nodes | transport | offered rep/s | ingested rep/s | behind | latency p50 / p99 | "
        "patches (max/round) | status JSON | operator CPU | RSS max (HWM) | "
        "publishers CPU | broker CPU | other load |"
    )
    print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        op = r.op
        behind = r.offered - op["latencies"]
        print(
            f"| {r.nodes:,} | {r.transport} | {r.offered / args.window:,.0f} | "
            f"{op['reports_in_window'] / args.window:,.0f} | {behind:,.0f} | "
            f"{op['lat_p50'] * 1e3:,.0f} / {op['lat_p99'] * 1e3:,.0f} ms | "
            f"{op['patches_in_window']} ({op['most_patches_per_round']}) | "
            f"{op['status_bytes_max'] / KIB:.1f} KiB | {op['cpu_percent']:.0f} % | "
            f"{op['rss_mib_max']:.0f} MiB ({op['hwm_mib']:.0f}) | "
            f"{sum(p['cpu_percent'] for p in r.pubs):.0f} % | {r.broker_cpu_percent:.0f} % | "
            f"{r.other_cpu_percent:.0f} % |"
        )
    print(
        "behind: reports published in the window that no status patch reflected by the end "
        "of the drain (backlog or loss); CPU in % of one core; other load: CPU used by "
        "processes outside this bench during the window"
    )
    print()
    print("operator detail:")
    for r in results:
        op = r.op
        gcs = ", ".join(f"gen{g} x{c}" for g, c in op["gc_collections"].items()) or "none"
        writes = ", ".join(f"{k} {v:,}" for k, v in op["node_writes"].items()) or "none"
        parts = [
            f"status compute p50 {op['compute_ms_p50']:.1f} ms (max {op['compute_ms_max']:.1f})",
            f"write round p50 {op['write_round_ms_p50']:.1f} ms "
            f"(max {op['write_round_ms_max']:.1f})",
            f"{op['rounds']} write rounds >= {op['min_round_gap']:.3f} s apart, at most "
            f"{op['most_patches_per_round']} patch per round, patches >= "
            f"{op['min_gap']:.3f} s apart",
            f"GC {op['gc_percent']:.1f} % of a core ({gcs})",
            f"latency max {op['lat_max'] * 1e3:,.0f} ms",
            f"one Node event (retarget) {op['node_event_ms_p50']:.2f} ms",
            f"node gating writes {sum(op['node_writes'].values()):,} ({writes})",
            f"events {op['events']}",
            f"dropped {op['dropped'] or 0}, reconnects {op['reconnects']}",
            f"publishers: max lateness {max(p['late_max'] for p in r.pubs) * 1e3:.0f} ms, "
            f"errors {sum(sum(p['errors'].values()) for p in r.pubs)}",
        ]
        if op["other_kube_calls"]:
            parts.append(f"other kube calls {op['other_kube_calls']}")
        print(f"  {r.nodes:>6,} {r.transport}: " + "; ".join(parts[:3]))
        for k in range(3, len(parts), 3):
            print("          " + "; ".join(parts[k : k + 3]))

    print()
    print("targets:")
    at_target = [r for r in results if r.nodes >= TARGET_NODES]
    if at_target:
        r = max(at_target, key=lambda x: x.nodes)
        cpu, hwm = r.op["cpu_percent"], r.op["hwm_mib"]
        kept_up = r.op["latencies"] >= r.offered
        print(
            f"  {verdict(cpu < TARGET_CPU_PERCENT and kept_up)}  {r.nodes:,} nodes under one "
            f"core: {cpu:.0f} % of one core"
            + ("" if kept_up else " while falling behind (a lower bound: MISS)")
        )
        print(
            f"  {verdict(hwm < TARGET_RSS_MIB)}  {r.nodes:,} nodes under "
            f"{TARGET_RSS_MIB:.0f} MiB: peak RSS (VmHWM) {hwm:.0f} MiB"
        )
    else:
        print(f"  (not run at {TARGET_NODES:,} nodes: no CPU / RSS verdict)")
    biggest = max(r.op["status_bytes_max"] for r in results)
    print(
        f"  {verdict(biggest < TARGET_STATUS_BYTES)}  status under 64 KiB at any N: "
        f"largest {biggest:,} B"
    )
    most = max(r.op["most_patches_per_round"] for r in results)
    close = sum(r.op["rounds_too_close"] for r in results)
    gap = min(r.op["min_round_gap"] for r in results)
    print(
        f"  {verdict(most <= TARGET_PATCHES_PER_WINDOW and close == 0)}  at most one status "
        f"patch per validation per window: at most {most} per write round, write rounds "
        f">= {gap:.3f} s apart (window {args.status_window:g} s)"
    )
    complete = all(r.op["latencies"] >= r.offered for r in results)
    print(
        f"  {verdict(complete)}  (sanity) every report published in the window reached a "
        "status patch"
    )
    busy = [r for r in results if r.other_cpu_percent > 10]
    if busy:
        loads = ", ".join(f"{r.nodes:,}: {r.other_cpu_percent:.0f} %" for r in busy)
        print(
            f"  note: other processes used CPU during the window ({loads} of one core): "
            "latency and keeping up depend on it; CPU and RSS of the operator less so"
        )
    if args.profile:
        print("\nprofiled run: cProfile inflates operator CPU; use the figures above with care")
        for r in results:
            print(f"\n--- cProfile, operator, {r.nodes:,} nodes, steady window ---")
            print(r.op["profile"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    first = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(description=first)
    parser.add_argument("--nodes", type=int, nargs="+", default=list(DEFAULT_NODES))
    parser.add_argument("--interval", type=float, default=10.0, help="report interval, s")
    parser.add_argument("--window", type=float, default=30.0, help="steady window, s")
    parser.add_argument("--warmup", type=float, help="s before the window (default: interval)")
    parser.add_argument("--status-window", type=float, default=2.0, help="operator window, s")
    parser.add_argument("--publishers", type=int, default=2, help="publisher processes")
    parser.add_argument("--connections", type=int, default=4, help="per publisher process")
    parser.add_argument("--failing-percent", type=float, default=1.0)
    parser.add_argument("--profile", action="store_true", help="cProfile the operator")
    parser.add_argument("--repeat", type=int, default=1, help="runs per N (medians printed)")
    parser.add_argument(
        "--transport",
        nargs="+",
        choices=["plaintext", "tls"],
        default=["plaintext"],
        help="MQTT transports to run, each N side by side (tls: verified, as in production)",
    )
    parser.add_argument("--role", choices=["main", "operator", "publisher"], default="main")
    parser.add_argument("--child-config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = args.interval
    return args


def main() -> None:
    args = parse_args()
    if args.role != "main":
        cfg = json.loads(args.child_config)
        entry = operator_main if args.role == "operator" else publisher_main
        asyncio.run(entry(cfg))
        return
    if not mosquitto.available():
        sys.exit(mosquitto.MISSING_REASON)
    command = shlex.join(["python", "bench/ingest.py", *sys.argv[1:]])
    results = []
    for _ in range(args.repeat):
        for n, transport in itertools.product(args.nodes, args.transport):
            started = time.monotonic()
            r = asyncio.run(run_one(n, args, transport))
            print(
                f"{n:,} nodes ({transport}): "
                f"{r.op['reports_in_window'] / args.window:,.0f} reports/s, "
                f"operator {r.op['cpu_percent']:.0f} % CPU, HWM {r.op['hwm_mib']:.0f} MiB, "
                f"{r.op['patches_in_window']} patches ({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            results.append(r)
    results.sort(key=lambda r: r.nodes)
    report(results, args, command)
    if args.repeat > 1:
        medians(results)
    broken = [
        (r.nodes, r.op["unknown_kube_calls"], r.op["problems"])
        for r in results
        if r.op["unknown_kube_calls"] or r.op["problems"] or not r.op["patches_in_window"]
    ]
    for n, unknown, problems in broken:
        print(f"\nFAILED run at {n:,} nodes: the figures above do not count", file=sys.stderr)
        if unknown:
            print(f"  KubeApi calls the stand-in lacks: {unknown}", file=sys.stderr)
        for line in problems:
            print(f"  operator logged: {line}", file=sys.stderr)
    if broken:
        sys.exit(1)


def medians(results: list[RunResult]) -> None:
    """Per N, the median of each headline figure over the repeated runs."""
    print()
    print("medians over the repeated runs:")
    print("| nodes | runs | ingested rep/s | latency p50 / p99 | operator CPU | RSS max (HWM) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sorted({r.nodes for r in results}):
        runs = [r.op for r in results if r.nodes == n]

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(op[key] for op in runs)

        window = runs[0]["wall"]
        print(
            f"| {n:,} | {len(runs)} | {med('reports_in_window') / window:,.0f} | "
            f"{med('lat_p50') * 1e3:,.0f} / {med('lat_p99') * 1e3:,.0f} ms | "
            f"{med('cpu_percent'):.0f} % | {med('rss_mib_max'):.0f} MiB ({med('hwm_mib'):.0f}) |"
        )


if __name__ == "__main__":
    main()
