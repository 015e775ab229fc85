"""`netval doctor`'s permissions check: every verb the operator uses, as its service account.

One SelfSubjectAccessReview per verb, impersonating the operator's service account (in a pod:
the pod's own identity). The tables are the chart's RBAC (charts/netval/templates/rbac.yaml);
tests/test_doctor.py holds them against tests/test_chart_rbac.py's table.
"""

from __future__ import annotations

import argparse
import os
from typing import Final

from netval.cli.common import ENV_SERVICE_HOST
from netval.cli.doctor_cluster import KUEUE_GROUP
from netval.cli.doctor_kube import KubeReader
from netval.cli.doctor_operator import LEASE_NAME, OperatorInfo
from netval.cli.doctor_result import CheckResult, fail, ok
from netval.cli.doctor_webhook import WEBHOOK_CONFIGURATION

# (namespace: None cluster-wide, "$NS" the operator's, else that namespace), group, resource,
# subresource, resource name, verbs.
Permission = tuple[str | None, str, str, str, str, tuple[str, ...]]
BASE_PERMISSIONS: Final[tuple[Permission, ...]] = (
    (None, "netval.io", "networkvalidations", "", "", ("get", "list", "watch", "patch")),
    (None, "netval.io", "networkvalidations", "status", "", ("patch",)),
    (None, "netval.io", "networkvalidations", "finalizers", "", ("update",)),
    (None, "netval.io", "networkloadtests", "", "", ("get", "list", "watch", "patch")),
    (None, "netval.io", "networkloadtests", "status", "", ("patch",)),
    (None, "", "nodes", "", "", ("get", "list", "watch", "patch")),
    (None, "", "nodes", "status", "", ("patch",)),
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


# With NETVAL_DEVICE_TAINTS (chart deviceTaints.enabled): DRA device taints.
DEVICE_TAINT_PERMISSIONS: Final[tuple[Permission, ...]] = (
    (None, "resource.k8s.io", "resourceslices", "", "", ("list", "watch")),
    (None, "resource.k8s.io", "devicetaintrules", "", "", ("list", "create", "delete")),
)


def operator_permissions(operator: OperatorInfo | None) -> list[Permission]:
    """What the operator, run as its Deployment says, needs."""
    perms = list(BASE_PERMISSIONS)
    if operator is not None and operator.webhook:
        perms += WEBHOOK_PERMISSIONS
    if operator is not None and operator.kueue:
        perms += KUEUE_PERMISSIONS
    if operator is not None and operator.identity:
        perms += IDENTITY_PERMISSIONS
    if operator is not None and operator.device_taints:
        perms += DEVICE_TAINT_PERMISSIONS
    return perms


def _subject(
    args: argparse.Namespace, ns: str, operator: OperatorInfo | None
) -> tuple[str, dict[str, str]]:
    """(who, impersonation headers) whose permissions are checked."""
    if args.service_account:
        sa = args.service_account
    elif os.environ.get(ENV_SERVICE_HOST) and args.kubeconfig is None:
        return "this pod's service account", {}
    elif operator is not None:
        sa = operator.service_account
    else:
        return "you (no operator service account known: --service-account)", {}
    user = f"system:serviceaccount:{ns}:{sa}"
    return user, {"Impersonate-User": user}


def check_permissions(
    kube: KubeReader, args: argparse.Namespace, ns: str, operator: OperatorInfo | None
) -> CheckResult:
    who, headers = _subject(args, ns, operator)
    denied: list[str] = []
    asked = 0
    for namespace, group, resource, sub, name, verbs in operator_permissions(operator):
        where_ns = ns if namespace == "$NS" else namespace
        for verb in verbs:
            attrs = {"verb": verb, "group": group, "resource": resource}
            for key, value in (("subresource", sub), ("name", name), ("namespace", where_ns)):
                if value:
                    attrs[key] = value
            review = {"apiVersion": "authorization.k8s.io/v1",
                      "kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": attrs}}  # fmt: skip
            code, body = kube.call(
                "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review, headers
            )
            asked += 1
            if code == 404:
                return fail("permissions", "the API does not serve SelfSubjectAccessReview "
                            "(authorization.k8s.io/v1): cannot check the operator's permissions",
                            "check the RBAC by hand against charts/netval/templates/rbac.yaml")  # fmt: skip
            if code == 403 and headers:
                return fail("permissions", f"not allowed to impersonate {who} to check "
                            "its permissions",
                            "run doctor as a cluster admin, or inside the operator pod "
                            f"(kubectl -n {ns} exec deploy/OPERATOR -- netval doctor)")  # fmt: skip
            if code != 201 and code != 200:
                return fail("permissions", f"SelfSubjectAccessReview failed: HTTP {code}",
                            "is the API server healthy?")  # fmt: skip
            if not (isinstance(body, dict) and (body.get("status") or {}).get("allowed")):
                target = f"{resource}/{sub}" if sub else resource
                if name:
                    target += f" {name}"
                where = f" in {where_ns}" if where_ns else ""
                denied.append(f"{verb} {target}{where}")
    if denied:
        shown = ", ".join(denied[:8]) + (f" and {len(denied) - 8} more" if len(denied) > 8 else "")
        return fail("permissions", f"{who} may not: {shown}",
                    "helm upgrade the chart (its RBAC grants exactly these), or extend "
                    "the operator's ClusterRole/Role")  # fmt: skip
    return ok("permissions", f"{who} may do all {asked} operator verbs (SelfSubjectAccessReview)")
