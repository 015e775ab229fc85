"""Who an `rdma.errors` finding points at: the vocabulary shared by the agent's counter
judgement and the operator's node verdict (docs/checks.md, "Attribution").

Requester-side retry and timeout counters (`local_ack_timeout_err`,
`req_transport_retries_exceeded`, `req_cqe_error`, ...) rise on every node that talks to a
peer that died, so on their own they warn with attribution `requester`: a victim, not a
culprit. They fail with attribution `local` only when the node's own port shows evidence
in the same window (`evidence` names the checks that saw it). The operator reads these keys
to tell victims from culprits; the values are a contract: never rename one.

An `rdma.errors` result that is not a pass carries, in `observed`:
- `attribution`: an `Attribution` value;
- `counters`: {counter name: delta over the window} of the counters behind the verdict;
- `ratePerSecond`: their total per second;
- `evidence` (attribution `local` only): a list of `Evidence` values.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class Attribution(StrEnum):
    # Requester-side retries/timeouts and no evidence on this node's own port: the peer or
    # the path is as likely as this node (a peer that died raises them on all its peers).
    REQUESTER = "requester"
    # Evidence on this node's own port in the same window, or counters that only this
    # node's port or NIC can raise (damaged packets received): the node is blamed.
    LOCAL = "local"
    # A receiver that did not post receive buffers in time (RNR NAK retries exhausted,
    # out_of_buffer) or completions an application tore down: the application, not the
    # fabric.
    APPLICATION = "application"
    # A counter the policy table does not classify yet: warned, never blamed.
    UNCLASSIFIED = "unclassified"


class ErrorsKey(StrEnum):
    """Keys of an `rdma.errors` result's `observed` that the operator reads."""

    ATTRIBUTION = "attribution"
    COUNTERS = "counters"
    RATE_PER_SECOND = "ratePerSecond"
    EVIDENCE = "evidence"


class Evidence(StrEnum):
    """Evidence on the node's own port that turns requester-side retries into a local
    failure: the id of the check that judges that evidence (netval.model.ids.CheckId)."""

    PORT_DOWN = "rdma.port_state"  # the RDMA port is not ACTIVE / LinkUp
    LINK_DOWN = "link.carrier"  # the port's netdev has no carrier
    LINK_FLAPS = "link.flaps"  # carrier changes in the window
    PHY_ERRORS = "link.phy_errors"  # PHY link-down events or errors past FEC
    IB_PORT_ERRORS = "ib.port_errors"  # IB PortCounters: symbol errors, link downed...
    PFC_DISCARDS = "pfc.discards"  # drops on the lossless priority
    PAUSE_STORM = "pfc.pause_storm"  # pause storm events or pause time over the limit
    # The port's own receive-side counters (damaged packets) point at this node.
    PORT_COUNTERS = "rdma.errors"


def attribution_of(observed: Mapping[str, object]) -> Attribution | None:
    """The attribution an untrusted result's `observed` states, or None when it states
    none or one this version does not know (an older or newer agent)."""
    value = observed.get(ErrorsKey.ATTRIBUTION)
    if not isinstance(value, str):
        return None
    try:
        return Attribution(value)
    except ValueError:
        return None


def evidence_of(observed: Mapping[str, object]) -> tuple[Evidence, ...]:
    """The known evidence names an untrusted result's `observed` lists (others dropped)."""
    value = observed.get(ErrorsKey.EVIDENCE)
    if not isinstance(value, list):
        return ()
    known = {e.value: e for e in Evidence}
    return tuple(known[v] for v in value if isinstance(v, str) and v in known)
