"""A network-namespace leaf-spine fabric with real `netval agent` processes, for the
NetworkLoadTest tests (tests/test_loadtest_*netns.py).

Two leaves of three nodes (namespaces), a bridge per leaf and rail, one uplink per rail
between the leaves (a veth); every node has a fabric port per rail (`f0`, `f1`, ...) and a
management port to a bridge where a real Mosquitto runs. Shaped (`rate_mbit`): every
node's port and each direction of each uplink by htb to the same rate, so the fabric is 3:1
across and 1:1 inside a leaf; unshaped: veth at whatever the CPUs give (they report 10000
Mb/s they never reach). The TEST plays the operator: it plans with `plan_run` from what the
agents announced (their rails), publishes each stage's plans (`build_plans`, retained) on
their loadplan topics through a small MQTT tool in the management namespace, collects their
LoadResults and folds them with the operator's `Aggregator`.
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

import mosquitto
from netns import Namespace, namespace, netval_script
from netval.model.loadplan import LoadPlan, LoadResult, encode
from netval.model.loadtest import Expectations, LoadRun
from netval.model.spec import NetworkValidationSpec
from netval.operator.ingest.peer_sets import AnnouncedRails
from netval.operator.loadtest.aggregate import Aggregator, Received
from netval.operator.loadtest.plan import Candidate, RunPlan, plan_run
from netval.operator.loadtest.rails import rails_of
from netval.operator.loadtest.tasks import build_plans
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

LEAVES = {"leaf-a": ["la1", "la2", "la3"], "leaf-b": ["lb1", "lb2", "lb3"]}
NODES = [n for members in LEAVES.values() for n in members]
LEAF = {n: leaf for leaf, members in LEAVES.items() for n in members}
MGMT = {n: f"192.168.88.{10 * (1 + i // 3) + 1 + i % 3}" for i, n in enumerate(NODES)}
RATE_MBIT = 40
PORT = 7481
VALIDATION = "lt"
TERM = 1_000


def rail_address(node: str, rail: int) -> str:
    i = NODES.index(node)
    return f"10.{89 + rail}.0.{10 * (1 + i // 3) + 1 + i % 3}"


FABRIC = {n: rail_address(n, 0) for n in NODES}  # rail 0: the responder's (f0)


def spec_for(rails: int) -> dict[str, Any]:
    ports = [f"f{r}" for r in range(rails)]
    peers: dict[str, Any] = {"enabled": True, "interface": "f0", "port": PORT,
                             "maxLatencyMs": 500.0}  # fmt: skip
    if rails > 1:
        peers["interfaces"] = ports
    return {
        "interval": "300s",  # the continuous probes stay out of the way (they pause anyway)
        "checks": {"link": {"interfaces": ports}, "peers": peers},
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


def shape_per_host(ns: Namespace, dev: str, mbit: int, hosts: list[str], match: str) -> None:
    """`dev`'s direction out at `mbit`, shared evenly by `hosts` (addresses, matched as the
    packets' `match`: src or dst): htb with a class per host (its fair share guaranteed, the
    whole rate when the others are idle). This kernel has no fair queueing qdisc (fq_codel,
    sfq); in one FIFO a TCP flow can starve the others for seconds, while flows hashed over
    a switch's ECMP port share roughly evenly."""
    share = mbit / len(hosts)
    run_in(ns, *f"tc qdisc add dev {dev} root handle 1: htb default 99 r2q 50".split())
    run_in(ns, *f"tc class add dev {dev} parent 1: classid 1:1 htb rate {mbit}mbit "
                "burst 64k cburst 64k".split())  # fmt: skip
    for i, host in enumerate(["default", *hosts]):
        classid = "1:99" if i == 0 else f"1:{10 + i}"
        rate = 0.1 if i == 0 else share
        run_in(ns, *f"tc class add dev {dev} parent 1:1 classid {classid} htb rate "
                    f"{rate:.3f}mbit ceil {mbit}mbit burst 64k cburst 64k".split())  # fmt: skip
        if i:
            run_in(ns, *f"tc filter add dev {dev} parent 1: protocol ip prio 1 u32 match "
                        f"ip {match} {host}/32 flowid {classid}".split())  # fmt: skip


def shape_uplink(ns: Namespace, senders: list[str], mbit: int, dev: str, rail: int) -> None:
    """The uplink's direction out of a leaf at `mbit`, shared evenly by the leaf's nodes."""
    shape_per_host(ns, dev, mbit, [rail_address(n, rail) for n in senders], "src")


def build_fabric(
    stack: contextlib.ExitStack, *, rate_mbit: int | None = RATE_MBIT, rails: int = 1
) -> tuple[dict[str, Namespace], dict[str, Namespace], Namespace]:
    """(nodes, leaves, mgmt): the two-leaf fabric, `rails` planes, shaped to `rate_mbit`
    (None: unshaped), and the management bridge, torn down with `stack`."""
    nodes = {n: stack.enter_context(namespace()) for n in NODES}
    leaves = {leaf: stack.enter_context(namespace()) for leaf in LEAVES}
    mgmt = stack.enter_context(namespace())
    ip(mgmt, "link", "add", "brm", "type", "bridge")
    ip(mgmt, "addr", "add", f"{MGMT_ADDR}/24", "dev", "brm")
    ip(mgmt, "link", "set", "brm", "up")
    ip(mgmt, "link", "set", "lo", "up")
    a, b = leaves["leaf-a"], leaves["leaf-b"]
    for r in range(rails):
        for leaf_ns in leaves.values():
            ip(leaf_ns, "link", "add", f"br{r}", "type", "bridge")
            ip(leaf_ns, "link", "set", f"br{r}", "up")
        ip(a, *["link", "add", f"up{r}", "type", "veth", "peer", "name", f"up{r}"], "netns",
           b.name)  # fmt: skip
        for leaf_ns in leaves.values():
            ip(leaf_ns, "link", "set", f"up{r}", "master", f"br{r}", "up")
    for node, ns in nodes.items():
        leaf_ns = leaves[LEAF[node]]
        for r in range(rails):
            ip(ns, *f"link add f{r} type veth peer name {node}-{r}".split(), "netns", leaf_ns.name)
            ip(leaf_ns, "link", "set", f"{node}-{r}", "master", f"br{r}", "up")
            ip(ns, "addr", "add", f"{rail_address(node, r)}/24", "dev", f"f{r}")
            ip(ns, "link", "set", f"f{r}", "up")
        ip(ns, *f"link add m0 type veth peer name m-{node}".split(), "netns", mgmt.name)
        ip(mgmt, "link", "set", f"m-{node}", "master", "brm", "up")
        ip(ns, "addr", "add", f"{MGMT[node]}/24", "dev", "m0")
        for ifname in ("lo", "m0"):
            ip(ns, "link", "set", ifname, "up")
        if rate_mbit is not None:
            for r in range(rails):
                shape(ns, f"f{r}", rate_mbit)  # the node's port, sending
    if rate_mbit is not None:
        for leaf, leaf_ns in leaves.items():
            for r in range(rails):
                shape_uplink(leaf_ns, LEAVES[leaf], rate_mbit, f"up{r}", r)
    for ns in nodes.values():
        for r in range(rails):
            ns.wait_operstate(f"f{r}", "up")
    return nodes, leaves, mgmt


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
    rails: dict[str, AnnouncedRails] = field(default_factory=dict)  # as announced
    spec: dict[str, Any] = field(default_factory=dict)

    def publish(self, topic: str, payload: bytes) -> None:
        assert self.tool.stdin is not None
        self.tool.stdin.write(json.dumps({"topic": topic, "payload": payload.decode()}) + "\n")
        self.tool.stdin.flush()

    def uplink_tx_bytes(self, rail: int = 0) -> int:
        """Bytes leaf A's side of the rail's uplink sent (towards leaf B)."""
        doc = json.loads(ip(self.leaves["leaf-a"], "-s", "-j", "link", "show", f"up{rail}"))
        return int(doc[0]["stats64"]["tx"]["bytes"])

    def diagnostics(self) -> str:
        return "\n".join(
            f"-- {n} --\n{p.read_text(errors='replace')[-2000:]}" for n, p in self.logs.items()
        )


@contextlib.contextmanager
def running_fabric(
    workdir: Path, *, rate_mbit: int | None = RATE_MBIT, rails: int = 1
) -> Iterator[Fabric]:
    """The fabric with six agents and their broker, every agent announced (with its rails)."""
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    spec = spec_for(rails)
    with contextlib.ExitStack() as stack:
        nodes, leaves, mgmt = build_fabric(stack, rate_mbit=rate_mbit, rails=rails)
        broker = mgmt_broker(workdir)
        stack.callback(stop_process, start_broker(mgmt, broker))
        config = {"validation": VALIDATION, "generation": 1, "spec": spec}
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
        fabric = Fabric(nodes, leaves, tool, messages, logs, {}, spec=spec)
        for n in NODES:  # as the operator would: an agent announces once it has one
            fabric.publish(
                f"netval/v1/{VALIDATION}/{n}/assignment", json.dumps({"domain": LEAF[n]}).encode()
            )
        # the newest announcement of each agent, until every one names its rails (the first
        # may come before the agent's first sample)
        while set(fabric.rails) != set(NODES) or any(
            len(fabric.rails[n][0]) != rails for n in NODES
        ):
            m = messages.wait(
                "endpoints with rails", lambda m: "endpoint" in m.get("topic", ""), 60
            )
            doc = json.loads(m["payload"])
            node = m["topic"].split("/")[3]
            fabric.endpoints[node] = (doc["address"], int(doc["port"]))
            fabric.rails[node] = (
                tuple((r[0], r[1], bool(r[2])) for r in doc.get("rails", [])),
                tuple((r[0], r[1], bool(r[2])) for r in doc.get("interfaces", [])),
            )
        yield fabric
        for path in logs.values():
            assert "Traceback" not in path.read_text(errors="replace"), diagnostics()


# -- playing the operator ---------------------------------------------------------------------


def make_plan(
    fabric: Fabric,
    run_id: str,
    duration: str,
    cap: float,
    *,
    skip_stages: int = 0,
    spec: dict[str, Any] | None = None,
) -> RunPlan:
    validation = NetworkValidationSpec.model_validate(fabric.spec)
    s = settle({"validation": VALIDATION, "duration": duration, "phases": ["eastWest"],
                "maxRateMbps": cap, **(spec or {})}, validation)  # fmt: skip
    assert isinstance(s, RunSettings), s
    candidates = [Candidate(n, LEAF[n], fresh=True, busy=False, gated=False) for n in NODES]
    rails = rails_of(NODES, s.interfaces, fabric.rails, fabric.endpoints)
    now = datetime.now(UTC)
    plan = plan_run(s, candidates, run_id=run_id, now=now, seed=7, rails=rails)
    assert isinstance(plan, RunPlan)
    if skip_stages:  # the same plan, shifted so that stage `skip_stages` goes out now
        shift = plan.stages[skip_stages].issued_at - plan.stages[0].issued_at
        plan = plan_run(s, candidates, run_id=run_id, now=now - shift, seed=7, rails=rails)
        assert isinstance(plan, RunPlan)
    return plan


def plan_topic(node: str) -> str:
    return f"netval/v1/{VALIDATION}/{node}/loadplan"


def stage_plans(fabric: Fabric, plan: RunPlan, index: int, term: int = TERM) -> dict[str, LoadPlan]:
    return build_plans(plan, plan.stages[index], term=term, endpoints=fabric.endpoints,
                       announced=fabric.rails)  # fmt: skip


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


def run_all(
    fabric: Fabric, plan: RunPlan, expect: Expectations | None = None
) -> tuple[LoadRun, list[LoadResult]]:
    """Every stage published at its time, every result collected and folded."""
    aggregator = Aggregator(plan)
    everything: list[LoadResult] = []
    for stage in plan.stages:
        wait_until(stage.issued_at)
        plans = stage_plans(fabric, plan, stage.index)
        publish_stage(fabric, plans)
        within = (stage.deadline - datetime.now(UTC)).total_seconds() + 15
        for result in collect(fabric, plan.run_id, len(plans), within):
            windows = {w.id: w for w in plan.windows_of(stage)}
            for f in result.flows:
                w = windows.get(f.window)
                lo = (f.start - w.measure_start).total_seconds() if w else None
                hi = (f.end - w.end).total_seconds() if w else None
                if f.error or lo is None or hi is None or abs(lo) > 0.5 or abs(hi) > 0.5:
                    print(f"\n{result.node} -> {f.peer} rail {f.rail} ({f.window}): "
                          f"{f.error}; start {lo} s, end {hi} s off the window")  # fmt: skip
            everything.append(result)
            # one machine, one clock: received when sent (the results queue in the tool
            # while the test waits for the slowest; its own clock would call them late)
            aggregator.add(Received(result, received_at=result.sent_at))
    run = aggregator.finish(expect=expect or Expectations(), finished_at=datetime.now(UTC))
    if run.east_west is not None:
        for c in run.east_west.cells:
            print(f"\n{c.a}/{c.b} rail {c.rail}: flows {c.flows}/{c.planned} per node "
                  f"{c.per_node_mbps} Mbit/s oversub {c.oversubscription} reason {c.reason} "
                  f"{c.note} port {c.port_mbps} cpu-bound {c.cpu_bound_percent} % idle p99 "
                  f"{c.idle_latency_p99_ms} ms loaded p99 {c.loaded_latency_p99_ms} ms")  # fmt: skip
    return run, everything
