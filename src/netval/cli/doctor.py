"""`netval doctor`: is the cluster ready for netval, and what to fix. One line per check.

Checks, in order (a check that needs an earlier one that failed is skipped, saying which):

- `kubernetes-api`: the API answers (/version).
- `crd`: networkvalidations.netval.io is installed, serves v1alpha1, and its schema has every
  spec and status field this netval writes and reads (an older CRD prunes them silently)
  (netval.cli.doctor_cluster, as is `kueue`).
- `operator`: its Deployment in --namespace (the one running `netval operator`) is ready;
  its arguments and environment tell the later checks whether it elects a leader, serves the
  webhook, uses Kueue, and which broker it uses.
- `leader`: without --standalone, a replica holds the operator's Lease and renews it
  (netval.cli.doctor_operator).
- `permissions`: a SelfSubjectAccessReview for every verb the operator uses (the table below,
  the same as the chart's RBAC), as the operator's service account (impersonated; in a pod:
  the pod's own identity) (netval.cli.doctor_permissions).
- `broker.*`: reachable, TLS handshake for mqtts://, MQTT login (netval.cli.doctor_broker).
- `kueue`: installed or not, which API versions; a failure only when the operator uses it.
- `webhook`: with the webhook, both configurations exist, their caBundle is a valid CA and
  the serving certificate (the operator's mounted Secret) is issued by it for the Service
  (netval.cli.doctor_webhook).
- `agents`: per NetworkValidation, its agent DaemonSet exists and has a ready pod on every
  targeted node (netval.cli.doctor_agents).

Exit 0 only when no check fails (skipped checks are not applicable), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

from netval.cli.common import EXIT_OK, EXIT_UNHEALTHY, BadInput, KubeTarget, load_kube_config
from netval.cli.doctor_agents import check_agents
from netval.cli.doctor_cluster import check_api, check_crd, check_kueue
from netval.cli.doctor_kube import KubeReader
from netval.cli.doctor_operator import OperatorInfo, check_leader, check_operator
from netval.cli.doctor_permissions import check_permissions
from netval.cli.doctor_result import CheckResult, State, fail, skip
from netval.cli.doctor_webhook import check_webhook


class Doctor:
    """The checks in order, each told what the earlier ones found (the operator's settings)."""

    def __init__(self, args: argparse.Namespace, target: KubeTarget) -> None:
        self.args = args
        self.target = target
        self.ns: str = args.namespace
        self.kube = KubeReader(args.timeout)
        self.results: list[CheckResult] = []
        self.operator: OperatorInfo | None = None

    def add(self, result: CheckResult) -> CheckResult:
        self.results.append(result)
        return result

    def check_operator(self) -> None:
        result, self.operator = check_operator(self.kube, self.ns)
        self.add(result)

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

    def run(self) -> list[CheckResult]:
        if self.add(check_api(self.kube, self.target)).failed:
            for name in ("crd", "operator", "leader", "permissions", "kueue", "webhook", "agents"):
                self.add(skip(name, "needs kubernetes-api"))
            return self.results
        self.add(check_crd(self.kube))
        self.check_operator()
        self.add(check_leader(self.kube, self.ns, self.operator))
        self.add(check_permissions(self.kube, self.args, self.ns, self.operator))
        self.check_broker()
        self.add(check_kueue(self.kube, self.operator is not None and self.operator.kueue))
        self.add(check_webhook(self.kube, self.ns, self.operator))
        self.results.extend(check_agents(self.kube, self.ns))
        return self.results


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
