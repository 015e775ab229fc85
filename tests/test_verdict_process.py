"""The node verdict through the real `netval operator` process (its webhook, its Kueue
controller), a real Mosquitto broker (two for the shard tests) and simulated agents
(tests/fleet_sim.py) where the fleet is large:

- 200 nodes: a failing node goes silent (its last will arrives) and stays excluded by
  label, taint, affinity and Kueue for 4+ intervals; it is back after recoveryReports
  passing reports; rack-level TAS assignments are judged by count;
- 40 nodes warn with requester-side retries while one node is offline: none is tainted or
  unhealthy, the status names the offline node, admission goes on;
- 30 % fail at once: at most the cap tainted, an annotated Pod admitted with an affinity
  that excludes the tainted nodes, a Warning Event; with `onBreakerTripped: hold`, gated;
- a relabel of 2,000 nodes at a low write rate: a node that fails meanwhile is labelled
  before the relabel completes;
- two brokers: one reconnecting does not extend the staleness of the other's nodes, an
  `offline` left on a node's old shard does not mark it offline, and after a broker
  restart a node that reported and went silent is stale by the normal rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mosquitto
from fleet_sim import Agents, add_nodes, node_report
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import CheckId, CheckResult, Status
from netval.model.keys import SchedulingGate
from netval.model.shards import shard_of
from netval.model.topics import TopicKind
from netval.operator.admission.configurations import MUTATE_PODS
from operator_env import NV
from operator_processes import OperatorProc
from test_admission import FABRIC as AFFINITY
from test_admission import pod, required_terms
from test_kueue import Kueue, admission_check, tas_admission
from test_operator_process import procs  # noqa: F401 (a fixture)
from test_shards_brokers import brokers, retained_on, shard_env, sigkill  # noqa: F401 (a fixture)
from verdict_process_kit import (
    FLEET,
    HOSTNAME,
    RACK,
    admitted,
    condition,
    events,
    fabric,
    fleet_validation,
    label_counts,
    metrics,
    start_operator,
    status,
    tainted,
    wait_webhook,
)

pytestmark = pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)

INTERVAL = 5.0  # seconds, the shortest allowed: a report is stale 15 s after it arrived


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    """What a test opens (simulated agents) is closed when it ends, passed or failed."""
    with contextlib.ExitStack() as opened:
        yield opened


def fleet(kube: KubeCluster, count: int, prefix: str = "node", per_rack: int = 20) -> list[str]:
    names = [f"{prefix}-{i:03d}" if count <= 1000 else f"{prefix}-{i:04d}" for i in range(count)]
    add_nodes(kube, [(n, {FLEET: "a", RACK: f"r{i // per_rack}", HOSTNAME: n})
                     for i, n in enumerate(names)])  # fmt: skip
    kube.ensure_namespace("netval-system")
    return names


def held_for(seconds: float, check: Any, what: str) -> int:
    """Poll `check` (raising AssertionError when it does not hold) for `seconds`; the checks
    made. Polls at least every second, so a short slip is seen."""
    end = time.monotonic() + seconds
    checks = 0
    while True:
        check()
        checks += 1
        if time.monotonic() >= end:
            return checks
        time.sleep(1.0)


# -- 200 nodes: silent after failing stays out ------------------------------------------------------


def test_a_failing_node_gone_silent_stays_excluded_until_it_recovers(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path,
    procs: list[OperatorProc], stack: contextlib.ExitStack,  # noqa: F811
) -> None:  # fmt: skip
    nodes = fleet(kube, 200)
    bad = "node-017"  # rack r0, with 19 others
    # NetworkFabricReady is not what this test is about: 200 condition writes beside the
    # labels would double what the paced queue must drain before the first assertion
    kube.create(fleet_validation(taint=True, recoveryReports=3, nodeCondition=False))
    kube.create(admission_check("fabric"))
    proc = start_operator(kube, mosquitto_broker, tmp_path)
    procs.append(proc)
    wait_webhook(kube, proc)
    agents = stack.enter_context(Agents([mosquitto_broker], period=2.0))
    agents.set([n for n in nodes if n != bad], Status.PASS)
    agents.own_client(bad)
    agents.set([bad], Status.FAIL)
    agents.start()
    wait_for(lambda: fabric(kube).get(bad) == ("unhealthy", True)
             and label_counts(kube)["healthy"] == 199, timeout=120, interval=1.0,
             what=f"node-017 excluded, 199 healthy\n{proc.log()[-3000:]}")  # fmt: skip

    # its agent dies: the last will arrives, the node is offline, its verdict holds
    agents.crash(bad)
    wait_for(lambda: status(kube).get("nodes", {}).get("stale") == 1, timeout=60,
             what="node-017 offline in the status")  # fmt: skip
    k = Kueue(kube, "v1beta2")
    on_bad = tas_admission({"levels": [HOSTNAME], "slices": [{"domainCount": 1,
        "valuesPerLevel": [{"universal": bad}], "podCounts": {"universal": 1}}]})  # fmt: skip
    k.queue("on-bad", ["fabric"], admission=on_bad)
    k.reserve("on-bad")

    def out() -> None:
        assert fabric(kube)[bad] == ("unhealthy", True)
        assert status(kube)["nodes"]["excluded"] == 1
        gated = admitted(kube, MUTATE_PODS, pod("trainer"))
        assert AFFINITY in required_terms(gated["spec"])[0]["matchExpressions"]
        assert "schedulingGates" not in gated["spec"]  # admission goes on, elsewhere

    silent_from = time.monotonic()
    retry = k.wait_state("on-bad", "fabric", "Retry", timeout=60)
    assert f"unhealthy fabric: {bad}" in retry["message"]
    # rack r0 holds node-017 and 19 admissible nodes: 8 pods fit, 20 do not
    for name, count in (("rack-8", 8), ("rack-20", 20)):
        k.queue(name, ["fabric"], admission=tas_admission({"levels": [RACK], "slices": [
            {"domainCount": 1, "valuesPerLevel": [{"universal": "r0"}],
             "podCounts": {"universal": count}}]}))  # fmt: skip
        k.reserve(name)
    k.wait_state("rack-8", "fabric", "Ready", timeout=60)
    short = k.wait_state("rack-20", "fabric", "Retry", timeout=60)
    assert "has 19 healthy node(s), the assignment needs 20" in short["message"]
    # 4+ intervals of silence: still out (it would be `unknown` had it been healthy)
    held_for(4.5 * INTERVAL - (time.monotonic() - silent_from), out, "node-017 excluded")
    assert k.checks("on-bad")["fabric"]["state"] == "Retry"

    # back: recoveryReports (3) passing reports, each made visible in the status by a check
    # id of its own, before the exclusion lifts
    agents.own_client(bad)
    extra = ("link.carrier", "link.flaps", "pfc.priorities")
    for i, check in enumerate(extra):
        result = CheckResult(check=CheckId(check), subject="ens1np0", status=Status.PASS,
                             message="ok", observed={}, expected={})  # fmt: skip
        agents.publish(node_report(bad, Status.PASS, extra=(result,)))
        wait_for(lambda c=check: c in status(kube).get("checks", {}), timeout=60,
                 what=f"report {i + 1} of node-017 folded")  # fmt: skip
        if i < len(extra) - 1:
            assert status(kube)["nodes"]["excluded"] == 1, f"released after {i + 1} reports"
            assert fabric(kube)[bad] == ("unhealthy", True)
    wait_for(lambda: fabric(kube)[bad] == ("healthy", False), timeout=60,
             what="node-017 healthy after 3 passing reports")  # fmt: skip
    assert status(kube)["nodes"]["excluded"] == 0
    k.queue("on-bad-again", ["fabric"], admission=on_bad)
    k.reserve("on-bad-again")
    k.wait_state("on-bad-again", "fabric", "Ready", timeout=60)


# -- victims are not culprits --------------------------------------------------------------------


def test_retries_on_forty_nodes_while_one_is_offline_name_it_and_admission_goes_on(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path,
    procs: list[OperatorProc], stack: contextlib.ExitStack,  # noqa: F811
) -> None:  # fmt: skip
    nodes = fleet(kube, 60, prefix="gpu")
    culprit, victims, others = nodes[17], nodes[20:], [*nodes[:17], *nodes[18:20]]
    assert len(victims) == 40 and len(others) == 19
    kube.create(fleet_validation(taint=True))
    proc = start_operator(kube, mosquitto_broker, tmp_path, kueue=False)
    procs.append(proc)
    wait_webhook(kube, proc)
    agents = stack.enter_context(Agents([mosquitto_broker], period=2.0))
    agents.set([*others, *victims], Status.PASS)
    agents.own_client(culprit)
    agents.set([culprit], Status.PASS)
    agents.start()
    wait_for(lambda: label_counts(kube)["healthy"] == 60, timeout=90, interval=1.0,
             what=f"60 healthy\n{proc.log()[-3000:]}")  # fmt: skip

    # gpu-017 dies; every node that talked to it counts requester-side retries
    agents.crash(culprit)
    agents.set(victims, Status.WARN)  # rdma.errors warn, attribution requester
    retries = wait_for(
        lambda: (r := status(kube).get("retries")) and r["nodes"] == 40 and r,
        timeout=60,
        what="40 nodes warning with retries",
    )
    assert retries["culprits"][0] == {**retries["culprits"][0], "node": culprit,
                                      "state": "offline"}  # fmt: skip
    assert retries["message"].startswith(f"requester-side retries on 40 nodes since {culprit} "
                                         "went offline")  # fmt: skip
    assert retries["counters"] == ["local_ack_timeout_err", "req_transport_retries_exceeded"]
    healthy = condition(kube, "Healthy")
    assert f"since {culprit} went offline" in healthy["message"]
    # victims are neither tainted nor unhealthy; admission goes on
    wait_for(lambda: label_counts(kube)["degraded"] == 40, timeout=60, what="40 degraded")
    assert not tainted(kube) and label_counts(kube)["unhealthy"] == 0
    usable = condition(kube, "Usable")
    assert usable["status"] == "True" and usable["reason"] == "CapacityAvailable"
    assert status(kube)["nodes"]["failing"] == 0 and status(kube)["nodes"]["warning"] == 40
    response = admitted(kube, MUTATE_PODS, pod("restart"))
    assert "schedulingGates" not in response["spec"]
    (event,) = wait_for(lambda: events(kube, "RetriesAttributed"), timeout=30,
                        what="a RetriesAttributed Event")  # fmt: skip
    assert event["type"] == "Warning" and culprit in event["message"]


# -- a tripped breaker does not stop the cluster ---------------------------------------------------


def test_thirty_percent_failing_at_once_admit_then_hold(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path,
    procs: list[OperatorProc], stack: contextlib.ExitStack,  # noqa: F811
) -> None:  # fmt: skip
    nodes = fleet(kube, 100)
    bad = set(nodes[::10]) | set(nodes[1::10]) | set(nodes[2::10])
    assert len(bad) == 30
    kube.create(fleet_validation(taint=True))
    proc = start_operator(kube, mosquitto_broker, tmp_path, kueue=False)
    procs.append(proc)
    wait_webhook(kube, proc)
    agents = stack.enter_context(Agents([mosquitto_broker], period=2.0))
    agents.set([n for n in nodes if n not in bad], Status.PASS)
    agents.set(bad, Status.FAIL)
    agents.start()

    def settled() -> bool:
        counts = label_counts(kube)
        return counts == {"healthy": 70, "unhealthy": 10, "suspect": 20}

    wait_for(settled, timeout=120, interval=1.0, what=f"10 unhealthy, 20 suspect\n"
             f"{proc.log()[-3000:]}")  # fmt: skip
    cut = tainted(kube)
    assert len(cut) == 10 and cut <= bad  # at most the cap tainted
    assert {n for n, (label, _) in fabric(kube).items() if label == "unhealthy"} == cut
    usable = condition(kube, "Usable")
    assert (usable["status"], usable["reason"]) == ("True", "AdmittingPastBreaker")
    gate = condition(kube, "Gating")
    assert gate["reason"] == "BreakerTripped"
    assert "admission goes on (onBreakerTripped: admit)" in gate["message"]
    (event,) = wait_for(lambda: events(kube, "BreakerTripped"), timeout=30, what="the Event")
    assert event["type"] == "Warning" and "onBreakerTripped: admit" in event["message"]
    assert 'netval_operator_breaker_tripped{action="admit",validation="pool-a"} 1.0' in (
        metrics(proc)
    )
    # an annotated Pod is admitted at once, with the affinity that keeps it off the tainted
    # (unhealthy-labelled) nodes
    pod_spec = admitted(kube, MUTATE_PODS, pod("trainer"))["spec"]
    assert "schedulingGates" not in pod_spec
    assert AFFINITY in required_terms(pod_spec)[0]["matchExpressions"]

    # onBreakerTripped: hold: the same failures hold admission
    kube.patch(NV, "networkvalidations", "pool-a",
               {"spec": {"gating": {"onBreakerTripped": "hold"}}})  # fmt: skip
    wait_for(lambda: condition(kube, "Usable").get("reason") == "TooManyFailing", timeout=60,
             what="Usable False TooManyFailing")  # fmt: skip
    held = admitted(kube, MUTATE_PODS, pod("trainer-2"))["spec"]
    assert held["schedulingGates"] == [{"name": SchedulingGate.FABRIC}]
    assert tainted(kube) == cut  # the exclusions themselves do not change


# -- exclusions first --------------------------------------------------------------------------------


def test_a_node_failing_during_a_relabel_of_2000_is_labelled_first(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path,
    procs: list[OperatorProc], stack: contextlib.ExitStack,  # noqa: F811
) -> None:  # fmt: skip
    """2,000 unlabelled nodes targeted at once: 2,000 writes of `unknown` at 5 Node writes a
    second (400 s). A node that fails a few seconds in is labelled unhealthy (and tainted)
    while most of the relabel still waits."""
    kube.api.keep_requests = 10  # the test API's request log would hold every write
    nodes = fleet(kube, 2000)
    env = {"NETVAL_NODE_WRITES_PER_SECOND": "5", "NETVAL_NODE_WRITE_BURST": "1"}
    kube.create(fleet_validation(taint=True))
    proc = start_operator(kube, mosquitto_broker, tmp_path, env, kueue=False)
    procs.append(proc)
    wait_for(lambda: label_counts(kube)["unknown"] >= 10, timeout=120, interval=1.0,
             what=f"the relabel started\n{proc.log()[-3000:]}")  # fmt: skip
    agents = stack.enter_context(Agents([mosquitto_broker]))
    late = nodes[-1]  # last in the relabel's order
    agents.publish(node_report(late, Status.FAIL))
    wait_for(lambda: fabric(kube)[late] == ("unhealthy", True), timeout=60, interval=0.5,
             what="the failing node labelled and tainted")  # fmt: skip
    done = label_counts(kube)["unknown"]
    assert done < 1000, f"{done} of 2,000 relabelled first: the exclusion waited behind them"
    # every other node still gets its label, at the rate
    wait_for(lambda: "netval_operator_exclusions_pending 0.0" in metrics(proc), timeout=30,
             what="no exclusion pending")  # fmt: skip


# -- two brokers: the reconnect grace is per shard ------------------------------------------------


def stale_in_ready(kube: KubeCluster) -> str:
    ready = condition(kube, "Ready")
    return ready.get("message", "") if ready.get("reason") == "NodesStale" else ""


def test_two_brokers_one_reconnecting_moves_only_its_nodes_clock(
    kube: KubeCluster, brokers: list[MosquittoBroker], tmp_path: Path,  # noqa: F811
    procs: list[OperatorProc], stack: contextlib.ExitStack,  # noqa: F811
) -> None:  # fmt: skip
    names = [f"gpu-{i:02d}" for i in range(40)]
    on = {s: [n for n in names if shard_of(n, 2) == s] for s in (0, 1)}
    a0, z0 = on[0][:2]  # shard 0: reports again after the restart / stays silent
    s1, moved = on[1][:2]  # shard 1: silent / reports (and left an `offline` on shard 0)
    add_nodes(kube, [(n, {FLEET: "a"}) for n in (a0, z0, s1, moved)])
    kube.ensure_namespace("netval-system")
    agents = stack.enter_context(Agents(brokers, period=2.0))
    # what `moved`'s agent left on shard 0 before the shards were two: its last will
    agents.publish_raw(0, f"netval/v1/pool-a/{moved}/state", b"offline")
    kube.create(fleet_validation())
    env = shard_env(brokers, tmp_path)
    proc = start_operator(kube, brokers[0], tmp_path, env, kueue=False)
    procs.append(proc)
    agents.set([moved], Status.PASS)
    agents.start()

    def four_reporting() -> bool:
        # a0, z0 and s1 report until the operator has heard them all (a loaded machine may
        # start it later than their 3 intervals), then fall silent
        for node in (a0, z0, s1):
            agents.publish(node_report(node, Status.PASS))
        return bool(status(kube).get("nodes", {}).get("reporting") == 4)

    wait_for(four_reporting, timeout=90, interval=1.0, what="4 nodes reporting")
    # the old shard's `offline` did not mark `moved` offline; it was counted and cleared
    wrong = 'netval_operator_messages_dropped_total{reason="wrong_shard"} 1.0'
    wait_for(lambda: wrong in metrics(proc), timeout=30, what=wrong)
    wait_for(lambda: moved not in asyncio.run(retained_on(brokers[0], TopicKind.STATE)),
             timeout=30, what="the stale offline cleared on shard 0")  # fmt: skip

    # shard 0's broker restarts (no persistence): the operator's session on it reconnects
    sigkill(brokers[0])
    brokers[0].start()

    def back_on_shard_0() -> bool:
        # reconnected at least once: an attempt made before the broker listened again is
        # counted too (the operator's own sessions try again at once)
        text = metrics(proc)
        found = re.search(r"^netval_operator_mqtt_reconnects_total (\S+)$", text, re.M)
        return ('netval_operator_mqtt_shard_connected{shard="0"} 1.0' in text
                and found is not None and float(found.group(1)) >= 1)  # fmt: skip

    wait_for(back_on_shard_0, timeout=60, what="the operator back on shard 0")
    agents.reconnect(0)
    agents.publish(node_report(a0, Status.PASS))  # heard after the reconnect, then silent

    # shard 1's silent node turns stale by the normal rule (3 intervals after its report),
    # while z0, as old but on the reconnected shard, is within its grace (30 s more)
    text = wait_for(lambda: (m := stale_in_ready(kube)) and f"{s1} (" in m and m, timeout=60,
                    what=f"{s1} stale")  # fmt: skip
    assert f"{z0} (" not in text and moved not in text
    # a0 was heard after the reconnect: its grace ended then, it is stale by the normal rule
    text = wait_for(lambda: (m := stale_in_ready(kube)) and f"{a0} (" in m and m, timeout=60,
                    what=f"{a0} stale")  # fmt: skip
    assert f"{z0} (" not in text, f"{z0} stale before its grace ended: {text}"
    # z0's grace ends too: stale once 3 intervals passed since reconnect + 30 s
    wait_for(lambda: f"{z0} (" in stale_in_ready(kube), timeout=90, what=f"{z0} stale")
    assert moved not in stale_in_ready(kube)
