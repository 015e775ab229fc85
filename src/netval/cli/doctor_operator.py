"""`netval doctor`'s checks of the operator: its Deployment is ready, and a replica leads.

The Deployment's arguments and environment (`OperatorInfo`) tell the later checks whether the
operator elects a leader, serves the webhook, uses Kueue or per-node identity, and its broker.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from netval.cli.doctor_kube import KubeReader
from netval.cli.doctor_result import CheckResult, fail, ok, skip

LEASE_NAME: Final = "netval-operator"  # NETVAL_LEASE_NAME's default (operator.leadership)
LEASE_DURATION: Final = 10.0  # NETVAL_LEASE_DURATION_SECONDS's default


@dataclass
class OperatorInfo:
    """What the operator Deployment says about how the operator runs."""

    name: str
    service_account: str
    args: list[str]
    env: dict[str, str]
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)  # mount path -> volume

    @property
    def elects(self) -> bool:
        return "--standalone" not in self.args

    @property
    def lease(self) -> tuple[str | None, str]:
        """(namespace or None for the operator's, name) of its Lease."""
        namespace = self.env.get("NETVAL_LEASE_NAMESPACE", "").strip() or None
        return namespace, self.env.get("NETVAL_LEASE_NAME", "").strip() or LEASE_NAME

    @property
    def webhook(self) -> bool:
        return "--webhook-addr" in self.args or any(
            a.startswith("--webhook-addr=") for a in self.args
        )

    @property
    def identity(self) -> bool:
        addr = self.env.get("NETVAL_ENROLL_ADDR", "").strip().lower()
        return addr not in ("", "off")

    @property
    def kueue(self) -> bool:
        return self.env.get("NETVAL_KUEUE_ENABLED", "").strip().lower() == "true"

    @property
    def device_taints(self) -> bool:
        return self.env.get("NETVAL_DEVICE_TAINTS", "").strip().lower() == "true"

    def flag(self, name: str) -> str | None:
        for i, arg in enumerate(self.args):
            if arg == name and i + 1 < len(self.args):
                return self.args[i + 1]
            if arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
        return None


def check_operator(kube: KubeReader, ns: str) -> tuple[CheckResult, OperatorInfo | None]:
    code, body = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments")
    if code != 200 or not isinstance(body, dict):
        return fail("operator", f"cannot list Deployments in {ns}: HTTP {code}",
                    f"is -n {ns} the namespace netval is installed in?"), None  # fmt: skip
    for dep in body.get("items", []):
        info = operator_info(dep)
        if info is None:
            continue
        status = dep.get("status") or {}
        want = (dep.get("spec") or {}).get("replicas", 1)
        ready = status.get("readyReplicas", 0) or 0
        mode = "leader election" if info.elects else "standalone"
        extras = [x for x, on in (("webhook", info.webhook), ("kueue", info.kueue)) if on]
        what = f"Deployment {ns}/{info.name}: {ready}/{want} ready, {mode}" + (
            f", {' and '.join(extras)}" if extras else ""
        )
        if ready < 1:
            return fail("operator", what, f"kubectl -n {ns} describe deployment "
                        f"{info.name}; kubectl -n {ns} logs deployment/{info.name}"), info  # fmt: skip
        return ok("operator", what), info
    return fail("operator", f"no Deployment running `netval operator` in {ns}",
                f"helm install netval charts/netval -n {ns} (or pass -n NS)"), None  # fmt: skip


def check_leader(kube: KubeReader, ns: str, operator: OperatorInfo | None) -> CheckResult:
    if operator is None:
        return skip("leader", "needs the operator Deployment (leader election or not?)")
    if not operator.elects:
        return skip("leader", "the operator runs --standalone: no Lease")
    namespace, name = operator.lease
    namespace = namespace or ns
    code, body = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
    logs = f"kubectl -n {ns} logs deployment/{operator.name}"
    where = f"Lease {namespace}/{name}"
    if code == 404:
        return fail("leader", f"{where} does not exist: no replica has led yet",
                    f"{logs}: can the operator reach the API server and create Leases?")  # fmt: skip
    if code != 200 or not isinstance(body, dict):
        return fail("leader", f"cannot read {where}: HTTP {code}",
                    "is doctor allowed to get leases in that namespace?")  # fmt: skip
    spec = body.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    if not holder:
        return fail("leader", f"{where}: nobody leads (the last leader released it)",
                    f"{logs}: is any replica running?")  # fmt: skip
    age = _seconds_since(spec.get("renewTime"))
    duration = _number(spec.get("leaseDurationSeconds")) or LEASE_DURATION
    if age is None or age > 2 * duration:
        renewed = "never renewed" if age is None else f"not renewed for {age:.0f} s"
        return fail("leader", f"{where}: held by {holder} but {renewed} (lease "
                    f"{duration:g} s): the leader is gone or hung and no replica took over",
                    f"{logs}; kubectl -n {ns} get pods")  # fmt: skip
    return ok("leader", f"{where} held by {holder}, renewed {age:.0f} s ago")


def _seconds_since(stamp: Any) -> float | None:
    """Seconds since an RFC 3339 time (a Lease's MicroTime), None if absent or unreadable."""
    if not isinstance(stamp, str):
        return None
    try:
        then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return max(0.0, (datetime.datetime.now(datetime.UTC) - then).total_seconds())


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def operator_info(dep: Mapping[str, Any]) -> OperatorInfo | None:
    """The operator's settings from a Deployment whose container runs `netval operator`."""
    pod = ((dep.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in pod.get("containers") or []:
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if "operator" not in argv:
            continue
        args = argv[argv.index("operator") + 1 :]
        env = {
            e["name"]: str(e.get("value", "")) for e in container.get("env") or [] if "name" in e
        }
        volumes = {v["name"]: v for v in pod.get("volumes") or [] if "name" in v}
        mounts = {
            m["mountPath"].rstrip("/"): volumes.get(m.get("name", ""), {})
            for m in container.get("volumeMounts") or []
            if "mountPath" in m
        }
        return OperatorInfo(
            name=dep["metadata"]["name"],
            service_account=pod.get("serviceAccountName") or "default",
            args=[str(a) for a in args],
            env=env,
            volumes=mounts,
        )
    return None
