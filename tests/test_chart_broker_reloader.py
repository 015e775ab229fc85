"""The broker pod's `netval broker-reloader` sidecar (mqtt.tls.reloadOnRenewal), rendered.

It comes with a certificate the cluster renews behind the chart's back (cert-manager, the
user's Secret), in every broker shard, and never with the chart's own certificate (a new one
restarts the broker through checksum/tls), plaintext or an external broker. Its process is
tested for real in tests/test_broker_reloader.py; here: what the chart gives it.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from chart_kit import VARIANTS, find, operator_container, render
from netval.cli.parser import build_parser


def _broker_pods(variant: str | None = None, values: dict[str, Any] | None = None) -> list[Any]:
    if variant is not None:
        deployments = find(variant, "Deployment")
    else:
        text = render(values or {})["netval/templates/mqtt-broker.yaml"]
        deployments = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"]
    return [d["spec"]["template"]["spec"] for d in deployments
            if d["metadata"]["name"].startswith("netval-mqtt")]  # fmt: skip


def _reloader(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in pod["containers"] if c["name"] == "tls-reloader"), None)


@pytest.mark.parametrize("variant", ["broker-cert-manager", "broker-tls-existing"])
def test_a_renewable_certificate_gets_the_reloader(variant: str) -> None:
    (pod,) = _broker_pods(variant)
    assert pod["shareProcessNamespace"] is True  # to see the broker's process
    reloader = _reloader(pod)
    assert reloader is not None
    assert reloader["image"] == operator_container(variant)["image"]
    args = build_parser().parse_args(reloader["args"])  # the real command line takes them
    assert args.command == "broker-reloader" and str(args.dir) == "/mosquitto/tls"
    assert args.interval == 30.0
    # the broker's user, so it may signal it without a capability
    (broker,) = [c for c in pod["containers"] if c["name"] == "mosquitto"]
    assert reloader["securityContext"]["runAsUser"] == broker["securityContext"]["runAsUser"]
    assert reloader["securityContext"]["runAsUser"] == 1883
    security = reloader["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False and security["runAsNonRoot"] is True
    assert reloader["volumeMounts"] == [
        {"name": "tls", "mountPath": "/mosquitto/tls", "readOnly": True}
    ]
    assert reloader["resources"]["limits"]["memory"] and reloader["resources"]["requests"]["cpu"]


@pytest.mark.parametrize("variant", ["default", "broker-plaintext", "external-broker"])
def test_no_reloader_without_a_certificate_renewed_outside_the_chart(variant: str) -> None:
    for pod in _broker_pods(variant):
        assert _reloader(pod) is None
        assert "shareProcessNamespace" not in pod


def test_reload_on_renewal_can_be_turned_off() -> None:
    values = {"mqtt": {"tls": {"certManager": {"enabled": True}, "reloadOnRenewal": False}}}
    (pod,) = _broker_pods(values=values)
    assert _reloader(pod) is None and "shareProcessNamespace" not in pod
    # the variants above leave it at its default: on
    assert "reloadOnRenewal" not in VARIANTS["broker-cert-manager"]["mqtt"]["tls"]


def test_every_broker_shard_gets_its_own_reloader() -> None:
    pods = _broker_pods(values={"mqtt": {"shards": 3, "tls": {"certManager": {"enabled": True}}}})
    assert len(pods) == 3
    for pod in pods:
        assert pod["shareProcessNamespace"] is True and _reloader(pod) is not None


def test_the_toggle_is_a_boolean() -> None:
    with pytest.raises(Exception, match="reloadOnRenewal"):
        render({"mqtt": {"tls": {"reloadOnRenewal": "yes"}}})


def test_the_interval_is_a_positive_number_of_seconds() -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["broker-reloader", "--interval", "0"])
    assert exit_.value.code == 2
