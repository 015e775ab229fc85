"""Agent enrollment, end to end over real interfaces: the operator's HTTPS enrollment server
(`IdentityService`, signing CSRs with the chart's identity CA), TokenReview and Pod reads
against the test API server (tests/kube.py, with a token -> pod mapping this file controls,
shaped as a real apiserver answers), the chart's Mosquitto requiring client certificates,
and the agent's `Enroller` and `ReportPublisher`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from identity_kit import BrokerRestarts, LoopThread, Mqtt, agent_pod
from kube import KubeCluster, wait_for
from netval.agent.enroll import Credential, Enroller, EnrollError, EnrollSettings, make_csr
from netval.agent.publish import ReportPublisher
from netval.infra.mqtt_settings import MqttSettings, PemIdentity
from netval.model.identity import OPERATOR_IDENTITY
from netval.model.keys import MANAGED_BY_OPERATOR
from netval.operator.identity.authority import IdentityAuthority, MintedIdentity
from netval.operator.identity.review import PodTokenReviewer
from netval.operator.identity.service import IdentityService, IdentitySettings
from netval.operator.kube import certs
from test_chart_broker import run_chart_broker

NS = "netval-system"
SA = "netval-agent"
AGENT_LABELS = {
    "app.kubernetes.io/name": "netval-agent",
    "app.kubernetes.io/managed-by": MANAGED_BY_OPERATOR,
}


@dataclass
class Claims:
    """What a projected ServiceAccount token says (the apiserver's view of it)."""

    pod: str
    uid: str
    node: str | None
    namespace: str = NS
    service_account: str = SA
    audiences: tuple[str, ...] = ("netval",)
    bound: bool = True


def _b64(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


def jwt_shaped(claims: Claims | None = None, *, lifetime: float = 3600.0, **payload: Any) -> str:
    """A token shaped as the kubelet's projected ones (header, claims, a random signature
    that only the test's TokenReview table knows); `payload` overrides claims."""
    now = int(time.time())
    doc: dict[str, Any] = {
        "aud": list(claims.audiences) if claims else ["netval"],
        "exp": now + int(lifetime), "iat": now, "nbf": now,
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": f"system:serviceaccount:{claims.namespace}:{claims.service_account}"
        if claims else "system:serviceaccount:x:y",
    }  # fmt: skip
    doc.update(payload)
    signature = secrets.token_urlsafe(48)
    return f"{_b64({'alg': 'RS256', 'kid': 'test'})}.{_b64(doc)}.{signature}"


@dataclass
class TokenAuthority:
    """The test's apiserver side of TokenReview: token -> claims, answered as a real
    apiserver does (an audience mismatch is not authenticated)."""

    tokens: dict[str, Claims] = field(default_factory=dict)
    reviews: int = 0

    def mint(self, claims: Claims, *, lifetime: float = 3600.0) -> str:
        token = jwt_shaped(claims, lifetime=lifetime)
        self.tokens[token] = claims
        return token

    def review(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.reviews += 1
        claims = self.tokens.get(spec.get("token", ""))
        if claims is None:
            return {"authenticated": False, "error": "invalid bearer token"}
        wanted = spec.get("audiences") or ["https://kubernetes.default.svc"]
        matched = [a for a in wanted if a in claims.audiences]
        if not matched:
            return {
                "authenticated": False,
                "error": "token audiences are invalid for the target audiences",
            }
        extra: dict[str, list[str]] = {}
        if claims.bound:
            extra = {
                "authentication.kubernetes.io/pod-name": [claims.pod],
                "authentication.kubernetes.io/pod-uid": [claims.uid],
            }
            if claims.node is not None:
                extra["authentication.kubernetes.io/node-name"] = [claims.node]
        return {
            "authenticated": True,
            "audiences": matched,
            "user": {
                "username": f"system:serviceaccount:{claims.namespace}:{claims.service_account}",
                "uid": "sa-uid",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{claims.namespace}"],
                "extra": extra,
            },
        }


class Enrollment:
    """The chart's broker (per-node identity, reachable by address too), the operator's
    identity service with the chart's identity CA, the test API's TokenReviews."""

    def __init__(
        self, tmp_path: Path, kube: KubeCluster, port: int, secrets_: dict[str, str]
    ) -> None:
        self.tmp_path = tmp_path
        self.kube = kube
        self.mqtt_port = port
        self.secrets = secrets_
        self.broker_ca = Path(secrets_["broker_ca"])
        self.authority = TokenAuthority()
        kube.api.token_reviewer = self.authority.review
        kube.ensure_namespace(NS)
        self.tls = certs.generate_self_signed(tmp_path / "enroll-tls", ["127.0.0.1"])
        self.loop = LoopThread()
        self.clients: list[Mqtt] = []
        self.ca = self.identity_ca(timedelta(hours=24))
        self.service = self.start_service()

    def identity_ca(self, lifetime: timedelta) -> IdentityAuthority:
        return IdentityAuthority.from_files(
            Path(self.secrets["identity_ca"]), Path(self.secrets["identity_key"]), lifetime=lifetime
        )

    def mqtt_settings(self, pem: Any = None, client_id: str = "x") -> MqttSettings:
        return MqttSettings(host="127.0.0.1", port=self.mqtt_port, tls=True,
                            ca_file=self.broker_ca, identity=pem, client_id=client_id)  # fmt: skip

    def start_service(self) -> IdentityService:
        operator_mqtt = self.mqtt_settings(MintedIdentity(self.ca, OPERATOR_IDENTITY), "operator")
        settings = IdentitySettings("127.0.0.1", 0, self.tls.cert, self.tls.key)
        reviewer = PodTokenReviewer(self.kube.api_client(), namespace=NS)
        service = IdentityService(settings, operator_mqtt, reviewer, self.ca)
        self.loop.run(service.start())
        return service

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.service.server.port}/v1/enroll"

    def pod(self, name: str, node: str, *, labels: dict[str, str] | None = None,
            service_account: str = SA, owner: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        return agent_pod(self.kube, name, node, NS, labels=labels, service_account=service_account,
                         owner=owner)  # fmt: skip

    def agent_token(self, name: str, node: str) -> str:
        pod = self.pod(name, node)
        return self.authority.mint(Claims(name, pod["metadata"]["uid"], node))

    def post(self, token: str | None, body: Any = None, *, raw: bytes | None = None,
             header: str | None = None) -> tuple[int, dict[str, Any]]:  # fmt: skip
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        request = urllib.request.Request(self.url, data=data, method="POST")
        if header is not None:
            request.add_header("Authorization", header)
        elif token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        try:
            with urllib.request.urlopen(request, context=context, timeout=20) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            text = exc.read()
            return exc.code, json.loads(text) if text else {}

    def enroller(self, token: str, node: str, validation: str = "pool", **kw: Any) -> Enroller:
        token_file = self.tmp_path / f"token-{node}-{secrets.token_hex(3)}"
        token_file.write_text(token)
        return Enroller(EnrollSettings(self.url, token_file, self.tls.ca, node, validation), **kw)

    def client(self, pem: Any, **kw: Any) -> Mqtt:
        context = self.mqtt_settings(pem).ssl_context()
        client = Mqtt(self.mqtt_port, None, None, tls=context, **kw)
        self.clients.append(client)
        return client

    def node(self, credential: Credential, **kw: Any) -> Mqtt:
        client = self.client(PemIdentity(credential.cert_pem, credential.key_pem), **kw)
        assert not client.connect().is_failure
        return client

    def operator(self) -> Mqtt:
        op = self.client(MintedIdentity(self.ca, OPERATOR_IDENTITY))
        assert not op.connect().is_failure
        op.subscribe("netval/#")
        return op

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.loop.run(self.service.stop())
        self.loop.close()


@contextlib.contextmanager
def running_enrollment(tmp_path: Path, kube: KubeCluster) -> Iterator[Enrollment]:
    with run_chart_broker(tmp_path, by_address=True) as (port, secrets_):
        env = Enrollment(tmp_path, kube, port, secrets_)
        try:
            yield env
        finally:
            env.close()


@pytest.fixture
def enrollment(tmp_path: Path, kube: KubeCluster) -> Iterator[Enrollment]:
    with running_enrollment(tmp_path, kube) as env:
        yield env


def base(node: str) -> str:
    return f"netval/v1/pool/{node}"


def csr_for(identity: str) -> str:
    return make_csr(identity)[1].decode()


def test_an_agent_enrolls_and_speaks_for_its_node_only(enrollment: Enrollment) -> None:
    enroller = enrollment.enroller(enrollment.agent_token("agent-a", "node-a"), "node-a")
    credential = enrollment.loop.run(enroller.enroll())
    assert credential.identity == "pool/node-a"
    assert (credential.expires_at - credential.issued_at) > timedelta(hours=23)
    assert b"PRIVATE" not in repr(credential).encode() and "BEGIN" not in repr(credential)
    op = enrollment.operator()
    a = enrollment.node(credential)
    a.publish(f"{base('node-b')}/report", b"forged")
    a.publish(f"{base('node-a')}/report", b"mine")
    op.wait_message(f"{base('node-a')}/report", b"mine")
    assert op.topics() == {f"{base('node-a')}/report"}
    assert enrollment.service.server.outcomes == {"issued": 1}


def test_a_token_cannot_obtain_a_certificate_for_another_node(enrollment: Enrollment) -> None:
    """The node and the validation come from the API server (the token's pod, its
    DaemonSet's NetworkValidation): a body naming another node is refused, and so is a
    certificate request for another identity; asking for its own gives the pod its own."""
    b_status, b_answer = enrollment.post(
        enrollment.agent_token("agent-b", "node-b"),
        {"node": "node-b", "csr": csr_for("pool/node-b")},
    )
    assert b_status == 200 and b_answer["node"] == "node-b"
    assert b_answer["username"] == "pool/node-b" and b_answer["validation"] == "pool"
    a_token = enrollment.agent_token("agent-a", "node-a")
    status, answer = enrollment.post(a_token, {"node": "node-b", "csr": csr_for("pool/node-b")})
    assert status == 403 and "certificate" not in answer, answer
    assert "node-a" in answer["message"]
    for identity in ("pool/node-b", "other/node-a", "pool/node-a/x", "netval-operator"):
        status, answer = enrollment.post(a_token, {"node": "node-a", "csr": csr_for(identity)})
        assert status == 400 and answer["error"] == "bad_csr", (identity, answer)
        assert "wrong_subject" in answer["message"]
    for body in (
        {"node": "node-a", "csr": csr_for("pool/node-a")},
        {"csr": csr_for("pool/node-a")},
    ):
        status, answer = enrollment.post(a_token, body)
        assert (status, answer.get("username")) == (200, "pool/node-a")
    assert enrollment.service.server.csr_refusals == {"wrong_subject": 4}


def _deny_cases(e: Enrollment) -> dict[str, tuple[str | None, int]]:
    pod = e.pod("agent-x", "node-x")
    uid = pod["metadata"]["uid"]
    e.pod("not-agent", "node-x", labels={"app": "other"})
    not_agent_uid = e.kube.get("v1", "Pod", "not-agent", namespace=NS)["metadata"]["uid"]
    e.pod("wrong-sa", "node-x", service_account="default")
    wrong_sa_uid = e.kube.get("v1", "Pod", "wrong-sa", namespace=NS)["metadata"]["uid"]
    # owned by something else than an agent DaemonSet of netval's
    uids = {}
    stranger = e.kube.create({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "netval-agent-stranger", "namespace": NS, "labels": AGENT_LABELS},
        "spec": {"selector": {"matchLabels": AGENT_LABELS},
                 "template": {"metadata": {"labels": AGENT_LABELS},
                              "spec": {"containers": [{"name": "a", "image": "x"}]}}},
    })  # fmt: skip
    owners = {
        "replicaset": {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "netval-agent-x",
                       "uid": "rs-uid", "controller": True},
        "forged": {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "netval-agent-pool",
                   "uid": "forged-uid", "controller": True},
        "stranger": {"apiVersion": "apps/v1", "kind": "DaemonSet",
                     "name": "netval-agent-stranger", "uid": stranger["metadata"]["uid"],
                     "controller": True},
    }  # fmt: skip
    for key, owner in owners.items():
        uids[key] = e.pod(f"owned-{key}", "node-x", owner=owner)["metadata"]["uid"]
    mint = e.authority.mint
    return {
        "pod not of a DaemonSet": (
            mint(Claims("owned-replicaset", uids["replicaset"], "node-x")),
            403,
        ),
        "owner reference forged": (mint(Claims("owned-forged", uids["forged"], "node-x")), 403),
        "DaemonSet not netval's": (mint(Claims("owned-stranger", uids["stranger"], "node-x")), 403),
        "no token": (None, 401),
        "not a JWT": ("eyJnot-a-token", 401),
        "unknown token": (jwt_shaped(), 403),
        "wrong audience": (
            mint(Claims("agent-x", uid, "node-x", audiences=("https://kubernetes.default.svc",))),
            403,
        ),
        "expired": (mint(Claims("agent-x", uid, "node-x"), lifetime=-120), 403),
        "pod uid mismatch": (mint(Claims("agent-x", "another-uid", "node-x")), 403),
        "non-agent service account": (
            mint(Claims("agent-x", uid, "node-x", service_account="default")),
            403,
        ),
        "other namespace": (mint(Claims("agent-x", uid, "node-x", namespace="default")), 403),
        "token not bound to a pod": (mint(Claims("agent-x", uid, "node-x", bound=False)), 403),
        "pod without agent labels": (mint(Claims("not-agent", not_agent_uid, "node-x")), 403),
        "pod of another service account": (mint(Claims("wrong-sa", wrong_sa_uid, "node-x")), 403),
        "node in the token differs": (mint(Claims("agent-x", uid, "node-y")), 403),
        "pod gone": (mint(Claims("agent-gone", "gone-uid", "node-x")), 403),
    }


def test_tokens_that_do_not_prove_an_agent_pod_are_refused(enrollment: Enrollment) -> None:
    cases = _deny_cases(enrollment)
    for what, (token, expected) in cases.items():
        status, answer = enrollment.post(token, {"node": "node-x", "csr": csr_for("pool/node-x")})
        assert status == expected, (what, answer)
        assert "certificate" not in answer, what
    assert enrollment.ca.issued == 0
    assert enrollment.service.server.outcomes == {"unauthenticated": 2, "denied": len(cases) - 2}
    # Only tokens that could pass reached the API server: not the malformed, expired or
    # wrong-audience ones.
    assert enrollment.authority.reviews == len(cases) - 4


def test_the_api_server_unavailable_is_503(enrollment: Enrollment) -> None:
    import kmock

    token = enrollment.agent_token("agent-a", "node-a")
    (
        enrollment.kube.api[
            kmock.action.CREATE, kmock.resource("authentication.k8s.io", "v1", "tokenreviews")
        ]
        << 503
    )
    status, answer = enrollment.post(token, {"node": "node-a", "csr": csr_for("pool/node-a")})
    assert status == 503 and "certificate" not in answer


_HEADER_TEXT = st.text(
    st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=60
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    header=st.one_of(st.none(), _HEADER_TEXT.map(lambda t: "Bearer " + t), _HEADER_TEXT),
    raw=st.one_of(
        st.binary(max_size=600),
        st.builds(
            lambda n: json.dumps({"node": n}).encode(),
            st.one_of(
                st.text(max_size=300), st.integers(), st.none(), st.lists(st.text(max_size=3))
            ),
        ),
    ),
)
def test_garbage_requests_get_a_clear_refusal(
    enrollment: Enrollment, header: str | None, raw: bytes
) -> None:
    header = (
        None
        if header is None
        else "".join(c for c in header if c.isprintable() and c not in "\r\n")
    )
    status, answer = enrollment.post(None, raw=raw, header=header)
    assert status in (400, 401, 403), (status, answer)
    assert "certificate" not in answer
    assert enrollment.ca.issued == 0


def test_renewal_keeps_the_session_and_the_next_connect_uses_the_new_certificate(
    enrollment: Enrollment,
) -> None:
    """Certificates of 4 s (renewed at 2/3): the session the agent holds goes on through
    renewals (a broker checks a certificate at the handshake only); after the first one
    expired, a broker restart finds the agent connecting with the renewed one: no refusal,
    no extra enrollment."""
    e = enrollment
    e.ca.lifetime = timedelta(seconds=4)
    enroller = e.enroller(e.agent_token("agent-a", "node-a"), "node-a")
    first = e.loop.run(enroller.enroll())
    publisher = ReportPublisher(e.mqtt_settings(client_id="agent-a"), "pool", "node-a",
                                backoff_base=0.1, backoff_cap=0.5)  # fmt: skip
    publisher.settings = first.apply(publisher.settings)
    stop = e.loop.run(_event())
    op = e.operator()
    e.loop.run(publisher.start())
    keep = e.loop.call(lambda: asyncio.ensure_future(enroller.keep(publisher, stop, poll=0.1)))
    op.wait_message(f"{base('node-a')}/state", b"online")
    wait_for(lambda: enroller.enrollments >= 2, 15, what="a renewal")
    renewed = enroller.credential
    assert renewed is not None and renewed.cert_pem != first.cert_pem
    assert renewed.key_pem != first.key_pem  # a new key each time
    assert publisher.stats().reconnects == 0  # the session went on
    # the first certificate has expired; the broker restarts: the agent comes back with the
    # certificate it holds now
    wait_for(lambda: datetime.now(UTC) > first.expires_at, 10, what="the first expired")
    restarts = BrokerRestarts(e.tmp_path, e.mqtt_port)
    try:
        restarts.kill()
        restarts.start()
        wait_for(lambda: publisher.stats().reconnects >= 1 and publisher.connected, 30,
                 what="the agent back after the broker restart")  # fmt: skip
        assert publisher.stats().credential_refusals == 0
    finally:
        e.loop.call(stop.set)
        e.loop.run(publisher.stop())
        e.loop.run(_wait(keep))
        restarts.close()


def test_an_agent_whose_certificate_the_broker_refuses_enrolls_again(
    enrollment: Enrollment,
) -> None:
    """The operator was away longer than the certificate lived (so it could not be
    renewed), and the broker restarted: the broker refuses the expired certificate (a TLS
    alert), which is the one thing that makes the agent enroll again, with reason
    `refused`, and come back."""
    e = enrollment
    e.ca.lifetime = timedelta(seconds=3)
    enroller = e.enroller(e.agent_token("agent-a", "node-a"), "node-a", backoff_base=0.2,
                          backoff_cap=0.5)  # fmt: skip
    first = e.loop.run(enroller.enroll())
    publisher = ReportPublisher(e.mqtt_settings(client_id="agent-a"), "pool", "node-a",
                                backoff_base=0.1, backoff_cap=0.3)  # fmt: skip
    publisher.settings = first.apply(publisher.settings)
    e.loop.run(e.service.server.stop())  # no renewal possible
    stop = e.loop.run(_event())
    e.loop.run(publisher.start())
    wait_for(lambda: publisher.connected, 10, what="connected")
    keep = e.loop.call(lambda: asyncio.ensure_future(enroller.keep(publisher, stop, poll=0.1)))
    wait_for(lambda: datetime.now(UTC) > first.expires_at, 10, what="the certificate expired")
    restarts = BrokerRestarts(e.tmp_path, e.mqtt_port)
    try:
        restarts.kill()
        restarts.start()
        wait_for(lambda: publisher.stats().credential_refusals >= 1, 30, what="the refusal")
        e.ca.lifetime = timedelta(hours=1)
        e.loop.run(e.service.server.start("127.0.0.1", e.service.server.port or 0,
                                          e.service.cert_reloader.context  # type: ignore[union-attr]
                                          if e.service.cert_reloader else None))  # fmt: skip
        wait_for(lambda: enroller.enrollments >= 2 and publisher.connected, 40,
                 what="enrolled again and back")  # fmt: skip
        assert enroller.credential is not None and enroller.credential.cert_pem != first.cert_pem
    finally:
        e.loop.call(stop.set)
        e.loop.run(publisher.stop())
        e.loop.run(_wait(keep))
        restarts.close()


def test_an_unreachable_enrollment_server_is_an_error_not_a_crash(
    enrollment: Enrollment, tmp_path: Path
) -> None:
    token = tmp_path / "t"
    token.write_text("x")
    enroller = Enroller(
        EnrollSettings("https://127.0.0.1:1/v1/enroll", token, enrollment.tls.ca, "n", "v"),
        timeout=2,
    )
    with pytest.raises(EnrollError):
        enrollment.loop.run(enroller.enroll())
    missing = Enroller(
        EnrollSettings(enrollment.url, tmp_path / "none", enrollment.tls.ca, "n", "v")
    )
    with pytest.raises(EnrollError, match="cannot read"):
        enrollment.loop.run(missing.enroll())


async def _event() -> asyncio.Event:
    return asyncio.Event()


async def _wait(future: Any) -> None:
    await asyncio.wait_for(future, 10)


def test_the_agent_process_enrolls_and_reports_for_its_node(
    enrollment: Enrollment, tmp_path: Path
) -> None:
    import signal
    import subprocess

    import yaml

    from test_agent import LO_CHECKS, agent_config, netval_script, stop_process

    e = enrollment
    token = tmp_path / "token"
    token.write_text(e.agent_token("agent-a", "node-a"))
    config = tmp_path / "agent.yaml"
    # the validation whose DaemonSet runs the pod (the certificate is for pool/node-a)
    config.write_text(
        yaml.safe_dump({**agent_config(LO_CHECKS, interval="5s"), "validation": "pool"})
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NETVAL_CONFIG": str(config),
        "NETVAL_NODE_NAME": "node-a",
        "NETVAL_MQTT_URL": f"mqtts://127.0.0.1:{e.mqtt_port}",
        "NETVAL_MQTT_CA_FILE": str(e.broker_ca),
        "NETVAL_METRICS_ADDR": "off",
        "NETVAL_ENROLL_URL": e.url,
        "NETVAL_ENROLL_TOKEN_FILE": str(token),
        "NETVAL_ENROLL_CA_FILE": str(e.tls.ca),
        # this checkout's code, when the tests run with PYTHONPATH pointing at it
        **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
    }  # no MQTT user, password or certificate: the agent has only its token
    op = e.operator()
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen([netval_script(), "agent"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for(lambda: op.received("netval/v1/pool/node-a/report"), 30,
                 what="the agent's report")  # fmt: skip
        assert op.received("netval/v1/pool/node-a/state")[-1] == b"online"
        assert e.service.server.outcomes == {"issued": 1}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        op.wait_message("netval/v1/pool/node-a/state", b"offline")
    finally:
        stop_process(proc)
        log.close()
    agent_log = (tmp_path / "agent.log").read_text()
    assert "enrolled as pool/node-a" in agent_log
    assert token.read_text() not in agent_log and "PRIVATE KEY" not in agent_log


def test_the_agent_process_refuses_a_plaintext_enrollment_url(tmp_path: Path) -> None:
    import subprocess

    import yaml

    from test_agent import LO_CHECKS, agent_config, netval_script

    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(agent_config(LO_CHECKS)))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NETVAL_CONFIG": str(config),
           "NETVAL_NODE_NAME": "node-a", "NETVAL_MQTT_URL": "mqtt://127.0.0.1:1",
           "NETVAL_METRICS_ADDR": "off", "NETVAL_ENROLL_URL": "http://operator:9444/v1/enroll",
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}  # fmt: skip
    proc = subprocess.run([netval_script(), "agent"], env=env, capture_output=True, text=True,
                          timeout=15, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "NETVAL_ENROLL_URL" in proc.stderr and "https://" in proc.stderr
