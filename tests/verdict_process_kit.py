"""What tests/test_verdict_process.py needs around a real `netval operator` process: its
start with the webhook and Kueue, the Nodes' labels and taints as the API holds them, the
webhook's answer over its own TLS, the operator's metrics and status."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from kube import KubeCluster, wait_for
from mosquitto import free_port
from netval.model.keys import LabelKey, TaintKey
from operator_env import NV, status_of
from operator_processes import OperatorProc
from test_admission import ADMISSIONREG, admission_review, patched

FABRIC = LabelKey.FABRIC.value
FLEET = "netval.example/fleet"
RACK = "netval.example/topology-rack"
HOSTNAME = LabelKey.HOSTNAME.value


def start_operator(
    cluster: KubeCluster, broker: Any, tmp_path: Path, env: dict[str, str] | None = None,
    *, kueue: bool = True,
) -> OperatorProc:  # fmt: skip
    """`netval operator --standalone` with its webhook (self-signed, on a free port) and,
    with `kueue`, the Kueue AdmissionCheck controller."""
    full = {"NETVAL_KUEUE_ENABLED": "true" if kueue else "false", **(env or {})}
    args = ("--webhook-addr", f"127.0.0.1:{free_port()}")
    return OperatorProc(cluster, broker, tmp_path, "op", standalone=True, env=full,
                        args=args).start()  # fmt: skip


def fabric(cluster: KubeCluster, prefix: str = "") -> dict[str, tuple[str | None, bool]]:
    """node -> (netval.io/fabric label, our taint) as the API holds them."""
    out: dict[str, tuple[str | None, bool]] = {}
    for node in cluster.list("v1", "nodes"):
        meta = node["metadata"]
        if not meta["name"].startswith(prefix):
            continue
        taints = (node.get("spec") or {}).get("taints") or []
        out[meta["name"]] = (
            (meta.get("labels") or {}).get(FABRIC),
            any(t.get("key") == TaintKey.FABRIC_UNHEALTHY for t in taints),
        )
    return out


def label_counts(cluster: KubeCluster, prefix: str = "") -> Counter[str | None]:
    return Counter(label for label, _ in fabric(cluster, prefix).values())


def tainted(cluster: KubeCluster, prefix: str = "") -> set[str]:
    return {n for n, (_, t) in fabric(cluster, prefix).items() if t}


def review(cluster: KubeCluster, handler_id: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview response of the operator's webhook for creating `obj`, over the
    TLS its configuration's caBundle vouches for."""
    configs = [
        cluster.stored(ADMISSIONREG, kind, "netval.io")
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
    ]
    for config in configs:
        for hook in (config or {}).get("webhooks") or []:
            url = hook["clientConfig"].get("url", "")
            if not url.endswith(f"/{handler_id}"):
                continue
            ctx = ssl.create_default_context(
                cadata=base64.b64decode(hook["clientConfig"]["caBundle"]).decode()
            )
            request = urllib.request.Request(
                url, data=json.dumps(admission_review(obj)).encode(),
                headers={"Content-Type": "application/json"}, method="POST",
            )  # fmt: skip
            opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
            )
            with opener.open(request, timeout=30) as response:
                body: dict[str, Any] = json.loads(response.read())
            return body
    raise LookupError(handler_id)


def wait_webhook(cluster: KubeCluster, proc: OperatorProc) -> None:
    wait_for(
        lambda: cluster.stored(ADMISSIONREG, "mutatingwebhookconfigurations", "netval.io"),
        timeout=60,
        what=f"the webhook configurations\n{proc.log()[-2000:]}",
    )


def admitted(cluster: KubeCluster, handler_id: str, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server stores it after the webhook's patch."""
    return patched(obj, review(cluster, handler_id, obj))


def metrics(proc: OperatorProc) -> str:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=10
    ) as response:
        text: str = response.read().decode()
        return text


def status(cluster: KubeCluster, name: str = "pool-a") -> dict[str, Any]:
    return status_of(cluster, name)


def condition(cluster: KubeCluster, kind: str, name: str = "pool-a") -> dict[str, Any]:
    found = next((c for c in status(cluster, name).get("conditions") or [] if c["type"] == kind),
                 None)  # fmt: skip
    return found or {}


def events(cluster: KubeCluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.list("v1", "events", "default") if e.get("reason") == reason]


def fleet_validation(name: str = "pool-a", **gating: Any) -> dict[str, Any]:
    return {
        "apiVersion": NV,
        "kind": "NetworkValidation",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {FLEET: "a"}, "interval": "5s", "gating": gating},
    }
