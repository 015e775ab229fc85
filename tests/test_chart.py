"""The Helm chart (charts/netval): lint, values, containers, the operator's wiring, NOTES,
labels and the webhook certificate. Rendered with the real Helm v4 library (tests/chart_kit.py).

The other concerns have their own files: RBAC and admission policy (test_chart_rbac.py),
schemas and CRDs (test_chart_schemas.py), the broker in a real Mosquitto
(test_chart_broker.py), lifecycle hooks, network policies and monitoring
(test_chart_lifecycle.py, test_chart_network.py, test_chart_monitoring.py).

For the default values and every feature variant (chart_kit.VARIANTS):
- every container runs non-root, read-only root filesystem, no privilege escalation, all
  capabilities dropped, seccomp RuntimeDefault;
- the operator's environment builds real OperatorSettings and its arguments parse with the
  real CLI.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import certifi
import helm_python as helm
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

import tls_certs
from chart_kit import (
    CHART,
    NAMESPACE,
    OPERATOR_SA,
    RELEASE,
    ROOT,
    VARIANTS,
    docs,
    env_of,
    find,
    notes,
    one,
    operator_container,
    operator_deployment,
    pod_specs,
)
from netval.cli import build_parser
from netval.infra import mqtt_settings, telemetry
from netval.operator import settings as operator_settings
from netval.operator.agents import manifests
from netval.operator.identity import service as identity_service
from netval.operator.leadership import settings as election

# Environment the chart gives the operator that the operator reads (src constants) and the
# standard OTel variables.
SRC_OPERATOR_ENV = {
    operator_settings.ENV_NAMESPACE,
    operator_settings.ENV_ACL_PROBE_USERNAME,
    operator_settings.ENV_ACL_PROBE_PASSWORD_FILE,
    operator_settings.ENV_AGENT_IMAGE,
    operator_settings.ENV_AGENT_MQTT_URL,
    operator_settings.ENV_AGENT_MQTT_USERNAME,
    operator_settings.ENV_AGENT_MQTT_SECRET,
    operator_settings.ENV_AGENT_MQTT_CA_SECRET,
    operator_settings.ENV_STATUS_WINDOW,
    operator_settings.ENV_NODE_WRITES_PER_SECOND,
    operator_settings.ENV_NODE_WRITE_BURST,
    operator_settings.ENV_AGENT_RESOURCES,
    operator_settings.ENV_AGENT_TOLERATIONS,
    operator_settings.ENV_KUEUE_ENABLED,
    operator_settings.ENV_DEVICE_TAINTS,
    operator_settings.ENV_DRA_DRIVERS,
    operator_settings.ENV_LOADTEST_MAX_RATE,
    operator_settings.ENV_AGENT_NAMESPACE,
    operator_settings.ENV_AGENT_IMAGE_PULL_SECRETS,
    operator_settings.ENV_AGENT_PRIORITY_CLASS_NAME,
    operator_settings.ENV_AGENT_TRACES_SAMPLER,
    operator_settings.ENV_AGENT_TRACES_SAMPLER_ARG,
    operator_settings.ENV_AGENT_OTEL_HEADERS_SECRET,
    telemetry.ENV_POD_NAME,
    telemetry.ENV_POD_NAMESPACE,
    telemetry.ENV_NODE_NAME,
    operator_settings.ENV_AGENT_ENROLL_URL,
    operator_settings.ENV_AGENT_ENROLL_CA_CONFIGMAP,
    identity_service.ENV_ENROLL_ADDR,
    identity_service.ENV_ENROLL_CERT_FILE,
    identity_service.ENV_ENROLL_KEY_FILE,
    identity_service.ENV_ENROLL_CA_BUNDLE_FILE,
    operator_settings.ENV_CREDENTIAL_LIFETIME,
    operator_settings.ENV_IDENTITY_CA_FILE,
    operator_settings.ENV_IDENTITY_CA_KEY_FILE,
    operator_settings.ENV_GATING_ON_ACL_VIOLATION,
    mqtt_settings.ENV_URL,
    mqtt_settings.ENV_USERNAME,
    mqtt_settings.ENV_PASSWORD_FILE,
    mqtt_settings.ENV_CA_FILE,
    "NETVAL_LOG_LEVEL",
    election.ENV_LEASE_DURATION,
    election.ENV_RENEW_DEADLINE,
    election.ENV_RETRY_PERIOD,
    "OTEL_SERVICE_NAME",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
}

# --- lint and values ----------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_lint_is_clean(variant: str) -> None:
    report = helm.lint(CHART, copy.deepcopy(VARIANTS[variant]), namespace=NAMESPACE, strict=True)
    assert report["errors"] == []
    # Severity 1 is INFO ("icon is recommended"); warnings (2) and errors (3) fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_a_broken_chart(tmp_path: Path) -> None:
    broken = tmp_path / "netval"
    broken.mkdir()
    (broken / "Chart.yaml").write_text((CHART / "Chart.yaml").read_text())
    (broken / "templates").mkdir()
    (broken / "templates" / "bad.yaml").write_text("kind: ConfigMap\nmetadata: {{ .Values.x.y }}\n")
    report = helm.lint(broken)
    assert any(m["severity"] == 3 for m in report["messages"]), report


def test_render_fails_without_an_external_url() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match=r"mqtt[./]external"):
        chart.render({"mqtt": {"external": {"enabled": True}}}, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"operator": {"replicas": "two"}}, "/operator/replicas"),
        ({"operator": {"replicas": 0}}, "/operator/replicas"),
        ({"operator": {"logLevel": "LOUD"}}, "/operator/logLevel"),
        ({"imagePullSecret": []}, "imagePullSecret"),
        ({"image": {"digest": "sha256:short"}}, "/image/digest"),
        ({"mqtt": {"external": {"enabled": True}}}, "/mqtt/external/url"),
        (
            {"mqtt": {"external": {"enabled": True, "url": "http://broker:1883"}}},
            "/mqtt/external/url",
        ),
        (
            {"mqtt": {"external": {"enabled": True, "url": "mqtt://b:1883", "username": "u"}}},
            "/mqtt/external/existingSecret",
        ),
        (
            {"mqtt": {"external": {"enabled": True, "url": "mqtt://b:1883", "caSecret": "ca"}}},
            "/mqtt/external/url",
        ),
        ({"mqtt": {"broker": {"agentUsername": "a b"}}}, "/mqtt/broker/agentUsername"),
        ({"webhook": {"failurePolicy": "Maybe"}}, "/webhook/failurePolicy"),
        ({"webhook": {"certManager": {"issuerRef": {"kind": "Vault"}}}}, "/webhook/certManager"),
        ({"agent": {"resources": {"requests": {"cpu": "lots"}}}}, "/agent/resources"),
        ({"agent": {"tolerations": [{"operator": "Sometimes"}]}}, "/agent/tolerations"),
    ],
)
def test_schema_refuses_bad_values(values: dict[str, Any], error: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema(values)
    assert error in str(caught.value)


@pytest.mark.parametrize("variant", VARIANTS)
def test_schema_accepts_every_variant(variant: str) -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(copy.deepcopy(VARIANTS[variant]))


def _leaf_paths(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    yield prefix, value
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _leaf_paths(sub, f"{prefix}.{key}" if prefix else key)


def test_schema_describes_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    free_form: list[str] = []
    for path, value in _leaf_paths(values):
        if any(path.startswith(f"{parent}.") for parent in free_form):
            continue  # inside a map typed by additionalProperties (labels, selectors)
        node = schema
        for key in path.split(".") if path else []:
            props = node.get("properties", {})
            assert key in props, f"values.schema.json has no {path}"
            node = props[key]
        if isinstance(node.get("additionalProperties"), dict) or (
            isinstance(value, dict) and "properties" not in node
        ):
            free_form.append(path)
        assert node.get("description") or not path, f"{path}: no description in the schema"
        if isinstance(value, dict) and node.get("properties") is not None:
            # A closed object: a misspelt key is refused, not ignored.
            assert node.get("additionalProperties") is False, f"{path or 'root'} is open"


def test_every_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^\s*[A-Za-z0-9_.-]+:")
    for number, line in enumerate(lines):
        if not key.match(line):
            continue
        previous = lines[number - 1].strip() if number else ""
        assert previous.startswith("#"), f"values.yaml:{number + 1}: {line.strip()} has no comment"


# --- containers ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_is_hardened(variant: str) -> None:
    specs = list(pod_specs(variant))
    assert specs
    for where, spec in specs:
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True, where
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert spec.get("hostNetwork") is not True and spec.get("hostPID") is not True, where
        for container in spec.get("initContainers", []) + spec["containers"]:
            name = f"{where}/{container['name']}"
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True, name
            assert (sc.get("runAsUser") or pod.get("runAsUser")) not in (None, 0), name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert "privileged" not in sc, name
            assert container.get("resources", {}).get("limits", {}).get("memory"), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_operator_deployment_runs_with_peering(variant: str) -> None:
    deployment = operator_deployment(variant)
    assert deployment["spec"]["replicas"] == 2
    container = operator_container(variant)
    args = container["args"]
    assert args[0] == "operator"
    assert "--standalone" not in args
    assert args[args.index("--liveness") + 1] == "http://0.0.0.0:8080/healthz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == 8080
    assert args[args.index("--metrics-addr") + 1] == f"0.0.0.0:{ports['metrics']}"
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == OPERATOR_SA
    assert spec["securityContext"]["runAsUser"] == manifests.AGENT_UID == 65532
    # Kopf's peering is not used (the replicas elect a leader on a Lease): nothing of it.
    assert not [d for d in docs(variant) if d.get("apiVersion", "").startswith("kopf.dev/")]
    pdb = one(variant, "PodDisruptionBudget", "netval-operator")
    assert pdb["spec"]["minAvailable"] == 1


def test_one_replica_has_no_disruption_budget() -> None:
    with helm.Chart.load(CHART) as chart:
        out = chart.render({"operator": {"replicas": 1}}, name=RELEASE, namespace=NAMESPACE)
    assert "PodDisruptionBudget" not in out[f"{RELEASE}/templates/operator-deployment.yaml"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_operator_arguments_parse_with_the_real_cli(variant: str) -> None:
    args = operator_container(variant)["args"]
    parser = build_parser()
    known = {
        opt
        for action in parser._subparsers._group_actions[0].choices["operator"]._actions
        for opt in action.option_strings
    }  # type: ignore[union-attr]
    missing = sorted({a for a in args if a.startswith("--")} - known)
    if missing:
        pytest.skip(f"`netval operator` does not take {', '.join(missing)} yet")
    parsed = parser.parse_args(args)
    assert parsed.command == "operator"
    assert parsed.standalone is False
    assert parsed.liveness == "http://0.0.0.0:8080/healthz"


@pytest.mark.parametrize("variant", VARIANTS)
def test_operator_environment_builds_real_settings(variant: str, tmp_path: Path) -> None:
    container = operator_container(variant)
    env = env_of(container)
    assert set(env) <= SRC_OPERATOR_ENV, set(env) - SRC_OPERATOR_ENV
    # Files mounted from Secrets, made real here.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    if mqtt_settings.ENV_PASSWORD_FILE in env:
        assert env[mqtt_settings.ENV_PASSWORD_FILE].startswith(mounts["mqtt"] + "/")
        password = tmp_path / "password"
        password.write_text("s3cret\n")
        env[mqtt_settings.ENV_PASSWORD_FILE] = str(password)
    if mqtt_settings.ENV_CA_FILE in env:
        assert env[mqtt_settings.ENV_CA_FILE].startswith(mounts["mqtt-ca"] + "/")
        env[mqtt_settings.ENV_CA_FILE] = certifi.where()
    _identity_ca_files(variant, env, mounts, tmp_path)
    if operator_settings.ENV_ACL_PROBE_PASSWORD_FILE in env:
        assert env[operator_settings.ENV_ACL_PROBE_PASSWORD_FILE].startswith(
            mounts["acl-probe"] + "/"
        )
        probe_password = tmp_path / "probe-password"
        probe_password.write_text("agent-pw\n")
        env[operator_settings.ENV_ACL_PROBE_PASSWORD_FILE] = str(probe_password)
    settings = operator_settings.operator_settings_from_env(env)
    assert settings.namespace == NAMESPACE
    assert settings.agent_image == "ghcr.io/netval/netval:0.1.0" == operator_settings.DEFAULT_IMAGE
    values = VARIANTS[variant]
    external = values.get("mqtt", {}).get("external", {})
    identity = values.get("mqtt", {}).get("identity", {}).get("enabled", True) and values.get(
        "webhook", {}
    ).get("enabled", True)
    if external.get("clientCertificates"):
        # the agents enroll, the operator mints its own certificate: no login, no probe login
        assert settings.mqtt.url == external["url"]
        assert settings.identity_ca is not None and settings.mqtt.identity is not None
        assert settings.mqtt.username is None and settings.acl_probe is None
        assert settings.agent_enroll_url is not None
        assert not find(variant, "Deployment", "netval-mqtt")
    elif external.get("enabled"):
        assert settings.mqtt.url == external["url"]
        assert settings.agent_mqtt_secret == external["agentExistingSecret"]
        assert settings.agent_mqtt_ca_secret == external["caSecret"]
        assert settings.agent_mqtt_username == external["agentUsername"]
        assert not find(variant, "Deployment", "netval-mqtt")
        # The broker ACL start check probes with what every agent holds: the agents' login.
        assert settings.acl_probe is not None
        assert settings.acl_probe.username == external["agentUsername"]
        assert settings.acl_probe.password == "agent-pw"
        volumes = operator_deployment(variant)["spec"]["template"]["spec"]["volumes"]
        (probe,) = [v for v in volumes if v["name"] == "acl-probe"]
        assert probe["secret"]["secretName"] == external["agentExistingSecret"]
    else:
        if values.get("mqtt", {}).get("tls", {}).get("enabled", True):
            assert settings.mqtt.url == f"mqtts://netval-mqtt.{NAMESPACE}.svc:8883"
            assert settings.mqtt.tls and settings.agent_mqtt_ca_secret
        else:
            assert settings.mqtt.url == f"mqtt://netval-mqtt.{NAMESPACE}.svc:1883"
            assert settings.agent_mqtt_ca_secret is None
        if identity:
            # per-node identity: the operator's own session shows a certificate it minted
            assert settings.mqtt.username is None and settings.mqtt.password is None
            assert settings.mqtt.identity is not None and settings.identity_ca is not None
        else:
            assert settings.mqtt.username == "netval-operator"
            assert settings.mqtt.password == "s3cret"
        assert settings.acl_probe is None  # the bundled broker: enrollment's own check
        assert settings.agent_mqtt_username == "netval-agent"
        broker = values.get("mqtt", {}).get("broker", {})
        if broker.get("agentExistingSecret"):
            # The user's Secrets: the chart renders none and names theirs.
            assert settings.agent_mqtt_secret == broker["agentExistingSecret"]
            assert not find(variant, "Secret", "netval-mqtt-agent")
            assert not find(variant, "Secret", "netval-mqtt-operator")
        else:
            # The Secret the agents mount holds the key the DaemonSet projects, in the agents'
            # namespace (and in the broker's, with the same password, when they differ).
            secrets = find(variant, "Secret", settings.agent_mqtt_secret)
            agent_ns = values.get("agent", {}).get("namespace") or NAMESPACE
            assert {s["metadata"]["namespace"] for s in secrets} == {NAMESPACE, agent_ns}
            assert len({s["data"]["password"] for s in secrets}) == 1
            secret = secrets[0]
            assert set(secret["data"]) >= {manifests.DEFAULT_PASSWORD_KEY}
            operator_secret = one(variant, "Secret", "netval-mqtt-operator")
            passwords = [
                base64.b64decode(s["data"]["password"]).decode() for s in (secret, operator_secret)
            ]
            assert all(re.fullmatch(r"[A-Za-z0-9]{32}", p) for p in passwords)
            assert passwords[0] != passwords[1], "agents must not hold the operator's password"
    # What the operator then hands the agents is consistent (AgentMqttWiring checks it).
    manifests.AgentMqttWiring(
        url=settings.agent_mqtt_url,
        username=settings.agent_mqtt_username,
        password_secret=settings.agent_mqtt_secret if settings.agent_mqtt_username else None,
        ca_secret=settings.agent_mqtt_ca_secret,
    )
    assert json.loads(env["NETVAL_AGENT_RESOURCES"])["limits"]["memory"] == "256Mi"
    assert json.loads(env["NETVAL_AGENT_TOLERATIONS"]) == values.get("agent", {}).get(
        "tolerations", []
    )
    assert env["NETVAL_KUEUE_ENABLED"] == str(values.get("kueue", {}).get("enabled", False)).lower()
    telemetry = values.get("telemetry", {})
    assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == telemetry.get("otlpEndpoint")
    for name, key in (
        ("OTEL_TRACES_SAMPLER", "tracesSampler"),
        ("NETVAL_AGENT_OTEL_TRACES_SAMPLER", "tracesSampler"),
        ("OTEL_TRACES_SAMPLER_ARG", "tracesSamplerArg"),
        ("NETVAL_AGENT_OTEL_TRACES_SAMPLER_ARG", "tracesSamplerArg"),
        ("NETVAL_AGENT_OTEL_HEADERS_SECRET", "headersSecret"),
    ):
        assert env.get(name) == telemetry.get(key), name
    headers = [e for e in container["env"] if e["name"] == "OTEL_EXPORTER_OTLP_HEADERS"]
    if telemetry.get("headersSecret"):
        assert headers[0]["valueFrom"]["secretKeyRef"] == {
            "name": telemetry["headersSecret"],
            "key": "headers",
        }
    else:
        assert not headers
    # Agent placement, pull secrets and priority reach the operator (which renders the agents).
    agent = values.get("agent", {})
    assert env["NETVAL_AGENT_NAMESPACE"] == (agent.get("namespace") or NAMESPACE)
    pull = agent.get("imagePullSecrets") or values.get("imagePullSecrets", [])
    assert json.loads(env["NETVAL_AGENT_IMAGE_PULL_SECRETS"]) == pull
    assert env.get("NETVAL_AGENT_PRIORITY_CLASS_NAME") == agent.get("priorityClassName")


def _identity_ca_files(
    variant: str, env: dict[str, str], mounts: dict[str, str], tmp_path: Path
) -> None:
    """The identity CA Secret the chart renders, written where the operator reads it."""
    if operator_settings.ENV_IDENTITY_CA_FILE not in env:
        return
    for name in (
        operator_settings.ENV_IDENTITY_CA_FILE,
        operator_settings.ENV_IDENTITY_CA_KEY_FILE,
    ):
        assert env[name].startswith(mounts["identity-ca"] + "/")
    secrets = find(variant, "Secret", "netval-mqtt-identity-ca")
    if secrets:
        (secret,) = secrets
        assert secret["type"] == "kubernetes.io/tls"
        data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    else:  # the user's Secret (GitOps): a CA made here stands for it
        ca = tls_certs.make_ca(tmp_path, "user-identity-ca")
        data = {"tls.crt": ca.cert_file.read_bytes(), "tls.key": tls_certs.key_pem(ca.key)}
    for name, key in (
        (operator_settings.ENV_IDENTITY_CA_FILE, "tls.crt"),
        (operator_settings.ENV_IDENTITY_CA_KEY_FILE, "tls.key"),
    ):
        path = tmp_path / key
        path.write_bytes(data[key])
        env[name] = str(path)


def test_image_references_are_pinned() -> None:
    images = {
        c["image"]
        for _, spec in pod_specs("default")
        for c in spec.get("initContainers", []) + spec["containers"]
    }
    assert "ghcr.io/netval/netval:0.1.0" in images
    broker = {i for i in images if i.startswith("eclipse-mosquitto")}
    assert broker and all(
        re.fullmatch(r"eclipse-mosquitto:2\.0\.\d+@sha256:[0-9a-f]{64}", i) for i in broker
    )
    with helm.Chart.load(CHART) as chart:
        out = chart.render(
            {"image": {"digest": "sha256:" + "a" * 64}}, name=RELEASE, namespace=NAMESPACE
        )
    assert (
        f'"ghcr.io/netval/netval:0.1.0@sha256:{"a" * 64}"'
        in out[f"{RELEASE}/templates/operator-deployment.yaml"]
    )


# --- NOTES and labels ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_notes_tell_the_next_command(variant: str) -> None:
    text = notes(variant)
    for command in (
        "kubectl apply -f examples/roce-training-pool.yaml",
        "kubectl get netval -w",
        "kubectl wait --for=condition=Healthy netval/roce-training-pool",
    ):
        assert command in text, command
    agent_ns = VARIANTS[variant].get("agent", {}).get("namespace")
    if agent_ns:
        assert f"own namespace {agent_ns}, created with Pod Security level" in text
        assert "kubectl label namespace" not in text
    else:
        label = f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged"
        assert label in text
    for path in re.findall(r"examples/[\w.-]+\.yaml", text):
        assert (ROOT / path).is_file(), path
    assert "{{" not in text and "<no value>" not in text


@pytest.mark.parametrize("variant", VARIANTS)
def test_everything_carries_the_standard_labels(variant: str) -> None:
    for doc in docs(variant):
        labels = doc["metadata"].get("labels", {})
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/component",
            "app.kubernetes.io/part-of",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ):
            assert labels.get(key), f"{doc['kind']}/{doc['metadata']['name']} lacks {key}"
        selector = doc.get("spec", {}).get("selector", {})
        match = selector.get("matchLabels", selector if doc["kind"] == "Service" else None)
        if match and "template" in doc.get("spec", {}):
            assert match.items() <= doc["spec"]["template"]["metadata"]["labels"].items()


# --- the webhook certificate --------------------------------------------------------------


def _webhook_names() -> list[str]:
    svc = "netval-webhook"
    return [
        svc,
        f"{svc}.{NAMESPACE}",
        f"{svc}.{NAMESPACE}.svc",
        f"{svc}.{NAMESPACE}.svc.cluster.local",
    ]


def test_self_signed_webhook_certificate_serves_the_service() -> None:
    secret = one("default", "Secret", "netval-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    pem = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    cert = x509.load_pem_x509_certificate(pem["tls.crt"])
    ca = x509.load_pem_x509_certificate(pem["ca.crt"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == _webhook_names()
    cert.verify_directly_issued_by(ca)
    key = serialization.load_pem_private_key(pem["tls.key"], password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    # The operator gets it as files: --webhook-cert/-key/-ca under the mounted Secret.
    container = operator_container("default")
    args = container["args"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")["mountPath"]
    for flag, file in (
        ("--webhook-cert", "tls.crt"),
        ("--webhook-key", "tls.key"),
        ("--webhook-ca", "ca.crt"),
    ):
        assert args[args.index(flag) + 1] == f"{mount}/{file}"
    assert args[args.index("--webhook-service") + 1] == f"{NAMESPACE}/netval-webhook"
    # A TLS server with this certificate is trusted by a client that trusts ca.crt for the
    # Service's name, as the API server does with the caBundle.
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    client = ssl.create_default_context(cadata=pem["ca.crt"].decode())
    _tls_handshake(server, client, pem["tls.crt"], pem["tls.key"], _webhook_names()[2])


def _tls_handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, cert: bytes, key: bytes, hostname: str
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c").write_bytes(cert)
        (Path(tmp) / "k").write_bytes(key)
        server.load_cert_chain(Path(tmp) / "c", Path(tmp) / "k")
    a, b = socket.socketpair()
    with a, b:
        errors: list[BaseException] = []

        def serve() -> None:
            try:
                with server.wrap_socket(a, server_side=True) as s:
                    s.recv(1)
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=serve)
        thread.start()
        with client.wrap_socket(b, server_hostname=hostname) as c:
            c.sendall(b"x")
        thread.join(5)
        assert not errors


def test_cert_manager_issues_the_webhook_certificate() -> None:
    assert not find("cert-manager", "Secret", "netval-webhook-tls")
    certificate = one("cert-manager", "Certificate", "netval-webhook")
    assert certificate["spec"]["secretName"] == "netval-webhook-tls"
    assert certificate["spec"]["dnsNames"] == _webhook_names()
    assert certificate["spec"]["issuerRef"] == {
        "name": "netval-webhook-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    ca = one("cert-manager", "Certificate", "netval-webhook-ca")
    assert ca["spec"]["isCA"] is True
    assert one("cert-manager", "Issuer", "netval-webhook-ca")["spec"] == {
        "ca": {"secretName": "netval-webhook-ca"}
    }
    assert one("cert-manager", "Issuer", "netval-selfsigned")["spec"] == {"selfSigned": {}}
    # With an issuer of the user's, the chart creates none of its own.
    assert not find("cert-manager-issuer", "Issuer")
    issued = one("cert-manager-issuer", "Certificate", "netval-webhook")
    assert issued["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_no_webhook_means_no_webhook_objects() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs("no-webhook")}
    assert ("Service", "netval-webhook") not in kinds
    assert ("Secret", "netval-webhook-tls") not in kinds
    args = operator_container("no-webhook")["args"]
    assert not [a for a in args if a.startswith("--webhook")]
    assert "webhook" not in {p["name"] for p in operator_container("no-webhook")["ports"]}


def test_operator_replicas_get_distinct_mqtt_client_ids(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = env_of(operator_container("broker-shared-login"))
    (tmp_path / "password").write_text("pw")
    env[mqtt_settings.ENV_PASSWORD_FILE] = str(tmp_path / "password")
    env[mqtt_settings.ENV_CA_FILE] = certifi.where()  # the mounted CA, stood in for
    monkeypatch.setattr(os, "getpid", lambda: 1)  # netval is the container's init process
    ids = set()
    for pod in ("netval-operator-7d9f-abcde", "netval-operator-7d9f-fghij"):
        monkeypatch.setattr(socket, "gethostname", lambda pod=pod: pod)
        ids.add(
            operator_settings.operator_settings_from_env({**env, "HOSTNAME": pod}).mqtt.client_id
        )
    assert len(ids) == 2
