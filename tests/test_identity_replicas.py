"""Enrollment on two real `netval operator` replicas (the chart's two, behind one Service
that routes an agent to either): the standby issues credentials as the leader does, the
leader alone writes the agents' CA ConfigMap and runs the broker ACL check, and after a
SIGKILL of the leader the new one takes the leader's duties on its running service: a Node
deleted while nobody led loses its identity as the new term starts.

The broker is the chart's Mosquitto with dynamic security (tests/test_chart_broker.py); the
test API answers TokenReview as an apiserver does (tests/test_enrollment.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from identity_kit import Mqtt, agent_pod
from kube import KubeCluster, wait_for
from mosquitto import free_port
from netval.operator.kube import certs
from operator_env import GPU, NS, add_node
from operator_processes import FAST_LEASE, OperatorProc, writes
from test_chart_broker import plaintext_listener, run_chart_broker
from test_enrollment import Claims, TokenAuthority

CA_CONFIGMAP = "netval-enroll-ca"
# The defaults' 15 s lease: after the SIGKILL nobody leads for ~14 s, ample time to delete a
# Node unseen on a loaded machine; a fast retry so the standby takes over soon after.
LEASE = {**FAST_LEASE, "NETVAL_LEASE_DURATION_SECONDS": "15",
         "NETVAL_LEASE_RENEW_DEADLINE_SECONDS": "10"}  # fmt: skip
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


@dataclass
class ChartBrokerLogin:
    port: int
    password: str
    host: str = "127.0.0.1"
    username: str = "netval-operator"


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _metrics(proc: OperatorProc) -> str:
    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _enroll(port: int, token: str, context: ssl.SSLContext) -> dict[str, Any]:
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/v1/enroll", data=b"", method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, context=context, timeout=20) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def test_a_standby_enrolls_agents_and_a_new_leader_takes_the_duties(
    tmp_path: Path, kube: KubeCluster
) -> None:
    kube.ensure_namespace(NS)
    for node in ("gpu-a", "gpu-b"):
        add_node(kube, node, GPU)
    authority = TokenAuthority()
    kube.api.token_reviewer = authority.review
    # One certificate for both replicas, as the chart mounts one Secret into each.
    tls = certs.generate_self_signed(tmp_path / "enroll-tls", ["127.0.0.1"])
    context = ssl.create_default_context(cafile=str(tls.ca))
    (tmp_path / "broker").mkdir()
    with run_chart_broker(tmp_path / "broker", plaintext_listener) as (port, secrets):
        login = ChartBrokerLogin(port, secrets["operator"])
        procs: dict[str, OperatorProc] = {}
        enroll_ports: dict[str, int] = {}
        for token in ("op-a", "op-b"):
            enroll_ports[token] = free_port()
            env = {
                **LEASE,
                "NETVAL_ENROLL_ADDR": f"127.0.0.1:{enroll_ports[token]}",
                "NETVAL_ENROLL_CERT_FILE": str(tls.cert),
                "NETVAL_ENROLL_KEY_FILE": str(tls.key),
                "NETVAL_ENROLL_CA_BUNDLE_FILE": str(tls.ca),
                "NETVAL_AGENT_ENROLL_URL": "https://netval-webhook.netval-system.svc:9444/v1/enroll",
                "NETVAL_AGENT_ENROLL_CA_CONFIGMAP": CA_CONFIGMAP,
            }
            procs[token] = OperatorProc(kube, login, tmp_path / "ops", token, env=env)
        try:
            for proc in procs.values():
                proc.start()

            def roles() -> tuple[str, str] | None:
                leading = [
                    t for t, p in procs.items() if "netval_operator_leader 1.0" in _safe_metrics(p)
                ]
                standing = [
                    t for t, p in procs.items() if "standing by: the Lease is held by" in p.log()
                ]
                if len(leading) == 1 and len(standing) == 1 and leading != standing:
                    return leading[0], standing[0]
                return None

            leader, standby = wait_for(roles, 60, what="one leader and one standby")
            wait_for(
                lambda: _listening(enroll_ports[standby]), 30, what="the standby's enrollment port"
            )
            wait_for(lambda: kube.get("v1", "ConfigMap", CA_CONFIGMAP, namespace=NS), 30,
                     what="the enrollment CA ConfigMap")  # fmt: skip

            pods = {}
            for node in ("gpu-a", "gpu-b"):
                pods[node] = agent_pod(kube, f"agent-{node}", node, NS)
            tokens = {
                node: authority.mint(Claims(f"agent-{node}", pod["metadata"]["uid"], node))
                for node, pod in pods.items()
            }
            # gpu-a through the standby, gpu-b through the leader: both work on the broker.
            creds = {
                "gpu-a": _enroll(enroll_ports[standby], tokens["gpu-a"], context),
                "gpu-b": _enroll(enroll_ports[leader], tokens["gpu-b"], context),
            }
            assert creds["gpu-a"]["node"] == "gpu-a" and creds["gpu-b"]["node"] == "gpu-b"
            clients = {
                node: Mqtt(port, c["username"], c["password"], client_id=c["clientId"])
                for node, c in creds.items()
            }
            try:
                for client in clients.values():
                    assert not client.connect().is_failure
                # The standby names the node by the token's pod, as the leader does.
                forged = urllib.request.Request(
                    f"https://127.0.0.1:{enroll_ports[standby]}/v1/enroll",
                    data=json.dumps({"node": "gpu-b"}).encode(), method="POST",
                    headers={"Authorization": f"Bearer {tokens['gpu-a']}",
                             "Content-Type": "application/json"},
                )  # fmt: skip
                try:
                    urllib.request.urlopen(forged, context=context, timeout=20)
                    raise AssertionError("a body naming another node was accepted")
                except urllib.error.HTTPError as exc:
                    assert exc.code == 403

                standby_metrics = _metrics(procs[standby])
                assert 'netval_operator_enrollments_total{outcome="issued"} 1.0' in standby_metrics
                assert "netval_operator_dynsec_connected 1.0" in standby_metrics
                assert "netval_broker_acl_violations" not in standby_metrics
                # The leader's duties, on its /metrics: the start check ran on the chart's ACL.
                leader_metrics = wait_for(
                    lambda: _with(_metrics(procs[leader]), "netval_broker_acl_violations"),
                    30, what="the leader's broker ACL check",
                )  # fmt: skip
                assert "netval_broker_acl_violations 0.0" in leader_metrics
                # Only the leader wrote (the CA ConfigMap included); the standby wrote nothing
                # (a TokenReview is a POST that stores nothing).
                writers = {t for _, t, _, path in writes(kube) if "/configmaps" in path}
                assert writers == {leader}
                by_standby = [w for w in writes(kube) if w[1] == standby]
                assert by_standby and {w[3] for w in by_standby} == {TOKEN_REVIEWS}

                # SIGKILL the leader and delete a Node while nobody leads (the Lease has ~14 s
                # to run): no replica sees that deletion, yet the new leader revokes the
                # node's identity when it takes the duties on its running service.
                procs[leader].kill()
                kube.delete("v1", "Node", "gpu-b")
                assert "netval_operator_leader 0.0" in _metrics(procs[standby])
                wait_for(lambda: "netval_operator_leader 1.0" in _safe_metrics(procs[standby]), 40,
                         what="the standby leading")  # fmt: skip
                wait_for(lambda: clients["gpu-b"].disconnects, 30, what="gpu-b disconnected")
                wait_for(lambda: "netval_broker_acl_violations" in _safe_metrics(procs[standby]), 30,
                         what="the new leader's broker ACL check")  # fmt: skip
                assert not clients["gpu-a"].disconnects
                assert (
                    "node gpu-b holds an MQTT identity but no longer exists" in procs[standby].log()
                )
            finally:
                for client in clients.values():
                    client.close()
        finally:
            for proc in procs.values():
                proc.terminate()
            for token, proc in procs.items():
                assert "Traceback" not in proc.log(), f"{token}:\n{proc.log()[-3000:]}"


def _safe_metrics(proc: OperatorProc) -> str:
    try:
        return _metrics(proc)
    except OSError:
        return ""


def _with(text: str, needle: str) -> str | None:
    return text if needle in text else None
