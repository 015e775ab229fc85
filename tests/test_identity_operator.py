"""The operator's identity service inside the real operator (in-process Kopf running
netval's handlers against the test API, the chart's Mosquitto): it starts with the operator,
publishes the enrollment CA for the agents, revokes a deleted Node's identity at once, and
the credential of an agent Pod that is gone.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from datetime import timedelta
from pathlib import Path

import kopf

from identity_kit import Mqtt, agent_pod
from kopf_harness import kopf_operator
from kube import KubeCluster, wait_for
from netval.infra.mqtt_settings import MqttSettings
from netval.operator.identity.service import IdentityService, IdentitySettings
from netval.operator.kube import certs
from netval.operator.settings import OperatorSettings
from operator_env import GPU, NS, add_node
from test_chart_broker import plaintext_listener, run_chart_broker
from test_enrollment import Claims, TokenAuthority


def test_a_deleted_node_or_agent_pod_loses_its_identity(tmp_path: Path, kube: KubeCluster) -> None:
    kube.ensure_namespace(NS)
    add_node(kube, "gpu-a", GPU)
    add_node(kube, "gpu-b", GPU)
    authority = TokenAuthority()
    kube.api.token_reviewer = authority.review
    tls = certs.generate_self_signed(tmp_path / "enroll-tls", ["127.0.0.1"])
    with run_chart_broker(tmp_path, plaintext_listener) as (port, secrets):
        mqtt = MqttSettings("127.0.0.1", port, username="netval-operator",
                            password=secrets["operator"], client_id="netval-operator-test")  # fmt: skip
        settings = OperatorSettings(
            namespace=NS, agent_image="registry.example/netval:test", mqtt=mqtt,
            agent_mqtt_url="mqtt://netval-mqtt.netval-system.svc:1883",
            agent_mqtt_username="netval-agent", agent_mqtt_secret="netval-mqtt-agent",
            agent_mqtt_ca_secret=None, status_window=0.2,
            agent_enroll_url="https://netval-webhook.netval-system.svc:9444/v1/enroll",
            agent_enroll_ca_configmap="netval-enroll-ca",
        )  # fmt: skip
        identity = IdentitySettings("127.0.0.1", 0, tls.cert, tls.key, timedelta(hours=1), tls.ca,
                                    departed_every=0.5)  # fmt: skip
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
            creds = {}
            for node in ("gpu-a", "gpu-b"):
                pod = agent_pod(kube, f"agent-{node}", node, NS)
                token = authority.mint(Claims(f"agent-{node}", pod["metadata"]["uid"], node))
                request = urllib.request.Request(
                    f"https://127.0.0.1:{service.server.port}/v1/enroll", data=b"", method="POST",
                    headers={"Authorization": f"Bearer {token}"},
                )  # fmt: skip
                with urllib.request.urlopen(request, context=context, timeout=20) as response:
                    creds[node] = json.loads(response.read())
            clients = {}
            for node, cred in creds.items():
                clients[node] = Mqtt(
                    port, cred["username"], cred["password"], client_id=cred["clientId"]
                )
                assert not clients[node].connect().is_failure
            try:
                kube.delete("v1", "Node", "gpu-a")
                wait_for(lambda: clients["gpu-a"].disconnects, 20, what="gpu-a disconnected")
                again = Mqtt(
                    port,
                    creds["gpu-a"]["username"],
                    creds["gpu-a"]["password"],
                    client_id=creds["gpu-a"]["clientId"],
                )
                assert again.connect().is_failure
                again.close()
                assert not clients["gpu-b"].disconnects
                # gpu-b's agent Pod goes (a rollout, or gpu-b left every validation) while the
                # Node stays: the leader's sweep revokes that pod's credential.
                kube.delete("v1", "Pod", "agent-gpu-b", namespace=NS)
                wait_for(lambda: clients["gpu-b"].disconnects, 20, what="gpu-b's pod revoked")
                assert kube.get("v1", "Node", "gpu-b")
                runtime = memo["runtime"]
                metrics_port = runtime.metrics_server.sockets[0].getsockname()[1]

                def metrics() -> str:
                    url = f"http://127.0.0.1:{metrics_port}/metrics"
                    with urllib.request.urlopen(url, timeout=10) as r:
                        return str(r.read().decode())

                # The start check's probe identity (a reserved node's) may not publish for
                # another node on the chart's broker; its credential is revoked after.
                def checked() -> str | None:
                    text = metrics()
                    return text if "netval_broker_acl_violations" in text else None

                text = wait_for(checked, 20, what="the broker ACL check")
                assert "netval_broker_acl_violations 0.0" in text
                assert 'netval_operator_enrollments_total{outcome="issued"} 2.0' in text
                # gpu-a's, the probe identity's and gpu-b's pod's
                assert 'netval_operator_mqtt_credentials_total{event="revoked"} 3.0' in text
                assert "netval_operator_dynsec_connected 1.0" in text
            finally:
                for client in clients.values():
                    client.close()


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
    enroll = agent_enroll.enroll_settings_from_env(env, "gpu-a")
    assert enroll is not None and enroll.url == settings.agent_enroll_url
    assert str(enroll.token_file) == f"{manifests.ENROLL_DIR}/token"
    assert str(enroll.ca_file) == f"{manifests.ENROLL_DIR}/ca.crt"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[manifests.VOLUME_ENROLL] == manifests.ENROLL_DIR
