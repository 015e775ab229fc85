"""Driver-specific counter names, mapped onto the checks that read them.

Counter names differ per NIC driver (and, for bnxt_re, per driver version). A driver listed
here has its counters judged; any other driver's counter checks are `skip` with the reason,
never a false fail. Each signal is a tuple of candidate names: the first one the node
exposes is read, so a map covers old and new spellings of one counter.

Sources (torvalds/linux unless said otherwise; names checked against these files):
- mlx5: Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst and
  drivers/net/ethernet/mellanox/mlx5/core/en_stats.c (v6.8: `rx_prio<p>_pause_duration`,
  `rx_global_pause(_duration)`, `link_down_events_phy`, `rx_pcs_symbol_err_phy`,
  `rx_corrected_bits_phy`, `rx_crc_errors_phy`, `rx_discards_phy`); RDMA:
  drivers/infiniband/hw/mlx5/counters.c (v6.8: Q counters `out_of_buffer`,
  `req_cqe_error`, `resp_cqe_error`, `req_transport_retries_exceeded`, extended
  `rx_icrc_encapsulated`, congestion `np_cnp_sent`, `rp_cnp_ignored`, ...).
- bnxt_en: drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c (v6.8: `pfc_pri<p>_rx_duration_us`,
  `rx_pause_frames`, `rx_stat_discard`, `continuous_roce_pause_events`, `link_down_events`,
  `rx_pcs_symbol_err`, `rx_corrected_bits`, `rx_fcs_err_frames`).
- bnxt_re: drivers/infiniband/hw/bnxt_re/hw_counters.c (v6.8: `to_retransmits`,
  `seq_err_naks_rcvd`, `max_retry_exceeded`, `oos_drop_count`, `tx_cnp_pkts`,
  `rx_cnp_pkts`, `rx_ecn_marked_pkts`, `rx_out_of_buffer`); the mlx5-style renames of
  "[PATCH rdma-next 6/9] RDMA/bnxt_re: RoCE related hardware counters update" (linux-rdma,
  2025-08-14: `local_ack_timeout_err`, `packet_seq_err`, `out_of_sequence`, `np_cnp_pkts`,
  `rp_cnp_handled`, `np_ecn_marked_roce_packets`, `out_of_buffer`, `req_cqe_error`, ...).
  bnxt_re has no "CNP ignored" counter under either name.
- Intel irdma, one RDMA provider on three NIC drivers, one map per NIC driver (the ethtool
  names differ; the hw_counters are irdma's on all three):
  - hw_counters: drivers/infiniband/hw/irdma/verbs.c irdma_hw_stat_descs and type.h enum
    irdma_hw_stats_index. A device exposes the indices below its generation's
    IRDMA_HW_STAT_INDEX_MAX_GEN_n: GEN_1 (X722, i40e, iWARP only) and GEN_2 (E810, ice,
    iWARP or RoCEv2) `ip4InDiscards`, `ip4InTruncatedPkts`, `rxVlanErrors`, the TCP
    retransmission counter (IRDMA_HW_STAT_INDEX_TCPRTXSEG), and on GEN_2 `cnpHandled`,
    `cnpIgnored`, `cnpSent`, `RxECNMrkd`. GEN_3 (IPU E2000, idpf; "[rdma v3 13/24]
    RDMA/irdma: Add GEN3 HW statistics support", intel-wired-lan 2025-02-07, in mainline
    with the GEN_3 series) adds `RNR sent`, `RNR received`, `Nak Sequence Error`,
    `Nak Sequence Error Implied`, `RTO`, `Rcvd Out of order packets`, `CRC errors`, and the
    same patch renamed TCPRTXSEG from `tcpRetransSegs` to `RetransSegs` (the table is
    shared, so every generation reads `RetransSegs` on those kernels). Values are 64-bit
    (irdma_update_stats() accumulates GEN_1/2 hardware counters; GEN_3's are read whole).
  - ice: drivers/net/ethernet/intel/ice/ice_ethtool.c (v6.8: `link_xoff_rx.nic`,
    `rx_priority_<p>_xoff.nic`, `rx_dropped.nic`, `rx_crc_errors.nic`); no pause-duration
    counters.
  - i40e: drivers/net/ethernet/intel/i40e/i40e_ethtool.c i40e_gstrings_stats
    (`port.rx_crc_errors`, `port.link_xoff_rx`, `port.link_xoff_tx`, `port.rx_dropped`,
    renamed `port.rx_discards` by "i40e: Add rx_missed_errors for buffer exhaustion").
  - idpf: drivers/net/ethernet/intel/idpf/idpf_ethtool.c idpf_gstrings_port_stats: vport
    statistics only (`rx-unicast_pkts`, `tx-skb_drops`, ...). The physical port belongs to
    the IPU's control plane: no pause, PHY or per-priority drop counter on the host.
- ionic (AMD Pensando): RDMA counter names come from the device firmware
  (drivers/infiniband/hw/ionic/ionic_hw_stats.c reads the names from the device), so the map
  lists the names Pollara firmware exposes (`rx_rdma_ecn_pkts`, `tx_rdma_cnp_pkts`,
  `rx_rdma_cnp_pkts`, `req_rx_pkt_seq_err`, `req_tx_retry_excd_err`, ...) and a node whose
  firmware names differ gets a skip naming the missing counter. ethtool: struct
  ionic_port_stats in drivers/net/ethernet/pensando/ionic/ionic_if.h (v6.8:
  `rx_pripause_<p>_1us_count`, `frames_rx_pause`).
- efa: drivers/infiniband/hw/efa/efa_verbs.c port stats (EFA_DEFINE_PORT_STATS, v6.8:
  `rx_drops`, `rdma_read_wr_err`, `rdma_write_wr_err`) and the network stats of "[PATCH
  for-next] RDMA/efa: Add Network HW statistics counters" (linux-rdma, 2025-07-06;
  efa_admin_cmds_defs.h struct efa_admin_network_stats: `retrans_timeout_events`,
  `unresponsive_remote_events`, `impaired_remote_conn_events`, besides `retrans_pkts` and
  `retrans_bytes`, which count SRD's normal retransmissions and are not errors). Older
  kernels lack the network stats: the names present are judged. EFA (SRD) has no PFC/ECN
  on the host: those checks say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

Names = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DriverCounters:
    name: str  # the map's name in messages, e.g. "mlx5"
    # The PCI driver of the NIC (uevent DRIVER=) and the RDMA provider, both select this map.
    drivers: tuple[str, ...]
    rdma_prefixes: tuple[str, ...]  # default RDMA device names (before udev renaming)
    # RDMA hw_counters names
    rdma_errors: Names
    # ethtool -S names; "{p}" is the priority. A NIC without host port counters (EFA, an
    # IPU vport) leaves them empty: their checks skip, saying so.
    rx_pause_duration: str | None = None  # microseconds the far end asked us to pause
    tx_pause_duration: str | None = None  # microseconds we asked the far end to pause
    pause_storm_events: Names = ()  # device stall watermarks crossed
    discards: Names = ()  # port-level drops that a lossless class must never see
    prio_discards: str | None = None  # per-priority drops, "{p}" is the priority
    global_pause: Names = ()  # 802.3x pause frames (rx, tx): stop every class, not one
    global_pause_duration: Names = ()  # microseconds of 802.3x pause (rx, tx)
    phy_errors: Names = ()  # post-FEC symbol errors, FCS errors, link-down events
    phy_corrected: Names = ()  # FEC-corrected bits: reported, a healthy link corrects some
    # RDMA congestion counters
    np_ecn_marked: Names = ()
    np_cnp_sent: Names = ()
    rp_cnp_handled: Names = ()
    rp_cnp_ignored: Names = ()
    # Why PFC/ECN checks do not apply (a fabric without host PFC/ECN), or None.
    no_qos_reason: str | None = None
    # Why the netdev has no port (PHY, pause, drop) counters, said in their skips, or None.
    port_counters_note: str | None = None

    def lacks(self, what: str) -> str:
        """The skip text for a counter this driver does not have, with why when known."""
        text = f"{self.name} has no {what}"
        return f"{text} ({self.port_counters_note})" if self.port_counters_note else text

    def per_prio(self, template: str, priority: int) -> str:
        return template.format(p=priority)

    @property
    def congestion_signals(self) -> dict[str, Names]:
        return {
            "ecnMarked": self.np_ecn_marked,
            "cnpSent": self.np_cnp_sent,
            "cnpHandled": self.rp_cnp_handled,
            "cnpIgnored": self.rp_cnp_ignored,
        }

    def hw_counter_names(self) -> set[str]:
        names = set(self.rdma_errors)
        for signal in self.congestion_signals.values():
            names.update(signal)
        return names


def pick(counters: Mapping[str, int] | None, names: Names) -> str | None:
    """The first of a signal's candidate names that `counters` has."""
    if counters is None:
        return None
    return next((n for n in names if n in counters), None)


MLX5: Final = DriverCounters(
    name="mlx5",
    drivers=("mlx5_core", "mlx5_ib"),
    rdma_prefixes=("mlx5_",),
    rx_pause_duration="rx_prio{p}_pause_duration",
    tx_pause_duration="tx_prio{p}_pause_duration",
    pause_storm_events=("tx_pause_storm_warning_events", "tx_pause_storm_error_events"),
    discards=("rx_discards_phy", "tx_discards_phy"),
    prio_discards="rx_prio{p}_discards",
    # Listed by mlx5 only while global pause is configured (no PFC on the port).
    global_pause=("rx_global_pause", "tx_global_pause"),
    global_pause_duration=("rx_global_pause_duration", "tx_global_pause_duration"),
    phy_errors=("rx_pcs_symbol_err_phy", "rx_crc_errors_phy", "link_down_events_phy"),
    phy_corrected=("rx_corrected_bits_phy",),
    rdma_errors=(
        "out_of_sequence",
        "packet_seq_err",
        "local_ack_timeout_err",
        "implied_nak_seq_err",
        "rnr_nak_retry_err",
        "roce_adp_retrans",
        "out_of_buffer",
        "req_cqe_error",
        "resp_cqe_error",
        "req_transport_retries_exceeded",
        "rx_icrc_encapsulated",
    ),
    np_ecn_marked=("np_ecn_marked_roce_packets",),
    np_cnp_sent=("np_cnp_sent",),
    rp_cnp_handled=("rp_cnp_handled",),
    rp_cnp_ignored=("rp_cnp_ignored",),
)

BNXT: Final = DriverCounters(
    name="bnxt",
    drivers=("bnxt_en", "bnxt_re"),
    rdma_prefixes=("bnxt_re",),
    rx_pause_duration="pfc_pri{p}_rx_duration_us",
    tx_pause_duration="pfc_pri{p}_tx_duration_us",
    # The port's pause-storm detector (continuous pause beyond the watchdog timer).
    pause_storm_events=("continuous_pause_events", "continuous_roce_pause_events"),
    discards=("rx_stat_discard", "tx_stat_discard"),
    prio_discards=None,  # bnxt counts drops per CoS queue, not per priority
    global_pause=("rx_pause_frames", "tx_pause_frames"),
    global_pause_duration=(),
    phy_errors=("rx_pcs_symbol_err", "rx_fcs_err_frames", "link_down_events"),
    phy_corrected=("rx_corrected_bits",),
    rdma_errors=(
        # names up to v6.17
        "to_retransmits",
        "seq_err_naks_rcvd",
        "max_retry_exceeded",
        "rnr_naks_rcvd",
        "missing_resp",
        "oos_drop_count",
        "rx_out_of_buffer",
        "unrecoverable_err",
        # mlx5-style names of newer drivers (the same hardware counters)
        "local_ack_timeout_err",
        "packet_seq_err",
        "rnr_nak_retry_err",
        "implied_nak_seq_err",
        "out_of_sequence",
        "out_of_buffer",
        "req_cqe_error",
        "resp_cqe_error",
    ),
    np_ecn_marked=("rx_ecn_marked_pkts", "np_ecn_marked_roce_packets"),
    np_cnp_sent=("tx_cnp_pkts", "np_cnp_pkts"),
    rp_cnp_handled=("rx_cnp_pkts", "rp_cnp_handled"),
    rp_cnp_ignored=(),
)

# irdma hw_counters (see the module docstring for generations and sources).
_IRDMA_ERRORS: Final = (
    "ip4InDiscards",
    "ip6InDiscards",
    "ip4InTruncatedPkts",
    "ip6InTruncatedPkts",
    "rxVlanErrors",
    "tcpRetransSegs",  # TCPRTXSEG before the GEN_3 series
    "RetransSegs",  # TCPRTXSEG since
)
_IRDMA_GEN3_ERRORS: Final = (
    "RTO",
    "Nak Sequence Error",
    "Nak Sequence Error Implied",
    "RNR sent",
    "RNR received",
    "CRC errors",
    "Rcvd Out of order packets",
)

INTEL: Final = DriverCounters(
    name="ice/irdma",
    drivers=("ice",),
    rdma_prefixes=("irdma",),
    discards=("rx_dropped.nic",),
    global_pause=("link_xoff_rx.nic", "link_xoff_tx.nic"),
    phy_errors=("rx_crc_errors.nic",),
    rdma_errors=_IRDMA_ERRORS,
    np_ecn_marked=("RxECNMrkd",),
    np_cnp_sent=("cnpSent",),
    rp_cnp_handled=("cnpHandled",),
    rp_cnp_ignored=("cnpIgnored",),
)

INTEL_X722: Final = DriverCounters(
    name="i40e/irdma",
    drivers=("i40e",),
    rdma_prefixes=(),
    discards=("port.rx_dropped", "port.rx_discards"),
    global_pause=("port.link_xoff_rx", "port.link_xoff_tx"),
    phy_errors=("port.rx_crc_errors",),
    rdma_errors=_IRDMA_ERRORS,  # GEN_1: iWARP only, no congestion counters
)

# The IPU's irdma: E810's RDMA names plus GEN_3's, no host port counters.
INTEL_IPU: Final = replace(
    INTEL,
    name="idpf/irdma",
    drivers=("idpf",),
    rdma_prefixes=(),
    rdma_errors=_IRDMA_ERRORS + _IRDMA_GEN3_ERRORS,
    discards=(),
    global_pause=(),
    phy_errors=(),
    port_counters_note="an idpf netdev is a vport of the IPU: its physical port, PHY, pause and "
    "drop counters belong to the IPU's control plane, not to this host",
)

IONIC: Final = DriverCounters(
    name="ionic",
    drivers=("ionic", "ionic_rdma"),
    rdma_prefixes=("ionic_",),
    rx_pause_duration="rx_pripause_{p}_1us_count",
    tx_pause_duration="tx_pripause_{p}_1us_count",
    pause_storm_events=(),
    discards=("hw_rx_dropped", "hw_tx_dropped"),
    prio_discards=None,
    global_pause=("frames_rx_pause", "frames_tx_pause"),
    global_pause_duration=("rx_pause_1us_count", "tx_pause_1us_count"),
    phy_errors=("frames_rx_bad_fcs",),
    phy_corrected=(),
    rdma_errors=(
        "req_rx_pkt_seq_err",
        "req_rx_rnr_retry_err",
        "req_rx_impl_nak_seq_err",
        "req_rx_cqe_err",
        "req_tx_retry_excd_err",
        "resp_rx_outouf_seq",
        "resp_rx_outof_buf",
        "resp_rx_cqe_err",
        "tx_rdma_ack_timeout",
    ),
    np_ecn_marked=("rx_rdma_ecn_pkts",),
    np_cnp_sent=("tx_rdma_cnp_pkts",),
    rp_cnp_handled=("rx_rdma_cnp_pkts",),
    rp_cnp_ignored=(),
)

EFA: Final = DriverCounters(
    name="efa",
    drivers=("efa", "ena"),
    rdma_prefixes=("efa_",),
    rdma_errors=(
        "rx_drops",  # packets the device dropped on receive
        "rdma_read_wr_err",
        "rdma_write_wr_err",
        # SRD gave up on a packet and timed out, or a peer stopped answering / degraded:
        # the EFA counterparts of RoCE's local_ack_timeout_err (2025 network stats).
        "retrans_timeout_events",
        "unresponsive_remote_events",
        "impaired_remote_conn_events",
    ),
    no_qos_reason="EFA uses SRD: no PFC/ECN on the host (congestion control runs in the device)",
)

MAPS: Final = (MLX5, BNXT, INTEL, INTEL_X722, INTEL_IPU, IONIC, EFA)
_BY_DRIVER: Final = {driver: m for m in MAPS for driver in m.drivers}


def counters_for_driver(driver: str | None) -> DriverCounters | None:
    return _BY_DRIVER.get(driver) if driver else None


def counters_for_rdma_prefix(name: str) -> DriverCounters | None:
    for m in MAPS:
        if any(name.startswith(prefix) for prefix in m.rdma_prefixes):
            return m
    return None


def known_drivers() -> list[str]:
    return sorted(_BY_DRIVER)


def all_hw_counter_names() -> tuple[str, ...]:
    """Every RDMA hw_counter a known driver's checks read: the only ones collectors read."""
    names: set[str] = set()
    for m in MAPS:
        names.update(m.hw_counter_names())
    return tuple(sorted(names))


def hw_counter_names_for(device: str, driver: str | None) -> tuple[str, ...]:
    """The hw_counters to read on a device: its driver's (by the device's PCI driver; by its
    name prefix only when no driver was read), or every known driver's when neither says. A
    missing counter file costs a failed open, so a port does not pay for the names of
    drivers it is not."""
    found = counters_for_driver(driver) if driver else counters_for_rdma_prefix(device)
    return _NAMES_BY_MAP[found.name] if found is not None else all_hw_counter_names()


_NAMES_BY_MAP: Final = {m.name: tuple(sorted(m.hw_counter_names())) for m in MAPS}
