"""`netval doctor` against the test Kubernetes API (tests/kube.py) and a real Mosquitto."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube import KubeCluster
from mosquitto import MosquittoBroker
from netval.cli import main
from netval.cli.doctor_broker import connect_packet
from netval.cli.doctor_cluster import missing_schema_fields
from netval.cli.doctor_permissions import (
    BASE_PERMISSIONS,
    DEVICE_TAINT_PERMISSIONS,
    IDENTITY_PERMISSIONS,
    KUEUE_PERMISSIONS,
    WEBHOOK_PERMISSIONS,
)
from netval.cli.doctor_webhook import verify_webhook_ca

REPO = Path(__file__).resolve().parents[1]
NS = "netval-system"
NV = "netval.io/v1alpha1"


def _crd() -> dict[str, Any]:
    return yaml.safe_load((REPO / "crds" / "networkvalidations.netval.io.yaml").read_text())


def _ready_pod(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {
                "app.kubernetes.io/name": "netval-agent", "netval.io/validation": "pool"}},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "x"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def lease(
    kube: KubeCluster, *, renewed_ago: float, holder: str = "netval-operator-7d9f-x2"
) -> None:
    """The operator's Lease as its leader keeps it (netval.operator.leadership)."""
    renewed = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=renewed_ago)
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "netval-operator", "namespace": NS},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}  # fmt: skip
    if kube.stored("coordination.k8s.io/v1", "leases", "netval-operator", namespace=NS):
        kube.patch("coordination.k8s.io/v1", "leases", "netval-operator", {"spec": body["spec"]},
                   namespace=NS)  # fmt: skip
    else:
        kube.create(body)


def install(kube: KubeCluster, broker: MosquittoBroker, *, ready_nodes: int = 2) -> None:
    """A cluster as the chart leaves it: CRD, operator Deployment (ready), a leader, one
    validation targeting two nodes, its agent DaemonSet with ready pods."""
    kube.create(_crd())
    kube.ensure_namespace(NS)
    host, port, user, _ = broker.address
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "netval-operator", "namespace": NS},
                 "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "op"}},
                          "template": {"metadata": {"labels": {"app": "op"}}, "spec": {
                              "serviceAccountName": "netval-operator",
                              "containers": [{"name": "operator", "image": "netval",
                                              "args": ["operator", "--metrics-addr", ":9478"],
                                              "env": [{"name": "NETVAL_MQTT_URL",
                                                       "value": f"mqtt://{host}:{port}"},
                                                      {"name": "NETVAL_MQTT_USERNAME",
                                                       "value": user}]}]}}}})  # fmt: skip
    kube.patch("apps/v1", "deployments", "netval-operator", {"status": {"readyReplicas": 2}},
               namespace=NS, subresource="status")  # fmt: skip
    lease(kube, renewed_ago=1.0)
    kube.create({"apiVersion": NV, "kind": "NetworkValidation", "metadata": {"name": "pool"},
                 "spec": {"nodeSelector": {"pool": "gpu"}}})  # fmt: skip
    for node in ("gpu-a", "gpu-b", "cpu-a"):
        labels = {"pool": "gpu"} if node.startswith("gpu") else {}
        kube.create({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": node, "labels": labels}})  # fmt: skip
    kube.create({"apiVersion": "apps/v1", "kind": "DaemonSet",
                 "metadata": {"name": "netval-agent-pool", "namespace": NS},
                 "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "netval-agent"}},
                          "template": {"spec": {"containers": [{"name": "agent",
                                                                "image": "x"}]}}}})  # fmt: skip
    for i, node in enumerate(["gpu-a", "gpu-b"][:ready_nodes]):
        pod = _ready_pod(f"agent-{i}", node)
        kube.create(pod)  # status is a subresource: written apart, as the kubelet does
        kube.patch("v1", "pods", pod["metadata"]["name"], {"status": pod["status"]},
                   namespace=NS, subresource="status")  # fmt: skip


@pytest.fixture
def password_file(tmp_path: Path, mosquitto_broker: MosquittoBroker) -> Path:
    path = tmp_path / "mqtt-password"
    path.write_text(mosquitto_broker.address[3] + "\n")
    return path


def _doctor(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, str]]:
    code = main(["doctor", "--timeout", "3", *extra])
    out = capsys.readouterr().out
    lines = {}
    for line in out.splitlines()[:-1]:
        state, name = line.split()[:2]
        lines[name] = line
        assert state in ("PASS", "FAIL", "SKIP"), line
    assert out.splitlines()[-1].startswith("READY" if code == 0 else "NOT READY"), out
    return code, lines


def enforce_acl(broker: MosquittoBroker) -> None:
    """netval's ACL on the test broker (docs/operations.md "Broker ACL"): its user is the
    operator, which reads everything and writes assignments only."""
    acl = broker.workdir / "acl"
    acl.write_text(
        f"user {broker.username}\ntopic read netval/#\ntopic write netval/v1/+/+/assignment\n"
    )
    broker.config.write_text(broker.config.read_text() + f"acl_file {acl}\n")
    broker.restart()


def test_ready_cluster_passes(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, password_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    enforce_acl(mosquitto_broker)
    install(kube, mosquitto_broker)
    asked: list[tuple[str | None, dict[str, Any]]] = []

    def policy(user: str | None, attrs: dict[str, Any]) -> bool:
        asked.append((user, attrs))
        return True

    kube.api.access_policy = policy
    code, lines = _doctor(capsys, "--mqtt-password-file", str(password_file))
    assert code == 0, "\n".join(lines.values())
    assert "PASS" in lines["crd"] and "every field" in lines["crd"]
    assert "2/2 ready, leader election" in lines["operator"]
    assert "PASS" in lines["leader"] and "held by netval-operator-7d9f-x2" in lines["leader"]
    assert (
        "PASS" in lines["permissions"]
        and "system:serviceaccount:netval-system:netval-operator" in lines["permissions"]
    )
    assert all(user == "system:serviceaccount:netval-system:netval-operator" for user, _ in asked)
    n_verbs = sum(len(p[5]) for p in BASE_PERMISSIONS)
    assert len(asked) == n_verbs and f"all {n_verbs} operator verbs" in lines["permissions"]
    assert {"verb": "update", "group": "coordination.k8s.io", "resource": "leases",
            "name": "netval-operator", "namespace": "netval-system"} in [a for _, a in asked]  # fmt: skip
    assert "PASS" in lines["broker.reachable"] and "PASS" in lines["broker.login"]
    assert "SKIP" in lines["broker.tls"]
    assert (
        "PASS" in lines["broker.acl"] and "cannot publish for another node" in lines["broker.acl"]
    )
    assert "PASS" in lines["kueue"] and "SKIP" in lines["webhook"]
    assert "a ready agent on all 2 targeted node(s)" in lines["agents/pool"]


def test_broken_cluster_says_what_to_fix(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    install(kube, mosquitto_broker, ready_nodes=1)
    lease(kube, renewed_ago=120.0)  # the leader hung, and no standby took over
    kube.api.access_policy = lambda user, attrs: (
        attrs.get("resource") != "nodes" or attrs["verb"] != "patch"
    )
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    code, lines = _doctor(capsys, "--mqtt-password-file", str(wrong))
    assert code == 1
    assert "FAIL" in lines["leader"] and "not renewed for 120 s" in lines["leader"]
    assert "fix: kubectl -n netval-system logs deployment/netval-operator" in lines["leader"]
    assert (
        "may not: patch nodes" in lines["permissions"]
        and "fix: helm upgrade" in lines["permissions"]
    )
    assert (
        "bad user name or password" in lines["broker.login"]
        or "not authorized" in lines["broker.login"]
    )
    assert "no ready agent on 1 of 2 targeted node(s): gpu-b" in lines["agents/pool"]
    assert "SKIP" in lines["broker.acl"] and "needs broker.login" in lines["broker.acl"]


def test_leader_check_names_a_missing_or_released_lease_and_skips_standalone(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    install(kube, mosquitto_broker)
    lease(kube, renewed_ago=1.0, holder="")
    _, lines = _doctor(capsys)
    assert "FAIL" in lines["leader"] and "nobody leads" in lines["leader"]
    kube.delete("coordination.k8s.io/v1", "leases", "netval-operator", namespace=NS)
    _, lines = _doctor(capsys)
    assert "FAIL" in lines["leader"] and "no replica has led yet" in lines["leader"]
    deployment = kube.get("apps/v1", "deployments", "netval-operator", namespace=NS)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [*container["args"], "--standalone"]
    kube.patch("apps/v1", "deployments", "netval-operator",
               {"spec": {"template": deployment["spec"]["template"]}}, namespace=NS)  # fmt: skip
    _, lines = _doctor(capsys)
    assert "SKIP" in lines["leader"] and "--standalone" in lines["leader"]
    assert "standalone" in lines["operator"]


def test_broker_without_per_node_acl_fails(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, password_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The test broker has no ACL at all, like an external broker set up without netval's
    rules: the identity may publish every kind of a node's topics."""
    install(kube, mosquitto_broker)
    code, lines = _doctor(capsys, "--mqtt-password-file", str(password_file))
    assert code == 1
    assert "FAIL" in lines["broker.acl"]
    assert (
        "can publish report, publish beat, publish endpoint, publish loadresult, publish state"
        " of a node it does not own" in lines["broker.acl"]
    )
    assert "Broker ACL" in lines["broker.acl"]


def test_missing_crd_and_operator(kube: KubeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _doctor(capsys, "--mqtt-url", "mqtt://127.0.0.1:1")
    assert code == 1
    assert "is not installed" in lines["crd"] and "kubectl apply -f crds/" in lines["crd"]
    assert "no Deployment running `netval operator`" in lines["operator"]
    assert "cannot connect to 127.0.0.1:1" in lines["broker.reachable"]
    assert "SKIP" in lines["broker.tls"] and "needs broker.reachable" in lines["broker.tls"]


def test_ssar_not_served_or_impersonation_refused(
    kube: KubeCluster, mosquitto_broker: MosquittoBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    install(kube, mosquitto_broker)
    kube.api.impersonation = False
    _, lines = _doctor(capsys)
    assert "not allowed to impersonate" in lines["permissions"]
    kube.api.impersonation = True
    kube.call(_404_ssar(kube))
    _, lines = _doctor(capsys)
    assert "does not serve SelfSubjectAccessReview" in lines["permissions"]


def _404_ssar(kube: KubeCluster) -> Any:
    import kmock

    async def add() -> None:
        kube.api[kmock.method.POST, kmock.resource("authorization.k8s.io", "v1",
                                                   "selfsubjectaccessreviews")] << 404  # fmt: skip

    return add


def test_old_crd_is_named(kube: KubeCluster, mosquitto_broker: MosquittoBroker,
                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    crd = _crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["spec"]["properties"]["checks"]["properties"]["peers"]
    del schema["properties"]["status"]["properties"]["eastWest"]
    assert missing_schema_fields(schema) == ["spec.checks.peers", "status.eastWest"]
    kube.create(crd)
    _, lines = _doctor(capsys)
    assert "older than this netval" in lines["crd"] and "spec.checks.peers" in lines["crd"]


def test_current_crd_has_every_field() -> None:
    assert missing_schema_fields(_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]) == []


def test_kueue_is_reported_with_its_version(
    kube: KubeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _, lines = _doctor(capsys, "--mqtt-url", "mqtt://127.0.0.1:1")
    # the test API serves both Kueue versions: installed, netval uses v1beta2
    assert "Kueue installed" in lines["kueue"] and "netval uses v1beta2" in lines["kueue"]


def test_broken_kubeconfig_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    bad = tmp_path / "kubeconfig"
    bad.write_text("just some text\n")
    monkeypatch.setenv("KUBECONFIG", str(bad))
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a kubeconfig" in err


def test_permission_table_matches_the_chart() -> None:
    import chart_kit
    import test_chart_rbac as rules

    mine: dict[tuple[str, str, str, str | None], set[str]] = {}
    for namespace, group, resource, sub, name, verbs in (
        *BASE_PERMISSIONS, *WEBHOOK_PERMISSIONS, *KUEUE_PERMISSIONS, *IDENTITY_PERMISSIONS,
        *DEVICE_TAINT_PERMISSIONS,
    ):  # fmt: skip
        scope = (
            "cluster"
            if namespace is None
            else (chart_kit.NAMESPACE if namespace == "$NS" else namespace)
        )
        key = (scope, group, f"{resource}/{sub}" if sub else resource, name or None)
        mine.setdefault(key, set()).update(verbs)
    theirs = {
        **rules.BASE_RULES,
        **rules.agent_rules(chart_kit.NAMESPACE),
        **rules.WEBHOOK_RULES,
        **rules.KUEUE_RULES,
        **rules.IDENTITY_RULES,
        **rules.DEVICE_TAINT_RULES,
    }
    assert mine == theirs


def _cert(ca_key: Any, subject_key: Any, issuer: str, subject: str, *, ca: bool,
          dns: list[str]) -> Any:  # fmt: skip
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(subject_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if dns:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), critical=False
        )
    return builder.sign(ca_key, hashes.SHA256())


def test_webhook_ca_verification() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key, other_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _cert(ca_key, ca_key, "ca", "ca", ca=True, dns=[])
    other = _cert(other_key, other_key, "other", "other", ca=True, dns=[])
    leaf = _cert(ca_key, leaf_key, "ca", "hook", ca=False, dns=["netval-webhook.netval-system.svc"])
    pem = lambda c: c.public_bytes(serialization.Encoding.PEM)  # noqa: E731
    hook = {"name": "gate.netval.io", "clientConfig": {
        "caBundle": base64.b64encode(pem(ca)).decode(),
        "service": {"name": "netval-webhook", "namespace": "netval-system"}}}  # fmt: skip
    assert verify_webhook_ca(hook, pem(leaf)) is None
    assert verify_webhook_ca(hook, None) is None
    wrong_ca = {**hook, "clientConfig": {**hook["clientConfig"],
                                        "caBundle": base64.b64encode(pem(other)).decode()}}  # fmt: skip
    assert "not issued by a CA in caBundle" in (verify_webhook_ca(wrong_ca, pem(leaf)) or "")
    wrong_svc = {**hook, "clientConfig": {**hook["clientConfig"],
                                         "service": {"name": "x", "namespace": "y"}}}  # fmt: skip
    assert "not for x.y.svc" in (verify_webhook_ca(wrong_svc, pem(leaf)) or "")
    assert verify_webhook_ca({"clientConfig": {}}, None) == "no caBundle"


def test_connect_packet_shape() -> None:
    packet = connect_packet("id", "u", "p")
    assert packet[0] == 0x10 and packet[1] == len(packet) - 2
    assert packet[2:8] == b"\x00\x04MQTT" and packet[8] == 4 and packet[9] == 0xC2


def test_broker_tls_handshake_and_wrong_ca(tmp_path: Path) -> None:
    """mqtts:// against a real TLS Mosquitto: verified with the right CA, a clear failure
    (and the login skipped) with another CA."""
    import mosquitto
    from netval.cli.doctor_broker import broker_checks
    from netval.infra.mqtt_settings import mqtt_settings_from_env

    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    from test_mqtt_publisher import _make_tls_files

    ca, cert, key, other_ca = _make_tls_files(tmp_path)
    broker = mosquitto.MosquittoBroker(tmp_path, tls=(ca, cert, key))
    password = tmp_path / "password"
    password.write_text(broker.password + "\n")
    enforce_acl(broker)  # starts it
    try:

        def run(ca_file: Path) -> dict[str, Any]:
            settings = mqtt_settings_from_env({
                "NETVAL_MQTT_URL": f"mqtts://localhost:{broker.port}",
                "NETVAL_MQTT_USERNAME": broker.username,
                "NETVAL_MQTT_PASSWORD_FILE": str(password),
                "NETVAL_MQTT_CA_FILE": str(ca_file)})  # fmt: skip
            return {r.name: r for r in broker_checks(settings, 3.0)}

        good = run(ca)
        assert [r.state.value for r in good.values()] == ["pass"] * 4, good
        assert "refused" in good["broker.acl"].detail  # probed over the verified TLS too
        assert "certificate valid for localhost" in good["broker.tls"].detail
        bad = run(other_ca)
        assert bad["broker.tls"].failed and "does not verify" in bad["broker.tls"].detail
        assert bad["broker.login"].state.value == "skip"
        assert bad["broker.acl"].state.value == "skip"
    finally:
        broker.close()
