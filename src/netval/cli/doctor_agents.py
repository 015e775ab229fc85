"""`netval doctor`'s agents check: per NetworkValidation, its agent DaemonSet exists and has a
ready pod on every targeted node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from netval.cli.doctor_kube import KubeReader
from netval.cli.doctor_result import CheckResult, fail, ok, skip


def check_agents(kube: KubeReader, ns: str) -> list[CheckResult]:
    from netval.cli.status_view import label_selector
    from netval.operator.agents.manifests import agent_object_name, selector_labels

    code, body = kube.get("/apis/netval.io/v1alpha1/networkvalidations")
    if code != 200 or not isinstance(body, dict):
        return [skip("agents", f"cannot list NetworkValidations (HTTP {code})")]
    validations = body.get("items", [])
    if not validations:
        return [skip("agents", "no NetworkValidation yet (kubectl apply -f "
                               "examples/roce-training-pool.yaml)")]  # fmt: skip
    results: list[CheckResult] = []
    for v in sorted(validations, key=lambda o: o["metadata"]["name"]):
        name = v["metadata"]["name"]
        check = f"agents/{name}"
        selector = label_selector(v)
        _, nodes = kube.get(
            "/api/v1/nodes" + (f"?labelSelector={quote(selector)}" if selector else "")
        )
        targeted = sorted(n["metadata"]["name"] for n in (nodes or {}).get("items", []))
        ds_name = agent_object_name(name)
        code, ds = kube.get(f"/apis/apps/v1/namespaces/{ns}/daemonsets/{ds_name}")
        if code != 200 or not isinstance(ds, dict):
            results.append(fail(check, f"DaemonSet {ns}/{ds_name} missing ({len(targeted)} "
                                "targeted node(s))", "is the operator running and watching? "
                                f"kubectl -n {ns} logs deploy/OPERATOR"))  # fmt: skip
            continue
        pod_selector = ",".join(f"{k}={val}" for k, val in sorted(selector_labels(name).items()))
        _, pods = kube.get(f"/api/v1/namespaces/{ns}/pods?labelSelector={quote(pod_selector)}")
        ready_on = {p.get("spec", {}).get("nodeName") for p in (pods or {}).get("items", [])
                    if _pod_ready(p)}  # fmt: skip
        missing = [n for n in targeted if n not in ready_on]
        if not targeted:
            results.append(skip(check, "nodeSelector matches no node"))
        elif missing:
            shown = ", ".join(missing[:6]) + (
                f" and {len(missing) - 6} more" if len(missing) > 6 else ""
            )
            results.append(fail(check, f"DaemonSet {ds_name}: no ready agent on {len(missing)} "
                                f"of {len(targeted)} targeted node(s): {shown}",
                                f"kubectl -n {ns} get pods -l {pod_selector} -o wide; taints "
                                "the agents do not tolerate (NETVAL_AGENT_TOLERATIONS)?"))  # fmt: skip
        else:
            results.append(ok(check, f"DaemonSet {ds_name}: a ready agent on all "
                                     f"{len(targeted)} targeted node(s)"))  # fmt: skip
    return results


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
