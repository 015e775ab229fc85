"""The counter policy as data: which RDMA/Ethernet counter family fails, warns or is only
reported, against which per-second limit, who it points at, and why (docs/checks.md,
"Counter policy" and "Attribution").

Checks stay pure functions of (deltas, elapsed seconds, expectations): they look a counter
up here, divide its delta by the window and compare with the family's limit, so a 1 s event
probe and a 300 s interval judge one fabric alike.

Each family has a side (netval.model.attribution.Attribution): who its counters point at.
- requester: counted by the node that sent and did not get an answer. They rise on every
  node that talks to a peer that died, so over their limit they warn; they fail only when the
  node's own port shows evidence in the same window (port_evidence.py).
  - retry: ACK timeouts and exhausted retries. Each stalls a QP for its timeout
    (4.096 us x 2^timeout; NCCL_IB_TIMEOUT 20 is 4.3 s), the -exceeded ones kill the QP:
    limit `rdma.maxRetryErrorsPerSecond`.
  - retransmit: go-back-N and TCP retransmissions (irdma RetransSegs / tcpRetransSegs,
    NAK sequence errors): limit `rdma.maxRetransmitsPerSecond`.
  - requester completion: work requests this node posted that completed in error (peer gone,
    QP flushed): limit `rdma.warnCompletionErrorsPerSecond`.
- local: only this node's port or NIC raises them. corruption (damaged packets received:
  ICRC errors, truncated packets) fails above `rdma.maxRetryErrorsPerSecond`; discards
  (IP-level receive drops of the RDMA stack, EFA receive drops) warn above
  `rdma.warnReceiverErrorsPerSecond` (they include traffic no QP waited for).
- application: a receiver that did not post receive buffers in time (out_of_buffer, RNR NAKs,
  RNR retries exceeded), responder completions with error status (mostly QPs an application
  tore down): warn, never fail; not the fabric.
- none (reorder): out-of-sequence arrivals and adaptive retransmissions. Adaptive routing
  (Spectrum-X, IB AR) sprays one QP's packets over paths, so a healthy fabric counts
  thousands per second (NVIDIA, "Out-of-Order (OOO) Data Placement", MLNX_OFED docs):
  reported only, never a verdict. Their cost shows up as retry counters when it matters.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from netval.model.attribution import Attribution
from netval.model.spec import RdmaChecks


class Verdict(StrEnum):
    FAIL = "fail"
    WARN = "warn"
    INFO = "info"  # reported in observed and the message, never a verdict


@dataclass(frozen=True, slots=True)
class CounterFamily:
    key: str
    # Without own-port evidence; a requester family over its limit fails only with it.
    verdict: Verdict
    side: Attribution | None  # who the counters point at; None: reported only
    limit_field: str | None  # the RdmaChecks field or property giving its per-second limit
    meaning: str  # said in the message when the family is over its limit
    counters: frozenset[str]

    def limit(self, spec: RdmaChecks) -> float | None:
        if self.limit_field is None:
            return None
        value: float = getattr(spec, self.limit_field)
        return value

    @property
    def requester(self) -> bool:
        return self.side is Attribution.REQUESTER


RETRY: Final = CounterFamily(
    "retry",
    Verdict.WARN,
    Attribution.REQUESTER,
    "retry_errors_limit",
    "ACK timeouts and exhausted retries: packets lost on the path, or a peer gone",
    frozenset(
        {
            # mlx5 (and bnxt_re since the 2025 renames)
            "local_ack_timeout_err",
            "req_transport_retries_exceeded",
            # bnxt_re up to v6.17: the requester half of struct bnxt_qplib_roce_stats
            "to_retransmits",
            "max_retry_exceeded",
            "missing_resp",
            "unrecoverable_err",
            # ionic: req_* and tx_* are the requester's
            "req_tx_retry_excd_err",
            "tx_rdma_ack_timeout",
            # efa (2025 network stats): SRD timed out retransmitting, or a peer stopped
            # answering / was marked impaired after repeated retries
            "retrans_timeout_events",
            "unresponsive_remote_events",
            "impaired_remote_conn_events",
            # irdma GEN_3 (ig3rdma): retransmission timeouts
            "RTO",
        }
    ),
)
RETRANSMIT: Final = CounterFamily(
    "retransmit",
    Verdict.WARN,
    Attribution.REQUESTER,
    "max_retransmits_per_second",
    "retransmissions: the path lost packets (or the peer stopped acknowledging)",
    frozenset(
        {
            # irdma: the TCPRTXSEG statistic, "tcpRetransSegs" before the GEN_3 series
            # renamed it "RetransSegs" for every generation
            "tcpRetransSegs",
            "RetransSegs",
            # irdma GEN_3: NAKs for a PSN gap, each answered by a go-back-N resend (irdma
            # does no out-of-order placement, unlike an adaptive-routing ConnectX fabric)
            "Nak Sequence Error",
            "Nak Sequence Error Implied",
        }
    ),
)
REQUESTER_COMPLETION: Final = CounterFamily(
    "requester completion",
    Verdict.WARN,
    Attribution.REQUESTER,
    "warn_completion_errors_per_second",
    "work requests this node posted completed in error (a peer gone, a QP flushed)",
    frozenset({"req_cqe_error", "req_rx_cqe_err", "rdma_read_wr_err", "rdma_write_wr_err"}),
)
CORRUPTION: Final = CounterFamily(
    "corruption",
    Verdict.FAIL,
    Attribution.LOCAL,
    "retry_errors_limit",
    "damaged packets received (bad ICRC or truncated): this port's link or NIC corrupts traffic",
    frozenset({"rx_icrc_encapsulated", "ip4InTruncatedPkts", "ip6InTruncatedPkts", "CRC errors"}),
)
DISCARDS: Final = CounterFamily(
    "discards",
    Verdict.WARN,
    Attribution.LOCAL,
    "warn_receiver_errors_per_second",
    "receive discards of the RDMA stack (they include packets no QP waited for)",
    frozenset({"ip4InDiscards", "ip6InDiscards", "rxVlanErrors", "rx_drops"}),
)
RECEIVER: Final = CounterFamily(
    "receiver",
    Verdict.WARN,
    Attribution.APPLICATION,
    "warn_receiver_errors_per_second",
    "the receiving application did not post receive buffers in time (the application, "
    "not the fabric)",
    frozenset(
        {
            # this node's receiver had no buffer posted (responder side)
            "out_of_buffer",
            "rx_out_of_buffer",
            "resp_rx_outof_buf",
            "RNR sent",
            # RNR NAKs received, and RNR retries exhausted: the peer's receiver
            "rnr_naks_rcvd",
            "rnr_nak_retry_err",
            "req_rx_rnr_retry_err",
            "RNR received",
        }
    ),
)
COMPLETION: Final = CounterFamily(
    "completion",
    Verdict.WARN,
    Attribution.APPLICATION,
    "warn_completion_errors_per_second",
    "responder work completions with an error status (QPs torn down by an application, or "
    "remote access errors)",
    frozenset({"resp_cqe_error", "resp_rx_cqe_err"}),
)
REORDER: Final = CounterFamily(
    "reorder",
    Verdict.INFO,
    None,
    None,
    "out-of-sequence arrivals and adaptive retransmissions (normal under adaptive routing)",
    frozenset(
        {
            "out_of_sequence",
            "packet_seq_err",
            "implied_nak_seq_err",
            "duplicate_request",
            "roce_adp_retrans",
            "roce_slow_restart",
            "roce_slow_restart_cnps",
            "roce_slow_restart_trans",
            "seq_err_naks_rcvd",
            "oos_drop_count",
            "req_rx_pkt_seq_err",
            "req_rx_impl_nak_seq_err",
            "resp_rx_outouf_seq",
            "Rcvd Out of order packets",
        }
    ),
)
# Not yet classified (a new driver's name): warned about, never failed, until it is.
UNCLASSIFIED: Final = CounterFamily(
    "unclassified",
    Verdict.WARN,
    Attribution.UNCLASSIFIED,
    "warn_completion_errors_per_second",
    "a counter the policy table does not classify yet",
    frozenset(),
)

FAMILIES: Final = (
    RETRY,
    RETRANSMIT,
    REQUESTER_COMPLETION,
    CORRUPTION,
    DISCARDS,
    RECEIVER,
    COMPLETION,
    REORDER,
)
_BY_COUNTER: Final = {name: f for f in FAMILIES for name in f.counters}


def family_of(counter: str) -> CounterFamily:
    return _BY_COUNTER.get(counter, UNCLASSIFIED)


# -- Ethernet port counters -----------------------------------------------------------------

# link.phy_errors: PHY link-down events fail on any growth (link.flaps judges the netdev's
# carrier the same way); every other phy_errors counter is an error past FEC, judged as a
# bit error ratio.
LINK_DOWN_COUNTERS: Final = frozenset({"link_down_events_phy", "link_down_events"})

# Post-FEC BER limits by link speed, IEEE 802.3 objectives at the MAC/PLS service interface:
# 802.3ba (40/100G), 802.3by (25G): BER 1e-12; 802.3bs (200/400G), 802.3ck and 802.3df
# (100G/lane, 800G): BER 1e-13. `link.maxPostFecBer` overrides.
BER_LIMITS: Final = ((200_000, 1e-13), (0, 1e-12))  # (from Mb/s, limit), fastest first


def default_ber_limit(speed_mbps: int) -> float:
    return next(limit for floor, limit in BER_LIMITS if speed_mbps >= floor)


def ber_allowance(bits: float, limit: float) -> int:
    """Most post-FEC errors a window of `bits` may show from a link exactly at `limit`:
    the expected count plus three standard deviations (Poisson) plus one. Without the slack,
    a single error in a 1 s window of a 400G link (2.5e-12) would fail a link that is in
    spec; over long windows the allowance converges on the limit itself."""
    expected = bits * limit
    return int(expected + 3 * expected**0.5 + 1)


# pfc.pause_storm: the mlx5 device stall watermarks. The warning event means the NIC kept
# pausing past the warning watermark (device_stall_minor_watermark); the error event means
# it crossed the critical one and the NIC stopped honouring pause (it drops instead).
# mlx5: Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst.
# bnxt's continuous pause events are only counted once its watchdog acted: errors.
PAUSE_STORM_WARNING_EVENTS: Final = frozenset({"tx_pause_storm_warning_events"})
