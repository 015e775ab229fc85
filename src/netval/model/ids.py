"""The stable vocabulary: check ids, result statuses, check groups.

These strings are a contract (reports, CR status, metrics, alerts, dashboards): never rename one.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class CheckGroup(StrEnum):
    LINK = "link"
    MTU = "mtu"
    RDMA = "rdma"
    PFC = "pfc"
    ECN = "ecn"
    IB = "ib"
    STORAGE = "storage"
    PEER = "peer"
    FLEET = "fleet"  # judged by the operator across nodes (issue 22), never by an agent


class CheckId(StrEnum):
    LINK_CARRIER = "link.carrier"
    LINK_FLAPS = "link.flaps"
    MTU_INTERFACE = "mtu.interface"
    MTU_ROCE = "mtu.roce"
    RDMA_DEVICES = "rdma.devices"
    RDMA_PORT_STATE = "rdma.port_state"
    RDMA_LINK_LAYER = "rdma.link_layer"
    RDMA_RATE = "rdma.rate"
    RDMA_GID_ROCE_V2 = "rdma.gid_roce_v2"
    RDMA_ERRORS = "rdma.errors"
    PFC_PRIORITIES = "pfc.priorities"
    PFC_TRUST = "pfc.trust"
    PFC_PAUSE_STORM = "pfc.pause_storm"
    PFC_DISCARDS = "pfc.discards"
    ECN_NP_ENABLED = "ecn.np_enabled"
    ECN_RP_ENABLED = "ecn.rp_enabled"
    ECN_CNP_FLOW = "ecn.cnp_flow"
    # -- transports, GIDs and InfiniBand ports (issue 11) --
    MTU_IPOIB = "mtu.ipoib"
    RDMA_GID_INDEX = "rdma.gid_index"
    IB_PORT_ERRORS = "ib.port_errors"
    # --
    STORAGE_REACHABLE = "storage.reachable"
    STORAGE_LATENCY = "storage.latency"
    STORAGE_THROUGHPUT = "storage.throughput"
    PEER_LATENCY = "peer.latency"
    PEER_LOSS = "peer.loss"
    PEER_PATH_MTU = "peer.path_mtu"
    PEER_THROUGHPUT = "peer.throughput"
    # -- driver counters (issue 11) --
    LINK_PHY_ERRORS = "link.phy_errors"
    PFC_GLOBAL_PAUSE = "pfc.global_pause"
    # -- fleet consistency (issue 22): the operator's verdict of a node against its cohort --
    FLEET_CONSISTENCY = "fleet.consistency"

    @property
    def group(self) -> CheckGroup:
        return CheckGroup(self.value.split(".", 1)[0])


class Status(StrEnum):
    """Outcome of one check; node status is the worst of its results."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    @property
    def is_bad(self) -> bool:
        """Fail and error are what `netval probe` exits 1 on and what gating acts on."""
        return self in (Status.FAIL, Status.ERROR)


# A skipped check says nothing about health, so it ranks below pass: a node whose RDMA
# checks pass and whose unknown-driver counter checks skip is a passing node.
_SEVERITY: dict[Status, int] = {
    Status.SKIP: 0,
    Status.PASS: 1,
    Status.WARN: 2,
    Status.FAIL: 3,
    Status.ERROR: 4,
}


def worst(statuses: Iterable[Status], default: Status = Status.SKIP) -> Status:
    result = default
    for status in statuses:
        if status.severity > result.severity:
            result = status
    return result
