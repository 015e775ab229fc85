"""The chart's NetworkPolicies: the bundled broker admits only the operator and the agents on
its MQTT port (on by default), the operator's policy (opt-in) admits the webhook port, the
agents on the enrollment port, and metrics from the configured namespaces only.
"""

from __future__ import annotations

from typing import Any

import yaml

from chart_kit import AGENT_NAMESPACE, NAMESPACE, find, one, render

OPERATOR_SELECTOR = {
    "app.kubernetes.io/name": "netval",
    "app.kubernetes.io/instance": "netval",
    "app.kubernetes.io/component": "operator",
}


def _policies(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    text = render(values)["netval/templates/networkpolicy.yaml"]
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(text) if d}


def test_broker_policy_is_on_by_default_and_admits_only_operator_and_agents() -> None:
    policy = one("default", "NetworkPolicy", "netval-mqtt")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "mqtt"
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "mqtt", "protocol": "TCP"}]
    operator, agents, *addresses = rule["from"]
    assert operator == {"podSelector": {"matchLabels": OPERATOR_SELECTOR}}
    assert agents == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "netval-agent"}},
    }
    # The agents are on the host network: their node addresses, by default any.
    assert addresses == [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    # The agent pods' label is the one the operator renders.
    from netval.operator.agents import manifests

    assert manifests.AGENT_APP_NAME == "netval-agent"
    assert not find("default", "NetworkPolicy", "netval-operator")


def test_pod_cidrs_are_carved_out_per_family() -> None:
    policy = _policies(
        {
            "agent": {"namespace": AGENT_NAMESPACE},
            "networkPolicy": {"broker": {"podCidrs": ["10.244.0.0/16", "fd00:10::/56"]}},
        }
    )["netval-mqtt"]
    _, agents, v4, v6 = policy["spec"]["ingress"][0]["from"]
    assert agents["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": AGENT_NAMESPACE
    }
    assert v4 == {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}}
    assert v6 == {"ipBlock": {"cidr": "::/0", "except": ["fd00:10::/56"]}}
    narrow = _policies(
        {"networkPolicy": {"broker": {"agentSources": [{"ipBlock": {"cidr": "192.168.0.0/20"}}]}}}
    )["netval-mqtt"]
    assert narrow["spec"]["ingress"][0]["from"][2:] == [{"ipBlock": {"cidr": "192.168.0.0/20"}}]


def test_no_broker_policy_when_off_or_external() -> None:
    assert not find("no-network-policy", "NetworkPolicy")
    assert not find("external-broker", "NetworkPolicy")


def test_operator_policy_admits_webhook_enrollment_and_metrics_only() -> None:
    policy = one("all-on", "NetworkPolicy", "netval-operator")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == OPERATOR_SELECTOR
    webhook, enroll, metrics = spec["ingress"]
    # The agents enroll from where they reach the broker: the same peers as its MQTT port.
    broker = one("all-on", "NetworkPolicy", "netval-mqtt")["spec"]["ingress"][0]["from"]
    assert enroll == {"ports": [{"port": "enroll", "protocol": "TCP"}], "from": broker[1:]}
    assert webhook == {
        "ports": [{"port": "webhook", "protocol": "TCP"}],
        "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
    }
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {},
        }
    ]
    # Without sources the webhook port is open to any (the API server cannot be selected),
    # and without the webhook there is no webhook rule at all.
    open_webhook = _policies({"networkPolicy": {"operator": {"enabled": True}}})["netval-operator"]
    assert "from" not in open_webhook["spec"]["ingress"][0]
    no_webhook = _policies(
        {
            "networkPolicy": {"operator": {"enabled": True}},
            "webhook": {"enabled": False},
            "mqtt": {"identity": {"enabled": False}},
        }
    )["netval-operator"]
    assert [r["ports"][0]["port"] for r in no_webhook["spec"]["ingress"]] == ["metrics"]
    # Without per-node identity (shared agent login) there is no enrollment port to open.
    shared = _policies(
        {"networkPolicy": {"operator": {"enabled": True}},
         "mqtt": {"identity": {"enabled": False}}}
    )["netval-operator"]  # fmt: skip
    assert [r["ports"][0]["port"] for r in shared["spec"]["ingress"]] == ["webhook", "metrics"]


def test_named_ports_exist_on_the_pods() -> None:
    """The policies name ports; the pods they select must have them."""
    operator = one("all-on", "Deployment", "netval-operator")["spec"]["template"]["spec"]
    ports = {p["name"] for p in operator["containers"][0]["ports"]}
    assert {"webhook", "enroll", "metrics"} <= ports
    broker = one("default", "Deployment", "netval-mqtt")["spec"]["template"]["spec"]
    assert "mqtt" in {p["name"] for p in broker["containers"][0]["ports"]}
