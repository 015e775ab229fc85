"""`netval doctor`: is the cluster ready for netval, and what to fix. One line per check.

Checks, in order (a check that needs an earlier one that failed is skipped, saying which):

- `kubernetes-api`: the API answers (/version).
- `crd`: networkvalidations.netval.io is installed, serves v1alpha1, and its schema has every
  spec and status field this netval writes and reads (an older CRD prunes them silently).
- `operator`: its Deployment in --namespace (the one running `netval operator`) is ready;
  its arguments and environment tell the later checks whether it elects a leader, serves the
  webhook, uses Kueue, and which broker it uses.
- `leader`: without --standalone, a replica holds the operator's Lease and renews it.
- `permissions`: a SelfSubjectAccessReview for every verb the operator uses (the table below,
  the same as the chart's RBAC), as the operator's service account (impersonated; in a pod:
  the pod's own identity).
- `broker.*`: reachable, TLS handshake for mqtts://, MQTT login (netval.cli.doctor_broker).
- `kueue`: installed or not, which API versions; a failure only when the operator uses it.
- `webhook`: with the webhook, both configurations exist, their caBundle is a valid CA and
  the serving certificate (the operator's mounted Secret) is issued by it for the Service.
- `agents`: per NetworkValidation, its agent DaemonSet exists and has a ready pod on every
  targeted node.

Exit 0 only when no check fails (skipped checks are not applicable), 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast, get_origin

from netval import __version__
from netval.cli.common import (
    ENV_SERVICE_HOST,
    EXIT_OK,
    EXIT_UNHEALTHY,
    BadInput,
    KubeTarget,
    load_kube_config,
)
from netval.cli.doctor_result import CheckResult, State, fail, ok, skip

CRD_NAME: Final = "networkvalidations.netval.io"
CRD_VERSION: Final = "v1alpha1"
CRD_FIX: Final = (
    "kubectl apply -f crds/networkvalidations.netval.io.yaml (or helm upgrade the chart)"
)
LEASE_NAME: Final = "netval-operator"  # NETVAL_LEASE_NAME's default (operator.leadership)
LEASE_DURATION: Final = 10.0  # NETVAL_LEASE_DURATION_SECONDS's default
WEBHOOK_CONFIGURATION: Final = "netval.io"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSIONS: Final = ("v1beta2", "v1beta1")  # what the operator's Kueue controller reads

# (namespace: None cluster-wide, "$NS" the operator's, else that namespace), group, resource,
# subresource, resource name, verbs. The chart's RBAC (charts/netval/templates/rbac.yaml)
# grants exactly these; tests/test_doctor.py holds them against tests/test_chart_rbac.py's table.
Permission = tuple[str | None, str, str, str, str, tuple[str, ...]]
BASE_PERMISSIONS: Final[tuple[Permission, ...]] = (
    (None, "netval.io", "networkvalidations", "", "", ("get", "list", "watch", "patch")),
    (None, "netval.io", "networkvalidations", "status", "", ("patch",)),
    (None, "netval.io", "networkvalidations", "finalizers", "", ("update",)),
    (None, "", "nodes", "", "", ("get", "list", "watch", "patch")),
    (None, "apiextensions.k8s.io", "customresourcedefinitions", "", "", ("list", "watch")),
    ("$NS", "coordination.k8s.io", "leases", "", "", ("create",)),
    ("$NS", "coordination.k8s.io", "leases", "", LEASE_NAME, ("get", "update")),
    ("default", "", "events", "", "", ("create",)),
    ("$NS", "", "configmaps", "", "", ("get", "create", "patch", "delete")),
    ("$NS", "apps", "daemonsets", "", "", ("get", "list", "create", "update", "delete")),
)  # fmt: skip
WEBHOOK_PERMISSIONS: Final[tuple[Permission, ...]] = (
    (None, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", ("create",)),
    (None, "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "",
     ("create",)),
    (None, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "",
     WEBHOOK_CONFIGURATION, ("get", "patch")),
    (None, "admissionregistration.k8s.io", "validatingwebhookconfigurations", "",
     WEBHOOK_CONFIGURATION, ("get", "patch")),
    (None, "", "pods", "", "", ("get", "list", "patch")),
)  # fmt: skip
# With per-node MQTT identity (the operator has NETVAL_ENROLL_ADDR): enrolling agents' tokens.
IDENTITY_PERMISSIONS: Final[tuple[Permission, ...]] = (
    (None, "authentication.k8s.io", "tokenreviews", "", "", ("create",)),
)
KUEUE_PERMISSIONS: Final[tuple[Permission, ...]] = (
    (None, KUEUE_GROUP, "workloads", "", "", ("get", "list", "watch")),
    (None, KUEUE_GROUP, "workloads", "status", "", ("patch",)),
    (None, KUEUE_GROUP, "admissionchecks", "", "", ("list", "watch")),
    (None, KUEUE_GROUP, "admissionchecks", "status", "", ("patch",)),
)


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

    def flag(self, name: str) -> str | None:
        for i, arg in enumerate(self.args):
            if arg == name and i + 1 < len(self.args):
                return self.args[i + 1]
            if arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
        return None


class Doctor:
    def __init__(self, args: argparse.Namespace, target: KubeTarget) -> None:
        from kubernetes import client

        self.args = args
        self.target = target
        self.ns: str = args.namespace
        self.api = client.ApiClient()
        self.results: list[CheckResult] = []
        self.operator: OperatorInfo | None = None

    # -- helpers --------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None,
              headers: Mapping[str, str] | None = None) -> tuple[int, Any]:  # fmt: skip
        """(HTTP status, parsed JSON body) of one request; status 0 when unreachable.

        Through the official client's connection pool (its TLS, client certificates, proxy)
        and its auth settings (bearer token, refreshed by exec plugins), without its
        generated API layer, whose call signature differs between client versions."""
        import json

        import urllib3

        cfg = self.api.configuration
        sent = {"Accept": "application/json", "Content-Type": "application/json", **(headers or {})}
        for auth in cfg.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                sent[str(auth["key"])] = str(auth["value"])
        try:
            resp = self.api.rest_client.pool_manager.request(
                method,
                f"{cfg.host.rstrip('/')}{path}",
                body=None if body is None else json.dumps(body).encode(),
                headers=sent,
                timeout=urllib3.Timeout(total=self.args.timeout),
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return 0, str(exc)
        try:
            return resp.status, json.loads(resp.data) if resp.data else None
        except ValueError:
            return resp.status, resp.data.decode(errors="replace")

    def _get(self, path: str) -> tuple[int, Any]:
        return self._call("GET", path)

    def add(self, result: CheckResult) -> CheckResult:
        self.results.append(result)
        return result

    # -- checks ---------------------------------------------------------------------------

    def check_api(self) -> bool:
        code, body = self._get("/version")
        if code != 200:
            self.add(fail("kubernetes-api", f"no answer from the API ({self.target}): {body}",
                          "check --kubeconfig/--context and that the cluster is up"))  # fmt: skip
            return False
        version = body.get("gitVersion", "?") if isinstance(body, dict) else "?"
        self.add(ok("kubernetes-api", f"{self.api.configuration.host} answers ({version}), "
                                      f"using {self.target}"))  # fmt: skip
        return True

    def check_crd(self) -> None:
        code, crd = self._get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        if code == 404:
            self.add(fail("crd", f"{CRD_NAME} is not installed", CRD_FIX))
            return
        if code != 200 or not isinstance(crd, dict):
            self.add(fail("crd", f"cannot read the CRD {CRD_NAME}: HTTP {code}",
                          "is doctor allowed to get customresourcedefinitions?"))  # fmt: skip
            return
        versions = {v.get("name"): v for v in crd.get("spec", {}).get("versions", [])}
        version = versions.get(CRD_VERSION)
        if version is None or not version.get("served", False):
            served = ", ".join(str(n) for n, v in versions.items() if v.get("served")) or "none"
            self.add(fail("crd", f"{CRD_NAME} does not serve {CRD_VERSION} (serves {served}); "
                                 f"this netval {__version__} needs it", CRD_FIX))  # fmt: skip
            return
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        missing = missing_schema_fields(schema)
        if missing:
            shown = ", ".join(missing[:6]) + (
                f" and {len(missing) - 6} more" if len(missing) > 6 else ""
            )
            self.add(fail("crd", f"{CRD_NAME} is older than this netval {__version__}: its "
                                 f"schema lacks {shown} (the API server would drop them)", CRD_FIX))  # fmt: skip
            return
        self.add(ok("crd", f"{CRD_NAME} serves {CRD_VERSION} with every field netval "
                           f"{__version__} uses"))  # fmt: skip

    def check_operator(self) -> None:
        code, body = self._get(f"/apis/apps/v1/namespaces/{self.ns}/deployments")
        if code != 200 or not isinstance(body, dict):
            self.add(fail("operator", f"cannot list Deployments in {self.ns}: HTTP {code}",
                          f"is -n {self.ns} the namespace netval is installed in?"))  # fmt: skip
            return
        for dep in body.get("items", []):
            info = _operator_info(dep)
            if info is None:
                continue
            self.operator = info
            status = dep.get("status") or {}
            want = (dep.get("spec") or {}).get("replicas", 1)
            ready = status.get("readyReplicas", 0) or 0
            mode = "leader election" if info.elects else "standalone"
            extras = [x for x, on in (("webhook", info.webhook), ("kueue", info.kueue)) if on]
            what = f"Deployment {self.ns}/{info.name}: {ready}/{want} ready, {mode}" + (
                f", {' and '.join(extras)}" if extras else ""
            )
            if ready < 1:
                self.add(fail("operator", what, f"kubectl -n {self.ns} describe deployment "
                              f"{info.name}; kubectl -n {self.ns} logs deployment/{info.name}"))  # fmt: skip
            else:
                self.add(ok("operator", what))
            return
        self.add(fail("operator", f"no Deployment running `netval operator` in {self.ns}",
                      f"helm install netval charts/netval -n {self.ns} (or pass -n NS)"))  # fmt: skip

    def check_leader(self) -> None:
        if self.operator is None:
            self.add(skip("leader", "needs the operator Deployment (leader election or not?)"))
            return
        if not self.operator.elects:
            self.add(skip("leader", "the operator runs --standalone: no Lease"))
            return
        namespace, name = self.operator.lease
        namespace = namespace or self.ns
        code, body = self._get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
        logs = f"kubectl -n {self.ns} logs deployment/{self.operator.name}"
        where = f"Lease {namespace}/{name}"
        if code == 404:
            self.add(fail("leader", f"{where} does not exist: no replica has led yet",
                          f"{logs}: can the operator reach the API server and create Leases?"))  # fmt: skip
            return
        if code != 200 or not isinstance(body, dict):
            self.add(fail("leader", f"cannot read {where}: HTTP {code}",
                          "is doctor allowed to get leases in that namespace?"))  # fmt: skip
            return
        spec = body.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        if not holder:
            self.add(fail("leader", f"{where}: nobody leads (the last leader released it)",
                          f"{logs}: is any replica running?"))  # fmt: skip
            return
        age = _seconds_since(spec.get("renewTime"))
        duration = _number(spec.get("leaseDurationSeconds")) or LEASE_DURATION
        if age is None or age > 2 * duration:
            renewed = "never renewed" if age is None else f"not renewed for {age:.0f} s"
            self.add(fail("leader", f"{where}: held by {holder} but {renewed} (lease "
                          f"{duration:g} s): the leader is gone or hung and no replica took over",
                          f"{logs}; kubectl -n {self.ns} get pods"))  # fmt: skip
            return
        self.add(ok("leader", f"{where} held by {holder}, renewed {age:.0f} s ago"))

    def _subject(self) -> tuple[str, dict[str, str]]:
        """(who, impersonation headers) whose permissions are checked."""
        if self.args.service_account:
            sa = self.args.service_account
        elif os.environ.get(ENV_SERVICE_HOST) and self.args.kubeconfig is None:
            return "this pod's service account", {}
        elif self.operator is not None:
            sa = self.operator.service_account
        else:
            return "you (no operator service account known: --service-account)", {}
        user = f"system:serviceaccount:{self.ns}:{sa}"
        return user, {"Impersonate-User": user}

    def permissions(self) -> list[Permission]:
        perms = list(BASE_PERMISSIONS)
        if self.operator is not None and self.operator.webhook:
            perms += WEBHOOK_PERMISSIONS
        if self.operator is not None and self.operator.kueue:
            perms += KUEUE_PERMISSIONS
        if self.operator is not None and self.operator.identity:
            perms += IDENTITY_PERMISSIONS
        return perms

    def check_permissions(self) -> None:
        who, headers = self._subject()
        denied: list[str] = []
        asked = 0
        for namespace, group, resource, sub, name, verbs in self.permissions():
            ns = self.ns if namespace == "$NS" else namespace
            for verb in verbs:
                attrs = {"verb": verb, "group": group, "resource": resource}
                for key, value in (("subresource", sub), ("name", name), ("namespace", ns)):
                    if value:
                        attrs[key] = value
                review = {"apiVersion": "authorization.k8s.io/v1",
                          "kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": attrs}}  # fmt: skip
                code, body = self._call(
                    "POST",
                    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                    review,
                    headers,
                )
                asked += 1
                if code == 404:
                    self.add(fail("permissions", "the API does not serve SelfSubjectAccessReview "
                                  "(authorization.k8s.io/v1): cannot check the operator's permissions",
                                  "check the RBAC by hand against charts/netval/templates/rbac.yaml"))  # fmt: skip
                    return
                if code == 403 and headers:
                    self.add(fail("permissions", f"not allowed to impersonate {who} to check "
                                  "its permissions",
                                  "run doctor as a cluster admin, or inside the operator pod "
                                  f"(kubectl -n {self.ns} exec deploy/OPERATOR -- netval doctor)"))  # fmt: skip
                    return
                if code != 201 and code != 200:
                    self.add(fail("permissions", f"SelfSubjectAccessReview failed: HTTP {code}",
                                  "is the API server healthy?"))  # fmt: skip
                    return
                if not (isinstance(body, dict) and (body.get("status") or {}).get("allowed")):
                    target = f"{resource}/{sub}" if sub else resource
                    if name:
                        target += f" {name}"
                    where = f" in {ns}" if ns else ""
                    denied.append(f"{verb} {target}{where}")
        if denied:
            shown = ", ".join(denied[:8]) + (
                f" and {len(denied) - 8} more" if len(denied) > 8 else ""
            )
            self.add(fail("permissions", f"{who} may not: {shown}",
                          "helm upgrade the chart (its RBAC grants exactly these), or extend "
                          "the operator's ClusterRole/Role"))  # fmt: skip
        else:
            self.add(ok("permissions", f"{who} may do all {asked} operator verbs "
                                       "(SelfSubjectAccessReview)"))  # fmt: skip

    def check_broker(self) -> None:
        from netval.cli.doctor_broker import broker_checks
        from netval.infra.mqtt_settings import mqtt_settings_from_env

        env = self._mqtt_env()
        if not env.get("NETVAL_MQTT_URL"):
            self.add(fail("broker", "no broker to check: --mqtt-url, NETVAL_MQTT_URL and the "
                          "operator Deployment name none",
                          "pass --mqtt-url mqtt(s)://HOST:PORT"))  # fmt: skip
            return
        try:
            settings = mqtt_settings_from_env(env, client_id="netval-doctor")
        except ValueError as exc:
            self.add(fail("broker", str(exc), "fix the broker settings (--mqtt-* flags)"))
            return
        self.results.extend(broker_checks(settings, self.args.timeout))

    def _mqtt_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.startswith("NETVAL_MQTT_")}
        op_env = self.operator.env if self.operator else {}
        for key in ("NETVAL_MQTT_URL", "NETVAL_MQTT_USERNAME"):
            if not env.get(key) and op_env.get(key):
                env[key] = op_env[key]
        a = self.args
        for key, value in (("NETVAL_MQTT_URL", a.mqtt_url), ("NETVAL_MQTT_USERNAME", a.mqtt_username),
                           ("NETVAL_MQTT_PASSWORD_FILE", a.mqtt_password_file),
                           ("NETVAL_MQTT_CA_FILE", a.mqtt_ca_file)):  # fmt: skip
            if value is not None:
                env[key] = str(value)
        return env

    def check_kueue(self) -> None:
        code, body = self._get(f"/apis/{KUEUE_GROUP}")
        used = self.operator is not None and self.operator.kueue
        if code != 200 or not isinstance(body, dict):
            if used:
                self.add(fail("kueue", f"the operator has NETVAL_KUEUE_ENABLED=true but the API "
                              f"serves no {KUEUE_GROUP}",
                              "install Kueue, or set kueue.enabled=false in the chart"))  # fmt: skip
            else:
                self.add(skip("kueue", "Kueue is not installed (the operator does not use it)"))
            return
        served = [v.get("version") for v in body.get("versions", [])]
        preferred = (body.get("preferredVersion") or {}).get("version")
        usable = [v for v in KUEUE_VERSIONS if v in served]
        what = f"Kueue installed: {KUEUE_GROUP} serves {', '.join(map(str, served))} (preferred {preferred})"
        if not usable:
            self.add(fail("kueue", f"{what}; netval reads {' or '.join(KUEUE_VERSIONS)}",
                          "upgrade Kueue to a release serving v1beta1 or v1beta2"))  # fmt: skip
            return
        use = f"; netval uses {usable[0]}" + ("" if used else " (not enabled in the operator)")
        self.add(ok("kueue", what + use))

    def check_webhook(self) -> None:
        used = self.operator is not None and self.operator.webhook
        found: dict[str, dict[str, Any]] = {}
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            code, body = self._get(
                f"/apis/admissionregistration.k8s.io/v1/{kind}/{WEBHOOK_CONFIGURATION}"
            )
            if code == 200 and isinstance(body, dict):
                found[kind] = body
        if not used and not found:
            self.add(skip("webhook", "the operator serves no admission webhook"))
            return
        if len(found) < 2:
            missing = {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"} - set(
                found
            )
            self.add(fail("webhook", f"{', '.join(sorted(missing))} {WEBHOOK_CONFIGURATION} missing",
                          "the operator creates them at start: check its logs; or helm upgrade"))  # fmt: skip
            return
        problems, seen = [], 0
        serving = self._serving_certificate()
        for kind, conf in found.items():
            for hook in conf.get("webhooks") or []:
                seen += 1
                problem = verify_webhook_ca(hook, serving)
                if problem:
                    problems.append(f"{kind.split('webhook')[0]} {hook.get('name')}: {problem}")
        if problems:
            self.add(fail("webhook", "; ".join(problems),
                          "re-create the serving certificate from the CA in the configurations "
                          "(helm upgrade), or restart the operator so it rewrites caBundle"))  # fmt: skip
            return
        cert_note = (
            "serving certificate issued by it"
            if serving
            else "serving certificate not readable from here"
        )
        self.add(ok("webhook", f"{seen} webhook(s) in {WEBHOOK_CONFIGURATION}: caBundle a valid CA, "
                               f"{cert_note}"))  # fmt: skip

    def _serving_certificate(self) -> bytes | None:
        """The webhook's serving certificate (PEM) from the Secret the operator mounts."""
        if self.operator is None:
            return None
        cert_path = self.operator.flag("--webhook-cert")
        if not cert_path:
            return None
        directory = str(Path(cert_path).parent)
        volume = self.operator.volumes.get(directory)
        secret = (volume or {}).get("secret", {}).get("secretName")
        if not secret:
            return None
        code, body = self._get(f"/api/v1/namespaces/{self.ns}/secrets/{secret}")
        if code != 200 or not isinstance(body, dict):
            return None
        data = (body.get("data") or {}).get(Path(cert_path).name)
        return base64.b64decode(data) if data else None

    def check_agents(self) -> None:
        from netval.cli.status_view import label_selector
        from netval.operator.agents.manifests import agent_object_name, selector_labels

        code, body = self._get("/apis/netval.io/v1alpha1/networkvalidations")
        if code != 200 or not isinstance(body, dict):
            self.add(skip("agents", f"cannot list NetworkValidations (HTTP {code})"))
            return
        validations = body.get("items", [])
        if not validations:
            self.add(skip("agents", "no NetworkValidation yet (kubectl apply -f "
                                    "examples/roce-training-pool.yaml)"))  # fmt: skip
            return
        from urllib.parse import quote

        for v in sorted(validations, key=lambda o: o["metadata"]["name"]):
            name = v["metadata"]["name"]
            check = f"agents/{name}"
            selector = label_selector(v)
            _, nodes = self._get(
                "/api/v1/nodes" + (f"?labelSelector={quote(selector)}" if selector else "")
            )
            targeted = sorted(n["metadata"]["name"] for n in (nodes or {}).get("items", []))
            ds_name = agent_object_name(name)
            code, ds = self._get(f"/apis/apps/v1/namespaces/{self.ns}/daemonsets/{ds_name}")
            if code != 200 or not isinstance(ds, dict):
                self.add(fail(check, f"DaemonSet {self.ns}/{ds_name} missing ({len(targeted)} "
                              "targeted node(s))", "is the operator running and watching? "
                              f"kubectl -n {self.ns} logs deploy/OPERATOR"))  # fmt: skip
                continue
            pod_selector = ",".join(
                f"{k}={val}" for k, val in sorted(selector_labels(name).items())
            )
            _, pods = self._get(
                f"/api/v1/namespaces/{self.ns}/pods?labelSelector={quote(pod_selector)}"
            )
            ready_on = {p.get("spec", {}).get("nodeName") for p in (pods or {}).get("items", [])
                        if _pod_ready(p)}  # fmt: skip
            missing = [n for n in targeted if n not in ready_on]
            if not targeted:
                self.add(skip(check, "nodeSelector matches no node"))
            elif missing:
                shown = ", ".join(missing[:6]) + (
                    f" and {len(missing) - 6} more" if len(missing) > 6 else ""
                )
                self.add(fail(check, f"DaemonSet {ds_name}: no ready agent on {len(missing)} of "
                              f"{len(targeted)} targeted node(s): {shown}",
                              f"kubectl -n {self.ns} get pods -l {pod_selector} -o wide; taints "
                              "the agents do not tolerate (NETVAL_AGENT_TOLERATIONS)?"))  # fmt: skip
            else:
                self.add(ok(check, f"DaemonSet {ds_name}: a ready agent on all {len(targeted)} "
                                   "targeted node(s)"))  # fmt: skip

    def run(self) -> list[CheckResult]:
        if not self.check_api():
            for name in ("crd", "operator", "leader", "permissions", "kueue", "webhook", "agents"):
                self.add(skip(name, "needs kubernetes-api"))
            return self.results
        self.check_crd()
        self.check_operator()
        self.check_leader()
        self.check_permissions()
        self.check_broker()
        self.check_kueue()
        self.check_webhook()
        self.check_agents()
        return self.results


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


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _operator_info(dep: Mapping[str, Any]) -> OperatorInfo | None:
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


def _schema_paths(schema: Mapping[str, Any], prefix: str) -> Iterable[str]:
    yield prefix
    for key, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, Mapping):
            yield from _schema_paths(sub, f"{prefix}.{key}")
            items = sub.get("items")
            if isinstance(items, Mapping):
                yield from _schema_paths(items, f"{prefix}.{key}[]")


def _model_paths(model: Any, prefix: str) -> Iterable[str]:
    from pydantic import BaseModel

    from netval.model.manifest import _inner_models

    yield prefix
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return
    for name, f in model.model_fields.items():
        key = f.alias or name
        if get_origin(f.annotation) is dict:  # additionalProperties: keys are free
            yield f"{prefix}.{key}"
            continue
        inner = next(_inner_models(f.annotation), None)
        is_list = getattr(f.annotation, "__origin__", None) is list or "list[" in str(f.annotation)
        path = f"{prefix}.{key}[]" if is_list and inner is not None else f"{prefix}.{key}"
        if inner is None:
            yield path
        elif inner.model_config.get("extra") != "allow":
            yield from _model_paths(inner, path)


def missing_schema_fields(schema: Mapping[str, Any]) -> list[str]:
    """Fields of the spec and status models that `schema` (the CRD's openAPIV3Schema) lacks:
    a CRD older than this netval, whose API server would prune what netval writes."""
    from netval.model.spec import NetworkValidationSpec
    from netval.model.status import NetworkValidationStatus

    props = schema.get("properties") or {}
    have: set[str] = set()
    for top in ("spec", "status"):
        sub = props.get(top)
        if isinstance(sub, Mapping):
            if sub.get("x-kubernetes-preserve-unknown-fields"):
                return []
            have.update(_schema_paths(sub, top))
    want = [*_model_paths(NetworkValidationSpec, "spec"),
            *_model_paths(NetworkValidationStatus, "status")]  # fmt: skip
    missing = [p for p in want if p not in have]
    # report the shallowest missing field only (spec.checks.peers, not all of peers' fields)
    return [p for p in missing if not any(p.startswith(f"{q}.") or p.startswith(f"{q}[]")
                                          for q in missing if q != p)]  # fmt: skip


def _issued_by(cert: Any, ca: Any) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def verify_webhook_ca(hook: Mapping[str, Any], serving_pem: bytes | None) -> str | None:
    """Why `hook`'s caBundle cannot verify its serving certificate (None: it can)."""
    from cryptography import x509
    from cryptography.x509.oid import ExtensionOID

    bundle = (hook.get("clientConfig") or {}).get("caBundle")
    if not bundle:
        return "no caBundle"
    try:
        cas = x509.load_pem_x509_certificates(base64.b64decode(bundle))
    except ValueError:
        return "caBundle is not base64 PEM certificates"
    now = datetime.datetime.now(datetime.UTC)
    valid = [c for c in cas if c.not_valid_before_utc <= now <= c.not_valid_after_utc]
    if not valid:
        return f"every CA in caBundle has expired or is not yet valid (until {cas[0].not_valid_after_utc:%Y-%m-%d})"
    if serving_pem is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(serving_pem)
    except ValueError:
        return "the serving certificate is not PEM"
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return (
            f"the serving certificate is outside its validity ({cert.not_valid_after_utc:%Y-%m-%d})"
        )
    if not any(_issued_by(cert, ca) for ca in valid):
        return "the serving certificate is not issued by a CA in caBundle"
    service = (hook.get("clientConfig") or {}).get("service")
    if service:
        host = f"{service.get('name')}.{service.get('namespace')}.svc"
        try:
            san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
            names = cast(x509.SubjectAlternativeName, san.value).get_values_for_type(x509.DNSName)
        except x509.ExtensionNotFound:
            names = []
        if host not in names:
            return (
                f"the serving certificate is not for {host} (it names {', '.join(names) or 'none'})"
            )
    return None


def cmd_doctor(args: argparse.Namespace) -> int:
    target = load_kube_config(args.kubeconfig, args.context)
    if args.mqtt_password_file is not None and not args.mqtt_password_file.is_file():
        raise BadInput(f"--mqtt-password-file {args.mqtt_password_file}: no such file")
    results = Doctor(args, target).run()
    for r in results:
        sys.stdout.write(r.line() + "\n")
    failed = [r for r in results if r.state is State.FAIL]
    passed = sum(1 for r in results if r.state is State.PASS)
    skipped = len(results) - passed - len(failed)
    sys.stdout.write(
        f"{'NOT READY' if failed else 'READY'}: {passed} passed, {len(failed)} failed, "
        f"{skipped} skipped\n"
    )
    return EXIT_UNHEALTHY if failed else EXIT_OK
