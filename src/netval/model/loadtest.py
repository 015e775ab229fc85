"""The NetworkLoadTest custom resource: spec and status (camelCase on the wire).

A NetworkLoadTest runs one bounded, coordinated load phase on the agents of one
NetworkValidation and records what it measured (docs/loadtest.md). The spec is a trust
boundary (user YAML): every model forbids unknown fields and bounds its values; the CRD
`crds/networkloadtests.netval.io.yaml` mirrors these models field for field
(tests/test_crd_loadtest.py). The status is written by the operator only: aggregates per
domain pair and per storage endpoint, never one entry per node pair, so it stays small at
10,000 nodes.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from netval.model.duration import DURATION_PATTERN, parse_duration
from netval.model.redaction import redact_message

MIN_DURATION_SECONDS: Final = 5.0
MAX_DURATION_SECONDS: Final = 300.0
MAX_HISTORY: Final = 20
MAX_ENDPOINTS: Final = 64  # as many as a validation may name
MAX_SKIPPED: Final = 100  # skippedNodes entries kept (the count is always exact)
MAX_LOAD_CELLS: Final = 136  # every pair of 16 domains, as status.eastWest
MAX_BREACHES: Final = 32
MAX_MESSAGE: Final = 32768
MAX_RAILS: Final = 16  # fabric interfaces of a node loaded at once (8 on a rail-optimised node)
MAX_STREAMS: Final = 16  # iperf3 parallel streams / perftest QPs per flow
MAX_ENGINES: Final = 8  # engine versions named in a run's status
MAX_NOTE: Final = 256
DEFAULT_ENGINE_PORT: Final = 7490
# A receiver's servers of one window use ports base .. base + MAX_FANOUT - 1 on each rail.
MAX_FANOUT: Final = 16

# Five cron fields (minute hour day-of-month month day-of-week) of numbers, `*`, ranges,
# lists and steps; no names or @macros (a shape the API server can check with a pattern; the
# ranges are checked by the model and the operator).
CRON_PATTERN: Final = r"^$|^[0-9*,/-]+( +[0-9*,/-]+){4}$"
_CRON_RANGES: Final = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_CRON_NAMES: Final = ("minute", "hour", "day of month", "month", "day of week")
_CRON_ITEM: Final = re.compile(r"^(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?$")
NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # a DNS subdomain (object names)
_S = TypeVar("_S", bound=str)


def check_cron(schedule: str) -> str:
    """`schedule` if empty or five valid cron fields, else ValueError naming the bad field."""
    if not schedule:
        return schedule
    fields = schedule.split()
    if len(fields) != 5:
        raise ValueError(f"schedule {schedule!r} must have 5 fields, has {len(fields)}")
    for text, (lo, hi), name in zip(fields, _CRON_RANGES, _CRON_NAMES, strict=True):
        for item in text.split(","):
            m = _CRON_ITEM.match(item)
            if m is None:
                raise ValueError(f"schedule {name} field {text!r}: {item!r} is not cron syntax")
            first, last, step = m.group(2), m.group(3), m.group(4)
            bounds = [int(v) for v in (first, last) if v is not None]
            if any(not lo <= v <= hi for v in bounds):
                raise ValueError(f"schedule {name} field {text!r}: values must be {lo}..{hi}")
            if len(bounds) == 2 and bounds[0] > bounds[1]:
                raise ValueError(f"schedule {name} field {text!r}: range {item!r} runs backwards")
            if step is not None and not 1 <= int(step) <= hi:
                raise ValueError(f"schedule {name} field {text!r}: step must be 1..{hi}")
    return schedule


def check_duration(text: str) -> str:
    """`text` if a duration of 5s..300s (the CRD's CEL rule says the same)."""
    if not MIN_DURATION_SECONDS <= parse_duration(text) <= MAX_DURATION_SECONDS:
        raise ValueError(f"duration must be 5s..300s, got {text!r}")
    return text


def _unique(values: list[_S] | None) -> list[_S] | None:
    if values is not None and len(set(values)) != len(values):
        raise ValueError(f"entries must be unique, got {values}")
    return values


class LoadPhase(StrEnum):
    EAST_WEST = "eastWest"
    STORAGE = "storage"


class PairScope(StrEnum):
    # rounds of disjoint domain pairs (a round-robin): D-1 cross rounds for D domains
    CROSS_DOMAIN = "crossDomain"
    # every domain pair in a round of its own (no other cross traffic): D(D-1)/2 rounds
    ALL = "all"


class LoadEngine(StrEnum):
    """What moves the east-west bytes (docs/loadtest.md, "Engines")."""

    AUTO = "auto"  # perftest on RDMA ports (RoCE, InfiniBand), iperf3 on other rails
    IPERF3 = "iperf3"  # TCP on every rail: the reference without RDMA privileges
    PERFTEST = "perftest"  # RDMA writes on every rail (a rail without an RDMA port fails)


IfName = Annotated[str, Field(min_length=1, max_length=15, pattern=r"^[A-Za-z0-9_.:@-]+$")]


class _Spec(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        allow_inf_nan=False,
    )


class EastWestLoad(_Spec):
    pairs: PairScope = PairScope.CROSS_DOMAIN
    engine: LoadEngine = LoadEngine.AUTO
    streams: Annotated[int, Field(ge=1, le=MAX_STREAMS)] = 4  # per flow: iperf3 -P, perftest -q
    # rails: these interfaces of every node, rail i to rail i of the peer; empty: the
    # validation's checks.peers.interfaces, else each node's RDMA netdevs
    interfaces: Annotated[list[IfName], Field(max_length=MAX_RAILS), AfterValidator(_unique)] = (
        Field(default_factory=list)
    )
    # the class to load: iperf3 --dscp, perftest --tclass (DSCP << 2); null: iperf3 the
    # default class, perftest the RDMA port's default_roce_tos (the class RDMA CM gives jobs)
    dscp: Annotated[int | None, Field(ge=0, le=63)] = None
    # engine servers listen on port .. port + 31 of each rail address, during their window
    # (bandwidth servers from port, latency servers from port + 16)
    port: Annotated[int, Field(ge=1024, le=65535 - 2 * MAX_FANOUT)] = DEFAULT_ENGINE_PORT


EndpointName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9._-]+$")]


class StorageLoad(_Spec):
    # empty: every endpoint of the validation's checks.storage
    endpoints: Annotated[
        list[EndpointName], Field(max_length=MAX_ENDPOINTS), AfterValidator(_unique)
    ] = Field(default_factory=list)


class Expectations(_Spec):
    """Optional limits; a breach fails the run (phase Failed, Passed=False)."""

    max_oversubscription: Annotated[float | None, Field(ge=1)] = None
    min_storage_m_bps_per_node: Annotated[
        float | None, Field(alias="minStorageMBpsPerNode", gt=0)
    ] = None
    max_latency_inflation: Annotated[float | None, Field(ge=1)] = None  # loaded / idle p99


class NetworkLoadTestSpec(_Spec):
    validation: Annotated[str, Field(min_length=1, max_length=253, pattern=NAME_PATTERN)]
    schedule: Annotated[
        str, Field(max_length=100, pattern=CRON_PATTERN), AfterValidator(check_cron)
    ] = ""
    history_limit: Annotated[int, Field(ge=0, le=MAX_HISTORY)] = 5
    duration: Annotated[str, Field(pattern=DURATION_PATTERN), AfterValidator(check_duration)] = (
        "20s"
    )
    # null: every phase the validation can run
    phases: Annotated[
        list[LoadPhase] | None, Field(min_length=1, max_length=2), AfterValidator(_unique)
    ] = None
    east_west: EastWestLoad = Field(default_factory=EastWestLoad)
    storage: StorageLoad = Field(default_factory=StorageLoad)
    max_rate_mbps: Annotated[float, Field(ge=0)] = 0.0  # per-flow cap; 0: none
    skip_busy_nodes: bool = True
    # taint the participants NoSchedule for the run (netval.io/load-test), always removed
    reserve_nodes: bool = False
    # the intra-domain reference below this share of the port rate, with the hosts' CPU the
    # bottleneck: the run measured its senders, not the fabric (Inconclusive)
    sender_limited_percent: Annotated[float, Field(gt=0, le=100)] = 60.0
    # a run that counted fewer of its planned flows and reads: Failed, InsufficientData
    min_coverage_percent: Annotated[float, Field(ge=0, le=100)] = 80.0
    expect: Expectations = Field(default_factory=Expectations)

    @property
    def duration_seconds(self) -> float:
        return parse_duration(self.duration)


# -- status ---------------------------------------------------------------------------------


class RunPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"  # ran but breached an expectation, or could not run
    # ran, breached nothing, but the hosts limited the reference flows: no verdict
    INCONCLUSIVE = "Inconclusive"


class LoadConditionType(StrEnum):
    COMPLETE = "Complete"
    PASSED = "Passed"


class LoadReason(StrEnum):
    INVALID_SPEC = "InvalidSpec"
    VALIDATION_NOT_FOUND = "ValidationNotFound"
    NO_PARTICIPANTS = "NoParticipants"
    EXPECTATIONS_BREACHED = "ExpectationsBreached"
    EXPECTATIONS_MET = "ExpectationsMet"
    ABORTED = "Aborted"
    RUNNING = "Running"
    WAITING = "Waiting"  # for its schedule, or for another run on the same validation
    RUN_FINISHED = "RunFinished"
    INSUFFICIENT_DATA = "InsufficientData"  # counted under minCoveragePercent of its flows
    INCONCLUSIVE = "Inconclusive"  # sender-limited cells: the tool, not the fabric, measured


class SkipReason(StrEnum):
    """Why a targeted node took no part in a run."""

    STALE = "Stale"  # no fresh report
    BUSY = "Busy"  # runs pods that request GPUs (skipBusyNodes)
    GATED = "Gated"  # failing: being gated, so never loaded
    CLOCK_OFFSET = "ClockOffset"  # its clock is off by more than the tolerance: not counted
    NO_RESULT = "NoResult"  # planned, but sent no (valid) result before the deadline
    ENGINE_UNAVAILABLE = "EngineUnavailable"  # its engine could not run (its result says why)


class CellReason(StrEnum):
    """Why a cell carries no oversubscription (or is kept out of the maximum)."""

    SENDER_LIMITED = "SenderLimited"  # the hosts, not the fabric, limited the reference
    NOT_MEASURED = "NotMeasured"  # planned, but no flow counted
    PARTIAL = "Partial"  # unequal domains: the larger side was not fully loaded


class _Status(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class LoadCondition(_Status):
    type: LoadConditionType
    status: Literal["True", "False", "Unknown"]
    reason: LoadReason
    message: Annotated[str, Field(max_length=MAX_MESSAGE)] = ""
    last_transition_time: datetime
    observed_generation: Annotated[int, Field(ge=0)]

    @field_validator("message")
    @classmethod
    def _redacted(cls, message: str) -> str:
        return redact_message(message, MAX_MESSAGE)


class SkippedNode(_Status):
    node: str
    reason: SkipReason
    stage: Annotated[int, Field(ge=0)] | None = None  # left out from this stage on (mid-run)


class LoadCell(_Status):
    """One unordered domain pair on one rail plane (a <= b; a == b: the intra-domain
    reference of that plane)."""

    a: str
    b: str
    rail: Annotated[int, Field(ge=0, le=MAX_RAILS - 1)] = 0
    flows: Annotated[int, Field(ge=0)]  # flows counted (windows that overlapped)
    planned: Annotated[int, Field(ge=0)] = 0  # flows planned
    # no ratio (SenderLimited, NotMeasured) or kept out of maxOversubscription (Partial)
    reason: CellReason | None = None
    note: Annotated[str, Field(max_length=MAX_NOTE)] = ""  # the numbers behind `reason`
    port_mbps: float | None = None  # the slowest port rate its flows reported
    cpu_bound_percent: float | None = None  # share of flows whose engine the CPU limited
    retransmits: Annotated[int, Field(ge=0)] | None = None  # TCP, summed over its flows
    per_node_mbps: float | None = None  # median over the phase's senders
    aggregate_mbps: float | None = None  # sum over the senders
    oversubscription: float | None = None  # median intra per-node / median cross per-node
    loss_percent: float | None = None  # echoes lost while loaded
    idle_latency_p99_ms: float | None = None
    loaded_latency_p99_ms: float | None = None


class LoadEastWest(_Status):
    cells: Annotated[list[LoadCell], Field(max_length=MAX_LOAD_CELLS)] = Field(default_factory=list)
    omitted_cells: int = 0


class LoadStorage(_Status):
    endpoint: str
    nodes: Annotated[int, Field(ge=0)]  # readers counted in the all-at-once read
    readers: Annotated[int, Field(ge=0)] = 0  # readers planned (the failed count as 0 MB/s)
    aggregate_m_bps: Annotated[float | None, Field(alias="aggregateMBps")] = None
    per_node_m_bps_min: Annotated[float | None, Field(alias="perNodeMBpsMin")] = None
    per_node_m_bps_median: Annotated[float | None, Field(alias="perNodeMBpsMedian")] = None
    single_node_m_bps: Annotated[float | None, Field(alias="singleNodeMBps")] = None
    fairness: float | None = None  # Jain's index over the nodes' rates: 1.0 is even


class Breach(_Status):
    expectation: str  # the spec.expect field, e.g. maxOversubscription
    subject: str  # "rack-a/rack-b", an endpoint name
    observed: float
    expected: float


class LoadRun(_Status):
    id: str
    started_at: datetime
    finished_at: datetime | None = None
    nodes: Annotated[int, Field(ge=0)] = 0  # participants
    skipped_nodes: Annotated[list[SkippedNode], Field(max_length=MAX_SKIPPED)] = Field(
        default_factory=list
    )
    skipped_count: Annotated[int, Field(ge=0)] = 0  # exact, also beyond MAX_SKIPPED
    refused_flows: Annotated[int, Field(ge=0)] = 0  # results outside their window
    planned_flows: Annotated[int, Field(ge=0)] = 0  # flows and reads planned
    counted_flows: Annotated[int, Field(ge=0)] = 0  # of them, counted
    coverage_percent: float | None = None  # counted / planned
    engines: Annotated[list[str], Field(max_length=MAX_ENGINES)] = Field(
        default_factory=list
    )  # "iperf3 3.12"
    reserved_nodes: Annotated[int, Field(ge=0)] = 0  # tainted NoSchedule for the run
    max_oversubscription: float | None = None  # the worst cross cell (a printer column)
    east_west: LoadEastWest | None = None
    storage: Annotated[list[LoadStorage], Field(max_length=MAX_ENDPOINTS)] = Field(
        default_factory=list
    )
    breaches: Annotated[list[Breach], Field(max_length=MAX_BREACHES)] = Field(default_factory=list)


class RunSummary(_Status):
    """One earlier run in `status.history`: enough to see a trend."""

    id: str
    started_at: datetime
    finished_at: datetime | None = None
    phase: RunPhase
    reason: LoadReason
    nodes: Annotated[int, Field(ge=0)] = 0
    max_oversubscription: float | None = None
    min_storage_m_bps_per_node: Annotated[float | None, Field(alias="minStorageMBpsPerNode")] = None
    breaches: Annotated[int, Field(ge=0)] = 0


class NetworkLoadTestStatus(_Status):
    observed_generation: int = 0
    phase: RunPhase = RunPhase.PENDING
    conditions: list[LoadCondition] = Field(default_factory=list)
    last_run: LoadRun | None = None
    history: Annotated[list[RunSummary], Field(max_length=MAX_HISTORY)] = Field(
        default_factory=list
    )
    next_run_at: datetime | None = None  # a scheduled test: when it runs next

    def condition(self, kind: LoadConditionType) -> LoadCondition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def to_patch(self) -> dict[str, object]:
        """A JSON merge patch body; an absent optional field is written as null (deleted)."""
        patch = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        for name, field in type(self).model_fields.items():
            if getattr(self, name) is None:
                patch[field.alias or name] = None
        return patch
