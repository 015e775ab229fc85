"""The real `netval operator` process (its flags and env, a real broker, the test API): it
handles a NetworkValidation with and without --standalone, with and without Kopf's peering
CRD and object in the cluster; its start-up is transactional (a taken port starts nothing)."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import kopf
import pytest

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.operator.term_startup import start_runtime, started_runtime, stop_runtime
from operator_env import (
    NS,
    condition,
    publish,
    report,
    report_msg,
    settings_for,
    status_of,
    validation,
)
from operator_processes import (
    FAST_LEASE,
    OperatorProc,
    mqtt_connections,
    status_writes,
    writes,
)
from tls_certs import key_pem, make_ca

PEERING_KEYS = ("kopf.dev/v1/clusterkopfpeerings", "kopf.dev/v1/kopfpeerings")


def _remove_peering_crd(kube: KubeCluster) -> None:
    async def remove() -> None:
        for key in PEERING_KEYS:
            kube.api.resources.pop(key, None)

    kube.call(remove)


@pytest.fixture
def procs() -> Iterator[list[OperatorProc]]:
    started: list[OperatorProc] = []
    yield started
    for proc in started:
        proc.terminate()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize(
    ("standalone", "peering"),
    [(True, "no-crd"), (True, "object"), (False, "no-crd"), (False, "object")],
)
def test_operator_process_handles_a_validation(
    standalone: bool, peering: str, cluster: KubeCluster, mosquitto_broker: MosquittoBroker,
    procs: list[OperatorProc], tmp_path: Path,
) -> None:  # fmt: skip
    if peering == "no-crd":
        _remove_peering_crd(cluster)
    else:
        cluster.create({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                        "metadata": {"name": "netval"}})  # fmt: skip
    proc = OperatorProc(cluster, mosquitto_broker, tmp_path, "op-a", standalone=standalone,
                        env=FAST_LEASE).start()  # fmt: skip
    procs.append(proc)
    cluster.create(validation())
    wait_for(lambda: condition(status_of(cluster), "Ready"), timeout=60,
             what=f"a Ready condition written\n{proc.log()[-3000:]}")  # fmt: skip
    wait_for(lambda: cluster.stored("apps/v1", "daemonsets", "netval-agent-pool-a", NS),
             timeout=30, what="the agent DaemonSet applied")  # fmt: skip

    publish(mosquitto_broker, [report_msg(report("gpu-a", Status.FAIL))])
    wait_for(lambda: status_of(cluster).get("nodes", {}).get("failing") == 1, timeout=30,
             what=f"the MQTT report folded into status\n{proc.log()[-3000:]}")  # fmt: skip

    code, text = _get(f"http://127.0.0.1:{proc.metrics_port}/metrics")
    assert code == 200 and "netval_operator_reports_received_total 1.0" in text
    assert "netval_operator_leader 1.0" in text
    assert _get(f"http://127.0.0.1:{proc.liveness_port}/healthz")[0] == 200
    if not standalone:
        lease = cluster.get("coordination.k8s.io/v1", "leases", "netval-operator", "netval-system")
        assert lease["spec"]["holderIdentity"].startswith(socket.gethostname())
    # nothing of Kopf's peering is written, whichever mode
    assert not [w for w in writes(cluster) if "kopfpeerings" in w[3] and w[1] == "op-a"]

    assert proc.terminate() == 0
    if not standalone:  # released on a clean stop: the next replica need not wait
        lease = cluster.get("coordination.k8s.io/v1", "leases", "netval-operator", "netval-system")
        assert lease["spec"]["holderIdentity"] == ""


def test_metrics_port_taken_exits_2_and_starts_nothing(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = OperatorProc(cluster, mosquitto_broker, tmp_path, "op-a", standalone=True,
                            metrics_port=port).start()  # fmt: skip
        cluster.create(validation())
        assert proc.proc is not None
        assert proc.proc.wait(60) == 2
    log = proc.log()
    assert f"--metrics-addr 127.0.0.1:{port}" in log and "Traceback" not in log
    assert mqtt_connections(mosquitto_broker) == 0  # no ingest was started
    assert status_writes(cluster) == []
    assert not [w for w in writes(cluster, leases=True) if w[1] == "op-a"]  # nothing written


def test_enrollment_port_taken_exits_2_before_leading(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """Every replica serves enrollment from the start: a taken port ends the process before
    it takes the Lease, in one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # enrollment signs with the identity CA, and client certificates need mqtts://
        ca = make_ca(tmp_path, "identity-ca")
        key = tmp_path / "identity-ca.key"
        key.write_bytes(key_pem(ca.key))
        env = {"NETVAL_ENROLL_ADDR": f"127.0.0.1:{port}",
               "NETVAL_MQTT_URL": f"mqtts://127.0.0.1:{mosquitto_broker.port}",
               "NETVAL_MQTT_CA_FILE": str(ca.cert_file), "NETVAL_MQTT_USERNAME": "",
               "NETVAL_MQTT_PASSWORD_FILE": "", "NETVAL_IDENTITY_CA_FILE": str(ca.cert_file),
               "NETVAL_IDENTITY_CA_KEY_FILE": str(key)}  # fmt: skip
        proc = OperatorProc(cluster, mosquitto_broker, tmp_path, "op-a", env=env).start()
        assert proc.proc is not None
        assert proc.proc.wait(60) == 2
    log = proc.log()
    assert f"NETVAL_ENROLL_ADDR 127.0.0.1:{port}" in log and "Traceback" not in log
    assert not [w for w in writes(cluster, leases=True) if w[1] == "op-a"]  # no Lease taken


def test_startup_retry_never_doubles_the_ingest(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker
) -> None:
    """Kopf retries a failed start-up activity: the failed attempt left nothing running
    (no MQTT session), and a second start of a started runtime starts nothing."""

    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            memo = kopf.Memo(settings=settings_for(mosquitto_broker),
                             metrics_addr=taken.getsockname())  # fmt: skip
            with pytest.raises(OSError):
                await start_runtime(memo)
            assert started_runtime(memo) is None
            leaked = [t for t in asyncio.all_tasks() if t.get_name().startswith("netval-")]
            assert leaked == []  # no ingest, status writer or gating task was left running
            assert mqtt_connections(mosquitto_broker) == 0
        memo["metrics_addr"] = ("127.0.0.1", 0)
        await start_runtime(memo)  # Kopf's retry
        runtime = started_runtime(memo)
        assert runtime is not None
        await start_runtime(memo)  # and once more: the same runtime, no second ingest
        assert started_runtime(memo) is runtime
        async with asyncio.timeout(30):
            await runtime.ingest.synced.wait()
        assert len([t for t in asyncio.all_tasks() if t.get_name() == "netval-ingest"]) == 1
        assert mqtt_connections(mosquitto_broker) == 1
        await stop_runtime(memo)
        await stop_runtime(memo)  # idempotent

    asyncio.run(main())
    assert "already connected, closing old connection" not in mosquitto_broker.log_file.read_text()
