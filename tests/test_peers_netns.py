"""East-west on a real multi-host network: 6 namespace nodes in 2 racks.

    rack A (namespace, bridge br0)  ==== up0 (inter-rack veth) ====  rack B (bridge br0)
       |        |        |                                              |       |       |
      a1       a2       a3        fabric f0, 10.88.0.0/24, MTU 9000     b1      b2      b3
       \\________\\________\\____  management m0, 192.168.88.0/24  ______/_______/_______/
                                    (bridge brm in namespace "mgmt",
                                     192.168.88.1: the MQTT broker)

Every node runs a worker (`ip netns exec NODE python -c WORKER`) that holds a real
`PeerResponder` on its fabric address and runs `probe_peer` / `measure_throughput` on
command, so each scenario is a few round trips, not process starts. Two tests run real
`netval agent` processes against a real Mosquitto broker on the management network: two
agents (announce, an assignment with their peer set, probes and a throughput slot end to
end), and all six agents
with the operator (Kopf, in-process, against the test Kubernetes API): it assigns the racks
from Node labels, renders the agent config they run, and folds their reports into
status.eastWest, which flags the shaped rack pair ~4:1 and names a node whose link goes down
the suspect.

Scenarios (each restores the fabric afterwards):
(a) the inter-rack link shaped by htb to a quarter of the node links: the throughput slots
    of `model.peer_selection` run for two rotations, `east_west` reports rack-a x rack-b
    at a capacity ratio of ~4:1 (a narrow link: lone flows show it);
(b) the inter-rack link at MTU 1500 on a 9000 fabric (a bridge drops the jumbo frames
    silently, no ICMP): peer.path_mtu fails for cross-rack pairs only, pathMTU found 1500;
(c) 10% random drop (nft numgen) on one node's fabric link: peer.loss fails exactly for that
    node's pairs, the suspect pass names it;
(d) one node's fabric link down: its peers cannot reach it, the suspect pass names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import mosquitto
from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from netns import Namespace, namespace, netval_script
from netval.model.ids import CheckId, Status
from netval.model.keys import LabelKey
from netval.model.peer_selection import rotation_length, throughput_schedule
from netval.model.results import CheckResult, Report
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents.manifests import AGENT_CONFIG_KEY
from netval.operator.ingest.peer_sets import epoch_of, peer_sets
from netval.operator.state.east_west_matrix import EastWest, east_west
from operator_env import GPU, NS, add_node, condition, settings_for, status_of

pytestmark = [pytest.mark.netns, pytest.mark.timeout(90)]

RACKS = {"rack-a": ["a1", "a2", "a3"], "rack-b": ["b1", "b2", "b3"]}
NODES = [n for members in RACKS.values() for n in members]
DOMAIN = {n: rack for rack, members in RACKS.items() for n in members}
FABRIC = {n: f"10.88.0.{10 * (1 + i // 3) + 1 + i % 3}" for i, n in enumerate(NODES)}
MGMT_ADDR = "192.168.88.1"
MGMT = {n: f"192.168.88.{10 * (1 + i // 3) + 1 + i % 3}" for i, n in enumerate(NODES)}
FABRIC_MTU = 9000
WORKER_PORT = 7472  # the agents of the end-to-end test use 7471 on the same addresses
AGENT_PORT = 7471

NODE_RATE_MBIT = 400  # every node's fabric link ("NIC speed")
UPLINK_RATE_MBIT = 100  # the shaped inter-rack link: a quarter: a 4:1 capacity ratio

# Generous latency (2 CPUs run 6 workers); loss at 5% so only injected loss can fail it.
CHECKS = {"enabled": True, "maxLatencyMs": 50.0, "maxLossPercent": 5.0, "minThroughputRatio": 0.5}
ECHOES = {"count": 100, "spacing": 0.002, "reply_timeout": 0.5}


# -- the fabric ---------------------------------------------------------------------------------


def ip(ns: Namespace, *args: str) -> str:
    done = subprocess.run(
        ["ip", "-n", ns.name, *args], capture_output=True, text=True, timeout=10, check=False
    )
    assert done.returncode == 0, f"ip -n {ns.name} {' '.join(args)}: {done.stderr}"
    return done.stdout


def run_in(ns: Namespace, *argv: str, stdin: str | None = None) -> str:
    done = ns.run(list(argv), timeout=20, input=stdin)
    assert done.returncode == 0, f"{' '.join(argv)} in {ns.name}: {done.stderr}"
    return done.stdout


def stop_process(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def mgmt_broker(workdir: Path, unix_socket: Path | None = None) -> mosquitto.MosquittoBroker:
    """A broker configured to listen on the management network (and on `unix_socket`)."""
    (workdir / "broker").mkdir()
    broker = mosquitto.MosquittoBroker(workdir / "broker")
    listeners = f"listener {broker.port} {MGMT_ADDR}"
    if unix_socket is not None:
        listeners += f"\nlistener 0 {unix_socket}"
    text = broker.config.read_text()
    broker.config.write_text(text.replace(f"listener {broker.port} 127.0.0.1", listeners))
    return broker


def start_broker(mgmt: Namespace, broker: mosquitto.MosquittoBroker) -> subprocess.Popen[bytes]:
    with broker.log_file.open("ab") as log:
        return subprocess.Popen(
            mgmt.argv([str(mosquitto.MOSQUITTO), "-c", str(broker.config)]),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def start_agent(
    ns: Namespace, node: str, broker: mosquitto.MosquittoBroker, workdir: Path, log: Path
) -> subprocess.Popen[bytes]:
    """`netval agent` as `node` in its namespace, with `workdir`/agent.yaml as its config and
    `workdir`/password for the broker on the management network."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NETVAL_CONFIG": str(workdir / "agent.yaml"),
        "NETVAL_NODE_NAME": node,
        "NETVAL_MQTT_URL": f"mqtt://{MGMT_ADDR}:{broker.port}",
        "NETVAL_MQTT_USERNAME": broker.username,
        "NETVAL_MQTT_PASSWORD_FILE": str(workdir / "password"),
        "NETVAL_METRICS_ADDR": "off",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            ns.argv([netval_script(), "agent"]),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


# Runs in a node namespace: a responder on the fabric address, then one JSON command per
# stdin line -> one JSON line of results.
WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from netval.agent.peers.responder import PeerResponder
    from netval.agent.peers.echo import probe_peer
    from netval.agent.peers.target import PeerTarget, ProbeSettings
    from netval.agent.peers.throughput import measure_throughput
    from netval.model.spec import PeerChecks

    async def main():
        address, port = sys.argv[1], int(sys.argv[2])
        responder = PeerResponder(address, port)
        await responder.start()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        print(json.dumps({"ready": True}), flush=True)
        while line := await reader.readline():
            cmd = json.loads(line)
            checks = PeerChecks.model_validate(cmd["checks"])
            settings = ProbeSettings(**cmd["settings"])
            targets = [PeerTarget(**t) for t in cmd["targets"]]
            if cmd["op"] == "probe":
                per_peer = await asyncio.gather(*(
                    probe_peer(t, checks=checks, mtu=cmd["mtu"], source=address,
                               settings=settings)
                    for t in targets
                ))
                results = [r for rs in per_peer for r in rs]
            else:
                results = [await measure_throughput(t, checks=checks, source=address,
                                                    settings=settings) for t in targets]
            print(json.dumps({"results": [r.model_dump(mode="json") for r in results]}),
                  flush=True)
        await responder.close()

    asyncio.run(main())
    """
)


class Worker:
    def __init__(self, node: str, ns: Namespace) -> None:
        self.node = node
        self.ns = ns
        self.proc = subprocess.Popen(
            ns.argv([sys.executable, "-c", WORKER, FABRIC[node], str(WORKER_PORT)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def send(self, op: str, targets: list[str], **settings: Any) -> None:
        assert self.proc.stdin is not None
        command = {
            "op": op,
            "checks": CHECKS,
            "mtu": FABRIC_MTU,
            "settings": settings,
            "targets": [
                {"node": t, "address": FABRIC[t], "port": WORKER_PORT, "domain": DOMAIN[t]}
                for t in targets
            ],
        }
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 20.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            stop_process(self.proc)
            raise AssertionError(f"worker {self.node} gave no answer: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        doc: dict[str, Any] = json.loads(line)
        return doc

    def results(self, timeout: float = 20.0) -> list[CheckResult]:
        return [CheckResult.model_validate(r) for r in self.read(timeout)["results"]]


@dataclass
class Fabric:
    nodes: dict[str, Namespace]
    racks: dict[str, Namespace]
    mgmt: Namespace
    workers: dict[str, Worker]

    def mesh(self, **settings: Any) -> dict[str, list[CheckResult]]:
        """Every node probes every other node (all workers at once)."""
        for node, worker in self.workers.items():
            worker.send("probe", [p for p in NODES if p != node], **{**ECHOES, **settings})
        return {node: worker.results() for node, worker in self.workers.items()}


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    with contextlib.ExitStack() as stack:
        nodes = {n: stack.enter_context(namespace()) for n in NODES}
        racks = {r: stack.enter_context(namespace()) for r in RACKS}
        mgmt = stack.enter_context(namespace())
        for rack_ns in racks.values():
            ip(rack_ns, "link", "add", "br0", "mtu", str(FABRIC_MTU), "type", "bridge")
            ip(rack_ns, "link", "set", "br0", "up")
        ip(mgmt, "link", "add", "brm", "type", "bridge")
        ip(mgmt, "addr", "add", f"{MGMT_ADDR}/24", "dev", "brm")
        ip(mgmt, "link", "set", "brm", "up")
        ip(mgmt, "link", "set", "lo", "up")
        rack_a, rack_b = racks["rack-a"], racks["rack-b"]
        mtu = str(FABRIC_MTU)
        ip(
            rack_a,
            *f"link add up0 mtu {mtu} type veth peer name up0 mtu {mtu}".split(),
            "netns",
            rack_b.name,
        )
        for rack_ns in racks.values():
            ip(rack_ns, "link", "set", "up0", "master", "br0", "up")
        for node, ns in nodes.items():
            rack_ns = racks[DOMAIN[node]]
            ip(
                ns,
                *f"link add f0 mtu {mtu} type veth peer name {node} mtu {mtu}".split(),
                "netns",
                rack_ns.name,
            )
            ip(rack_ns, "link", "set", node, "master", "br0", "up")
            ip(
                ns,
                "link",
                "add",
                "m0",
                "type",
                "veth",
                "peer",
                "name",
                f"m-{node}",
                "netns",
                mgmt.name,
            )
            ip(mgmt, "link", "set", f"m-{node}", "master", "brm", "up")
            ip(ns, "addr", "add", f"{FABRIC[node]}/24", "dev", "f0")
            ip(ns, "addr", "add", f"{MGMT[node]}/24", "dev", "m0")
            for ifname in ("lo", "f0", "m0"):
                ip(ns, "link", "set", ifname, "up")
        for ns in nodes.values():
            ns.wait_operstate("f0", "up")
        workers = {n: Worker(n, ns) for n, ns in nodes.items()}
        for w in workers.values():
            stack.callback(stop_process, w.proc)
        for w in workers.values():
            assert w.read(15) == {"ready": True}
        yield Fabric(nodes, racks, mgmt, workers)


def by(results: dict[str, list[CheckResult]], check: CheckId) -> dict[tuple[str, str], CheckResult]:
    return {(n, r.subject): r for n, rs in results.items() for r in rs if r.check is check}


def summary(results: dict[str, list[CheckResult]]) -> EastWest:
    return east_west(results, dict(DOMAIN), min_throughput_ratio=CHECKS["minThroughputRatio"])


# -- (a) a narrow inter-rack link: capacity ratio -----------------------------------------------


def shape(ns: Namespace, ifname: str, mbit: int) -> None:
    rate = f"{mbit}mbit"
    run_in(ns, "tc", "qdisc", "add", "dev", ifname, "root", "handle", "1:", "htb", "default", "10")
    run_in(
        ns,
        *f"tc class add dev {ifname} parent 1: classid 1:10 htb rate {rate} ceil {rate} "
        "burst 64k cburst 64k quantum 10000".split(),
    )


def unshape(ns: Namespace, ifname: str) -> None:
    ns.run(["tc", "qdisc", "del", "dev", ifname, "root"], timeout=10)


def test_a_narrow_inter_rack_link_is_reported_at_a_capacity_ratio_of_about_4_to_1(
    fabric: Fabric,
) -> None:
    shaped: list[tuple[Namespace, str]] = [(ns, "f0") for ns in fabric.nodes.values()]
    shaped += [(fabric.racks["rack-a"], "up0"), (fabric.racks["rack-b"], "up0")]
    try:
        for ns, ifname in shaped[:-2]:
            shape(ns, ifname, NODE_RATE_MBIT)
        for ns, ifname in shaped[-2:]:
            shape(ns, ifname, UPLINK_RATE_MBIT)
        # Two rotations of the real throughput schedule: per slot the samples run at once
        # (at most one per domain, so they never share the inter-rack link).
        m = rotation_length(len(RACKS))
        results: dict[str, list[CheckResult]] = {n: [] for n in NODES}
        concurrent: list[int] = []
        for slot in range(100 * m, 102 * m):
            pairs = throughput_schedule(dict(DOMAIN), slot)
            assert len({p.target for p in pairs}) == len(pairs)
            concurrent.append(len(pairs))
            for p in pairs:
                fabric.workers[p.prober].send("throughput", [p.target], throughput_seconds=0.6)
            for p in pairs:
                results[p.prober] += fabric.workers[p.prober].results()
    finally:
        for ns, ifname in shaped:
            unshape(ns, ifname)
    samples = [r for rs in results.values() for r in rs]
    assert all(r.status is Status.PASS for r in samples), [r.message for r in samples]
    ew = summary(results)
    cross = ew.cell("rack-a", "rack-b")
    intra = [ew.cell(r, r) for r in RACKS]
    print(
        f"\nthroughput samples per slot {concurrent}; intra Mbit/s "
        f"{[c.throughput_mbps for c in intra if c]}, cross {cross and cross.throughput_mbps}, "
        f"ratio {cross and cross.throughput_ratio}, capacity ratio {cross and cross.capacity_ratio}"
    )
    assert cross is not None and cross.throughput_samples == 2  # once per rotation
    assert all(c is not None and c.throughput_samples >= 2 for c in intra)
    assert cross.capacity_ratio is not None
    assert 4 * 0.75 <= cross.capacity_ratio <= 4 * 1.25, cross
    assert cross.flagged and [(f.a, f.b) for f in ew.flagged] == [("rack-a", "rack-b")]
    for c in intra:
        assert c is not None
        assert c.throughput_mbps is not None
        assert c.throughput_mbps == pytest.approx(NODE_RATE_MBIT, rel=0.25)


# -- (b) path MTU -------------------------------------------------------------------------------


def test_a_1500_byte_inter_rack_hop_fails_path_mtu_for_cross_rack_pairs_only(
    fabric: Fabric,
) -> None:
    racks = list(fabric.racks.values())
    try:
        for rack_ns in racks:
            ip(rack_ns, "link", "set", "up0", "mtu", "1500")
        results = fabric.mesh(count=20)
    finally:
        for rack_ns in racks:
            ip(rack_ns, "link", "set", "up0", "mtu", str(FABRIC_MTU))
    mtus = by(results, CheckId.PEER_PATH_MTU)
    assert len(mtus) == 30
    for (node, peer), r in sorted(mtus.items()):
        if DOMAIN[node] == DOMAIN[peer]:
            assert r.status is Status.PASS, r.message
            assert r.observed["pathMTU"] == FABRIC_MTU
        else:
            assert r.status is Status.FAIL, r.message
            assert r.observed["pathMTU"] == 1500, r.message
            assert r.observed["method"] == "blackhole"
    # small packets cross fine: latency and loss pass everywhere
    for check in (CheckId.PEER_LATENCY, CheckId.PEER_LOSS):
        assert all(r.status is Status.PASS for r in by(results, check).values())
    ew = summary(results)
    cross = ew.cell("rack-a", "rack-b")
    assert cross is not None and (cross.path_mtu, cross.failing) == (1500, 18)
    assert all(ew.cell(r, r).path_mtu == FABRIC_MTU for r in RACKS)  # type: ignore[union-attr]
    assert ew.suspects == [] and ew.unexplained_failing_pairs == 0
    # the rack pair is the suspect link: every cross pair fails, every pair inside passes
    (link,) = ew.link_suspects
    assert (link.kind, link.a, link.b, link.failing_paths, link.paths) == (
        "domainPair", "rack-a", "rack-b", 9, 9,
    )  # fmt: skip
    print(f"\n(b) {next(iter(r.message for r in mtus.values() if r.status is Status.FAIL))}")


# -- (c) random loss on one node ----------------------------------------------------------------

LOSSY = "b2"
LOSS_RULES = """
table inet nvt_loss {
  chain inbound {
    type filter hook input priority filter; policy accept;
    iifname "f0" numgen random mod 100 < 10 counter drop
  }
  chain outbound {
    type filter hook output priority filter; policy accept;
    oifname "f0" numgen random mod 100 < 10 counter drop
  }
}
"""


def test_random_loss_on_one_node_fails_its_pairs_and_names_it_the_suspect(
    fabric: Fabric,
) -> None:
    ns = fabric.nodes[LOSSY]
    run_in(ns, "nft", "-f", "-", stdin=LOSS_RULES)
    try:
        results = fabric.mesh(count=200, spacing=0.001)
        counters = run_in(ns, "nft", "list", "table", "inet", "nvt_loss")
    finally:
        ns.run(["nft", "delete", "table", "inet", "nvt_loss"], timeout=10)
    dropped = [int(n) for n in re.findall(r"counter packets (\d+)", counters)]
    assert len(dropped) == 2 and min(dropped) > 0, counters
    losses = by(results, CheckId.PEER_LOSS)
    with_lossy = {k: r.observed["lossPercent"] for k, r in losses.items() if LOSSY in k}
    print(f"\n(c) loss with {LOSSY}: {sorted(with_lossy.values())}; nft dropped {dropped}")
    for (node, peer), r in losses.items():
        if LOSSY in (node, peer):
            assert r.status is Status.FAIL, r.message
            assert 8.0 <= r.observed["lossPercent"] <= 35.0, r.message  # ~19% round trip # type: ignore[operator]
        else:
            assert r.status is Status.PASS, r.message
    ew = summary(results)
    assert [(s.node, s.failing_peers, s.peers) for s in ew.suspects] == [(LOSSY, 5, 5)]
    assert "peer.loss" in ew.suspects[0].checks
    assert ew.unexplained_failing_pairs == 0


# -- (d) a node's link down ---------------------------------------------------------------------

DOWN = "a3"


def test_a_node_with_its_link_down_is_unreachable_and_the_suspect(fabric: Fabric) -> None:
    ns = fabric.nodes[DOWN]
    ns.set_down("f0")
    try:
        results = fabric.mesh(count=20, reply_timeout=0.3)
    finally:
        ns.set_up("f0")
        ns.wait_operstate("f0", "up")
    lat = by(results, CheckId.PEER_LATENCY)
    for (node, peer), r in lat.items():
        if DOWN in (node, peer):
            assert r.status is Status.FAIL, r.message
        else:
            assert r.status is Status.PASS, r.message
    print(f"\n(d) {lat[('b1', DOWN)].message} | {lat[(DOWN, 'b1')].message}")
    assert lat[("b1", DOWN)].message.startswith("unreachable: none of 20 echoes")
    ew = summary(results)
    assert [s.node for s in ew.suspects] == [DOWN]
    assert ew.unexplained_failing_pairs == 0


# -- end to end: real agents and a real broker --------------------------------------------------

# Runs in the mgmt namespace: publishes retained messages, then prints every message of the
# given topics as a JSON line (first {"ready": true}); retries the connect while the broker
# starts.
MQTT_TOOL = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import aiomqtt
    host, port, user, password, retained, *topics = sys.argv[1:]

    def emit(doc):
        sys.stdout.write(json.dumps(doc) + "\\n")
        sys.stdout.flush()

    async def main():
        deadline = time.monotonic() + 10
        while True:
            try:
                async with aiomqtt.Client(host, int(port), username=user, password=password,
                                          protocol=aiomqtt.ProtocolVersion.V5, timeout=5) as c:
                    for topic, payload in json.loads(retained).items():
                        await c.publish(topic, payload, qos=1, retain=True)
                    for topic in topics:
                        await c.subscribe(topic, qos=1)
                    emit({"ready": True})
                    async for m in c.messages:
                        emit({"topic": str(m.topic), "payload": m.payload.decode()})
            except aiomqtt.MqttError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    asyncio.run(main())
    """
)

AGENTS = ("a1", "a2")  # one domain: a throughput sample in every slot


def test_two_agents_announce_get_their_domain_probe_each_other_and_sample_throughput(
    fabric: Fabric, tmp_path: Path
) -> None:
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    broker = mgmt_broker(tmp_path)
    validation = "ew"
    config = {
        "validation": validation,
        "generation": 1,
        "spec": {
            "interval": "5s",
            "checks": {
                "link": {"interfaces": ["f0"]},
                "mtu": {"interfaces": ["f0"], "interfaceMTU": FABRIC_MTU},
                "peers": {**CHECKS, "interface": "f0", "port": AGENT_PORT},
            },
        },
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "password").write_text(broker.password + "\n")
    logs = {n: tmp_path / f"agent-{n}.log" for n in AGENTS}

    def diagnostics() -> str:
        parts = [f"-- {n} --\n{p.read_text(errors='replace')[-3000:]}" for n, p in logs.items()]
        return "\n".join(parts) + f"\n-- broker --\n{broker.log_text()}"

    with contextlib.ExitStack() as stack:
        stack.callback(stop_process, start_broker(fabric.mgmt, broker))
        # what the operator publishes: the domain and the epoch's peer set (peer_sets)
        spec = NetworkValidationSpec.model_validate(config["spec"])
        epoch = epoch_of(spec, time.time())
        sets = peer_sets(
            AGENTS,
            DOMAIN,
            {n: (FABRIC[n], AGENT_PORT) for n in AGENTS},
            samples=spec.checks.peers.samples_per_domain,
            epoch=epoch,
        )
        assignments = {
            f"netval/v1/{validation}/{n}/assignment": json.dumps(
                {"domain": DOMAIN[n], **sets[n].payload(epoch)}
            )
            for n in AGENTS
        }
        tool = subprocess.Popen(
            fabric.mgmt.argv(
                [
                    sys.executable,
                    "-c",
                    MQTT_TOOL,
                    MGMT_ADDR,
                    str(broker.port),
                    broker.username,
                    broker.password,
                    json.dumps(assignments),
                    f"netval/v1/{validation}/+/endpoint",
                    f"netval/v1/{validation}/+/report",
                ]
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        stack.callback(stop_process, tool)
        messages = Messages(tool, diagnostics)
        messages.wait("the subscriber", lambda m: m.get("ready") is True, 10)

        agents = {}
        for n in AGENTS:
            agents[n] = start_agent(fabric.nodes[n], n, broker, tmp_path, logs[n])
            stack.callback(stop_process, agents[n])

        # 1. each agent announces its fabric address with the domain the operator assigned
        endpoints: dict[str, dict[str, Any]] = {}
        while len(endpoints) < len(AGENTS) or any(e["domain"] is None for e in endpoints.values()):
            m = messages.wait(
                "endpoint announcements", lambda m: "endpoint" in m.get("topic", ""), 15
            )
            endpoints[m["topic"].split("/")[3]] = json.loads(m["payload"])
        # (its one fabric interface is its load-test rail, without an RDMA port)
        assert endpoints == {
            n: {
                "address": FABRIC[n],
                "port": AGENT_PORT,
                "domain": DOMAIN[n],
                "rails": [["f0", FABRIC[n], False]],
            }
            for n in AGENTS
        }
        # ... and listens on the fabric address only, not the management network
        for n in AGENTS:
            listening = run_in(fabric.nodes[n], "ss", "-Hlnut", f"sport = :{AGENT_PORT}")
            local = sorted({line.split()[4] for line in listening.splitlines()})
            assert local == [f"{FABRIC[n]}:{AGENT_PORT}"], listening

        # 2. reports carry passing peer results about each other, with the peer's domain;
        # 3. a throughput sample appears within a few slots
        seen: dict[tuple[str, str], CheckResult] = {}
        want = {
            (n, CheckId(c)) for n in AGENTS for c in ("peer.latency", "peer.loss", "peer.path_mtu")
        }
        want |= {("any", CheckId.PEER_THROUGHPUT)}
        deadline = time.monotonic() + 35
        while want - {k for k in seen}:
            m = messages.wait("peer results in reports", is_report, deadline - time.monotonic())
            report = Report.model_validate_json(m["payload"])
            for r in report.results:
                if r.check.group.value == "peer" and r.status is not Status.SKIP:
                    seen[(report.node, r.check)] = r
                    if r.check is CheckId.PEER_THROUGHPUT:
                        seen[("any", r.check)] = r
        for (node, _check), r in seen.items():
            if node == "any":
                continue
            peer = next(a for a in AGENTS if a != node)
            assert (r.subject, r.status) == (peer, Status.PASS), r.message
            assert r.observed["domain"] == DOMAIN[peer]
            assert r.observed["address"] == FABRIC[peer]
        tput = seen[("any", CheckId.PEER_THROUGHPUT)]
        assert tput.status is Status.PASS and tput.observed["mbps"] > 10  # type: ignore[operator]
        print(
            f"\n(e2e) {seen[('a1', CheckId.PEER_LATENCY)].message}\n"
            f"(e2e) {seen[('a1', CheckId.PEER_PATH_MTU)].message}\n(e2e) {tput.message}"
        )

        # 4. a clean stop clears the retained endpoint: peers stop probing a gone agent
        agents["a2"].send_signal(signal.SIGTERM)
        assert agents["a2"].wait(10) == 0, diagnostics()
        messages.wait(
            "a2's cleared endpoint",
            lambda m: m.get("topic", "").endswith("/a2/endpoint") and m["payload"] == "",
            5,
        )
        for log_path in logs.values():
            assert "Traceback" not in log_path.read_text(errors="replace"), diagnostics()


def is_report(m: dict[str, Any]) -> bool:
    return str(m.get("topic", "")).endswith("/report")


class Messages:
    """The MQTT tool's JSON lines, read by a thread (select() cannot see lines that the
    text wrapper already buffered)."""

    def __init__(self, proc: subprocess.Popen[str], diagnostics: Any) -> None:
        self.proc = proc
        self.diagnostics = diagnostics
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def wait(self, what: str, predicate: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                doc = self.lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                raise AssertionError(
                    f"timed out waiting for {what}\n{self.diagnostics()}"
                ) from None
            if doc is None:
                raise AssertionError(f"subscriber exited waiting for {what}\n{self.diagnostics()}")
            if predicate(doc):
                return doc


# -- path MTU through a router: ICMP fragmentation-needed (IP_RECVERR / IP_MTU) ------------------

# Runs in the sending host: probes the peer twice in one process. The first probe learns
# the path MTU from the router's ICMP (error queue); the second finds it in the kernel's
# route cache (IP_MTU) before any jumbo packet leaves.
ROUTED_PROBE = textwrap.dedent(
    """
    import asyncio, json, sys
    from netval.agent.peers.echo import probe_peer
    from netval.agent.peers.target import PeerTarget, ProbeSettings
    from netval.model.spec import PeerChecks

    async def main():
        target = PeerTarget("far", sys.argv[1], int(sys.argv[2]), "zone-2")
        out = []
        for _ in range(2):
            results = await probe_peer(target, checks=PeerChecks(maxLatencyMs=50), mtu=9000,
                                       settings=ProbeSettings(count=10, spacing=0.001))
            out.append([r.model_dump(mode="json") for r in results])
        print(json.dumps(out))

    asyncio.run(main())
    """
)
RESPONDER = textwrap.dedent(
    """
    import asyncio, sys
    from netval.agent.peers.responder import PeerResponder

    async def main():
        async with PeerResponder(sys.argv[1], int(sys.argv[2])):
            print("ready", flush=True)
            await asyncio.sleep(60)

    asyncio.run(main())
    """
)


def test_a_routed_1500_hop_is_found_from_the_icmp_fragmentation_needed() -> None:
    with namespace() as near, namespace() as router, namespace() as far:
        ip(
            near,
            *[
                "link",
                "add",
                "r0",
                "mtu",
                "9000",
                "type",
                "veth",
                "peer",
                "name",
                "n0",
                "mtu",
                "9000",
            ],
            "netns",
            router.name,
        )
        ip(
            far,
            *[
                "link",
                "add",
                "r0",
                "mtu",
                "1500",
                "type",
                "veth",
                "peer",
                "name",
                "f0",
                "mtu",
                "1500",
            ],
            "netns",
            router.name,
        )
        for ns, addr in ((near, "10.90.1.2/24"), (far, "10.90.2.2/24")):
            ip(ns, "addr", "add", addr, "dev", "r0")
            ip(ns, "link", "set", "r0", "up")
            ip(ns, "link", "set", "lo", "up")
        ip(router, "addr", "add", "10.90.1.1/24", "dev", "n0")
        ip(router, "addr", "add", "10.90.2.1/24", "dev", "f0")
        for ifname in ("n0", "f0"):
            ip(router, "link", "set", ifname, "up")
        run_in(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        ip(near, "route", "add", "default", "via", "10.90.1.1")
        ip(far, "route", "add", "default", "via", "10.90.2.1")
        near.wait_operstate("r0", "up")
        far.wait_operstate("r0", "up")
        responder = subprocess.Popen(
            far.argv([sys.executable, "-c", RESPONDER, "10.90.2.2", str(WORKER_PORT)]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert responder.stdout is not None
            ready, _, _ = select.select([responder.stdout], [], [], 15)
            assert ready and responder.stdout.readline().strip() == "ready"
            out = run_in(near, sys.executable, "-c", ROUTED_PROBE, "10.90.2.2", str(WORKER_PORT))
        finally:
            stop_process(responder)
    first, cached = ([CheckResult.model_validate(r) for r in rs] for rs in json.loads(out))
    for results in (first, cached):
        lat, loss, mtu = results
        assert lat.status is Status.PASS and loss.status is Status.PASS, (lat.message, loss.message)
        assert mtu.status is Status.FAIL, mtu.message
        assert (mtu.observed["pathMTU"], mtu.observed["method"]) == (1500, "kernel"), mtu.message
    assert "ICMP fragmentation-needed from 10.90.1.1" in first[2].message, first[2].message
    assert "the route to it" in cached[2].message, cached[2].message
    print(f"\n(icmp) {first[2].message}\n(icmp) {cached[2].message}")


# -- end to end with the operator: six agents, the broker, status.eastWest ----------------------


class UnixToTcp:
    """127.0.0.1:<port> in this (root) namespace forwarded to a Unix socket: the broker runs
    in the mgmt namespace with a Unix-socket listener next to its TCP one, and Unix sockets,
    being files, cross network namespaces. The operator runs in-process here, against the
    test's Kubernetes API on loopback."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.port = mosquitto.free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UnixToTcp:
        self.thread.start()
        assert self.ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def _run(self) -> None:
        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_unix_connection(str(self.path))
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()


@pytest.mark.timeout(240)
def test_six_agents_and_the_operator_report_a_capacity_ratio_and_name_a_dead_node(
    fabric: Fabric, kube: KubeCluster, tmp_path: Path
) -> None:
    """The whole path: the operator (in-process, Kopf) assigns each node its rack from the
    Node label, renders the agent config; six `netval agent` processes (one per namespace
    node) announce, probe each other on the fabric (node links at 400 Mbit/s, the inter-rack
    link at 100) and report over the broker; the operator folds the reports into
    status.eastWest and flags the rack pair at a ~4:1 capacity ratio. Then one node's fabric link
    goes down and the status names it the suspect."""
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    sock = tmp_path / "mqtt.sock"
    broker = mgmt_broker(tmp_path, unix_socket=sock)
    kube.ensure_namespace(NS)
    for node in NODES:
        add_node(kube, node, {**GPU, "topology.kubernetes.io/zone": DOMAIN[node]})
    name = "fabric-e2e"
    kube.create(
        {
            "apiVersion": "netval.io/v1alpha1",
            "kind": "NetworkValidation",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": GPU,
                "interval": "5s",
                "checks": {
                    "link": {"interfaces": ["f0"]},
                    "mtu": {"interfaces": ["f0"], "interfaceMTU": FABRIC_MTU},
                    # the endpoints are on the fabric, not among the Nodes' addresses
                    "peers": {
                        **CHECKS,
                        "interface": "f0",
                        "port": AGENT_PORT,
                        "fabricCidrs": ["10.88.0.0/24"],
                    },
                },
            },
        }
    )
    logs = {n: tmp_path / f"agent-{n}.log" for n in NODES}

    def diagnostics() -> str:
        parts = [f"-- {n} --\n{p.read_text(errors='replace')[-2000:]}" for n, p in logs.items()]
        return "\n".join(parts) + f"\n-- broker --\n{broker.log_text()[-3000:]}"

    with contextlib.ExitStack() as stack:
        # shaped before the agents start: every throughput sample sees the narrow link
        for ns in fabric.nodes.values():
            stack.callback(unshape, ns, "f0")
            shape(ns, "f0", NODE_RATE_MBIT)
        for ns in fabric.racks.values():
            stack.callback(unshape, ns, "up0")
            shape(ns, "up0", UPLINK_RATE_MBIT)
        stack.callback(stop_process, start_broker(fabric.mgmt, broker))
        wait_for(sock.exists, what="the broker's Unix socket")
        forward = stack.enter_context(UnixToTcp(sock))
        address = type("Broker", (), {"host": "127.0.0.1", "port": forward.port,
                                       "username": broker.username,
                                       "password": broker.password})()  # fmt: skip
        memo = kopf.Memo(settings=settings_for(address), span_exporter=InMemorySpanExporter())
        stack.enter_context(kopf_operator(kube, modules=["netval.operator.handlers"], memo=memo))

        # the agents run the config the operator rendered into their ConfigMap
        def rendered() -> str | None:
            for cm in kube.list("v1", "configmaps", NS):
                if cm["metadata"].get("labels", {}).get(LabelKey.VALIDATION) == name:
                    return str(cm["data"][AGENT_CONFIG_KEY])
            return None

        (tmp_path / "agent.yaml").write_text(wait_for(rendered, what="the agent ConfigMap"))
        (tmp_path / "password").write_text(broker.password + "\n")
        for n in NODES:
            stack.callback(stop_process, start_agent(fabric.nodes[n], n, broker, tmp_path, logs[n]))

        def east_west_status(pred: Any, what: str) -> dict[str, Any]:
            def check() -> dict[str, Any] | None:
                ew = status_of(kube, name).get("eastWest")
                return ew if ew and pred(ew) else None

            try:
                return wait_for(check, timeout=90, interval=0.5, what=what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{status_of(kube, name)}\n{diagnostics()}") from None

        def cells(ew: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
            return {(c["a"], c["b"]): c for c in ew["cells"]}

        # 1. all six report; every rack pair measured, nothing failing
        east_west_status(
            lambda ew: (
                (r := condition(status_of(kube, name), "Ready")) is not None
                and r["status"] == "True"
            ),
            "Ready: all six agents reporting",
        )
        ew = east_west_status(
            lambda ew: (
                len(cells(ew)) == 3 and all(c.get("latencyP50Ms") is not None for c in ew["cells"])
            ),
            "latency in all three rack pairs",
        )
        assert (ew["domains"], ew["nodes"]) == (2, 6)
        assert set(cells(ew)) == {("rack-a", "rack-a"), ("rack-a", "rack-b"),
                                  ("rack-b", "rack-b")}  # fmt: skip
        assert all(c["pathMTU"] == FABRIC_MTU for c in ew["cells"] if c.get("pathMTU")), ew
        assert not ew.get("suspects") and not ew.get("failingPairs"), json.dumps(ew)

        # 2. throughput samples in their slots (one rotation: 3 slots of 5 s): flagged ~4:1
        ew = east_west_status(
            lambda ew: bool(ew.get("flagged")), "the rack pair flagged (capacity ratio)"
        )
        cross = cells(ew)[("rack-a", "rack-b")]
        print(f"\n(e2e operator) cross {cross}")
        assert [(f["a"], f["b"]) for f in ew["flagged"]] == [("rack-a", "rack-b")]
        assert 4 * 0.75 <= cross["capacityRatio"] <= 4 * 1.25, cross
        intra = [cells(ew)[(r, r)].get("throughputMbps") for r in RACKS]
        assert any(intra), ew  # the ratio's denominator
        for mbps in filter(None, intra):
            assert mbps == pytest.approx(NODE_RATE_MBIT, rel=0.25), intra

        # 3. a3's fabric link down: the operator names it, and only it, the suspect
        fabric.nodes[DOWN].set_down("f0")
        try:
            ew = east_west_status(
                lambda ew: [s["node"] for s in ew.get("suspects") or []] == [DOWN],
                f"{DOWN} named the suspect",
            )
        finally:
            fabric.nodes[DOWN].set_up("f0")
            fabric.nodes[DOWN].wait_operstate("f0", "up")
        (suspect,) = ew["suspects"]
        assert suspect["domain"] == DOMAIN[DOWN] and suspect["failingPeers"] >= 1, suspect
        print(f"\n(e2e operator) suspect {suspect}; cells {ew['cells']}")
        for log_path in logs.values():
            assert "Traceback" not in log_path.read_text(errors="replace"), diagnostics()
