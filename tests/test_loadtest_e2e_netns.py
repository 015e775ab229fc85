"""NetworkLoadTest end to end: every process real.

The fabric of tests/test_loadtest_netns.py (two leaves of three namespace nodes, node ports
and the uplink shaped by htb to 40 Mbit/s: 3:1 across, 1:1 inside a leaf), six real
`netval agent` processes on it, a real Mosquitto on the management network, and the real
`netval operator` process (tests/operator_processes.py) against the test Kubernetes API,
reaching the broker through a Unix-socket forward (the broker lives in the management
namespace, the operator and the test API in this one).

The agents run what they would in a cluster: the config the operator rendered into their
ConfigMap (written to their NETVAL_CONFIG file; peers enabled), the broker login from env
(one shared login with the operator: this broker has no per-node ACL), their leaf from the
operator's retained assignment (the Nodes' `netval.test/leaf` label,
`checks.peers.topologyKey`). The test only creates Kubernetes objects and reads status,
the fabric's byte counters and the retained plan topics:

(a) a spec naming no validation fails at once, the message naming spec.validation;
(b) a 5 s run with `expect.maxOversubscription: 1.5` measures ~3 across and ~1 inside,
    latency under load above idle, fails `ExpectationsBreached`, and its figures land in
    the validation's status.topology.domainPairs;
(c) a 30 s run deleted mid-window: the retained plans become LoadAborts and the nodes'
    fabric ports go quiet within 2 s of the DELETE (the window is the first stage's,
    intra-leaf: the ports carry it, the uplink does not);
(d) a node that starts a GPU job mid-run gets a LoadAbort and is left out of the next
    stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import aiomqtt
import pytest

import mosquitto
from kube import KubeCluster, wait_for
from loadtest_netns import LEAF, LEAVES, NODES, PORT, RATE_MBIT, build_fabric, start_agent
from netns import Namespace
from netval.model.keys import LabelKey
from netval.model.loadplan import LoadAbort, decode_plan
from netval.operator.agents.manifests import AGENT_CONFIG_KEY
from operator_env import NS, NV, add_node, condition, status_of
from operator_processes import OperatorProc
from test_peers_netns import UnixToTcp, ip, mgmt_broker, start_broker, stop_process

pytestmark = [pytest.mark.netns, pytest.mark.timeout(400)]

VALIDATION = "fabric-e2e"
POOL = "netval.test/pool"
LEAF_KEY = "netval.test/leaf"
T = TypeVar("T")
INTERVAL = 10
# Each agent's continuous throughput sample (~1 s, rarely) starts 0.25 s after a boundary of
# the interval on the Unix clock (netval.agent.peers.service); the quiet check stays clear.
SAMPLES_END = 2.0
QUIET_BYTES = 10_000  # in 0.25 s on all six ports: a few echoes at most, no flow


@dataclass
class EndToEnd:
    kube: KubeCluster
    operator: OperatorProc
    login: Any  # host, port, username, password of the broker, from this namespace
    leaves: dict[str, Namespace]
    diagnostics: Callable[[], str]
    logs: dict[str, Path]

    def fabric_tx_bytes(self) -> int:
        """Bytes all six nodes sent on their fabric ports (every load flow leaves by one),
        read on the leaves' ends of the ports: one `ip` call per leaf."""
        total = 0
        for leaf_ns in self.leaves.values():
            for link in json.loads(ip(leaf_ns, "-s", "-j", "link", "show")):
                if link["ifname"] in {f"{n}-0" for n in NODES}:  # the leaf's end of f0
                    total += int(link["stats64"]["rx"]["bytes"])
        return total


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def waiting(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    diagnostics: Callable[[], str],
    interval: float = 0.25,
) -> T:
    """`wait_for`, with the processes' logs when it gives up."""
    try:
        found = wait_for(predicate, timeout=timeout, interval=interval, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics()}") from None
    assert found is not None  # wait_for returns only what is truthy
    return found


def _validation() -> dict[str, Any]:
    return {
        "apiVersion": NV,
        "kind": "NetworkValidation",
        "metadata": {"name": VALIDATION},
        "spec": {
            "nodeSelector": {POOL: VALIDATION},
            # short: an agent's first cycle (its first report) comes at a random point of
            # its first interval
            "interval": f"{INTERVAL}s",
            "checks": {
                "link": {"interfaces": ["f0"]},
                "peers": {
                    "enabled": True,
                    "interface": "f0",
                    "port": PORT,
                    "maxLatencyMs": 500.0,
                    "topologyKey": LEAF_KEY,
                    # the endpoints and rails are on the fabric (rail 0's network), not among
                    # the Nodes' addresses
                    "fabricCidrs": ["10.89.0.0/24"],
                },
            },
            # status.topology (and its domainPairs) is written when levels are declared
            "topology": {"levels": [LEAF_KEY]},
        },
    }


def loadtest(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": NV,
        "kind": "NetworkLoadTest",
        "metadata": {"name": name},
        "spec": {"validation": VALIDATION, "duration": "5s", "phases": ["eastWest"], **spec},
    }


def netload(kube: KubeCluster, name: str) -> dict[str, Any]:
    return dict(kube.get(NV, "networkloadtests", name).get("status") or {})


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EndToEnd]:
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    pytest.importorskip("kmock", reason="kmock is not installed (pip install kmock==0.8)")
    workdir = tmp_path_factory.mktemp("loadtest-e2e")
    with contextlib.ExitStack() as stack:
        nodes, leaves, mgmt = build_fabric(stack)
        sock = workdir / "mqtt.sock"
        broker = mgmt_broker(workdir, unix_socket=sock)
        stack.callback(stop_process, start_broker(mgmt, broker))
        wait_for(sock.exists, what="the broker's Unix socket")
        forward = stack.enter_context(UnixToTcp(sock))
        login = SimpleNamespace(host="127.0.0.1", port=forward.port, username=broker.username,
                                password=broker.password)  # fmt: skip
        kube = KubeCluster(workdir / "kube").start()
        stack.callback(kube.stop)
        kube.ensure_namespace(NS)
        for n in NODES:
            add_node(kube, n, {POOL: VALIDATION, LEAF_KEY: LEAF[n]})
        kube.create(_validation())
        operator = OperatorProc(kube, login, workdir / "operator", "op-e2e", standalone=True)
        operator.start()
        stack.callback(operator.terminate)
        logs = {n: workdir / f"agent-{n}.log" for n in NODES}

        def diagnostics() -> str:
            parts = [f"-- {n} --\n{_tail(p, 1500)}" for n, p in logs.items()]
            return "\n".join([*parts, f"-- operator --\n{operator.log()[-4000:]}"])

        # the agents run the config the operator rendered into their ConfigMap
        def rendered() -> str | None:
            for cm in kube.list("v1", "configmaps", NS):
                if cm["metadata"].get("labels", {}).get(LabelKey.VALIDATION) == VALIDATION:
                    return str(cm["data"][AGENT_CONFIG_KEY])
            return None

        config = waiting(rendered, 60, "the agent ConfigMap", diagnostics)
        (workdir / "agent.yaml").write_text(config)
        (workdir / "password").write_text(broker.password + "\n")
        for n in NODES:
            stack.callback(stop_process, start_agent(nodes[n], n, broker, workdir, logs[n]))

        def ready() -> bool:
            status = status_of(kube, VALIDATION)
            r = condition(status, "Ready")
            return r is not None and r["status"] == "True" and status["nodes"]["reporting"] == 6

        waiting(ready, 60, "Ready, six agents reporting", diagnostics)
        yield EndToEnd(kube, operator, login, leaves, diagnostics, logs)
        for path in logs.values():
            assert "Traceback" not in path.read_text(errors="replace"), diagnostics()
        assert "Traceback" not in operator.log(), diagnostics()


def test_a_a_test_of_an_unknown_validation_fails_naming_spec_validation(e2e: EndToEnd) -> None:
    e2e.kube.create(loadtest("nowhere", validation="no-such-pool"))

    def written() -> dict[str, Any] | None:
        status = netload(e2e.kube, "nowhere")
        return status if status.get("phase") else None

    status = waiting(written, 30, "the test's status", e2e.diagnostics)
    assert status["phase"] == "Failed", status
    complete = cond(status, "Complete")
    assert (complete["status"], complete["reason"]) == ("True", "ValidationNotFound"), status
    assert complete["message"].startswith("spec.validation:"), complete["message"]
    assert cond(status, "Passed")["status"] == "False"


def test_b_a_run_measures_3_across_1_inside_breaches_and_feeds_domain_pairs(
    e2e: EndToEnd,
) -> None:
    kube = e2e.kube
    kube.create(loadtest("under-load", expect={"maxOversubscription": 1.5}))

    def finished() -> dict[str, Any] | None:
        s = netload(kube, "under-load")
        return s if cond(s, "Complete").get("reason") not in (None, "Running", "Waiting") else None

    # two stages of duration + 15 s each after a 5 s lead, then the results
    status = waiting(finished, 90, "the run finished", e2e.diagnostics)
    run = status["lastRun"]
    assert status["phase"] == "Failed", status
    assert cond(status, "Passed")["reason"] == "ExpectationsBreached", status
    assert run["nodes"] == 6 and run.get("refusedFlows", 0) == 0, (run, e2e.diagnostics())
    cells = {(c["a"], c["b"]): c for c in run["eastWest"]["cells"]}
    for key, c in sorted(cells.items()):
        print(f"\n(e2e) {key}: {c}")
    cross = cells[("leaf-a", "leaf-b")]
    assert 2.2 <= cross["oversubscription"] <= 4.0, cross
    for leaf in LEAVES:
        intra = cells[(leaf, leaf)]
        assert 0.8 <= intra["oversubscription"] <= 1.25, intra
        assert 0.7 * RATE_MBIT <= intra["perNodeMbps"] <= 1.1 * RATE_MBIT, intra  # full port
    for c in cells.values():
        assert c["loadedLatencyP99Ms"] > c["idleLatencyP99Ms"], c
    assert [b["expectation"] for b in run["breaches"]] == ["maxOversubscription"], run
    assert run["breaches"][0]["subject"] == "leaf-a/leaf-b"

    # the validation's status carries the run's figures per domain pair
    def pairs() -> dict[str, Any] | None:
        topology = status_of(kube, VALIDATION).get("topology") or {}
        return topology if topology.get("loadTest") == f"under-load/{run['id']}" else None

    topology = waiting(pairs, 20, "status.topology.loadTest", e2e.diagnostics)
    (pair,) = topology["domainPairs"]
    assert (pair["a"], pair["b"]) == ("leaf-a", "leaf-b")
    assert pair["oversubscription"] == pytest.approx(cross["oversubscription"])
    assert pair["loadedLatencyP99Ms"] == pytest.approx(cross["loadedLatencyP99Ms"])
    assert topology["pairsKey"] == LEAF_KEY


def retained_plans(login: Any, want: set[str], timeout: float = 10.0) -> dict[str, bytes]:
    """The retained payloads on the validation's loadplan topics, per node."""

    async def main() -> dict[str, bytes]:
        got: dict[str, bytes] = {}
        async with aiomqtt.Client(login.host, login.port, username=login.username,
                                  password=login.password) as client:  # fmt: skip
            await client.subscribe(f"netval/v1/{VALIDATION}/+/loadplan", qos=1)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    async for m in client.messages:
                        payload = m.payload if isinstance(m.payload, bytes) else b""
                        got[m.topic.value.split("/")[3]] = payload
                        if set(got) >= want:
                            break
        return got

    return asyncio.run(main())


def test_c_deleting_a_test_mid_window_aborts_it_and_the_fabric_goes_quiet(
    e2e: EndToEnd,
) -> None:
    kube = e2e.kube
    kube.create(loadtest("long", duration="30s"))

    # the ports' counters over a short time: a rate, not a synchronisation
    def sent_within(seconds: float) -> int:
        before = e2e.fabric_tx_bytes()
        time.sleep(seconds)
        return e2e.fabric_tx_bytes() - before

    def flows_in_a_quiet_slot() -> bool:
        # scheduling, not synchronisation: the 2.5 s after the DELETE hold no continuous
        # throughput sample, and the load flows of the first stage (intra-leaf: every node
        # sends on its port) are running right before it
        slot_ok = SAMPLES_END <= time.time() % INTERVAL <= INTERVAL - 3.0
        return slot_ok and sent_within(0.25) > 20 * QUIET_BYTES

    waiting(flows_in_a_quiet_slot, 45, "load flows", e2e.diagnostics, interval=0)
    assert netload(kube, "long").get("phase") == "Running"
    kube.delete(NV, "networkloadtests", "long")
    deleted = time.monotonic()

    def quiet_since() -> float | None:
        began = time.monotonic()
        sent = sent_within(0.25)
        return None if sent >= QUIET_BYTES else max(began - deleted, 1e-6)

    after = waiting(quiet_since, 2.5, "the fabric quiet", e2e.diagnostics, interval=0)
    print(f"\n(e2e) fabric quiet {after:.2f} s after the DELETE")
    assert after <= 2.0
    # the operator replaced every node's retained plan with an abort (kept until the
    # run's last published deadline: an agent reconnecting now still learns of it)
    plans = retained_plans(e2e.login, set(NODES))
    assert set(plans) == set(NODES), plans
    for node, payload in plans.items():
        assert isinstance(decode_plan(payload), LoadAbort), (node, payload[:200])


def test_d_a_node_turning_busy_mid_run_is_aborted_and_leaves_the_next_stage(
    e2e: EndToEnd,
) -> None:
    """A GPU job lands on la1 during the intra stage: the operator (no agent has API access)
    sees it at its next check, sends la1's agent a LoadAbort of its term, and plans the
    cross stage without la1, which skippedNodes names with the stage."""
    kube = e2e.kube
    kube.create(loadtest("busy-midway"))

    def first_stage_out() -> dict[str, Any] | None:
        s = netload(kube, "busy-midway")
        run = s.get("lastRun") or {}
        log = (e2e.logs["la1"]).read_text(errors="replace")
        return s if run.get("id") and f"load plan {run['id']} stage 0" in log else None

    running = waiting(first_stage_out, 40, "the first stage running on la1", e2e.diagnostics)
    run_id = running["lastRun"]["id"]
    container = {"name": "train", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    kube.create({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "training", "namespace": NS},
                 "spec": {"nodeName": "la1", "containers": [container]}})  # fmt: skip

    def finished() -> dict[str, Any] | None:
        s = netload(kube, "busy-midway")
        return s if s.get("lastRun", {}).get("finishedAt") else None

    done = waiting(finished, 90, "the run finished", e2e.diagnostics)
    skipped = {(s["node"], s["reason"], s.get("stage")) for s in done["lastRun"]["skippedNodes"]}
    assert ("la1", "Busy", 1) in skipped, done["lastRun"]
    log = e2e.logs["la1"].read_text(errors="replace")
    assert f"load plan {run_id} stage 0 stopped" in log  # its agent stopped at once
    assert f"load plan {run_id} stage 1" not in log  # and got no plan of the next stage
    others = e2e.logs["la2"].read_text(errors="replace")
    assert f"load plan {run_id} stage 1" in others
    kube.delete("v1", "pods", "training", NS)
