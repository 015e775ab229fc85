"""Metrics as the Prometheus ecosystem expects: the operator's metrics Service, the
ServiceMonitor / PodMonitor / PrometheusRule of the Prometheus Operator (off by default;
validated against the transcribed monitoring.coreos.com/v1 schemas in chart_kit), and the
PrometheusRule's alerts are the ones docs/operations.md suggests.
"""

from __future__ import annotations

import re

import yaml

from chart_kit import AGENT_NAMESPACE, CHART, NAMESPACE, ROOT, find, one, schema_errors
from netval.model.keys import MANAGED_BY_OPERATOR, LabelKey
from netval.operator.agents import manifests


def test_monitoring_is_off_by_default_but_the_service_is_there() -> None:
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        assert not find("default", kind)
    service = one("default", "Service", "netval-operator-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9478, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "operator"


def test_service_monitor_scrapes_the_operator_service() -> None:
    monitor = one("monitoring", "ServiceMonitor", "netval-operator")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = one("monitoring", "Service", "netval-operator-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"


def test_pod_monitor_scrapes_the_agents_named_port() -> None:
    monitor = one("all-on", "PodMonitor", "netval-agents")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [AGENT_NAMESPACE]}
    assert monitor["spec"]["selector"]["matchLabels"] == {
        LabelKey.NAME: manifests.AGENT_APP_NAME,
        LabelKey.MANAGED_BY: MANAGED_BY_OPERATOR,
    }
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    # A fixed name, whatever port number each validation's agents listen on.
    assert endpoint["port"] == manifests.METRICS_PORT_NAME == "metrics"
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert targets == {"node", "validation"}


def _doc_alerts() -> dict[str, dict[str, str]]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("### Suggested alerts") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block
    (group,) = yaml.safe_load(block.group(1))["groups"]
    return {r["alert"]: r for r in group["rules"]}


def test_prometheus_rule_has_the_documented_alerts() -> None:
    rule = one("monitoring", "PrometheusRule", "netval")
    (group,) = rule["spec"]["groups"]
    rendered = {r["alert"]: r for r in group["rules"]}
    documented = _doc_alerts()
    assert set(rendered) == set(documented)
    for name, alert in documented.items():
        assert rendered[name]["expr"] == alert["expr"], name
        assert rendered[name].get("for") == alert.get("for"), name
        assert rendered[name]["labels"]["severity"] in {"critical", "warning", "info"}
        assert rendered[name]["annotations"]["summary"]
    # The rule file is shipped as is (Prometheus templates like {{ $labels.node }} intact).
    source = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert group["rules"] == source


def test_monitoring_schemas_catch_mistakes() -> None:
    monitor = one("monitoring", "ServiceMonitor", "netval-operator")
    assert schema_errors(monitor) == []
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    assert schema_errors(monitor)
    rule = one("monitoring", "PrometheusRule", "netval")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    assert schema_errors(rule)
