"""Load-test messages over MQTT: the operator's plan for one node, the node's results.

Topics (`netval.model.topics`): the operator publishes a node's `LoadPlan` (or a `LoadAbort`)
on `netval/v1/<validation>/<node>/loadplan`; the node publishes its `LoadResult` on
`netval/v1/<validation>/<node>/loadresult`. Both sit under the node's own topic level, so the
per-node ACL pattern (`netval.operator.identity.acl`) lets a node read only its own plan and
publish only its own results.

Both directions are trust boundaries: a plan makes an agent start traffic engines, a result
becomes status. So every model forbids unknown fields, refuses NaN and infinities, and
bounds every number, string and list; a plan spans at most `MAX_PLAN_SECONDS` from issue to
deadline (an agent that loses the operator stops by itself at the deadline). A plan covers
one stage of a run (a few windows); the operator publishes the next stage's plans as the run
goes on. Plans and aborts carry the leader's `term`: an agent drops a plan of an older term
than one it has seen (a paused old leader's plan landing after the new leader's abort).

Traffic runs on *rails*: a node's fabric interfaces in a fixed order (its RDMA netdevs, or
the interfaces the user names), rail i of one node to rail i of its peer. Each flow is one
engine run (`Engine`): an iperf3 client (several parallel streams) or a perftest
`ib_write_bw` client (several QPs) on the sender, and its server, started by the receiver's
own plan (`ServeTask`) on the port the plan names.

Times are absolute and timezone-aware. A plan's times are the operator's clock; a result's
are the agent's. Clocks are assumed NTP-synced: the operator estimates each agent's offset
from `LoadResult.sent_at` and the receive time, and refuses the results of an agent off by
more than `CLOCK_TOLERANCE_SECONDS` (docs/loadtest.md).
"""

from __future__ import annotations

import math
from datetime import timedelta
from enum import StrEnum
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

from netval.model.loadtest import MAX_DURATION_SECONDS, MAX_RAILS, MAX_STREAMS, NAME_PATTERN

LOADPLAN_SCHEMA: Final = 2  # 2: engines, rails, terms, latency histograms
MAX_TASKS: Final = 512  # a stage: a few tasks per rail and window
MAX_HISTOGRAM_BUCKETS: Final = 4096  # 1%-wide buckets from 1 ns to 60 s: about 2,500
MAX_PLAN_BYTES: Final = 256 * 1024
# A result must pass the chart's broker (its maxPacketSize, `MAX_REPORT_PACKET_BYTES` =
# 1 MiB + 4 KiB, refuses a larger packet and disconnects its sender): 1,000,000 bytes of
# payload leaves over 50 KiB for the topic and MQTT headers. The agent keeps its results
# under this (coarsening latency histograms), the operator refuses bigger ones.
MAX_RESULT_BYTES: Final = 1_000_000
MAX_WARMUP_SECONDS: Final = 30.0
MAX_PLAN_SECONDS: Final = 600.0  # issue to deadline: one stage (a 300 s window and margins)
MAX_BYTES: Final = 2**62  # 400 Gb/s for 300 s is 1.5e13: far below
MAX_MBPS: Final = 10_000_000.0  # 10 Tb/s
MAX_LATENCY_MS: Final = 60_000.0
MAX_TERM: Final = 2**62
CLOCK_TOLERANCE_SECONDS: Final = 1.0
# An engine's server starts this long before its client and runs this long after the
# client's planned end (the engine's closing exchange; perftest's trailing margin adds its
# warm-up): a ServeTask spans lead + warm-up + measured (+ warm-up) + tail, its
# `warmup_seconds` is lead + warm-up. iperf3's results exchange waits behind what a
# congested link still queues and, on a tail-dropping one, the control connection's
# retransmission backoff: over 3.5 s now and then on the shaped netns fabric.
SERVE_LEAD_SECONDS: Final = 0.5
SERVE_TAIL_SECONDS: Final = 6.0

# Latency histograms: bucket k holds round trips in [1.01^k, 1.01^(k+1)) ms, so a p99 read
# from the buckets is within 0.5 % of the exact one. Round trips are clamped to
# [MIN_LATENCY_MS, MAX_LATENCY_MS] first, which bounds k.
LATENCY_BUCKET_WIDTH: Final = math.log(1.01)
MIN_LATENCY_MS: Final = 1e-6  # 1 ns
MIN_BUCKET: Final = math.floor(math.log(MIN_LATENCY_MS) / LATENCY_BUCKET_WIDTH)
MAX_BUCKET: Final = math.floor(math.log(MAX_LATENCY_MS) / LATENCY_BUCKET_WIDTH)


def latency_bucket(ms: float) -> int:
    """The histogram bucket of a round trip of `ms` milliseconds (clamped to the range)."""
    value = min(max(ms, MIN_LATENCY_MS), MAX_LATENCY_MS) if math.isfinite(ms) else MAX_LATENCY_MS
    return min(max(math.floor(math.log(value) / LATENCY_BUCKET_WIDTH), MIN_BUCKET), MAX_BUCKET)


def bucket_ms(bucket: int) -> float:
    """The middle of a bucket (geometric), what a percentile read from buckets reports."""
    return math.exp((bucket + 0.5) * LATENCY_BUCKET_WIDTH)


RunId = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
WindowId = Annotated[str, Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9._:-]+$")]
NodeName = Annotated[str, Field(min_length=1, max_length=253, pattern=NAME_PATTERN)]
EndpointName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9._-]+$")]
Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_SECONDS)]
# a server's span: lead, warm-up, the measured part, perftest's trailing warm-up, tail
SpanSeconds = Annotated[float, Field(gt=0, le=MAX_DURATION_SECONDS + 3 * MAX_WARMUP_SECONDS)]
Warmup = Annotated[float, Field(ge=0, le=MAX_WARMUP_SECONDS)]
ShortText = Annotated[str, Field(max_length=256)]
Rail = Annotated[int, Field(ge=0, lt=MAX_RAILS)]
Port = Annotated[int, Field(ge=1, le=65535)]
Streams = Annotated[int, Field(ge=1, le=MAX_STREAMS)]
Dscp = Annotated[int, Field(ge=0, le=63)]
Term = Annotated[int, Field(ge=0, le=MAX_TERM)]
Percent = Annotated[float, Field(ge=0, le=100_000)]  # of one core: a multi-threaded engine
Mbps = Annotated[float, Field(ge=0, le=MAX_MBPS)]


class Engine(StrEnum):
    """The traffic engine of a flow (docs/loadtest.md, "Engines")."""

    IPERF3 = "iperf3"  # TCP, on any rail: the Ethernet engine and the TCP reference
    PERFTEST = "perftest"  # RDMA writes (ib_write_bw) on an RDMA port's device


class LatencyEngine(StrEnum):
    ECHO = "echo"  # the peer responder's UDP echo (kernel timestamps), on the first rail
    PERFTEST = "perftest"  # ib_write_lat on the rail's RDMA device


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
    """Run the engine's client from `start` to `peer`'s rail `rail`, port `port`; the first
    `warmup_seconds` are not measured."""

    kind: Literal["flow"] = "flow"
    window: WindowId
    peer: NodeName
    rail: Rail = 0
    engine: Engine = Engine.IPERF3
    port: Port
    streams: Streams = 1  # iperf3 -P, perftest -q
    dscp: Dscp | None = None  # None: the rail's default class (see docs/loadtest.md)
    start: AwareDatetime
    warmup_seconds: Warmup
    seconds: Seconds  # the measured part, after the warm-up

    @property
    def end(self) -> AwareDatetime:
        return self.start + timedelta(seconds=self.warmup_seconds + self.seconds)


class ServeTask(_Msg):
    """Run the engine's server on this node's rail `rail`, port `port`, for `peer`'s flow of
    the same window: from `start` for `seconds`, then it is killed whatever it does."""

    kind: Literal["serve"] = "serve"
    window: WindowId
    peer: NodeName  # the sender it serves
    rail: Rail = 0
    engine: Engine = Engine.IPERF3
    test: Literal["bw", "lat"] = "bw"
    port: Port
    streams: Streams = 1
    dscp: Dscp | None = None
    start: AwareDatetime
    # lead + the client's warm-up: its CPU counts from start + warmup_seconds
    warmup_seconds: Warmup = 0.0
    seconds: SpanSeconds  # its whole span: then it is killed
    # the client's measured seconds: a perftest server runs the client's options
    client_seconds: Seconds | None = None

    @property
    def end(self) -> AwareDatetime:
        return self.start + timedelta(seconds=self.seconds)


class LatencyTask(_Msg):
    """Measure round trips to `peer` from `start` for `seconds` (idle or under load): the
    UDP echo every `interval_ms`, or perftest's `ib_write_lat` paced at `interval_ms`/1000
    against the peer's server on `port`."""

    kind: Literal["latency"] = "latency"
    window: WindowId
    peer: NodeName
    rail: Rail = 0
    engine: LatencyEngine = LatencyEngine.ECHO
    port: Port | None = None  # perftest: the peer's ib_write_lat server
    start: AwareDatetime
    seconds: Seconds
    interval_ms: Annotated[int, Field(ge=10, le=1000)] = 100
    loaded: bool

    @property
    def end(self) -> AwareDatetime:
        return self.start + timedelta(seconds=self.seconds)


class StorageTask(_Msg):
    """Read `endpoint` (a name of the validation's checks.storage) from `start`: its own
    object (`{node}` in the endpoint's path) or, of one object, byte range `part` of
    `parts` (`parts` 1: the whole object, a reader alone)."""

    kind: Literal["storage"] = "storage"
    window: WindowId
    endpoint: EndpointName
    start: AwareDatetime
    warmup_seconds: Warmup
    seconds: Seconds
    part: Annotated[int, Field(ge=0, le=100_000)] = 0
    parts: Annotated[int, Field(ge=1, le=100_001)] = 1

    @property
    def end(self) -> AwareDatetime:
        return self.start + timedelta(seconds=self.warmup_seconds + self.seconds)

    @model_validator(mode="after")
    def _part_of_parts(self) -> StorageTask:
        if self.part >= self.parts:
            raise ValueError(f"part {self.part} is not below parts {self.parts}")
        return self


Task = Annotated[FlowTask | ServeTask | LatencyTask | StorageTask, Field(discriminator="kind")]


class PeerAddress(_Msg):
    """Where a peer listens (its announced endpoint, as the operator holds it): the echo
    responder's address and port, and the address of each of its rails (by rail index;
    None: it has no such rail)."""

    address: IPvAnyAddress
    port: Port
    rails: Annotated[list[IPvAnyAddress | None], Field(max_length=MAX_RAILS)] = Field(
        default_factory=list
    )


class LoadPlan(_Msg):
    type: Literal["plan"] = "plan"
    schema_version: Annotated[
        int, Field(alias="schema", ge=LOADPLAN_SCHEMA, le=LOADPLAN_SCHEMA)
    ] = LOADPLAN_SCHEMA
    term: Term  # the leader's term: a plan of an older term than one seen is dropped
    run: RunId
    stage: Annotated[int, Field(ge=0, le=100_000)]
    validation: NodeName  # an object name: the same shape as a node name
    node: NodeName
    issued_at: AwareDatetime
    deadline: AwareDatetime  # every task ends by then; the agent stops whatever still runs
    max_rate_mbps: Annotated[float, Field(ge=0, le=MAX_MBPS)] = 0.0  # per flow; 0: none
    # the rails this node uses, by index: the interface names the load test asks for
    # (empty: the node's announced rails in their order)
    interfaces: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=15)]], Field(max_length=MAX_RAILS)
    ] = Field(default_factory=list)
    tasks: Annotated[list[Task], Field(max_length=MAX_TASKS)]
    # every node this plan sends to or receives from in the stage: an agent knows only the
    # endpoints of its own epoch's peer set (issue 24)
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
            length = task.seconds + (
                task.warmup_seconds if isinstance(task, FlowTask | StorageTask) else 0.0
            )
            if begins < 0 or begins + length > span:
                raise ValueError(f"tasks[{i}] ({task.window}) runs outside issuedAt..deadline")
        return self


class LoadAbort(_Msg):
    """Stop every task of `run` now (the test or its validation was deleted, the node
    turned busy, gated or stale, the operator lost the run)."""

    type: Literal["abort"] = "abort"
    term: Term = 0
    run: RunId
    reason: ShortText = ""


PlanMessage = Annotated[LoadPlan | LoadAbort, Field(discriminator="type")]


_PLAN_MESSAGE: Final = TypeAdapter[LoadPlan | LoadAbort](PlanMessage)


# -- agent -> operator ----------------------------------------------------------------------


class FlowResult(_Msg):
    """What one engine run moved in its measured part (agent clock), and what limited it:
    the sender rail's port rate and the engine's CPU on both ends."""

    window: WindowId
    peer: NodeName
    rail: Rail = 0
    bytes: Annotated[int, Field(ge=0, le=MAX_BYTES)]
    start: AwareDatetime
    end: AwareDatetime
    error: ShortText | None = None
    streams: Streams = 1
    port_mbps: Mbps | None = None  # the sender rail's port rate (None: unknown)
    # the engine process's CPU (user + system) over its run, % of one core, as the engine
    # reports it (iperf3's cpu_utilization_percent host_total / remote_total)
    cpu_percent: Percent | None = None
    remote_cpu_percent: Percent | None = None
    # the sender engine's CPU demand over the measured part: time on a CPU plus time ready
    # but waiting for one (/proc/<pid>/schedstat), % of one core: near 100 % means the host,
    # not the network, set the pace (a busy-polling engine is always near 100 %)
    cpu_demand_percent: Percent | None = None
    retransmits: Annotated[int, Field(ge=0, le=MAX_BYTES)] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> FlowResult:
        if self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class ServeResult(_Msg):
    """The receiving side of one flow: its server's CPU demand and the rail's port rate."""

    window: WindowId
    peer: NodeName  # the sender
    rail: Rail = 0
    port_mbps: Mbps | None = None
    cpu_demand_percent: Percent | None = None
    error: ShortText | None = None


class LatencyResult(_Msg):
    """Every round trip of a latency task, in 1%-wide buckets (`latency_bucket`):
    `histogram` is [[bucket, count], ...]. Round trips: the echo's, or perftest's one-way
    figure doubled."""

    window: WindowId
    peer: NodeName
    loaded: bool
    engine: LatencyEngine = LatencyEngine.ECHO
    sent: Annotated[int, Field(ge=0, le=100_000_000)]
    received: Annotated[int, Field(ge=0, le=100_000_000)]
    histogram: Annotated[
        list[
            tuple[
                Annotated[int, Field(ge=MIN_BUCKET, le=MAX_BUCKET)],
                Annotated[int, Field(ge=1, le=100_000_000)],
            ]
        ],
        Field(max_length=MAX_HISTOGRAM_BUCKETS),
    ] = Field(default_factory=list)
    error: ShortText | None = None

    @model_validator(mode="after")
    def _consistent(self) -> LatencyResult:
        if self.received > self.sent:
            raise ValueError(f"received {self.received} is more than sent {self.sent}")
        counted = sum(count for _, count in self.histogram)
        if counted > self.received:
            raise ValueError(f"histogram holds {counted} round trips, received {self.received}")
        return self


class StorageResult(_Msg):
    window: WindowId
    endpoint: EndpointName
    bytes: Annotated[int, Field(ge=0, le=MAX_BYTES)]
    start: AwareDatetime
    end: AwareDatetime
    error: ShortText | None = None
    # what was read: this node's own object ({node} in the path), or a byte range of one
    # object (first and last byte), or the whole object (neither)
    own_object: bool = False
    range_first: Annotated[int, Field(ge=0, le=MAX_BYTES)] | None = None
    range_last: Annotated[int, Field(ge=0, le=MAX_BYTES)] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> StorageResult:
        if self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class LoadResult(_Msg):
    schema_version: Annotated[
        int, Field(alias="schema", ge=LOADPLAN_SCHEMA, le=LOADPLAN_SCHEMA)
    ] = LOADPLAN_SCHEMA
    run: RunId
    stage: Annotated[int, Field(ge=0, le=100_000)]
    validation: NodeName
    node: NodeName
    sent_at: AwareDatetime  # agent clock: the operator's offset estimate
    # the engines this plan ran, name -> version ("iperf3" -> "3.12")
    engines: Annotated[
        dict[Annotated[str, Field(max_length=32)], Annotated[str, Field(max_length=64)]],
        Field(max_length=4),
    ] = Field(default_factory=dict)
    flows: Annotated[list[FlowResult], Field(max_length=MAX_TASKS)] = Field(default_factory=list)
    serves: Annotated[list[ServeResult], Field(max_length=MAX_TASKS)] = Field(default_factory=list)
    latency: Annotated[list[LatencyResult], Field(max_length=MAX_TASKS)] = Field(
        default_factory=list
    )
    storage: Annotated[list[StorageResult], Field(max_length=MAX_TASKS)] = Field(
        default_factory=list
    )
    # what an engine needs and this node lacks ("perftest: no RDMA device mlx5_3"): its
    # flows carry errors too; said once here so the run can name the node
    unavailable: ShortText | None = None
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
