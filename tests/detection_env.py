"""The detection campaign's processes on its fabric (tests/detection_fabric.py): a Mosquitto
broker serving MQTT over TLS only (a CA of the run, the broker's certificate for its
management address, verified by every client), the test Kubernetes API (tests/kube.py), the
real `netval operator` process (tests/operator_processes.py) and one real `netval agent`
per node (tests/detection_agent.py: the entry point with the recorded DCB state), running
the config the operator rendered into their ConfigMap. A tap subscribed to the reports keeps
what each agent published (`ReportTap`), for the scores and for diagnosis.

One shared MQTT login for operator and agents (the per-node identity needs the enrollment
server: not the subject here).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiomqtt

import mosquitto
from detection_fabric import LEAF_KEY, Fabric
from kube import KubeCluster, wait_for
from netval.model.ids import CheckGroup, Status
from netval.model.keys import LabelKey
from netval.model.results import Report
from netval.operator.agents.manifests import AGENT_CONFIG_KEY
from operator_env import NS, NV, add_node
from operator_processes import OperatorProc
from tls_certs import issue, make_ca

VALIDATION: Final = "detection"
POOL_KEY: Final = "netval.test/pool"
AGENT: Final = str(Path(__file__).resolve().parent / "detection_agent.py")


def validation_spec(
    interval: int, *, max_latency_ms: float, max_loss_percent: float, fabric_cidr: str
) -> dict[str, Any]:
    """A RoCE pool as examples/roce-training-pool.yaml, on the namespace fabric
    (`fabric_cidr`: its addresses, which the test Nodes do not list as theirs)."""
    return {
        "nodeSelector": {POOL_KEY: VALIDATION},
        "interval": f"{interval}s",
        # every cycle in full: the tap sees what each cycle measured (the operator's verdict
        # is the same with beats: a beat says "the same material content as the last report")
        "report": {"fullEvery": 1},
        "checks": {
            "mtu": {"interfaceMTU": 9000, "roceMTU": 4096},
            "rdma": {"linkLayer": "Ethernet", "minRateGbps": 400, "requireRoCEv2": True},
            "pfc": {"priorities": [3], "trust": "dscp"},
            "ecn": {"priorities": [3]},
            "peers": {
                "enabled": True,
                "interface": "f0",
                "fabricCidrs": [fabric_cidr],
                "topologyKey": LEAF_KEY,
                "samplesPerDomain": 2,
                "maxLatencyMs": max_latency_ms,
                "maxLossPercent": max_loss_percent,
            },
        },
        "gating": {
            "nodeLabel": True,
            "taint": True,
            "maxUnhealthyPercent": 10,
            "recoveryReports": 3,
        },
    }


@dataclass(frozen=True, slots=True)
class Seen:
    """One published report, reduced: its bad results and every peer.* result."""

    at: float  # monotonic, when the tap received it
    node: str
    started: float  # the report's startedAt (Unix seconds)
    bad: tuple[tuple[str, str, str, str], ...]  # (check, subject, status, message)
    peers: tuple[tuple[str, str, str, dict[str, Any]], ...]  # (check, subject, status, observed)


class ReportTap:
    """Every report of the validation as the broker delivered it (a thread of its own)."""

    def __init__(self, host: str, port: int, username: str, password: str, ca: Path) -> None:
        self.login = (host, port, username, password)
        self.ca = ca
        self.seen: list[Seen] = []
        self.ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> ReportTap:
        self._thread.start()
        if not self.ready.wait(20):
            raise TimeoutError("the report tap did not subscribe")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        host, port, username, password = self.login
        context = ssl.create_default_context(cafile=str(self.ca))
        async with aiomqtt.Client(host, port, username=username, password=password,
                                  tls_context=context, identifier="detection-tap") as client:  # fmt: skip
            await client.subscribe(f"netval/v1/{VALIDATION}/+/report", qos=1)
            self.ready.set()
            reader = asyncio.create_task(self._read(client))
            await self._stop.wait()
            reader.cancel()

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            if message.retain or not isinstance(message.payload, bytes) or not message.payload:
                continue
            with contextlib.suppress(ValueError):
                self.seen.append(reduce(Report.model_validate_json(message.payload)))

    def dump(self, path: Path) -> None:
        """Every report kept, one JSON line each (for diagnosis)."""
        with path.open("w") as out:
            for s in list(self.seen):
                out.write(json.dumps(dataclasses.asdict(s), default=str) + "\n")

    def since(self, at: float) -> list[Seen]:
        return [s for s in list(self.seen) if s.at >= at]


def reduce(report: Report) -> Seen:
    bad = tuple(
        (r.check.value, r.subject, r.status.value, r.message)
        for r in report.results
        if r.status in (Status.WARN, Status.FAIL, Status.ERROR)
    )
    peers = tuple(
        (r.check.value, r.subject, r.status.value, dict(r.observed))
        for r in report.results
        if r.check.group is CheckGroup.PEER
    )
    return Seen(time.monotonic(), report.node, report.started_at.timestamp(), bad, peers)


@dataclass
class Env:
    fabric: Fabric
    kube: KubeCluster
    operator: OperatorProc
    broker: mosquitto.MosquittoBroker
    ca: Path
    tap: ReportTap
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def log(self, node: str) -> Path:
        return self.fabric.workdir / f"agent-{node}.log"

    def start_agent(self, node: str) -> None:
        layout = self.fabric.layout
        work = self.fabric.workdir
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "NETVAL_CONFIG": str(work / "agent.yaml"),
            "NETVAL_NODE_NAME": node,
            "NETVAL_MQTT_URL": f"mqtts://{layout.mgmt_ip()}:{self.broker.port}",
            "NETVAL_MQTT_USERNAME": self.broker.username,
            "NETVAL_MQTT_PASSWORD_FILE": str(work / "password"),
            "NETVAL_MQTT_CA_FILE": str(self.ca),
            "NETVAL_METRICS_ADDR": "off",
            "NVT_RECORDED_DCB": str(self.fabric.dcb_dir(node)),
        }
        with self.log(node).open("ab") as out:
            self.agents[node] = subprocess.Popen(
                self.fabric.agent_argv(node, [sys.executable, AGENT]), env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def signal_agent(self, node: str, sig: signal.Signals) -> None:
        proc = self.agents[node]
        if proc.poll() is None:
            proc.send_signal(sig)
            if sig is signal.SIGKILL:
                proc.wait(10)

    def stop_agents(self) -> None:
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in self.agents.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def dead_agents(self) -> dict[str, int]:
        return {n: rc for n, p in self.agents.items() if (rc := p.poll()) is not None}

    def diagnostics(self, chars: int = 1500) -> str:
        parts = [
            f"-- {n} --\n{self.log(n).read_text(errors='replace')[-chars:]}" for n in self.agents
        ]
        return "\n".join([*parts, f"-- operator --\n{self.operator.log()[-4 * chars :]}"])


def _broker(fabric: Fabric) -> tuple[mosquitto.MosquittoBroker, Path]:
    work = fabric.workdir / "broker"
    work.mkdir()
    host = fabric.layout.mgmt_ip()
    ca = make_ca(work)
    leaf = issue(ca, work, "broker", ip_addresses=(host,))
    broker = mosquitto.MosquittoBroker(
        work, tls=(ca.cert_file, leaf.cert_file, leaf.key_file), extra_config=mosquitto.CHART_LIMITS
    )
    text = broker.config.read_text()
    broker.config.write_text(text.replace(f"listener {broker.port} {broker.host}",
                                          f"listener {broker.port} {host}"))  # fmt: skip
    broker.host = host
    return broker, ca.cert_file


@contextlib.contextmanager
def running(
    fabric: Fabric, *, interval: int, max_latency_ms: float, max_loss_percent: float
) -> Any:
    """Broker, API, operator, tap and agents up, every node reporting; torn down on exit."""
    layout, work = fabric.layout, fabric.workdir
    with contextlib.ExitStack() as stack:
        broker, ca = _broker(fabric)
        broker.start()
        stack.callback(broker.stop)
        kube = KubeCluster(work / "kube").start()
        stack.callback(kube.stop)
        # kmock matches each request against its whole log: an hour of status writes would
        # turn every request quadratic and stall the API the operator writes to
        kube.api.keep_requests = 500
        kube.ensure_namespace(NS)
        for node in layout.nodes:
            add_node(kube, node, {POOL_KEY: VALIDATION, LEAF_KEY: layout.leaf_of(node)})
        spec = validation_spec(interval, max_latency_ms=max_latency_ms,
                               max_loss_percent=max_loss_percent,
                               fabric_cidr=f"10.{layout.net}.0.0/16")  # fmt: skip
        kube.create({"apiVersion": NV, "kind": "NetworkValidation",
                     "metadata": {"name": VALIDATION}, "spec": spec})  # fmt: skip
        mqtt_env = {
            "NETVAL_MQTT_URL": f"mqtts://{broker.host}:{broker.port}",
            "NETVAL_MQTT_CA_FILE": str(ca),
        }
        operator = OperatorProc(kube, broker, work / "operator", "op-detection",
                                standalone=True, env=mqtt_env)  # fmt: skip
        operator.start()
        stack.callback(operator.terminate)
        tap = stack.enter_context(
            ReportTap(broker.host, broker.port, broker.username, broker.password, ca)
        )
        env = Env(fabric, kube, operator, broker, ca, tap)
        stack.callback(env.stop_agents)

        def rendered() -> str | None:
            for cm in kube.list("v1", "configmaps", NS):
                if cm["metadata"].get("labels", {}).get(LabelKey.VALIDATION) == VALIDATION:
                    return str(cm["data"][AGENT_CONFIG_KEY])
            return None

        (work / "agent.yaml").write_text(wait_for(rendered, 60, what="the agent ConfigMap"))
        (work / "password").write_text(broker.password + "\n")
        for node in layout.nodes:
            env.start_agent(node)

        def reporting() -> bool:
            status = dict(kube.stored(NV, "networkvalidations", VALIDATION) or {}).get("status")
            return bool(status) and status["nodes"]["reporting"] == len(layout.nodes)

        try:
            wait_for(reporting, 90, interval=0.5, what="every agent reporting")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{env.diagnostics()}") from None
        yield env
