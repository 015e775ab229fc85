"""Enrollment on two real `netval operator` replicas (the chart's two, behind one Service
that routes an agent to either, one identity CA mounted into both): the standby signs
agents' certificates as the leader does, the leader alone writes the agents' CA ConfigMap
and runs the broker ACL check, and after a SIGKILL of the leader the new one takes the
leader's duties on its running service while the agents' certificates keep working.

The broker is the chart's Mosquitto with per-node identity (tests/test_chart_broker.py);
the test API answers TokenReview as an apiserver does (tests/test_enrollment.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from identity_kit import IdentityBrokerLogin, Mqtt, agent_pod
from kube import KubeCluster, wait_for
from mosquitto import free_port
from netval.agent.enroll import make_csr
from netval.operator.kube import certs
from operator_env import GPU, NS, add_node
from operator_processes import FAST_LEASE, OperatorProc, writes
from test_chart_broker import run_chart_broker
from test_enrollment import Claims, TokenAuthority

CA_CONFIGMAP = "netval-enroll-ca"
# The defaults' 15 s lease; a fast retry so the standby takes over soon after the SIGKILL.
LEASE = {**FAST_LEASE, "NETVAL_LEASE_DURATION_SECONDS": "15",
         "NETVAL_LEASE_RENEW_DEADLINE_SECONDS": "10"}  # fmt: skip
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _metrics(proc: OperatorProc) -> str:
    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _enroll(port: int, token: str, context: ssl.SSLContext, csr: bytes) -> dict[str, Any]:
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/v1/enroll", data=json.dumps({"csr": csr.decode()}).encode(),
        method="POST", headers={"Authorization": f"Bearer {token}"},
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
    with run_chart_broker(tmp_path / "broker", by_address=True) as (port, secrets):
        login = IdentityBrokerLogin(port, secrets)
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
                **login.env,  # one identity CA for both, as the chart mounts one Secret
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
            keys = {node: make_csr(f"pool/{node}") for node in ("gpu-a", "gpu-b")}
            creds = {
                "gpu-a": _enroll(enroll_ports[standby], tokens["gpu-a"], context, keys["gpu-a"][1]),
                "gpu-b": _enroll(enroll_ports[leader], tokens["gpu-b"], context, keys["gpu-b"][1]),
            }
            assert creds["gpu-a"]["node"] == "gpu-a" and creds["gpu-b"]["node"] == "gpu-b"
            clients = {
                node: Mqtt(port, None, None, host="127.0.0.1", tls=_context(
                    secrets, c["certificate"].encode(), keys[node][0]))
                for node, c in creds.items()
            }  # fmt: skip
            try:
                for client in clients.values():
                    assert not client.connect().is_failure
                # The standby names the node by the token's pod, as the leader does.
                forged = urllib.request.Request(
                    f"https://127.0.0.1:{enroll_ports[standby]}/v1/enroll",
                    data=json.dumps({"node": "gpu-b",
                                     "csr": make_csr("pool/gpu-b")[1].decode()}).encode(),
                    method="POST",
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

                # SIGKILL the leader: the standby takes the duties on its running service
                # (its ACL check), and the agents' certificates keep working meanwhile.
                procs[leader].kill()
                assert "netval_operator_leader 0.0" in _metrics(procs[standby])
                wait_for(lambda: "netval_operator_leader 1.0" in _safe_metrics(procs[standby]), 40,
                         what="the standby leading")  # fmt: skip
                wait_for(lambda: "netval_broker_acl_violations 0.0" in _safe_metrics(procs[standby]),
                         60, what="the new leader's broker ACL check")  # fmt: skip
                for node, client in clients.items():
                    client.publish(f"netval/v1/pool/{node}/state", b"online")
                assert not clients["gpu-a"].disconnects and not clients["gpu-b"].disconnects
            finally:
                for client in clients.values():
                    client.close()
        finally:
            for proc in procs.values():
                proc.terminate()
            for token, proc in procs.items():
                assert "Traceback" not in proc.log(), f"{token}:\n{proc.log()[-3000:]}"


def _context(secrets: dict[str, str], cert: bytes, key: bytes) -> ssl.SSLContext:
    from netval.infra.mqtt_settings import MqttSettings, PemIdentity

    settings = MqttSettings("127.0.0.1", 1, tls=True, ca_file=Path(secrets["broker_ca"]),
                            identity=PemIdentity(cert, key))  # fmt: skip
    context = settings.ssl_context()
    assert context is not None
    return context


def _safe_metrics(proc: OperatorProc) -> str:
    try:
        return _metrics(proc)
    except OSError:
        return ""


def _with(text: str, needle: str) -> str | None:
    return text if needle in text else None
