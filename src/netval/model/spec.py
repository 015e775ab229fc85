"""The NetworkValidation spec (camelCase on the wire): expectations shared by agent and operator.

This is a trust boundary (user YAML, the rendered agent config), so every model forbids
unknown fields and bounds its values; defaults are documented in docs/checks.md.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field, model_validator

from netval.model.duration import DURATION_PATTERN, parse_duration
from netval.model.spec_base import SpecModel as _Spec
from netval.model.spec_fleet import Consistency as Consistency
from netval.model.spec_fleet import FindingSeverity as FindingSeverity
from netval.model.spec_fleet import TopologySpec as TopologySpec
from netval.model.spec_fleet import TopologyVerdict as TopologyVerdict

MIN_INTERVAL_SECONDS: Final = 5.0

Priority = Annotated[int, Field(ge=0, le=7)]
IfName = Annotated[str, Field(min_length=1, max_length=15, pattern=r"^[^/\s:]+$")]
RoceMTU = Annotated[int, Field(description="one of 256, 512, 1024, 2048, 4096")]
ROCE_MTUS: Final = (256, 512, 1024, 2048, 4096)


def _unique_priorities(values: list[int]) -> list[int]:
    if len(set(values)) != len(values):
        raise ValueError(f"priorities must be unique, got {values}")
    return sorted(values)


Priorities = Annotated[list[Priority], AfterValidator(_unique_priorities)]


def _unique_names(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError(f"interfaces must be unique, got {values}")
    return values


class LinkLayer(StrEnum):
    ETHERNET = "Ethernet"
    INFINIBAND = "InfiniBand"
    # AWS EFA ports: the kernel's link_layer reads "Unknown" (IB_LINK_LAYER_UNSPECIFIED);
    # users name the fabric, so the value is "EFA" (docs/checks.md, "Transports").
    EFA = "EFA"


class Trust(StrEnum):
    DSCP = "dscp"
    PCP = "pcp"


class StorageProtocol(StrEnum):
    TCP = "tcp"
    CEPH = "ceph"
    NFS = "nfs"
    S3 = "s3"
    HTTP = "http"


class AdmissionMode(StrEnum):
    GATE = "gate"
    DENY = "deny"


class AdmissionPolicy(StrEnum):
    """What admission (webhook gate/deny, the Kueue check, gate release) waits for."""

    CAPACITY = "capacity"  # Usable, enough healthy nodes, the workload's own nodes not failing
    STRICT = "strict"  # Healthy: no targeted node failing


class BreakerAction(StrEnum):
    """What admission does while more nodes fail than `maxUnhealthyPercent` allows."""

    # admit with the exclusions that still hold (the capped taints and `unhealthy` labels)
    ADMIT = "admit"
    HOLD = "hold"  # Usable turns False: admission waits until the failures are within the cap


class LinkChecks(_Spec):
    interfaces: list[IfName] = Field(default_factory=list)
    max_carrier_changes: Annotated[int, Field(ge=0)] = 0
    # link.phy_errors: the post-FEC bit error ratio a port may show; null: the IEEE 802.3
    # objective for its speed (1e-13 from 200 Gb/s, else 1e-12; docs/checks.md).
    max_post_fec_ber: Annotated[float | None, Field(gt=0, lt=1)] = None


class MtuChecks(_Spec):
    # lo defaults to 65536 and the kernel caps no MTU below INT_MAX
    interface_mtu: Annotated[int, Field(alias="interfaceMTU", ge=68, le=2_147_483_647)] = 9000
    roce_mtu: Annotated[RoceMTU, Field(alias="roceMTU")] = 4096
    interfaces: list[IfName] = Field(default_factory=list)
    # IPoIB netdevs are judged against this, not interfaceMTU; null: by IPoIB mode, 4092 in
    # datagram mode (a 4096 IB MTU minus the 4-byte IPoIB header), 65520 in connected mode.
    ipoib_mtu: Annotated[int | None, Field(alias="ipoibMTU", ge=68, le=65520)] = None

    @model_validator(mode="after")
    def _roce_mtu_is_ib_mtu(self) -> MtuChecks:
        if self.roce_mtu not in ROCE_MTUS:
            raise ValueError(f"roceMTU must be one of {list(ROCE_MTUS)}, got {self.roce_mtu}")
        return self


# Deprecated per-interval counts (section, old field, its per-second replacement). A spec that
# sets the old field and not the new one is read as new = old / spec.interval; a bare checks
# document (netval probe) has no interval and is read with the default one.
DEPRECATED_PER_INTERVAL: Final = (
    ("rdma", "maxErrorsPerInterval", "maxRetryErrorsPerSecond"),
    ("pfc", "maxDiscardsPerInterval", "maxDiscardsPerSecond"),
)
DEFAULT_INTERVAL: Final = "30s"
# Each ACK timeout stalls its QP for the transport timeout (4.3 s at NCCL_IB_TIMEOUT 20): one
# every 10 s on a port is already visible in collective times (docs/checks.md).
DEFAULT_MAX_RETRY_ERRORS_PER_SECOND: Final = 0.1
# A go-back-N retransmission resends the window behind the lost packet; ten per second on a
# port is a lossy path (400/s is one packet in ~20,000 at 100 Gb/s of 4 KiB frames).
DEFAULT_MAX_RETRANSMITS_PER_SECOND: Final = 10.0


def _python_name(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


def _per_second_from_interval(section: Any, old: str, new: str, interval_seconds: float) -> Any:
    """`section` with `new` set from the deprecated `old` count, when only `old` is set."""
    if not isinstance(section, dict):
        return section
    old_keys, new_keys = (old, _python_name(old)), (new, _python_name(new))
    value = next((section[k] for k in old_keys if k in section), None)
    if any(section.get(k) is not None for k in new_keys) or value is None:
        return section
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return section  # the field (strict int) rejects it
    return {**section, new: value / interval_seconds}


def deprecated_fields_set(spec: NetworkValidationSpec) -> list[str]:
    """The deprecated fields a spec sets, each with what it was read as (for warnings)."""
    out = []
    for section, old, new in DEPRECATED_PER_INTERVAL:
        model = getattr(spec.checks, section)
        count = getattr(model, _python_name(old))
        if count is None:
            continue
        rate = getattr(model, _python_name(new))
        if rate is not None and abs(rate - count / spec.interval_seconds) > 1e-12:
            out.append(f"spec.checks.{section}.{old} is deprecated and ignored: {new} is set")
            continue
        out.append(
            f"spec.checks.{section}.{old} is deprecated: read as {new} {rate or 0.0:g} "
            f"(per interval {spec.interval}); set {new} instead"
        )
    return out


class RdmaChecks(_Spec):
    devices: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list)
    link_layer: LinkLayer = LinkLayer.ETHERNET
    min_rate_gbps: Annotated[float | None, Field(ge=0)] = None
    require_ro_ce_v2: Annotated[bool, Field(alias="requireRoCEv2")] = True
    # -- rdma.errors, per counter family and per second (docs/checks.md, "Counter policy") --
    # null: DEFAULT_MAX_RETRY_ERRORS_PER_SECOND (left unset so a deprecated
    # maxErrorsPerInterval can still be converted after the API server's defaulting)
    max_retry_errors_per_second: Annotated[float | None, Field(ge=0)] = None
    warn_receiver_errors_per_second: Annotated[float, Field(ge=0)] = 0.0
    warn_completion_errors_per_second: Annotated[float, Field(ge=0)] = 0.0
    # Requester-side retransmissions (irdma RetransSegs/tcpRetransSegs, NAK sequence errors):
    # TCP-based iWARP retransmits now and then on a healthy lossy fabric, so these have their
    # own bar; over it they warn (requester) or fail with own-port evidence.
    max_retransmits_per_second: Annotated[float, Field(ge=0)] = DEFAULT_MAX_RETRANSMITS_PER_SECOND
    # Deprecated: a count per spec.interval; read as maxRetryErrorsPerSecond = value /
    # interval when maxRetryErrorsPerSecond is not set.
    max_errors_per_interval: Annotated[int | None, Field(ge=0, strict=True)] = None

    @model_validator(mode="before")
    @classmethod
    def _deprecated_per_interval(cls, data: Any) -> Any:
        return _per_second_from_interval(
            data,
            "maxErrorsPerInterval",
            "maxRetryErrorsPerSecond",
            parse_duration(DEFAULT_INTERVAL),
        )

    @property
    def retry_errors_limit(self) -> float:
        value = self.max_retry_errors_per_second
        return DEFAULT_MAX_RETRY_ERRORS_PER_SECOND if value is None else value

    # -- transports and GIDs (issue 11) --
    # A node with InfiniBand and RoCE ports states both; when set it replaces linkLayer.
    link_layers: Annotated[list[LinkLayer] | None, Field(min_length=1, max_length=3)] = None
    # The GID index jobs are told to use (NCCL_IB_GID_INDEX); null: any index, but a change
    # of index between two samples is reported (rdma.gid_index).
    ro_ce_v2_gid_index: Annotated[int | None, Field(alias="roceV2GidIndex", ge=0, le=255)] = None

    @property
    def expected_link_layers(self) -> list[LinkLayer]:
        return list(self.link_layers) if self.link_layers else [self.link_layer]


class PfcChecks(_Spec):
    priorities: Priorities = Field(default_factory=lambda: [3])
    trust: Trust = Trust.DSCP
    warn_pause_percent: Annotated[float, Field(ge=0, le=100)] = 5.0
    max_pause_percent: Annotated[float, Field(ge=0, le=100)] = 20.0
    # pfc.discards: drops of the lossless priorities per second (a lossless class must not drop)
    # null: 0 (unset for the same reason as rdma.maxRetryErrorsPerSecond)
    max_discards_per_second: Annotated[float | None, Field(ge=0)] = None
    # Deprecated: a count per spec.interval; read as maxDiscardsPerSecond = value / interval
    # when maxDiscardsPerSecond is not set.
    max_discards_per_interval: Annotated[int | None, Field(ge=0, strict=True)] = None

    @model_validator(mode="before")
    @classmethod
    def _deprecated_per_interval(cls, data: Any) -> Any:
        return _per_second_from_interval(
            data,
            "maxDiscardsPerInterval",
            "maxDiscardsPerSecond",
            parse_duration(DEFAULT_INTERVAL),
        )

    @property
    def discards_limit(self) -> float:
        return self.max_discards_per_second or 0.0


class EcnMode(StrEnum):
    """The fabric's congestion control: ECN-driven DCQCN, or none (PFC-only or lossy
    fabrics, and fabrics whose congestion control does not use CNPs)."""

    DCQCN = "dcqcn"
    NONE = "none"


class EcnChecks(_Spec):
    mode: EcnMode = EcnMode.DCQCN
    # None means "the PFC priorities": RoCE congestion control only works when ECN and PFC
    # protect the same traffic class.
    priorities: Priorities | None = None
    min_marks_for_cnp: Annotated[int, Field(ge=1)] = 100
    max_cnp_ignored_per_interval: Annotated[int, Field(ge=0)] = 0


# -- which subjects are judged, and InfiniBand port expectations (issue 11) ----------------

# A glob (fnmatch: *, ?, [..]) over RDMA device names, "<device>/<port>" or netdev names, or
# a PCI address ("0000:3b:00.1", "0000:3b:*").
SelectPattern = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:/*?!\[\]-]+$")
]


class AdminDown(StrEnum):
    JUDGE = "judge"  # an admin-down port or netdev is judged (and fails): safe default
    SKIP = "skip"  # admin down is not a fault: such ports/netdevs are reported as skip


class PatternFilter(_Spec):
    """Empty include: everything; exclude wins over include."""

    include: Annotated[list[SelectPattern], Field(max_length=64)] = Field(default_factory=list)
    exclude: Annotated[list[SelectPattern], Field(max_length=64)] = Field(default_factory=list)


class Selection(_Spec):
    """`spec.checks.select`: which RDMA devices, ports and netdevs the node is judged on."""

    devices: PatternFilter = Field(default_factory=PatternFilter)
    ports: PatternFilter = Field(default_factory=PatternFilter)
    netdevs: PatternFilter = Field(default_factory=PatternFilter)
    admin_down: AdminDown = AdminDown.JUDGE
    # iWARP ports get no PFC/ECN intent checks unless asked (iWARP runs over TCP).
    qos_on_iwarp: Annotated[bool, Field(alias="qosOnIWARP")] = False


class IbCounterLimits(_Spec):
    """Most growth per interval of each IB PortCounters error counter (ports/<n>/counters)."""

    symbol_error: Annotated[int, Field(ge=0)] = 10
    link_error_recovery: Annotated[int, Field(ge=0)] = 0
    link_downed: Annotated[int, Field(ge=0)] = 0
    port_rcv_errors: Annotated[int, Field(ge=0)] = 10
    port_xmit_discards: Annotated[int, Field(ge=0)] = 100
    excessive_buffer_overrun_errors: Annotated[int, Field(ge=0)] = 0
    local_link_integrity_errors: Annotated[int, Field(ge=0)] = 0
    vl15_dropped: Annotated[int, Field(alias="VL15Dropped", ge=0)] = 100


class InfinibandChecks(_Spec):
    """`spec.checks.infiniband`: expectations for InfiniBand ports only."""

    # null: rdma.minRateGbps (or, unset too, the fastest port of the same card and link layer)
    min_rate_gbps: Annotated[float | None, Field(ge=0)] = None
    max_counter_deltas: IbCounterLimits = Field(default_factory=IbCounterLimits)


class StorageEndpoint(_Spec):
    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9._-]+$")]
    protocol: StorageProtocol
    host: Annotated[str, Field(min_length=1, max_length=253)]
    port: Annotated[int | None, Field(ge=1, le=65535)] = None
    path: Annotated[str | None, Field(max_length=1024)] = None
    max_latency_ms: Annotated[float, Field(gt=0)] = 10.0
    min_throughput_m_bps: Annotated[float | None, Field(alias="minThroughputMBps", gt=0)] = None

    @property
    def measures_throughput(self) -> bool:
        """`storage.throughput` applies: an s3/http object with a minimum rate."""
        return (
            self.min_throughput_m_bps is not None
            and self.path is not None
            and self.protocol in (StorageProtocol.S3, StorageProtocol.HTTP)
        )


class StorageChecks(_Spec):
    endpoints: list[StorageEndpoint] = Field(default_factory=list)
    # the minimum spacing of one node's reads (in agent intervals)
    throughput_every_cycles: Annotated[int, Field(ge=1)] = 10
    # the fleet budget: readers of one endpoint at once, per validation (docs/checks.md)
    max_concurrent_probes: Annotated[int, Field(ge=1, le=64)] = 4

    @model_validator(mode="after")
    def _unique_names(self) -> StorageChecks:
        names = [e.name for e in self.endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"storage endpoint names must be unique, got {names}")
        return self


DEFAULT_PEER_TOPOLOGY_KEY: Final = "topology.kubernetes.io/zone"


def _cidr(value: str) -> str:
    """A network in CIDR notation, normalised (host bits set: refused, not masked)."""
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        raise ValueError(f"not a network in CIDR notation: {value!r} ({exc})") from None


Cidr = Annotated[str, Field(min_length=2, max_length=43), AfterValidator(_cidr)]
MAX_FABRIC_CIDRS: Final = 64


class PeerChecks(_Spec):
    enabled: bool = False
    interface: IfName | None = None
    # the networks an announced east-west endpoint may be in besides the Node's own
    # addresses (status.addresses): the fabric NICs' subnets (docs/checks.md "The endpoint check")
    fabric_cidrs: Annotated[list[Cidr], Field(max_length=MAX_FABRIC_CIDRS)] = Field(
        default_factory=list
    )
    # the node's fabric rails, in order (a NetworkLoadTest loads each, rail i to rail i of
    # a peer); the first is the probes' interface when `interface` is not set
    interfaces: Annotated[list[IfName], Field(max_length=16), AfterValidator(_unique_names)] = (
        Field(default_factory=list)
    )
    port: Annotated[int, Field(ge=1, le=65535)] = 7471
    # null: the lowest level of spec.topology (declared, else auto-detected), else
    # DEFAULT_PEER_TOPOLOGY_KEY (netval.operator.topology.agreement.peer_topology_key)
    topology_key: Annotated[str | None, Field(min_length=1, max_length=317)] = None
    samples_per_domain: Annotated[int, Field(ge=1, le=64)] = 2
    max_latency_ms: Annotated[float, Field(gt=0)] = 1.0
    max_loss_percent: Annotated[float, Field(ge=0, le=100)] = 0.1
    min_throughput_ratio: Annotated[float, Field(gt=0, le=1)] = 0.5

    @property
    def primary_interface(self) -> str | None:
        """Where the responder listens: `interface`, else the first rail, else None (the
        first RDMA netdev)."""
        return self.interface or (self.interfaces[0] if self.interfaces else None)


class Checks(_Spec):
    """`spec.checks`: what a healthy node looks like."""

    link: LinkChecks = Field(default_factory=LinkChecks)
    mtu: MtuChecks = Field(default_factory=MtuChecks)
    rdma: RdmaChecks = Field(default_factory=RdmaChecks)
    infiniband: InfinibandChecks = Field(default_factory=InfinibandChecks)
    select: Selection = Field(default_factory=Selection)
    pfc: PfcChecks = Field(default_factory=PfcChecks)
    ecn: EcnChecks = Field(default_factory=EcnChecks)
    storage: StorageChecks = Field(default_factory=StorageChecks)
    peers: PeerChecks = Field(default_factory=PeerChecks)

    @property
    def ecn_priorities(self) -> list[int]:
        return self.ecn.priorities if self.ecn.priorities is not None else self.pfc.priorities

    @property
    def named_interfaces(self) -> list[str]:
        """Interfaces the user asked to judge in addition to the RDMA netdevs."""
        return list(
            dict.fromkeys([*self.link.interfaces, *self.mtu.interfaces, *self.peers.interfaces])
        )


MAX_FAILED_DEVICES_PER_NODE: Final = 16
MAX_DEVICE_TAINTS: Final = 10_000


class Gating(_Spec):
    node_label: bool = True
    taint: bool = False
    max_unhealthy_percent: Annotated[float, Field(ge=0, le=100)] = 10.0
    recovery_reports: Annotated[int, Field(ge=1, le=100)] = 3
    admission: AdmissionMode = AdmissionMode.GATE
    admission_policy: AdmissionPolicy = AdmissionPolicy.CAPACITY
    on_breaker_tripped: BreakerAction = BreakerAction.ADMIT
    # issue 30: the Node condition NetworkFabricReady, DRA device taints, k of N rails
    node_condition: bool = True
    device_taints: bool = False
    max_failed_devices_per_node: Annotated[int, Field(ge=0, le=MAX_FAILED_DEVICES_PER_NODE)] = 0
    max_device_taints: Annotated[int, Field(ge=1, le=MAX_DEVICE_TAINTS)] = 1000


class Telemetry(_Spec):
    otlp_endpoint: Annotated[str | None, Field(max_length=1024)] = None


# spec.report.fullEvery: cycles between two full reports at most (beats in between, issue 23)
DEFAULT_FULL_EVERY: Final = 10
MAX_FULL_EVERY: Final = 1000


class ReportCadence(_Spec):
    """How often an unchanged node publishes its full report (docs/architecture.md, "Reports
    and beats"); a change is published at once whatever this says."""

    full_every: Annotated[int, Field(ge=1, le=MAX_FULL_EVERY)] = DEFAULT_FULL_EVERY


class NetworkValidationSpec(_Spec):
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    interval: Annotated[str, Field(pattern=DURATION_PATTERN)] = DEFAULT_INTERVAL
    checks: Checks = Field(default_factory=Checks)
    gating: Gating = Field(default_factory=Gating)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    consistency: Consistency = Field(default_factory=Consistency)
    topology: TopologySpec = Field(default_factory=TopologySpec)
    report: ReportCadence = Field(default_factory=ReportCadence)

    @model_validator(mode="before")
    @classmethod
    def _deprecated_per_interval(cls, data: Any) -> Any:
        """Deprecated per-interval counts are converted with this spec's own interval."""
        if not isinstance(data, dict) or not isinstance(data.get("checks"), dict):
            return data
        try:
            seconds = parse_duration(str(data.get("interval", DEFAULT_INTERVAL)))
        except ValueError:
            return data  # the interval field reports it
        if seconds <= 0:
            return data
        checks = dict(data["checks"])
        for section, old, new in DEPRECATED_PER_INTERVAL:
            if section in checks:
                checks[section] = _per_second_from_interval(checks[section], old, new, seconds)
        return {**data, "checks": checks}

    @model_validator(mode="after")
    def _interval_floor(self) -> NetworkValidationSpec:
        if parse_duration(self.interval) < MIN_INTERVAL_SECONDS:
            raise ValueError(f"interval must be at least 5s, got {self.interval!r}")
        return self

    @property
    def interval_seconds(self) -> float:
        return parse_duration(self.interval)

    def referenced_label_keys(self) -> frozenset[str]:
        """Every node-label key this spec reads: the node selector, the peers' domain key, the
        topology levels (with none declared, every key the auto-detection looks for) and the
        consistency cohort label.
        A metadata-only Node cache may keep just these."""
        from netval.model.topology import auto_level_keys  # the model's own, no cycle at import

        levels = self.topology.levels or auto_level_keys()
        peer_key = self.checks.peers.topology_key or DEFAULT_PEER_TOPOLOGY_KEY
        cohort = [self.consistency.cohort_label] if self.consistency.cohort_label else []
        return frozenset([*self.node_selector, peer_key, *levels, *cohort])
