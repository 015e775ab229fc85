"""perftest's privileges go to the agents of validations with an RDMA load test, and only
to them: which tests are (pure), what their pods get (the rendered DaemonSet), and the
operator rendering them again when a test comes or goes (Kopf in process, the kmock API).
The agent finds the privileged perftest copies only through the engine path those pods
carry."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.agent.loadtest.engines import ENV_ENGINE_PATH, find_binary
from netval.model.loadtest import NetworkLoadTestSpec
from netval.model.spec import NetworkValidationSpec
from netval.operator.agents.agent_pod import ENGINE_PATH, RDMA_ENGINE_DIR
from netval.operator.agents.rollout import render_agents
from netval.operator.loadtest.privileges import RdmaLoadTests, needs_rdma
from operator_env import NS, NV, settings_for

ROCE = NetworkValidationSpec.model_validate({"checks": {"peers": {"enabled": True}}})
EFA = NetworkValidationSpec.model_validate(
    {"checks": {"peers": {"enabled": True}, "rdma": {"linkLayer": "EFA"}}}
)
OWNER = {"apiVersion": NV, "kind": "NetworkValidation",
         "metadata": {"name": "pool", "uid": "u-1", "generation": 1}}  # fmt: skip


def test_which_load_tests_need_rdma() -> None:
    def spec(**kw: Any) -> NetworkLoadTestSpec:
        return NetworkLoadTestSpec.model_validate({"validation": "pool", **kw})

    assert needs_rdma(spec(), ROCE)  # auto on RoCE ports: perftest
    assert needs_rdma(spec(eastWest={"engine": "perftest"}), EFA)
    assert not needs_rdma(spec(eastWest={"engine": "iperf3"}), ROCE)
    assert not needs_rdma(spec(), EFA)  # auto on EFA: no RoCE/IB port, iperf3
    assert not needs_rdma(spec(phases=["storage"]), ROCE)
    assert not needs_rdma(spec(), None)
    registry = RdmaLoadTests()
    registry.note("a", {"validation": "pool"})
    registry.note("b", {"validation": "tcp-only", "eastWest": {"engine": "iperf3"}})
    registry.note("bad", {"validation": "pool", "duration": "nope"})
    assert registry.validations({"pool": ROCE, "tcp-only": ROCE}) == {"pool"}
    registry.forget("a")
    assert registry.validations({"pool": ROCE, "tcp-only": ROCE}) == set()


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = ds["spec"]["template"]["spec"]["containers"][0]
    return container


def test_only_rdma_agents_get_the_devices_ipc_lock_and_the_engine_path() -> None:
    broker = SimpleNamespace(host="broker", port=1883, username="u", password="p")
    settings = settings_for(broker)  # type: ignore[arg-type]
    _cm, plain = render_agents(settings, OWNER, 1, ROCE)
    c = _container(plain)
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert ENV_ENGINE_PATH not in {e["name"] for e in c["env"]}
    assert "/dev/infiniband" not in {m["mountPath"] for m in c["volumeMounts"]}

    _cm, rdma = render_agents(settings, OWNER, 1, ROCE, rdma=True)
    c = _container(rdma)
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is True  # file capabilities
    assert c["securityContext"]["runAsNonRoot"] is True
    assert {"name": ENV_ENGINE_PATH, "value": ENGINE_PATH} in c["env"]
    assert ENGINE_PATH.split(":")[0] == RDMA_ENGINE_DIR
    assert {"name": "infiniband", "mountPath": "/dev/infiniband"} in c["volumeMounts"]
    volumes = {v["name"]: v for v in rdma["spec"]["template"]["spec"]["volumes"]}
    assert volumes["infiniband"]["hostPath"] == {"path": "/dev/infiniband", "type": "Directory"}

    # with a device plugin, its resource brings the devices: no host path
    with_plugin = dataclasses.replace(settings, agent_rdma_resource="rdma/rdma_shared_device_a")
    _cm, ds = render_agents(with_plugin, OWNER, 1, ROCE, rdma=True)
    c = _container(ds)
    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert c["resources"]["requests"]["rdma/rdma_shared_device_a"] == "1"
    assert "infiniband" not in {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    _cm, ds = render_agents(with_plugin, OWNER, 1, ROCE)
    assert "rdma/rdma_shared_device_a" not in _container(ds)["resources"].get("limits", {})


def test_the_agent_looks_for_engines_on_its_pod_s_engine_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    privileged = tmp_path / "rdma-bin"
    privileged.mkdir()
    (privileged / "ib_write_bw").write_text("#!/bin/sh\n")
    (privileged / "ib_write_bw").chmod(0o755)
    assert find_binary("ib_write_bw") == "/usr/bin/ib_write_bw"  # the Debian package's
    monkeypatch.setenv(ENV_ENGINE_PATH, f"{privileged}:/usr/bin")
    assert find_binary("ib_write_bw") == str(privileged / "ib_write_bw")


def _daemonset(cluster: KubeCluster) -> dict[str, Any] | None:
    for ds in cluster.list("apps/v1", "daemonsets", NS):
        if ds["metadata"]["name"].endswith("pool"):
            return ds
    return None


def _has_ipc_lock(cluster: KubeCluster) -> bool | None:
    ds = _daemonset(cluster)
    if ds is None:
        return None
    caps = _container(ds)["securityContext"]["capabilities"]
    return "IPC_LOCK" in caps.get("add", [])


def test_the_operator_renders_the_agents_again_when_an_rdma_load_test_comes_and_goes(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    memo = kopf.Memo(settings=settings_for(mosquitto_broker))
    with kopf_operator(cluster, modules=["netval.operator.handlers"], memo=memo):
        cluster.create({**OWNER, "metadata": {"name": "pool"},
                        "spec": {"checks": {"peers": {"enabled": True}}}})  # fmt: skip
        wait_for(lambda: _has_ipc_lock(cluster) is False, timeout=30, what="plain agents")
        tcp = {"apiVersion": NV, "kind": "NetworkLoadTest", "metadata": {"name": "tcp"},
               "spec": {"validation": "pool", "schedule": "0 0 1 1 *",
                        "eastWest": {"engine": "iperf3"}}}  # fmt: skip
        cluster.create(tcp)
        rdma = {"apiVersion": NV, "kind": "NetworkLoadTest", "metadata": {"name": "roce"},
                "spec": {"validation": "pool", "schedule": "0 0 1 1 *"}}  # fmt: skip
        runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="runtime")
        wait_for(lambda: "tcp" in runtime.loadtests.tests, timeout=30, what="tcp test seen")
        assert _has_ipc_lock(cluster) is False  # an iperf3 test needs nothing
        cluster.create(rdma)
        wait_for(lambda: _has_ipc_lock(cluster) is True, timeout=30,
                 what="the agents rendered with perftest's privileges")  # fmt: skip
        cluster.delete(NV, "networkloadtests", "roce")
        wait_for(lambda: _has_ipc_lock(cluster) is False, timeout=30,
                 what="the privileges gone with the last RDMA load test")  # fmt: skip
    # the next term lists the tests before it renders: the RDMA agents keep their pods
    cluster.create(rdma)
    memo = kopf.Memo(settings=settings_for(mosquitto_broker))
    with kopf_operator(cluster, modules=["netval.operator.handlers"], memo=memo):
        runtime = wait_for(lambda: memo.get("runtime"), timeout=30, what="runtime")
        wait_for(lambda: runtime._rdma_listed, timeout=30, what="the tests listed")
        wait_for(lambda: _has_ipc_lock(cluster) is True, timeout=30, what="still privileged")
