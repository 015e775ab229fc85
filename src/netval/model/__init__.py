"""Shared, I/O-free model: check ids, statuses, spec expectations, reports, snapshots.

The agent and the operator both import this package and never each other.
"""

from netval.model.ids import CheckGroup, CheckId, Status, worst
from netval.model.results import REPORT_SCHEMA, CheckResult, Report, node_status
from netval.model.snapshot import (
    SNAPSHOT_FORMAT,
    Dcb,
    DcbApp,
    Gid,
    Netdev,
    NodeSnapshot,
    RdmaDevice,
    RdmaPort,
    Sample,
)
from netval.model.spec import Checks, NetworkValidationSpec

__all__ = [
    "REPORT_SCHEMA",
    "SNAPSHOT_FORMAT",
    "CheckGroup",
    "CheckId",
    "CheckResult",
    "Checks",
    "Dcb",
    "DcbApp",
    "Gid",
    "Netdev",
    "NetworkValidationSpec",
    "NodeSnapshot",
    "RdmaDevice",
    "RdmaPort",
    "Report",
    "Sample",
    "Status",
    "node_status",
    "worst",
]
