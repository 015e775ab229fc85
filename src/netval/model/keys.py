"""Every label, annotation, taint and scheduling-gate key netval writes, defined once.

Users select on these (`kubectl get nodes -l netval.io/fabric=unhealthy`), Kueue and the
scheduler react to them, and the uninstall clean-up removes them: they are a contract.
"""

from __future__ import annotations

from enum import StrEnum


class LabelKey(StrEnum):
    FABRIC = "netval.io/fabric"  # on Nodes: worst health across the validations targeting it
    VALIDATION = "netval.io/validation"  # on agent objects: which validation they serve
    GATED_BY = "netval.io/gated-by"  # on Pods: the validation whose gate holds them
    NAME = "app.kubernetes.io/name"
    MANAGED_BY = "app.kubernetes.io/managed-by"
    HOSTNAME = "kubernetes.io/hostname"  # Kubernetes' own; Kueue's topology level for nodes


class AnnotationKey(StrEnum):
    REQUIRE_HEALTHY = "netval.io/require-healthy"  # on Pods/Jobs: the validation they need
    GATE_MESSAGE = "netval.io/gate-message"  # on gated Pods: why the gate stays
    # on Pods/Jobs: how many healthy nodes the workload needs (policy capacity)
    MIN_HEALTHY_NODES = "netval.io/min-healthy-nodes"
    CONFIG_HASH = "netval.io/config-hash"  # on the agent ConfigMap: the config document's hash
    # on the agent pod template: rolls the agents when what they read only at start changes
    RESTART_HASH = "netval.io/restart-hash"
    GENERATION = "netval.io/generation"  # on the agent DaemonSet: the spec generation it runs


class TaintKey(StrEnum):
    FABRIC_UNHEALTHY = "netval.io/fabric-unhealthy"
    # NoSchedule on a NetworkLoadTest's participants for its run (spec.reserveNodes); the
    # value is the run id
    LOAD_TEST = "netval.io/load-test"


class SchedulingGate(StrEnum):
    FABRIC = "netval.io/fabric"


class FabricHealth(StrEnum):
    """Values of the `netval.io/fabric` Node label."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"
    # failing, but the circuit breaker holds the `unhealthy` label back (more than
    # maxUnhealthyPercent failing at once); the webhook's affinity does not exclude it
    SUSPECT = "suspect"


MANAGED_BY_OPERATOR = "netval-operator"  # value of app.kubernetes.io/managed-by
TAINT_EFFECT = "NoSchedule"
