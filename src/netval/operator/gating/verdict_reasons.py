"""The node verdict's vocabulary (pure): how fresh a node is heard (`Heard`), why it is
decided as it is (`Why`, CamelCase like condition reasons, docs/gating.md's table), which
reasons admission counts healthy, which taint NICs rather than the node, and the
`NetworkFabricReady` status and reason of each (`CONDITIONS`). `gating.verdict` decides with
them; they live apart so the table reads in one place."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from netval.model.keys import FabricHealth


class Heard(StrEnum):
    """How fresh a node's last report is (`netval.operator.state.validation.heard`)."""

    FRESH = "fresh"  # within 3 intervals (a matching beat counts), its agent not offline
    SILENT = "silent"  # older, or a beat contradicted it
    OFFLINE = "offline"  # its agent's last will (or a clean stop)
    NEVER = "never"  # no report held: awaiting the first, or never reported


class Why(StrEnum):
    """The reason of a decision (CamelCase, as condition reasons)."""

    FAILING = "Failing"
    BLAMED = "RetriesBlamedOnNode"  # requester retries, and the east-west paths point here
    RECOVERING = "Recovering"  # passing again, fewer than recoveryReports reports in a row
    SILENT_AFTER_FAILING = "SilentAfterFailing"
    SUSPECT = "BreakerSuspect"  # wants exclusion, the breaker's cap is full
    RETRIES_FROM_PEERS = "RetriesFromPeers"  # requester retries only: warn, not its fault
    # its only warnings are failing paths towards a suspect node or through a suspect link
    OBSERVER = "PathObserver"
    DEVICES_FAILING = "DevicesFailing"  # at most maxFailedDevicesPerNode NICs fail: tainted
    DEVICES_RECOVERING = "DevicesRecovering"  # a NIC passing again, < recoveryReports times
    SILENT_AFTER_DEVICES = "SilentAfterDevicesFailing"  # silent; its NICs stay tainted
    WARNING = "Warning"
    PASSING = "Passing"
    HELD = "StaleHeld"  # went stale with more than the cap at once: its last label holds
    SILENT = "Silent"
    OFFLINE = "Offline"
    NEVER_REPORTED = "NeverReported"


# "worst" for the label: no data ranks above healthy, a known warning above no data.
RANK: Final = {
    FabricHealth.HEALTHY: 0,
    FabricHealth.UNKNOWN: 1,
    FabricHealth.DEGRADED: 2,
    FabricHealth.SUSPECT: 3,
    FabricHealth.UNHEALTHY: 4,
}
# the reasons of a node admission counts as healthy: a fresh passing or warning report, or
# one whose failing NICs are tainted (their devices are kept off; the node's others are fine)
ADMISSIBLE: Final = frozenset({Why.PASSING, Why.WARNING, Why.RETRIES_FROM_PEERS, Why.OBSERVER,
                               Why.DEVICES_FAILING, Why.DEVICES_RECOVERING})  # fmt: skip
DEVICE_WHYS: Final = frozenset({Why.DEVICES_FAILING, Why.DEVICES_RECOVERING,
                                Why.SILENT_AFTER_DEVICES})  # fmt: skip


class ConditionStatus(StrEnum):
    TRUE = "True"
    UNKNOWN = "Unknown"
    FALSE = "False"


# The Node condition NetworkFabricReady of each why: (status, reason). False: the fabric
# fails the node (a NIC or more); Unknown: no fresh judgement, or the breaker doubts it.
CONDITIONS: Final[dict[Why, tuple[ConditionStatus, str]]] = {
    Why.PASSING: (ConditionStatus.TRUE, "ChecksPassing"),
    Why.WARNING: (ConditionStatus.TRUE, "ChecksWarning"),
    Why.RETRIES_FROM_PEERS: (ConditionStatus.TRUE, "RetriesFromPeers"),
    Why.OBSERVER: (ConditionStatus.TRUE, "PathObserver"),
    Why.FAILING: (ConditionStatus.FALSE, "ChecksFailing"),
    Why.BLAMED: (ConditionStatus.FALSE, "RetriesBlamedOnNode"),
    Why.RECOVERING: (ConditionStatus.FALSE, "Recovering"),
    Why.SILENT_AFTER_FAILING: (ConditionStatus.FALSE, "SilentAfterFailing"),
    Why.DEVICES_FAILING: (ConditionStatus.FALSE, "DevicesFailing"),
    Why.DEVICES_RECOVERING: (ConditionStatus.FALSE, "DevicesRecovering"),
    Why.SILENT_AFTER_DEVICES: (ConditionStatus.FALSE, "SilentAfterDevicesFailing"),
    Why.SUSPECT: (ConditionStatus.UNKNOWN, "BreakerSuspect"),
    Why.HELD: (ConditionStatus.UNKNOWN, "StaleHeld"),
    Why.SILENT: (ConditionStatus.UNKNOWN, "Silent"),
    Why.OFFLINE: (ConditionStatus.UNKNOWN, "Offline"),
    Why.NEVER_REPORTED: (ConditionStatus.UNKNOWN, "NeverReported"),
}
CONDITION_RANK: Final = {ConditionStatus.TRUE: 0, ConditionStatus.UNKNOWN: 1,
                          ConditionStatus.FALSE: 2}  # fmt: skip
UNKNOWN_WHY: Final = {Heard.SILENT: Why.SILENT, Heard.OFFLINE: Why.OFFLINE,
                       Heard.NEVER: Why.NEVER_REPORTED, Heard.FRESH: Why.SILENT}  # fmt: skip


__all__ = [
    "ADMISSIBLE",
    "CONDITIONS",
    "CONDITION_RANK",
    "DEVICE_WHYS",
    "RANK",
    "UNKNOWN_WHY",
    "ConditionStatus",
    "Heard",
    "Why",
]
