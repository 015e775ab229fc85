"""Who a counter's rise points at: the contract between the agent's `rdma.errors` check and
the operator's node verdict (docs/checks.md "rdma.errors", docs/gating.md "Retries point at
the peer").

Requester-side retry and timeout counters (`local_ack_timeout_err`,
`req_transport_retries_exceeded`, `rnr_nak_retry_err`, `req_cqe_error`, ...) rise on every
node that talks to a peer that died or stalls: one crashed node of a 512-node job makes
hundreds of survivors count them in the same window. Without evidence on the node's own port
the agent reports such a rise as a `warn` result of check `rdma.errors` whose `observed`
carries:

    observed["attribution"] == "requester"
    observed["counters"] == {counter name: delta over the window}
    observed["ratePerSecond"] (optional) == the summed rate of those counters

The operator never taints or labels `unhealthy` on that warning alone; it counts it as a
failure only when the east-west results point at the node too, and names the likely culprit
(a node offline, silent or failing) when many nodes warn together.
"""

from __future__ import annotations

from enum import StrEnum


class Attribution(StrEnum):
    """Values of `observed["attribution"]` of an `rdma.errors` result."""

    # the counters say "my requests to some peer went unanswered": a peer's (or a path's)
    # fault as likely as this node's
    REQUESTER = "requester"


class AttributionKey(StrEnum):
    """Keys of an attributed result's `observed`."""

    ATTRIBUTION = "attribution"  # an `Attribution` value
    COUNTERS = "counters"  # {counter name: delta over the window}
    RATE_PER_SECOND = "ratePerSecond"  # the counters' summed rate, per second (optional)


__all__ = ["Attribution", "AttributionKey"]
