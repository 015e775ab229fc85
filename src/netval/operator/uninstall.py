"""`netval uninstall-cleanup`: remove everything netval wrote into the cluster.

The chart runs it as a pre-delete hook Job (charts/netval/templates/uninstall-hook.yaml) so
that `helm uninstall` leaves nothing that changes how the cluster behaves:

1. the operator is scaled to 0 and its pods are waited for (a running operator would put
   back what the next steps remove: Kopf re-adds its finalizer on the very event the removal
   causes, gating re-taints within a status window, the webhook configurations are rewritten
   at start);
2. the Mutating- and ValidatingWebhookConfiguration the operator wrote (`netval.io`) are
   deleted: with failurePolicy Fail and no operator they would refuse every annotated Pod
   and Job for good;
3. Pods held by netval's scheduling gate are released (the gate `netval.io/fabric`, the label
   `netval.io/gated-by` and the annotation `netval.io/gate-message` removed), other gates kept;
4. netval's labels `netval.io/fabric` and `topology.netval.io/*` and its taint
   `netval.io/fabric-unhealthy` are removed from every Node, foreign labels and taints kept,
   and its condition `NetworkFabricReady` from their status (other conditions kept);
5. Kopf's finalizer is removed from every NetworkValidation (other finalizers kept), so that
   validations can still be deleted once no operator runs;
6. the agent DaemonSets and ConfigMaps the operator rendered (labelled
   `app.kubernetes.io/managed-by=netval-operator` in the agents' namespace) are deleted: the
   NetworkValidations that own them stay (with the CRD), so no garbage collector would;
7. with `--kueue-topologies`, the Kueue `Topology` objects the operator wrote (labelled
   managed-by netval-operator with a `netval.io/validation`), in every version served, for
   the same reason;
8. with `--device-taint-rules`, the DeviceTaintRules the operator wrote (the same labels) in
   every `resource.k8s.io` version served: a failing NIC's device would stay tainted.

Idempotent (a second run finds nothing to do) and tolerant: every step runs even when an
earlier one failed, every API call has a timeout, a conflicting write is retried on fresh
data. Anything not cleaned is listed on stderr and the exit code is 1.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from netval.model.keys import (
    MANAGED_BY_OPERATOR,
    AnnotationKey,
    LabelKey,
    SchedulingGate,
    TaintKey,
)
from netval.model.manifest import API_GROUP
from netval.model.topology import TOPOLOGY_LABEL_PREFIX
from netval.operator.admission.configurations import CONFIGURATION_NAME
from netval.operator.kube.api import PLURAL, VERSION, load_kube_client
from netval.operator.kube.paging import paged_items
from netval.operator.kube.read_modify_write import Written, read_modify_write
from netval.operator.topology.kueue_topology import (
    KUEUE_GROUP,
    SERVED_PREFERENCE,
    TOPOLOGY_PLURAL,
)
from netval.operator.uninstall_devices import condition_cleanup_patch, delete_rules

log = logging.getLogger("netval.uninstall")

# Both webhook configurations the operator writes.
WEBHOOK_CONFIGURATION: Final = CONFIGURATION_NAME
# Kopf's default finalizer (kopf.OperatorSettings().persistence.finalizer); netval keeps it.
KOPF_FINALIZER: Final = "kopf.zalando.org/KopfFinalizerMarker"
MERGE_PATCH: Final = "application/merge-patch+json"
PAGE: Final = 500
WRITE_ATTEMPTS: Final = 5
EXIT_OK: Final = 0
EXIT_INCOMPLETE: Final = 1
EXIT_BAD_INPUT: Final = 2


@dataclass(frozen=True, slots=True)
class CleanupOptions:
    operator_deployment: tuple[str, str] | None = None  # (namespace, name)
    agent_namespace: str | None = None
    kueue_topologies: bool = False
    device_taint_rules: bool = False
    timeout: float = 10.0  # seconds per API call
    operator_wait: float = 60.0  # seconds for the operator's pods to go


@dataclass(slots=True)
class CleanupReport:
    done: list[str] = field(default_factory=list)  # one line per step
    failures: list[str] = field(default_factory=list)  # one line per thing left behind

    @property
    def ok(self) -> bool:
        return not self.failures


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def without_fabric_taint(taints: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [t for t in taints or [] if t.get("key") != TaintKey.FABRIC_UNHEALTHY]


def without_fabric_gate(gates: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [g for g in gates or [] if g.get("name") != SchedulingGate.FABRIC]


def pod_release_patch(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that releases `pod` from netval (None: nothing of netval's on it)."""
    meta = pod.get("metadata") or {}
    gates = (pod.get("spec") or {}).get("schedulingGates")
    kept = without_fabric_gate(gates)
    has_label = LabelKey.GATED_BY in (meta.get("labels") or {})
    has_note = AnnotationKey.GATE_MESSAGE in (meta.get("annotations") or {})
    if not has_label and not has_note and len(kept) == len(gates or []):
        return None
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "labels": {LabelKey.GATED_BY.value: None},
            "annotations": {AnnotationKey.GATE_MESSAGE.value: None},
        }
    }
    if len(kept) != len(gates or []):
        # Gates may only be removed; a merge patch replaces the list with what is left.
        patch["spec"] = {"schedulingGates": kept or None}
    return patch


def node_cleanup_patch(node: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that removes netval's labels (`netval.io/fabric`, the published
    `topology.netval.io/*`) and taint (None: none is there)."""
    meta = node.get("metadata") or {}
    taints = (node.get("spec") or {}).get("taints")
    kept = without_fabric_taint(taints)
    ours = [
        k
        for k in meta.get("labels") or {}
        if k == LabelKey.FABRIC or k.startswith(TOPOLOGY_LABEL_PREFIX)
    ]
    if not ours and len(kept) == len(taints or []):
        return None
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": meta.get("resourceVersion")},
    }
    if ours:
        patch["metadata"]["labels"] = dict.fromkeys(sorted(ours))
    if len(kept) != len(taints or []):
        # The whole list, as read minus ours: the resourceVersion makes a concurrent
        # change a 409 (retried on fresh data) instead of a lost taint.
        patch["spec"] = {"taints": kept or None}
    return patch


def finalizer_patch(obj: dict[str, Any]) -> dict[str, Any] | None:
    meta = obj.get("metadata") or {}
    finalizers = meta.get("finalizers") or []
    if KOPF_FINALIZER not in finalizers:
        return None
    kept = [f for f in finalizers if f != KOPF_FINALIZER]
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"), "finalizers": kept}}


class Cleanup:
    def __init__(self, api_client: client.ApiClient, options: CleanupOptions) -> None:
        self.options = options
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.admission = client.AdmissionregistrationV1Api(api_client)
        self.report = CleanupReport()

    # -- helpers ---------------------------------------------------------------------------

    @property
    def _t(self) -> dict[str, Any]:
        return {"_request_timeout": self.options.timeout}

    def _pages(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Every item of a list call, page by page, as plain dicts."""
        return paged_items(fn, *args, page=PAGE, **kwargs, **self._t)

    def _rewrite(
        self,
        what: str,
        obj: dict[str, Any],
        make_patch: Callable[[dict[str, Any]], dict[str, Any] | None],
        patch_fn: Callable[..., Any],
        read_fn: Callable[..., Any],
        *key: str,
    ) -> bool:
        """Patch `obj` (`patch_fn(*key, patch)`) until the patch applies; on 409 re-read it
        (`read_fn(*key)`) and recompute. True when something was changed, False when there
        was nothing (left) to do or the object is gone."""

        def read() -> dict[str, Any]:
            return cast(
                dict[str, Any], json.loads(read_fn(*key, _preload_content=False, **self._t).data)
            )

        def write(patch: dict[str, Any]) -> None:
            patch_fn(*key, patch, _content_type=MERGE_PATCH, **self._t)

        done = read_modify_write(
            what, read, make_patch, write, current=obj, attempts=WRITE_ATTEMPTS
        )
        return isinstance(done, Written)

    def _step(self, name: str, fn: Callable[[], str]) -> None:
        try:
            self.report.done.append(f"{name}: {fn()}")
        except Exception as exc:  # a step that fails must not stop the others
            self.report.failures.append(f"{name}: {_reason(exc)}")

    # -- the steps -------------------------------------------------------------------------

    def stop_operator(self) -> str:
        if self.options.operator_deployment is None:
            return "skipped (no --operator-deployment)"
        namespace, name = self.options.operator_deployment
        try:
            deployment = self.apps.read_namespaced_deployment(name, namespace, **self._t)
        except ApiException as exc:
            if exc.status == 404:
                return f"{namespace}/{name} not found"
            raise
        self.apps.patch_namespaced_deployment(
            name, namespace, {"spec": {"replicas": 0}}, _content_type=MERGE_PATCH, **self._t
        )
        labels = (deployment.spec.selector.match_labels or {}) if deployment.spec else {}
        if not labels:
            return f"scaled {namespace}/{name} to 0"
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        deadline = time.monotonic() + self.options.operator_wait
        while True:
            left = [
                p["metadata"]["name"]
                for p in self._pages(
                    self.core.list_namespaced_pod, namespace, label_selector=selector
                )
            ]
            if not left:
                return f"scaled {namespace}/{name} to 0, its pods are gone"
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{namespace}/{name} scaled to 0 but pods still run after "
                    f"{self.options.operator_wait:g}s: {', '.join(sorted(left))}"
                )
            time.sleep(1.0)

    def delete_webhook_configurations(self) -> str:
        deleted = []
        for kind, delete in (
            ("MutatingWebhookConfiguration", self.admission.delete_mutating_webhook_configuration),
            (
                "ValidatingWebhookConfiguration",
                self.admission.delete_validating_webhook_configuration,
            ),
        ):
            try:
                delete(WEBHOOK_CONFIGURATION, **self._t)
                deleted.append(kind)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return f"deleted {', '.join(deleted)} {WEBHOOK_CONFIGURATION}" if deleted else "none"

    def release_pods(self) -> str:
        released = failed = 0
        for pod in self._pages(
            self.core.list_pod_for_all_namespaces, label_selector=LabelKey.GATED_BY.value
        ):
            meta = pod["metadata"]
            ns, name = meta["namespace"], meta["name"]
            try:
                if self._rewrite(
                    f"pod {ns}/{name}",
                    pod,
                    pod_release_patch,
                    self.core.patch_namespaced_pod,
                    self.core.read_namespaced_pod,
                    name,
                    ns,
                ):
                    released += 1
            except (ApiException, HTTPError, RuntimeError) as exc:
                failed += 1
                self.report.failures.append(f"pods: {ns}/{name}: {_reason(exc)}")
        return f"released {released}" + (f", {failed} failed" if failed else "")

    def clean_nodes(self) -> str:
        cleaned = conditions = failed = 0
        for node in self._pages(self.core.list_node):
            name = node["metadata"]["name"]
            try:
                if self._rewrite(
                    f"node {name}",
                    node,
                    node_cleanup_patch,
                    self.core.patch_node,
                    self.core.read_node,
                    name,
                ):
                    cleaned += 1
                if condition_cleanup_patch(node) is not None and self._rewrite(
                    f"node {name} status",
                    node,
                    condition_cleanup_patch,
                    self.core.patch_node_status,
                    self.core.read_node_status,
                    name,
                ):
                    conditions += 1
            except (ApiException, HTTPError, RuntimeError) as exc:
                failed += 1
                self.report.failures.append(f"nodes: {name}: {_reason(exc)}")
        return f"removed netval's label/taint from {cleaned}, its condition from {conditions}" + (
            f", {failed} failed" if failed else ""
        )

    def remove_finalizers(self) -> str:
        try:
            items = list(
                self._pages(self.custom.list_cluster_custom_object, API_GROUP, VERSION, PLURAL)
            )
        except ApiException as exc:
            if exc.status == 404:
                return "no NetworkValidation API (CRD gone)"
            raise
        removed = failed = 0
        for obj in items:
            name = obj["metadata"]["name"]
            try:
                if self._rewrite(
                    f"networkvalidation {name}",
                    obj,
                    finalizer_patch,
                    self.custom.patch_cluster_custom_object,
                    self.custom.get_cluster_custom_object,
                    API_GROUP,
                    VERSION,
                    PLURAL,
                    name,
                ):
                    removed += 1
            except (ApiException, HTTPError, RuntimeError) as exc:
                failed += 1
                self.report.failures.append(f"finalizers: {name}: {_reason(exc)}")
        return f"removed Kopf's finalizer from {removed}" + (f", {failed} failed" if failed else "")

    def delete_agents(self) -> str:
        namespace = self.options.agent_namespace
        if not namespace:
            return "skipped (no --agent-namespace)"
        selector = f"{LabelKey.MANAGED_BY}={MANAGED_BY_OPERATOR}"
        counts = []
        for kind, lister, deleter in (
            (
                "DaemonSets",
                self.apps.list_namespaced_daemon_set,
                self.apps.delete_namespaced_daemon_set,
            ),
            (
                "ConfigMaps",
                self.core.list_namespaced_config_map,
                self.core.delete_namespaced_config_map,
            ),
        ):
            deleted = 0
            for obj in self._pages(lister, namespace, label_selector=selector):
                name = obj["metadata"]["name"]
                try:
                    deleter(name, namespace, **self._t)
                    deleted += 1
                except ApiException as exc:
                    if exc.status != 404:
                        self.report.failures.append(
                            f"agents: {kind[:-1]} {namespace}/{name}: {_reason(exc)}"
                        )
            counts.append(f"{deleted} {kind}")
        return f"deleted {' and '.join(counts)} in {namespace}"

    def delete_kueue_topologies(self) -> str:
        if not self.options.kueue_topologies:
            return "skipped (no --kueue-topologies)"
        selector = f"{LabelKey.MANAGED_BY}={MANAGED_BY_OPERATOR},{LabelKey.VALIDATION}"
        deleted, served = 0, []
        for version in SERVED_PREFERENCE:
            try:
                found = list(
                    self._pages(
                        self.custom.list_cluster_custom_object,
                        KUEUE_GROUP,
                        version,
                        TOPOLOGY_PLURAL,
                        label_selector=selector,
                    )
                )
            except ApiException as exc:
                if exc.status == 404:
                    continue  # that version (or Kueue) is not served
                raise
            served.append(version)
            for obj in found:  # gone from the next version's list once deleted here
                name = obj["metadata"]["name"]
                try:
                    self.custom.delete_cluster_custom_object(
                        KUEUE_GROUP, version, TOPOLOGY_PLURAL, name, **self._t
                    )
                    deleted += 1
                except ApiException as exc:
                    if exc.status != 404:
                        self.report.failures.append(f"kueue: Topology {name}: {_reason(exc)}")
        if not served:
            return "no Kueue Topology API"
        return f"deleted {deleted} Kueue Topologies"

    def run(self) -> CleanupReport:
        self._step("operator", self.stop_operator)
        self._step("webhook configurations", self.delete_webhook_configurations)
        self._step("gated pods", self.release_pods)
        self._step("nodes", self.clean_nodes)
        self._step("finalizers", self.remove_finalizers)
        self._step("agents", self.delete_agents)
        self._step("kueue topologies", self.delete_kueue_topologies)
        self._step("device taint rules", self.delete_device_taint_rules)
        return self.report

    def delete_device_taint_rules(self) -> str:
        if not self.options.device_taint_rules:
            return "skipped (no --device-taint-rules)"
        return delete_rules(self.custom, self._pages, self._t, self.report.failures)


# -- the command ---------------------------------------------------------------------------


def parse_namespaced_name(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"expected NAMESPACE/NAME, got {text!r}")
    return namespace, name


def run_command(options: CleanupOptions) -> int:
    """`netval uninstall-cleanup`: what was done on stdout, what was not on stderr."""
    try:
        api_client = load_kube_client()
    except Exception as exc:  # no usable configuration: a usage error
        sys.stderr.write(f"netval: error: no Kubernetes configuration: {exc}\n")
        return EXIT_BAD_INPUT
    with api_client:
        report = Cleanup(api_client, options).run()
    for line in report.done:
        sys.stdout.write(f"{line}\n")
    for line in report.failures:
        sys.stderr.write(f"not cleaned: {line}\n")
    if report.failures:
        sys.stderr.write(
            f"netval uninstall-cleanup: {len(report.failures)} item(s) could not be cleaned; "
            "fix the cause and run it again (it is idempotent)\n"
        )
        return EXIT_INCOMPLETE
    return EXIT_OK
