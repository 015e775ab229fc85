"""Gate the NIC, not the node (issue 30), through the real `netval operator` process, a real
Mosquitto broker and simulated agents (tests/fleet_sim.py) on GPU nodes of 8 NICs each,
against the test API serving `resource.k8s.io` (tests/dra_kit.py: the upstream schemas of
ResourceSlice and DeviceTaintRule) or not:

- one failing NIC: exactly one DeviceTaintRule selecting that device (valid by the upstream
  schema), the node labelled degraded and not tainted, its condition False DevicesFailing;
  two failing NICs: the node-level path (tainted, unhealthy, no rule); a warning NIC: no
  rule, the node degraded and True; recovery: the rule deleted after recoveryReports;
- the NetworkFabricReady condition on every node: True, False, Unknown (silent), each
  with its reason, and no nodes/status write while nothing changes;
- uninstall removes the rules and the conditions;
- a cluster without the DRA API: node-level gating as before, one Event, a bounded
  number of requests; a cluster serving only v1beta2 gets its rules in v1beta2.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mosquitto
from dra_kit import (
    add_slices,
    node_condition,
    node_status_writes,
    rail_report,
    rail_slice,
    requests_to,
    rules,
    serve_dra,
    validate_rule,
)
from fleet_sim import Agents, add_nodes
from kube import KubeCluster, kubeconfig_env, wait_for
from mosquitto import MosquittoBroker
from operator_processes import OperatorProc
from test_operator_process import procs  # noqa: F401 (a fixture)
from verdict_process_kit import FLEET, events, fabric, metrics, status

pytestmark = pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)

NODES = [f"gpu-{i:02d}" for i in range(12)]
DEVICE_ENV = {"NETVAL_DEVICE_TAINTS": "true"}


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as opened:
        yield opened


def validation(**gating: Any) -> dict[str, Any]:
    return {
        "apiVersion": "netval.io/v1alpha1",
        "kind": "NetworkValidation",
        "metadata": {"name": "pool-a"},
        "spec": {"nodeSelector": {FLEET: "a"}, "interval": "5s",
                 "gating": {"taint": True, "maxUnhealthyPercent": 50, **gating}},
    }  # fmt: skip


def fleet(kube: KubeCluster) -> None:
    add_nodes(kube, [(n, {FLEET: "a"}) for n in NODES])
    kube.ensure_namespace("netval-system")


def agents_for(stack: contextlib.ExitStack, broker: MosquittoBroker) -> Agents:
    agents = stack.enter_context(Agents([broker], period=1.0))
    for node in NODES:
        agents.reports[node] = lambda n=node: rail_report(n)
    return agents.start()


def set_nics(agents: Agents, node: str, failing: tuple[int, ...] = (),
             warning: tuple[int, ...] = ()) -> None:  # fmt: skip
    agents.reports[node] = lambda: rail_report(node, failing=failing, warning=warning)


def condition_writes(proc: OperatorProc) -> int:
    line = next(x for x in metrics(proc).splitlines()
                if x.startswith("netval_operator_node_condition_writes_total "))  # fmt: skip
    return int(float(line.split()[1]))


def condition(kube: KubeCluster, node: str) -> tuple[str, str]:
    found = node_condition(kube, node) or {}
    return found.get("status", "-"), found.get("reason", "-")


def start(kube: KubeCluster, broker: MosquittoBroker, tmp_path: Path,
          env: dict[str, str] | None = None) -> OperatorProc:  # fmt: skip
    return OperatorProc(kube, broker, tmp_path, "op", standalone=True, env=env).start()


def test_one_failing_nic_is_tainted_as_its_device_not_the_node(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path,
    procs: list[OperatorProc], stack: contextlib.ExitStack,  # noqa: F811
) -> None:  # fmt: skip
    fleet(kube)
    serve_dra(kube, ("v1",))
    add_slices(kube, [rail_slice(n) for n in NODES])
    kube.create(validation(deviceTaints=True, maxFailedDevicesPerNode=1, recoveryReports=2))
    proc = start(kube, mosquitto_broker, tmp_path, DEVICE_ENV)
    procs.append(proc)
    agents = agents_for(stack, mosquitto_broker)

    # every node reports passing: NetworkFabricReady True on each, then no write at all
    wait_for(lambda: all(condition(kube, n) == ("True", "ChecksPassing") for n in NODES),
             timeout=90, interval=1.0, what=f"True everywhere\n{proc.log()[-3000:]}")  # fmt: skip
    assert node_condition(kube, NODES[0])["message"] == "pool-a: fabric checks passing"
    settled = node_status_writes(kube)
    # one write per node, at its first verdict (a request the API refused with a 409, a label
    # write landing between the read and the write, is read again and sent once more)
    assert condition_writes(proc) == len(NODES)
    time.sleep(6)  # several status windows and agent rounds: nothing to write
    assert node_status_writes(kube) == settled

    one, two, warn = "gpu-03", "gpu-04", "gpu-05"
    set_nics(agents, one, failing=(3,))
    set_nics(agents, two, failing=(2, 6))
    set_nics(agents, warn, warning=(5,))

    def gated() -> bool:
        f = fabric(kube)
        return (f[one] == ("degraded", False) and f[two] == ("unhealthy", True)
                and f[warn] == ("degraded", False) and len(rules(kube)) == 1)  # fmt: skip

    wait_for(gated, timeout=90, interval=1.0, what=f"one rule\n{proc.log()[-3000:]}")
    (rule,) = rules(kube)
    validate_rule(rule, "v1")
    assert rule["spec"]["deviceSelector"] == {"driver": "dra.net", "pool": one,
                                               "device": "pci-0000-1b-00-0"}  # fmt: skip
    assert rule["spec"]["taint"] == {"key": "netval.io/fabric-unhealthy", "value": "true",
                                     "effect": "NoSchedule"}  # fmt: skip
    owner = rule["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("NetworkValidation", "pool-a")
    wait_for(lambda: condition(kube, one) == ("False", "DevicesFailing")
             and condition(kube, two) == ("False", "ChecksFailing")
             and condition(kube, warn) == ("True", "ChecksWarning"), timeout=60,
             what="the conditions")  # fmt: skip
    assert "mlx5_3 0000:1b:00.0: rdma.port_state" in node_condition(kube, one)["message"]
    assert "rdma.port_state on mlx5_2/1, mlx5_6/1" in node_condition(kube, two)["message"]
    nics = status(kube)["nics"]
    assert (nics["failing"], nics["warning"], nics["tainted"], nics["deviceTaints"]) == (
        3,
        1,
        1,
        "Active",
    )
    assert nics["total"] == 8 * len(NODES)
    assert {(e["node"], e["device"], e["state"], e["tainted"]) for e in nics["entries"]} == {
        (one, "mlx5_3", "failing", True), (two, "mlx5_2", "failing", False),
        (two, "mlx5_6", "failing", False), (warn, "mlx5_5", "warning", False)}  # fmt: skip
    assert status(kube)["nodes"]["excluded"] == 1  # gpu-04 only: gpu-03 still admits work

    # a silent node: Unknown once its reports are 3 intervals old
    silent = "gpu-07"
    agents.set([silent], None)
    wait_for(lambda: condition(kube, silent) == ("Unknown", "Silent"), timeout=60,
             interval=1.0, what="Unknown for the silent node")  # fmt: skip

    # the NIC recovers: its rule goes after recoveryReports (2) passing reports
    set_nics(agents, one)
    wait_for(lambda: not rules(kube) and fabric(kube)[one] == ("healthy", False)
             and condition(kube, one) == ("True", "ChecksPassing"), timeout=60,
             interval=0.5, what=f"rule lifted\n{proc.log()[-2000:]}")  # fmt: skip

    # uninstall: the operator stops first, then the clean-up removes rules and conditions
    set_nics(agents, one, failing=(1,))
    wait_for(lambda: len(rules(kube)) == 1, timeout=60, what="a rule again")
    agents.close()
    proc.terminate()
    with kubeconfig_env(kube.kubeconfig_path):
        done = subprocess.run(
            [sys.executable, "-m", "netval.cli", "uninstall-cleanup", "--device-taint-rules"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "deleted 1 DeviceTaintRules" in done.stdout + done.stderr
    assert not rules(kube)
    assert all(node_condition(kube, n) is None for n in NODES)
    assert [c["type"] for c in kube.get("v1", "Node", NODES[0])["status"].get("conditions", [])
            ] == []  # fmt: skip


def test_without_the_dra_api_failing_nics_gate_their_node_as_before(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path,
    procs: list[OperatorProc], stack: contextlib.ExitStack,  # noqa: F811
) -> None:  # fmt: skip
    fleet(kube)  # the test API serves no resource.k8s.io
    kube.create(validation(deviceTaints=True, maxFailedDevicesPerNode=1))
    proc = start(kube, mosquitto_broker, tmp_path, DEVICE_ENV)
    procs.append(proc)
    agents = agents_for(stack, mosquitto_broker)
    set_nics(agents, "gpu-03", failing=(3,))
    wait_for(lambda: fabric(kube)["gpu-03"] == ("unhealthy", True), timeout=90, interval=1.0,
             what=f"node-level gating\n{proc.log()[-3000:]}")  # fmt: skip
    assert condition(kube, "gpu-03") == ("False", "ChecksFailing")
    wait_for(lambda: events(kube, "DeviceTaintsUnavailable"), timeout=30, what="the Event")
    discovered = requests_to(kube, "/apis/resource.k8s.io")
    time.sleep(10)  # many gating rounds later: no request loop
    assert requests_to(kube, "/apis/resource.k8s.io") == discovered <= 3
    (event,) = events(kube, "DeviceTaintsUnavailable")
    assert "serves no DeviceTaintRule API" in event["message"]
    nics = status(kube)["nics"]
    assert nics["deviceTaints"] == "Unavailable" and nics["tainted"] == 0


def test_a_cluster_serving_v1beta2_gets_its_rules_in_v1beta2(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path,
    procs: list[OperatorProc], stack: contextlib.ExitStack,  # noqa: F811
) -> None:  # fmt: skip
    fleet(kube)
    serve_dra(kube, ("v1beta2",))  # Kubernetes 1.36
    add_slices(kube, [rail_slice(n, version="v1beta2") for n in NODES], version="v1beta2")
    kube.create(validation(deviceTaints=True, maxFailedDevicesPerNode=2, nodeCondition=False))
    proc = start(kube, mosquitto_broker, tmp_path, DEVICE_ENV)
    procs.append(proc)
    agents = agents_for(stack, mosquitto_broker)
    set_nics(agents, "gpu-09", failing=(0, 7))
    wait_for(lambda: len(rules(kube, "v1beta2")) == 2, timeout=90, interval=1.0,
             what=f"two rules in v1beta2\n{proc.log()[-3000:]}")  # fmt: skip
    for rule in rules(kube, "v1beta2"):
        validate_rule(rule, "v1beta2")
    assert {r["spec"]["deviceSelector"]["device"] for r in rules(kube, "v1beta2")} == {
        "pci-0000-18-00-0",
        "pci-0000-1f-00-0",
    }
    assert fabric(kube)["gpu-09"] == ("degraded", False)
    assert node_condition(kube, "gpu-09") is None  # gating.nodeCondition: false
