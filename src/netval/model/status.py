"""The NetworkValidation status (what `kubectl get/describe/wait` and `netval status` read).

Conditions follow metav1.Condition: type, status, reason, message, lastTransitionTime,
observedGeneration. Reasons are CamelCase constants, part of the contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from netval.model.consistency import ConsistencyStatus
from netval.model.east_west import EastWest
from netval.model.nic_status import NicStatus
from netval.model.redaction import redact, redact_message
from netval.model.topology import TopologyStatus

MAX_FAILURES: Final = 50


class ConditionType(StrEnum):
    READY = "Ready"  # agents deployed and every targeted node reported within 3 intervals
    HEALTHY = "Healthy"  # no targeted node failing
    GATING = "Gating"  # node gating acts as configured (False when the breaker tripped)
    # failing nodes within maxUnhealthyPercent and at least one healthy node: admission
    # (policy capacity) admits workloads, whose node affinity avoids the failing nodes
    USABLE = "Usable"


class Reason(StrEnum):
    AGENTS_PENDING = "AgentsPending"
    AGENTS_REPORTING = "AgentsReporting"
    NODES_STALE = "NodesStale"
    NO_TARGETED_NODES = "NoTargetedNodes"
    CHECKS_FAILING = "ChecksFailing"
    ALL_CHECKS_PASSING = "AllChecksPassing"
    AWAITING_REPORTS = "AwaitingReports"
    INVALID_SPEC = "InvalidSpec"
    BREAKER_TRIPPED = "BreakerTripped"
    GATING_ACTIVE = "GatingActive"
    # Gating False: the broker ACL check found an identity that can speak for another node
    BROKER_ACL_VIOLATED = "BrokerAclViolated"
    CAPACITY_AVAILABLE = "CapacityAvailable"
    TOO_MANY_FAILING = "TooManyFailing"
    NO_HEALTHY_NODES = "NoHealthyNodes"
    # Usable True while the breaker is tripped (gating.onBreakerTripped: admit)
    ADMITTING_PAST_BREAKER = "AdmittingPastBreaker"


class EventReason(StrEnum):
    """Reasons of the Kubernetes Events about a NetworkValidation (`kubectl describe`)."""

    CHECK_FAILING = "CheckFailing"  # Warning: a fresh node started failing a check
    CHECK_RECOVERED = "CheckRecovered"  # Normal: a node passes a check it failed
    NODE_STALE = "NodeStale"  # Warning: a failing node stopped reporting (offline or silent)
    EVENTS_SUPPRESSED = "EventsSuppressed"  # Warning: transitions past the rate cap, counted
    BREAKER_TRIPPED = "BreakerTripped"  # Warning: the breaker withheld taints or held labels
    PEER_PORT_CONFLICT = "PeerPortConflict"  # Warning: two validations share a peers port
    # Warning: gating held, the broker lets one node's identity speak for another
    BROKER_ACL_VIOLATED = "BrokerAclViolated"
    # Warning: an announced east-west endpoint is not the node's address, refused
    ENDPOINT_REFUSED = "EndpointRefused"
    DEPRECATED_FIELD = "DeprecatedField"  # Warning: the spec sets a field read another way now
    # Warning: the Kueue Topology cannot be kept (no Kueue, no RBAC, its name taken)
    KUEUE_TOPOLOGY_FAILED = "KueueTopologyFailed"
    # Warning: many nodes warn with requester-side retries; names the likely culprit
    RETRIES_ATTRIBUTED = "RetriesAttributed"
    # Warning: gating.deviceTaints asks for DeviceTaintRules that cannot be written (no API,
    # the operator not allowed, no RBAC): failing NICs gate their node as a whole
    DEVICE_TAINTS_UNAVAILABLE = "DeviceTaintsUnavailable"
    # Warning: the east-west results name a new first culprit (a link or a node)
    CULPRIT_LOCALIZED = "CulpritLocalized"


class _Status(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Condition(_Status):
    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[
        str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    ]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: datetime
    observed_generation: Annotated[int, Field(ge=0)]

    # Redacted when built or read (a status written by an older operator included). A
    # validator, not field metadata: the field's type stays what the CRD's schema says.
    @field_validator("message")
    @classmethod
    def _redacted(cls, message: str) -> str:
        return redact_message(message, 32768)


class NodeCounts(_Status):
    targeted: int = 0
    reporting: int = 0
    passing: int = 0
    warning: int = 0
    failing: int = 0
    stale: int = 0
    # what the node verdict (docs/gating.md) makes of them: nodes admission keeps workloads
    # off, and nodes with a fresh passing or warning report no exclusion holds (None: a
    # status computed without a verdict, or written before there was one)
    excluded: int | None = None
    admissible: int | None = None


class CheckCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    pass_: Annotated[int, Field(alias="pass", ge=0)] = 0
    warn: Annotated[int, Field(ge=0)] = 0
    fail: Annotated[int, Field(ge=0)] = 0


class Failure(_Status):
    node: str
    check: str
    subject: str
    message: str
    since: datetime

    @field_validator("message")
    @classmethod
    def _redacted(cls, message: str) -> str:
        return redact(message)


MAX_CULPRITS: Final = 5
MAX_RETRY_COUNTERS: Final = 8


class CulpritState(StrEnum):
    OFFLINE = "offline"  # its agent's last will
    SILENT = "silent"  # no report within 3 intervals
    FAILING = "failing"  # its fresh report fails


class Culprit(_Status):
    node: str
    state: CulpritState
    since: datetime


class Retries(_Status):
    """Requester-side retries on many nodes at once and the nodes they likely point at."""

    nodes: Annotated[int, Field(ge=0)]
    since: datetime
    counters: Annotated[list[str], Field(max_length=MAX_RETRY_COUNTERS)] = Field(
        default_factory=list
    )
    culprits: Annotated[list[Culprit], Field(max_length=MAX_CULPRITS)] = Field(default_factory=list)
    message: Annotated[str, Field(max_length=1024)]


class NetworkValidationStatus(_Status):
    observed_generation: int = 0
    conditions: list[Condition] = Field(default_factory=list)
    nodes: NodeCounts = Field(default_factory=NodeCounts)
    checks: dict[str, CheckCounts] = Field(default_factory=dict)
    failures: Annotated[list[Failure], Field(max_length=MAX_FAILURES)] = Field(default_factory=list)
    last_report_time: datetime | None = None
    east_west: EastWest | None = None  # peers.enabled: domain matrix, capacity ratios, suspects
    consistency: ConsistencyStatus | None = None  # spec.consistency.enabled: cohorts and outliers
    topology: TopologyStatus | None = None  # levels, discovery, disagreements
    retries: Retries | None = None  # requester-side retries on many nodes: the likely culprit
    nics: NicStatus | None = None  # per-NIC health, in aggregate (reports with a nics section)

    @classmethod
    def from_api(
        cls, raw: Mapping[str, Any] | None, *, exclude: frozenset[str] = frozenset()
    ) -> NetworkValidationStatus | None:
        """The status of an object as the API returns it, or None if absent or unreadable.

        Only our fields are read (Kopf or an older operator may have written others), and
        `exclude` names fields a caller reads separately.
        """
        if not raw:
            return None
        ours = {(f.alias or n) for n, f in cls.model_fields.items()} - exclude
        try:
            return cls.model_validate({k: v for k, v in raw.items() if k in ours})
        except ValidationError:
            return None

    def condition(self, kind: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def to_patch(self) -> dict[str, object]:
        """A JSON merge patch body: an absent optional field is written as null, which
        deletes what an earlier status had (e.g. eastWest after peers were disabled)."""
        patch = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        for name, field in type(self).model_fields.items():
            alias = field.alias or name
            if getattr(self, name) is None:
                patch[alias] = None
        return patch
