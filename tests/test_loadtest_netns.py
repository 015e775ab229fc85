"""NetworkLoadTest on a real fabric: the agents' side end to end.

Two leaves of three nodes (namespaces), a bridge per leaf, one inter-leaf uplink; every
node's fabric port and the uplink (each direction) shaped by htb to the same 40 Mbit/s, so
the fabric is 3:1 oversubscribed across and 1:1 inside a leaf. Six real `netval agent`
processes run against a real Mosquitto on a management network. The TEST plays the
operator: it plans the run with `netval.operator.loadtest.plan.plan_run`, publishes each
stage's plans (retained) on the agents' loadplan topics, collects their LoadResults from the
broker and folds them with `netval.operator.loadtest.aggregate`.

(b) cross-leaf oversubscription near 3, intra near 1, loaded latency p99 above idle;
(c) a LoadAbort mid-window stops the traffic: the uplink's byte counter stops within 2 s;
(d) the per-flow cap holds (the aborted run is capped below the fair share).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

import mosquitto
from netns import Namespace, namespace, netval_script
from netval.model.loadplan import LoadAbort, LoadPlan, LoadResult, encode
from netval.model.loadtest import Expectations
from netval.model.spec import NetworkValidationSpec
from netval.operator.loadtest.aggregate import Aggregator, Received
from netval.operator.loadtest.plan import Candidate, RunPlan, plan_run
from netval.operator.loadtest.validate import RunSettings, settle
from test_peers_netns import (
    MGMT_ADDR,
    Messages,
    ip,
    mgmt_broker,
    run_in,
    shape,
    start_broker,
    stop_process,
)

pytestmark = [pytest.mark.netns, pytest.mark.timeout(150)]

LEAVES = {"leaf-a": ["la1", "la2", "la3"], "leaf-b": ["lb1", "lb2", "lb3"]}
NODES = [n for members in LEAVES.values() for n in members]
LEAF = {n: leaf for leaf, members in LEAVES.items() for n in members}
FABRIC = {n: f"10.89.0.{10 * (1 + i // 3) + 1 + i % 3}" for i, n in enumerate(NODES)}
MGMT = {n: f"192.168.88.{10 * (1 + i // 3) + 1 + i % 3}" for i, n in enumerate(NODES)}
RATE_MBIT = 40
PORT = 7481
VALIDATION = "lt"
SPEC = {
    "interval": "300s",  # the continuous probes stay out of the way (they pause anyway)
    "checks": {
        "link": {"interfaces": ["f0"]},
        "peers": {"enabled": True, "interface": "f0", "port": PORT, "maxLatencyMs": 500.0},
    },
}

# Runs in the mgmt namespace: publishes what arrives on stdin ({"topic", "payload"} JSON
# lines, retained), prints every message of the given topics as a JSON line.
TOOL = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import aiomqtt
    host, port, user, password, *topics = sys.argv[1:]

    def emit(doc):
        sys.stdout.write(json.dumps(doc) + "\\n")
        sys.stdout.flush()

    async def main():
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        deadline = time.monotonic() + 10
        while True:
            try:
                async with aiomqtt.Client(host, int(port), username=user, password=password,
                                          protocol=aiomqtt.ProtocolVersion.V5, timeout=5) as c:
                    for topic in topics:
                        await c.subscribe(topic, qos=1)
                    emit({"ready": True})

                    async def relay():
                        try:
                            while line := await reader.readline():
                                doc = json.loads(line)
                                await c.publish(doc["topic"], doc["payload"].encode(), qos=1,
                                                retain=True)
                                emit({"published": doc["topic"]})
                        except BaseException as exc:
                            print("relay:", repr(exc), file=sys.stderr, flush=True)
                            raise

                    relay_task = asyncio.create_task(relay())
                    async for m in c.messages:
                        emit({"topic": str(m.topic), "payload": m.payload.decode()})
            except aiomqtt.MqttError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    asyncio.run(main())
    """
)


def start_agent(
    ns: Namespace, node: str, broker: mosquitto.MosquittoBroker, workdir: Path, log: Path
) -> subprocess.Popen[bytes]:
    """`netval agent` as `node` (as tests/test_peers_netns.py starts it), running the code
    under test: PYTHONPATH passes through when set (a source tree ahead of the install)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NETVAL_CONFIG": str(workdir / "agent.yaml"),
        "NETVAL_NODE_NAME": node,
        "NETVAL_MQTT_URL": f"mqtt://{MGMT_ADDR}:{broker.port}",
        "NETVAL_MQTT_USERNAME": broker.username,
        "NETVAL_MQTT_PASSWORD_FILE": str(workdir / "password"),
        "NETVAL_METRICS_ADDR": "off",
    }
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    with log.open("ab") as out:
        return subprocess.Popen(
            ns.argv([netval_script(), "agent"]), env=env, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


@dataclass
class Fabric:
    nodes: dict[str, Namespace]
    leaves: dict[str, Namespace]
    tool: subprocess.Popen[str]
    messages: Messages
    logs: dict[str, Path]
    # node -> (address, port) announced: what the operator puts into each plan's `peers`
    # (an agent knows only its own peer set's endpoints, and no operator runs here)
    endpoints: dict[str, tuple[str, int]]

    def publish(self, topic: str, payload: bytes) -> None:
        assert self.tool.stdin is not None
        self.tool.stdin.write(json.dumps({"topic": topic, "payload": payload.decode()}) + "\n")
        self.tool.stdin.flush()

    def uplink_tx_bytes(self) -> int:
        """Bytes leaf A's side of the uplink sent (towards leaf B)."""
        doc = json.loads(ip(self.leaves["leaf-a"], "-s", "-j", "link", "show", "up0"))
        return int(doc[0]["stats64"]["tx"]["bytes"])


def shape_uplink(ns: Namespace, senders: list[str], mbit: int, dev: str = "up0") -> None:
    """The uplink's direction out of a leaf at `mbit`, shared evenly by the leaf's nodes:
    htb with a class per sending node (its fair share guaranteed, the whole rate when the
    others are idle). This kernel has no fair queueing qdisc (fq_codel, sfq); in one FIFO a
    TCP flow can starve the others for seconds, while flows hashed over a switch's ECMP
    port share roughly evenly."""
    share = mbit / len(senders)
    run_in(ns, *f"tc qdisc add dev {dev} root handle 1: htb default 99 r2q 50".split())
    run_in(ns, *f"tc class add dev {dev} parent 1: classid 1:1 htb rate {mbit}mbit "
                "burst 64k cburst 64k".split())  # fmt: skip
    for i, node in enumerate(["default", *senders]):
        classid = "1:99" if i == 0 else f"1:{10 + i}"
        rate = 0.1 if i == 0 else share
        run_in(ns, *f"tc class add dev {dev} parent 1:1 classid {classid} htb rate "
                    f"{rate:.3f}mbit ceil {mbit}mbit burst 64k cburst 64k".split())  # fmt: skip
        if i:
            run_in(ns, *f"tc filter add dev {dev} parent 1: protocol ip prio 1 u32 match "
                        f"ip src {FABRIC[node]}/32 flowid {classid}".split())  # fmt: skip


def build_fabric(
    stack: contextlib.ExitStack,
) -> tuple[dict[str, Namespace], dict[str, Namespace], Namespace]:
    """(nodes, leaves, mgmt): the shaped two-leaf fabric and the management bridge, torn
    down with `stack` (also used by tests/test_loadtest_e2e_netns.py)."""
    nodes = {n: stack.enter_context(namespace()) for n in NODES}
    leaves = {leaf: stack.enter_context(namespace()) for leaf in LEAVES}
    mgmt = stack.enter_context(namespace())
    for leaf_ns in leaves.values():
        ip(leaf_ns, "link", "add", "br0", "type", "bridge")
        ip(leaf_ns, "link", "set", "br0", "up")
    ip(mgmt, "link", "add", "brm", "type", "bridge")
    ip(mgmt, "addr", "add", f"{MGMT_ADDR}/24", "dev", "brm")
    ip(mgmt, "link", "set", "brm", "up")
    ip(mgmt, "link", "set", "lo", "up")
    a, b = leaves["leaf-a"], leaves["leaf-b"]
    ip(a, *["link", "add", "up0", "type", "veth", "peer", "name", "up0"], "netns", b.name)
    for leaf_ns in leaves.values():
        ip(leaf_ns, "link", "set", "up0", "master", "br0", "up")
    for node, ns in nodes.items():
        leaf_ns = leaves[LEAF[node]]
        ip(ns, *f"link add f0 type veth peer name {node}".split(), "netns", leaf_ns.name)
        ip(leaf_ns, "link", "set", node, "master", "br0", "up")
        ip(ns, *f"link add m0 type veth peer name m-{node}".split(), "netns", mgmt.name)
        ip(mgmt, "link", "set", f"m-{node}", "master", "brm", "up")
        ip(ns, "addr", "add", f"{FABRIC[node]}/24", "dev", "f0")
        ip(ns, "addr", "add", f"{MGMT[node]}/24", "dev", "m0")
        for ifname in ("lo", "f0", "m0"):
            ip(ns, "link", "set", ifname, "up")
        shape(ns, "f0", RATE_MBIT)  # the node's port, sending
    for leaf, leaf_ns in leaves.items():
        shape_uplink(leaf_ns, LEAVES[leaf], RATE_MBIT)  # each direction of the uplink
    for ns in nodes.values():
        ns.wait_operstate("f0", "up")
    return nodes, leaves, mgmt


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    workdir = tmp_path_factory.mktemp("loadtest")
    with contextlib.ExitStack() as stack:
        nodes, leaves, mgmt = build_fabric(stack)
        broker = mgmt_broker(workdir)
        stack.callback(stop_process, start_broker(mgmt, broker))
        config = {"validation": VALIDATION, "generation": 1, "spec": SPEC}
        (workdir / "agent.yaml").write_text(yaml.safe_dump(config))
        (workdir / "password").write_text(broker.password + "\n")
        logs = {n: workdir / f"agent-{n}.log" for n in NODES}
        tool_log = workdir / "tool.log"

        def diagnostics() -> str:
            parts = [f"-- {n} --\n{p.read_text(errors='replace')[-2000:]}" for n, p in logs.items()]
            return "\n".join(parts) + f"\n-- tool --\n{tool_log.read_text()[-2000:]}"

        tool = subprocess.Popen(
            mgmt.argv([sys.executable, "-c", TOOL, MGMT_ADDR, str(broker.port), broker.username,
                       broker.password, f"netval/v1/{VALIDATION}/+/endpoint",
                       f"netval/v1/{VALIDATION}/+/loadresult"]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=tool_log.open("w"), text=True,
        )  # fmt: skip
        stack.callback(stop_process, tool)
        messages = Messages(tool, diagnostics)
        messages.wait("the MQTT tool", lambda m: m.get("ready") is True, 15)
        for n in NODES:
            stack.callback(stop_process, start_agent(nodes[n], n, broker, workdir, logs[n]))
        fabric_tool = Fabric(nodes, leaves, tool, messages, logs, {})
        for n in NODES:  # as the operator would: an agent announces once it has one
            fabric_tool.publish(
                f"netval/v1/{VALIDATION}/{n}/assignment", json.dumps({"domain": LEAF[n]}).encode()
            )
        announced: dict[str, tuple[str, int]] = {}
        while set(announced) != set(NODES):
            m = messages.wait("endpoints", lambda m: "endpoint" in m.get("topic", ""), 30)
            doc = json.loads(m["payload"])
            announced[m["topic"].split("/")[3]] = (doc["address"], int(doc["port"]))
        yield Fabric(nodes, leaves, tool, messages, logs, announced)
        for path in logs.values():
            assert "Traceback" not in path.read_text(errors="replace"), diagnostics()


def make_plan(run_id: str, duration: str, cap: float, *, skip_stages: int = 0) -> RunPlan:
    validation = NetworkValidationSpec.model_validate(SPEC)
    s = settle({"validation": VALIDATION, "duration": duration, "phases": ["eastWest"],
                "maxRateMbps": cap}, validation)  # fmt: skip
    assert isinstance(s, RunSettings), s
    candidates = [Candidate(n, LEAF[n], fresh=True, busy=False, gated=False) for n in NODES]
    now = datetime.now(UTC)
    plan = plan_run(s, candidates, run_id=run_id, now=now, seed=7)
    assert isinstance(plan, RunPlan)
    if skip_stages:  # the same plan, shifted so that stage `skip_stages` goes out now
        shift = plan.stages[skip_stages].issued_at - plan.stages[0].issued_at
        plan = plan_run(s, candidates, run_id=run_id, now=now - shift, seed=7)
        assert isinstance(plan, RunPlan)
    return plan


def plan_topic(node: str) -> str:
    return f"netval/v1/{VALIDATION}/{node}/loadplan"


def publish_stage(fabric: Fabric, plans: dict[str, LoadPlan]) -> None:
    for node, plan in plans.items():
        fabric.publish(plan_topic(node), encode(plan))


def collect(fabric: Fabric, run_id: str, want: int, within: float) -> list[LoadResult]:
    results: list[LoadResult] = []
    deadline = time.monotonic() + within
    while len(results) < want:
        m = fabric.messages.wait(
            f"{want} results of {run_id} ({len(results)} so far)",
            lambda m: str(m.get("topic", "")).endswith("/loadresult"),
            max(deadline - time.monotonic(), 0.0),
        )
        result = LoadResult.model_validate_json(m["payload"])
        if result.run == run_id:
            results.append(result)
    return results


def wait_until(at: datetime) -> None:
    """Scheduling, not synchronisation: a stage's plans go out at their issue time."""
    while (left := (at - datetime.now(UTC)).total_seconds()) > 0:
        time.sleep(min(left, 0.2))


def test_b_a_3_to_1_fabric_measures_3_across_and_1_inside_and_latency_under_load(
    fabric: Fabric,
) -> None:
    plan = make_plan("oversub", "5s", 0)
    assert len(plan.stages) == 2  # intra, then the one cross round
    aggregator = Aggregator(plan)
    for stage in plan.stages:
        wait_until(stage.issued_at)
        plans = plan.plans(stage, fabric.endpoints)
        publish_stage(fabric, plans)
        within = (stage.deadline - datetime.now(UTC)).total_seconds() + 10
        for result in collect(fabric, plan.run_id, len(plans), within):
            assert result.error is None, result
            assert all(f.error is None for f in result.flows), result.flows
            aggregator.add(Received(result, received_at=datetime.now(UTC)))
    run = aggregator.finish(expect=Expectations(), finished_at=datetime.now(UTC))
    assert run.east_west is not None
    cells = {(c.a, c.b): c for c in run.east_west.cells}
    for key, c in sorted(cells.items()):
        print(f"\n{key}: flows {c.flows} per node {c.per_node_mbps} Mbit/s oversub "
              f"{c.oversubscription} idle p99 {c.idle_latency_p99_ms} ms loaded p99 "
              f"{c.loaded_latency_p99_ms} ms loss {c.loss_percent}%")  # fmt: skip
    assert run.refused_flows == 0, run
    cross = cells[("leaf-a", "leaf-b")]
    assert cross.flows == 6
    assert cross.oversubscription is not None and 2.2 <= cross.oversubscription <= 4.0, cross
    for leaf in LEAVES:
        intra = cells[(leaf, leaf)]
        assert intra.flows == 3
        assert intra.per_node_mbps is not None
        assert 0.7 * RATE_MBIT <= intra.per_node_mbps <= 1.1 * RATE_MBIT, intra
    for c in cells.values():
        assert c.idle_latency_p99_ms is not None and c.loaded_latency_p99_ms is not None
        assert c.loaded_latency_p99_ms > c.idle_latency_p99_ms, c


def test_c_d_an_abort_stops_the_uplink_within_2s_and_the_cap_holds(fabric: Fabric) -> None:
    cap = 10.0  # below the cross share (40/3): the uplink carries 3 x 10 Mbit/s
    plan = make_plan("abort", "60s", cap, skip_stages=1)  # the cross round, now
    stage = plan.stages[1]
    plans = plan.plans(stage, fabric.endpoints)
    publish_stage(fabric, plans)
    load_start = next(w.measure_start for w in plan.windows_of(stage) if w.id.endswith("cross"))
    wait_until(load_start + timedelta(seconds=2))
    before = fabric.uplink_tx_bytes()
    time.sleep(0.5)
    assert fabric.uplink_tx_bytes() - before > 0.5 * 3 * cap * 1e6 / 8 * 0.5  # loaded
    for node in plans:
        fabric.publish(plan_topic(node), encode(LoadAbort(run="abort", reason="test deleted")))
    aborted = time.monotonic()
    # quiet: under 20 KB in 0.5 s (echo and control traffic only), reached within 2 s
    last = fabric.uplink_tx_bytes()
    quiet_at = None
    while time.monotonic() - aborted < 2.5:
        time.sleep(0.5)
        now_bytes = fabric.uplink_tx_bytes()
        if now_bytes - last < 20_000:
            quiet_at = time.monotonic() - 0.5
            break
        last = now_bytes
    assert quiet_at is not None and quiet_at - aborted <= 2.0, "the uplink kept sending"
    print(f"\nuplink quiet {quiet_at - aborted:.2f} s after the abort")
    results = collect(fabric, "abort", len(plans), 10)
    for result in results:
        for flow in result.flows:
            assert flow.error == "stopped early", flow
            seconds = (flow.end - flow.start).total_seconds()
            assert seconds > 1.0
            mbps = flow.bytes * 8 / seconds / 1e6
            assert mbps <= cap * 1.05, (result.node, mbps)
            assert mbps >= cap * 0.6, (result.node, mbps)
