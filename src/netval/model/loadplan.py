"""Load-test messages over MQTT: the operator's plan for one node, the node's results.

Topics (`netval.model.topics`): the operator publishes a node's `LoadPlan` (or a `LoadAbort`)
on `netval/v1/<validation>/<node>/loadplan`; the node publishes its `LoadResult` on
`netval/v1/<validation>/<node>/loadresult`. Both sit under the node's own topic level, so the
per-node ACL pattern (`netval.operator.identity.acl`) lets a node read only its own plan and
publish only its own results.

Both directions are trust boundaries: a plan makes an agent send traffic, a result becomes
status. So every model forbids unknown fields, refuses NaN and infinities, and bounds every
number, string and list; a plan spans at most `MAX_PLAN_SECONDS` from issue to deadline (an
agent that loses the operator stops by itself at the deadline). A plan covers one stage of a
run (a few windows); the operator publishes the next stage's plans as the run goes on.

Times are absolute and timezone-aware. A plan's times are the operator's clock; a result's
are the agent's. Clocks are assumed NTP-synced: the operator estimates each agent's offset
from `LoadResult.sent_at` and the receive time, and refuses the results of an agent off by
more than `CLOCK_TOLERANCE_SECONDS` (docs/loadtest.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyAddress,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from netval.model.loadtest import MAX_DURATION_SECONDS, NAME_PATTERN

LOADPLAN_SCHEMA: Final = 1
MAX_TASKS: Final = 512  # a stage: at most a few tasks per window
MAX_LATENCY_SAMPLES: Final = 256  # per latency task; the agent keeps an even subsample
MAX_PLAN_BYTES: Final = 256 * 1024
# A result must pass the chart's broker (its maxPacketSize, `MAX_REPORT_PACKET_BYTES` =
# 1 MiB + 4 KiB, refuses a larger packet and disconnects its sender): 1,000,000 bytes of
# payload leaves over 50 KiB for the topic and MQTT headers. The agent keeps its results
# under this (thinning latency samples), the operator refuses bigger ones.
MAX_RESULT_BYTES: Final = 1_000_000
MAX_WARMUP_SECONDS: Final = 30.0
MAX_PLAN_SECONDS: Final = 600.0  # issue to deadline: one stage (a 300 s window and margins)
MAX_BYTES: Final = 2**62  # 400 Gb/s for 300 s is 1.5e13: far below
MAX_MBPS: Final = 10_000_000.0  # 10 Tb/s
MAX_LATENCY_MS: Final = 60_000.0
CLOCK_TOLERANCE_SECONDS: Final = 1.0

RunId = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
WindowId = Annotated[str, Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9._:-]+$")]
NodeName = Annotated[str, Field(min_length=1, max_length=253, pattern=NAME_PATTERN)]
EndpointName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9._-]+$")]
Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_SECONDS)]
Warmup = Annotated[float, Field(ge=0, le=MAX_WARMUP_SECONDS)]
ShortText = Annotated[str, Field(max_length=256)]


class _Msg(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )


# -- operator -> agent ----------------------------------------------------------------------


class FlowTask(_Msg):
    """Send TCP to `peer`'s responder from `start`; count bytes after the warm-up."""

    kind: Literal["flow"] = "flow"
    window: WindowId
    peer: NodeName
    start: AwareDatetime
    warmup_seconds: Warmup
    seconds: Seconds  # the measured part, after the warm-up

    @property
    def end(self) -> AwareDatetime:
        return self.start + timedelta(seconds=self.warmup_seconds + self.seconds)


class LatencyTask(_Msg):
    """Echo `peer` every `interval_ms` from `start` for `seconds` (idle or under load)."""

    kind: Literal["latency"] = "latency"
    window: WindowId
    peer: NodeName
    start: AwareDatetime
    seconds: Seconds
    interval_ms: Annotated[int, Field(ge=10, le=1000)] = 100
    loaded: bool

    @property
    def end(self) -> AwareDatetime:
        return self.start + timedelta(seconds=self.seconds)


class StorageTask(_Msg):
    """Read `endpoint` (a name of the validation's checks.storage) from `start`."""

    kind: Literal["storage"] = "storage"
    window: WindowId
    endpoint: EndpointName
    start: AwareDatetime
    warmup_seconds: Warmup
    seconds: Seconds

    @property
    def end(self) -> AwareDatetime:
        return self.start + timedelta(seconds=self.warmup_seconds + self.seconds)


Task = Annotated[FlowTask | LatencyTask | StorageTask, Field(discriminator="kind")]


class PeerAddress(_Msg):
    """Where a peer's responder listens (its announced endpoint, as the operator holds it)."""

    address: IPvAnyAddress
    port: Annotated[int, Field(ge=1, le=65535)]


class LoadPlan(_Msg):
    type: Literal["plan"] = "plan"
    schema_version: Annotated[int, Field(alias="schema", ge=1, le=LOADPLAN_SCHEMA)] = (
        LOADPLAN_SCHEMA
    )
    run: RunId
    stage: Annotated[int, Field(ge=0, le=100_000)]
    validation: NodeName  # an object name: the same shape as a node name
    node: NodeName
    issued_at: AwareDatetime
    deadline: AwareDatetime  # every task ends by then; the agent stops whatever still runs
    max_rate_mbps: Annotated[float, Field(ge=0, le=MAX_MBPS)] = 0.0  # per flow; 0: none
    tasks: Annotated[list[Task], Field(max_length=MAX_TASKS)]
    # every node this plan sends to or receives from in the stage: an agent knows only the
    # endpoints of its own epoch's peer set (issue 24), and its sink admits load flows only
    # from these addresses
    peers: Annotated[dict[NodeName, PeerAddress], Field(max_length=MAX_TASKS)] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _bounded_in_time(self) -> LoadPlan:
        span = (self.deadline - self.issued_at).total_seconds()
        if not 0 < span <= MAX_PLAN_SECONDS:
            raise ValueError(
                f"deadline must be after issuedAt and at most {MAX_PLAN_SECONDS:g}s later, "
                f"got {span:g}s"
            )
        for i, task in enumerate(self.tasks):
            # offsets from issuedAt, not `task.end`: a start near year 9999 would overflow
            begins = (task.start - self.issued_at).total_seconds()
            length = task.seconds + getattr(task, "warmup_seconds", 0.0)
            if begins < 0 or begins + length > span:
                raise ValueError(f"tasks[{i}] ({task.window}) runs outside issuedAt..deadline")
        return self


class LoadAbort(_Msg):
    """Stop every task of `run` now (the test or its validation was deleted)."""

    type: Literal["abort"] = "abort"
    run: RunId
    reason: ShortText = ""


PlanMessage = Annotated[LoadPlan | LoadAbort, Field(discriminator="type")]


_PLAN_MESSAGE: Final = TypeAdapter[LoadPlan | LoadAbort](PlanMessage)


# -- agent -> operator ----------------------------------------------------------------------


class FlowResult(_Msg):
    """What one flow moved in its measured part (agent clock)."""

    window: WindowId
    peer: NodeName
    bytes: Annotated[int, Field(ge=0, le=MAX_BYTES)]
    start: AwareDatetime
    end: AwareDatetime
    error: ShortText | None = None

    @model_validator(mode="after")
    def _ordered(self) -> FlowResult:
        if self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class LatencyResult(_Msg):
    window: WindowId
    peer: NodeName
    loaded: bool
    sent: Annotated[int, Field(ge=0, le=10_000_000)]
    received: Annotated[int, Field(ge=0, le=10_000_000)]
    samples_ms: Annotated[
        list[Annotated[float, Field(ge=0, le=MAX_LATENCY_MS)]],
        Field(max_length=MAX_LATENCY_SAMPLES),
    ] = Field(default_factory=list)

    @model_validator(mode="after")
    def _received_at_most_sent(self) -> LatencyResult:
        if self.received > self.sent:
            raise ValueError(f"received {self.received} is more than sent {self.sent}")
        return self


class StorageResult(_Msg):
    window: WindowId
    endpoint: EndpointName
    bytes: Annotated[int, Field(ge=0, le=MAX_BYTES)]
    start: AwareDatetime
    end: AwareDatetime
    error: ShortText | None = None

    @model_validator(mode="after")
    def _ordered(self) -> StorageResult:
        if self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class LoadResult(_Msg):
    schema_version: Annotated[int, Field(alias="schema", ge=1, le=LOADPLAN_SCHEMA)] = (
        LOADPLAN_SCHEMA
    )
    run: RunId
    stage: Annotated[int, Field(ge=0, le=100_000)]
    validation: NodeName
    node: NodeName
    sent_at: AwareDatetime  # agent clock: the operator's offset estimate
    flows: Annotated[list[FlowResult], Field(max_length=MAX_TASKS)] = Field(default_factory=list)
    latency: Annotated[list[LatencyResult], Field(max_length=MAX_TASKS)] = Field(
        default_factory=list
    )
    storage: Annotated[list[StorageResult], Field(max_length=MAX_TASKS)] = Field(
        default_factory=list
    )
    error: ShortText | None = None  # the plan could not run at all


# -- decoding -------------------------------------------------------------------------------


def _problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(message)"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def decode_plan(payload: bytes) -> LoadPlan | LoadAbort:
    """A plan or abort message, or ValueError saying what is wrong (first problem)."""
    if len(payload) > MAX_PLAN_BYTES:
        raise ValueError(f"plan of {len(payload)} bytes is over {MAX_PLAN_BYTES}")
    try:
        return _PLAN_MESSAGE.validate_json(payload)
    except ValidationError as exc:
        raise ValueError(f"invalid load plan: {_problem(exc)}") from None


def decode_result(payload: bytes) -> LoadResult:
    """A node's results, or ValueError saying what is wrong (first problem)."""
    if len(payload) > MAX_RESULT_BYTES:
        raise ValueError(f"result of {len(payload)} bytes is over {MAX_RESULT_BYTES}")
    try:
        return LoadResult.model_validate_json(payload)
    except ValidationError as exc:
        raise ValueError(f"invalid load result: {_problem(exc)}") from None


def encode(message: LoadPlan | LoadAbort | LoadResult) -> bytes:
    return message.model_dump_json(by_alias=True).encode()
