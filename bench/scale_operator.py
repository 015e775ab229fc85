"""The operator of bench/scale.py, in its own process (`--role operator`): the real
`OperatorRuntime` (MQTT ingest, aggregation, status writer, node gating) built as
`netval operator` builds it from NETVAL_* settings with their defaults (status window 2 s,
status resync 300 s), against a `KubeApi`-shaped stand-in that counts and timestamps every
write it is asked for (status patches, Node label/taint writes, Events) with no API-server
latency. Kopf and the Node watch are replaced by what they would tell the runtime at start
(N Nodes, one NetworkValidation targeting all of them).

JSON lines: stdout says `ready`, `synced`, `replayed`; stdin asks for `stats`, `ingest`, `mark` (from
now on, note each node's first live report or matching beat) and `back` (how many nodes
since the mark, and when the last of them came). SIGTERM stops the runtime as the real
operator's shutdown does (a rollout).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Final

from scale_client import emit, node_name, proc_usage

VALIDATION: Final = "fabric"
POOL: Final = {"netval.io/pool": "bench"}


class CountingKube:
    """Every write the runtime makes, with its wall time; any call not listed raises."""

    retries = 0

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.writes: list[tuple[float, str]] = []
        self.patches: list[tuple[float, int, int]] = []  # (time, reporting, failing)
        self.node_writes: list[tuple[float, str, str | None]] = []  # (time, node, label)

    async def patch_status(self, name: str, status: dict[str, Any]) -> None:
        now = time.time()
        counts = status.get("nodes") or {}
        self.writes.append((now, "status"))
        self.patches.append((now, int(counts.get("reporting", 0)), int(counts.get("failing", 0))))

    async def post_event(self, ref: dict[str, Any], **_: Any) -> None:
        self.writes.append((time.time(), "event"))

    async def set_node_gating(self, node: str, label: str | None, taint: bool) -> bool:
        self.writes.append((time.time(), "node"))
        self.node_writes.append((time.time(), node, label))
        return True

    async def set_node_label(self, node: str, label: str | None) -> bool:
        self.writes.append((time.time(), "node"))
        self.node_writes.append((time.time(), node, label))
        return True

    async def set_node_labels(self, node: str, patch: dict[str, Any]) -> bool:
        self.writes.append((time.time(), "node"))
        return True

    async def set_node_condition(self, node: str, wanted: tuple[str, str, str] | None) -> bool:
        self.writes.append((time.time(), "condition"))
        return True

    async def list_validation_names(self) -> list[str]:
        return [VALIDATION]

    async def agent_pod_counts(self, *_: Any) -> dict[str, tuple[int, int]]:
        return {}

    async def list_node_labels(self, keys: frozenset[str]) -> dict[str, dict[str, str]]:
        labels = {k: v for k, v in POOL.items() if k in keys}
        return {node_name(i): dict(labels) for i in range(self.nodes)}

    async def list_loadtest_specs(self) -> dict[str, dict[str, Any]]:
        return {}  # no NetworkLoadTest: no agent gets RDMA privileges

    async def nodes_with_taint(self, key: str) -> dict[str, str]:
        return {}  # no load test reserved a node (each term sweeps once at its start)

    async def set_node_taint(self, node: str, key: str, value: str | None) -> bool:
        self.writes.append((time.time(), "node"))
        return True

    async def apply_configmap(self, body: dict[str, Any]) -> None:
        self.writes.append((time.time(), "configmap"))

    async def apply_daemonset(self, body: dict[str, Any]) -> None:
        self.writes.append((time.time(), "daemonset"))

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"CountingKube has no {name!r}: add it to the bench's stand-in")


class Problems(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "is plaintext MQTT" not in record.getMessage() and len(self.lines) < 20:
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def resolve_to_loopback(name: str) -> None:
    """The chart's broker name (in its certificate) resolves to the local broker, as the
    cluster DNS points it at the Service."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == name else host, port, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]


async def operator_main(cfg: dict[str, Any]) -> None:
    from netval.infra.telemetry import make_tracer_provider
    from netval.model.keys import FabricHealth, LabelKey
    from netval.model.spec import NetworkValidationSpec
    from netval.operator.settings import operator_settings_from_env
    from netval.operator.term_runtime import OperatorRuntime

    problems = Problems()
    logging.getLogger("netval").addHandler(problems)
    n = cfg["nodes"]
    workdir = Path(cfg["workdir"])
    env = {
        "NETVAL_MQTT_URL": cfg["url"],
        **({"NETVAL_MQTT_CA_FILE": cfg["ca_file"]} if cfg.get("ca_file") else {}),
    }
    if cfg.get("identity"):  # per-node identity: the operator mints its own certificate
        env["NETVAL_IDENTITY_CA_FILE"] = cfg["identity"]["ca"]
        env["NETVAL_IDENTITY_CA_KEY_FILE"] = cfg["identity"]["key"]
    else:
        (workdir / "operator-password").write_text(cfg["password"] + "\n")
        env["NETVAL_MQTT_USERNAME"] = "netval-operator"
        env["NETVAL_MQTT_PASSWORD_FILE"] = str(workdir / "operator-password")
    if cfg.get("tls_host"):
        resolve_to_loopback(cfg["tls_host"])
    kube = CountingKube(n)
    runtime = OperatorRuntime(
        operator_settings_from_env(env),
        kube,  # type: ignore[arg-type]
        make_tracer_provider({}, default_service="netval-operator"),
    )
    counts = {"live": 0, "retained": 0}
    newest = [0.0]  # the publish time of the newest live report handed to the runtime
    on_report, on_beat = runtime.ingest.on_report, runtime.ingest.on_beat
    firsts: dict[str, float] | None = None  # since `mark`: node -> first live report/beat

    def counted(report: Any, retained: bool) -> None:
        counts["retained" if retained else "live"] += 1
        if not retained:
            newest[0] = max(newest[0], report.started_at.timestamp())
            if firsts is not None:
                firsts.setdefault(report.node, time.time())
        on_report(report, retained)

    def counted_beat(message: Any, retained: bool) -> object:
        outcome = on_beat(message, retained)
        if not retained and firsts is not None and str(outcome) == "matched":
            firsts.setdefault(message.node, time.time())
        return outcome

    runtime.ingest.on_report = counted
    runtime.ingest.on_beat = counted_beat
    # The Nodes as the watch shows them once the operator has labelled them (any start but
    # the very first): healthy, so the steady window sees transitions only, not the first
    # labelling of N Nodes (500 writes per status window) nor their first condition.
    labelled = {**POOL, LabelKey.FABRIC.value: FabricHealth.HEALTHY.value}
    # ... and carrying the NetworkFabricReady condition the operator wrote then
    ready = [{"type": "NetworkFabricReady", "status": "True", "reason": "ChecksPassing",
              "message": f"{VALIDATION}: fabric checks passing"}]  # fmt: skip
    for i in range(n):
        runtime.store.on_node(node_name(i), labelled, [], ready)
    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": POOL, "interval": f"{cfg['interval']:g}s"}
    )
    ref = {"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
           "metadata": {"name": VALIDATION, "uid": "00000000-0000-0000-0000-000000000001"}}  # fmt: skip
    runtime.store.upsert_validation(VALIDATION, generation=1, spec=spec, body=ref, status=None)
    runtime.store.agents_applied(VALIDATION)
    emit({"ready": True, **proc_usage()})

    started = time.monotonic()
    runtime.start()
    await asyncio.wait_for(runtime.ingest.synced.wait(), cfg["replay_timeout"])
    emit({"synced": time.monotonic() - started, "retained": counts["retained"]})
    deadline = time.monotonic() + cfg["replay_timeout"]
    while not any(reporting >= n for _, reporting, _ in kube.patches):
        if time.monotonic() > deadline:
            emit({"error": f"not every node counted: {kube.patches[-1:]}, {counts}"})
            return
        await asyncio.sleep(0.05)
    emit({"replayed": time.monotonic() - started, "retained": counts["retained"]})

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    terminated = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, terminated.set)
    stop = asyncio.ensure_future(terminated.wait())
    while True:
        read = asyncio.ensure_future(reader.readline())
        await asyncio.wait([read, stop], return_when=asyncio.FIRST_COMPLETED)
        if not read.done():
            read.cancel()
            break
        line = read.result()
        if not line:
            break
        msg = json.loads(line)
        if msg["cmd"] == "mark":
            firsts = {}
            emit({"marked": time.time()})
        elif msg["cmd"] == "ingest":
            emit({"ingest": {"connected": runtime.ingest.stats.connected}})
        elif msg["cmd"] == "back":
            emit({"back": {"count": len(firsts or {}),
                           "last": max((firsts or {}).values(), default=None)}})  # fmt: skip
        elif msg["cmd"] == "stats":
            since = msg.get("since", 0.0)
            stats = runtime.ingest.stats
            emit({"stats": {
                **counts, **proc_usage(),
                "lag": time.time() - newest[0],  # how far behind the publishers it reads
                "writes": [w for w in kube.writes if w[0] >= since],
                "patches": [p for p in kube.patches if p[0] >= since],
                "dropped": {str(k): v for k, v in stats.dropped.items()},
                "reconnects": stats.reconnects,
                "beats": sum(stats.beats.values()),
                "beat_outcomes": dict(stats.beats),
                "problems": problems.lines,
                "node_writes": [w for w in kube.node_writes if w[0] >= since],
                "ingest_connected": stats.connected,
            }})  # fmt: skip
        elif msg["cmd"] == "stop":
            break
    await runtime.stop()
