"""The operator's identity service inside the real operator (in-process Kopf running
netval's handlers against the test API, the chart's Mosquitto with per-node identity): it
starts with the operator, publishes the enrollment CA for the agents, signs an agent's
request, and the leader's broker ACL check finds the chart's broker enforcing (gating not
held). A deleted Node's pods must pass a TokenReview again.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path

import kopf

from identity_kit import IdentityBrokerLogin, agent_pod
from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from netval.agent.enroll import make_csr
from netval.infra.mqtt_settings import MqttSettings
from netval.operator.identity.service import IdentityService, IdentitySettings
from netval.operator.kube import certs
from netval.operator.settings import OperatorSettings, operator_settings_from_env
from operator_env import GPU, NS, add_node
from test_chart_broker import run_chart_broker
from test_enrollment import Claims, TokenAuthority


def test_the_identity_service_runs_in_the_operator_and_checks_the_broker(
    tmp_path: Path, kube: KubeCluster
) -> None:
    kube.ensure_namespace(NS)
    add_node(kube, "gpu-a", GPU)
    authority = TokenAuthority()
    kube.api.token_reviewer = authority.review
    tls = certs.generate_self_signed(tmp_path / "enroll-tls", ["127.0.0.1"])
    with run_chart_broker(tmp_path, by_address=True) as (port, secrets):
        env = {**IdentityBrokerLogin(port, secrets).env, "NETVAL_NAMESPACE": NS,
               "NETVAL_AGENT_ENROLL_URL": "https://netval-webhook.netval-system.svc:9444/v1/enroll",
               "NETVAL_AGENT_ENROLL_CA_CONFIGMAP": "netval-enroll-ca",
               "NETVAL_STATUS_WINDOW_SECONDS": "0.2"}  # fmt: skip
        settings = operator_settings_from_env(env)
        assert settings.mqtt.identity is not None and settings.mqtt.username is None
        identity = IdentitySettings("127.0.0.1", 0, tls.cert, tls.key, tls.ca)
        memo = kopf.Memo(settings=settings, metrics_addr=("127.0.0.1", 0), identity=identity)
        with kopf_operator(kube, modules=["netval.operator.handlers"], memo=memo):
            service = wait_for(
                lambda: memo.get("identity") if isinstance(memo.get("identity"), IdentityService) else None,
                30, what="the identity service",
            )  # fmt: skip
            assert isinstance(service, IdentityService) and service.server.port
            ca = wait_for(lambda: kube.get("v1", "ConfigMap", "netval-enroll-ca", namespace=NS), 10)
            assert ca["data"]["ca.crt"] == tls.ca.read_text()
            # What the agents mount: it verifies the enrollment server.
            (tmp_path / "agent-ca.crt").write_text(ca["data"]["ca.crt"])
            context = ssl.create_default_context(cafile=str(tmp_path / "agent-ca.crt"))
            pod = agent_pod(kube, "agent-gpu-a", "gpu-a", NS)
            token = authority.mint(Claims("agent-gpu-a", pod["metadata"]["uid"], "gpu-a"))
            body = json.dumps({"csr": make_csr("pool/gpu-a")[1].decode()}).encode()
            request = urllib.request.Request(
                f"https://127.0.0.1:{service.server.port}/v1/enroll", data=body, method="POST",
                headers={"Authorization": f"Bearer {token}"},
            )  # fmt: skip
            with urllib.request.urlopen(request, context=context, timeout=20) as response:
                answer = json.loads(response.read())
            assert (
                answer["username"] == "pool/gpu-a" and "BEGIN CERTIFICATE" in answer["certificate"]
            )
            runtime = memo["runtime"]
            metrics_port = runtime.metrics_server.sockets[0].getsockname()[1]

            def metrics() -> str:
                url = f"http://127.0.0.1:{metrics_port}/metrics"
                with urllib.request.urlopen(url, timeout=10) as r:
                    return str(r.read().decode())

            # The start check's probe identity (a reserved node's certificate) gets nothing
            # of another node through the chart's broker, both ways: gating goes on.
            def checked() -> str | None:
                text = metrics()
                return text if "netval_broker_acl_violations" in text else None

            text = wait_for(checked, 60, what="the broker ACL check")
            assert "netval_broker_acl_violations 0.0" in text
            assert "netval_operator_gating_held 0.0" in text
            assert 'netval_operator_enrollments_total{outcome="issued"} 1.0' in text
            assert "netval_operator_mqtt_certificates_total" in text
            # A deleted Node: its pods' cached reviews go.
            reviews = authority.reviews
            kube.delete("v1", "Node", "gpu-a")
            wait_for(lambda: len(service.server.reviews) == 0, 20, what="the review forgotten")
            with urllib.request.urlopen(request, context=context, timeout=20):
                pass
            assert authority.reviews == reviews + 1


def test_the_agent_daemonset_enrolls_with_a_projected_token() -> None:
    import kubernetes_validate

    from chart_kit import KUBE_VERSIONS
    from netval.agent import enroll as agent_enroll
    from netval.model.spec import NetworkValidationSpec
    from netval.operator.agents import manifests
    from netval.operator.agents.rollout import render_agents

    settings = OperatorSettings(
        namespace=NS, agent_image="registry.example/netval:test",
        mqtt=MqttSettings("broker", 1883, username="netval-operator", password="x"),
        agent_mqtt_url="mqtt://netval-mqtt.netval-system.svc:1883",
        agent_mqtt_username="netval-agent", agent_mqtt_secret="netval-mqtt-agent",
        agent_mqtt_ca_secret=None, status_window=1.0,
        agent_enroll_url="https://netval-webhook.netval-system.svc:9444/v1/enroll",
        agent_enroll_ca_configmap="netval-enroll-ca",
    )  # fmt: skip
    owner = {"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
             "metadata": {"name": "pool", "uid": "u-1"}}  # fmt: skip
    spec = NetworkValidationSpec.model_validate({"nodeSelector": GPU})
    _, ds = render_agents(settings, owner, 1, spec)
    # (the newest schema: the agent's recursiveReadOnly /sys mount is newer than 1.29's)
    kubernetes_validate.validate(ds, KUBE_VERSIONS[-1], strict=True)
    pod = ds["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # no API token, only audience netval
    (volume,) = [v for v in pod["volumes"] if v["name"] == manifests.VOLUME_ENROLL]
    token, ca = volume["projected"]["sources"]
    assert token["serviceAccountToken"]["audience"] == "netval"
    assert ca["configMap"]["name"] == "netval-enroll-ca"
    assert all(
        "secret" not in s for v in pod["volumes"] for s in v.get("projected", {}).get("sources", [])
    )
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert "NETVAL_MQTT_PASSWORD_FILE" not in env  # no shared password on any node
    enroll = agent_enroll.enroll_settings_from_env(env, "gpu-a", "pool")
    assert enroll is not None and enroll.url == settings.agent_enroll_url
    assert str(enroll.token_file) == f"{manifests.ENROLL_DIR}/token"
    assert str(enroll.ca_file) == f"{manifests.ENROLL_DIR}/ca.crt"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[manifests.VOLUME_ENROLL] == manifests.ENROLL_DIR
