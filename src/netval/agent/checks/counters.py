"""Counter deltas and rates: counters are judged per second, never as absolute values.

One width rule for every check: `counter_width(map, name)` says how wide a driver's counter
is, and every check that reads that counter takes its delta through it, so ecn.cnp_flow,
rdma.errors and the ethtool checks agree on when a counter wrapped.

Widths (torvalds/linux v6.8):
- mlx5 hw_counters: the Q counters (out_of_sequence, local_ack_timeout_err, out_of_buffer,
  req_cqe_error, ...) are 32-bit: drivers/infiniband/hw/mlx5/counters.c
  mlx5_ib_query_q_counters() reads each as `be32_to_cpu`. The congestion counters
  (np_cnp_sent, rp_cnp_handled, ...) and the extended PPCNT ones (rx_icrc_encapsulated) are
  read with `be64_to_cpup`: 64-bit.
- bnxt_re, irdma, ionic, efa hw_counters: u64 in the kernel (irdma accumulates its narrower
  hardware counters into 64-bit software ones in irdma_update_stats()).
- ethtool -S: u64 in struct ethtool_stats for every driver.
- carrier_changes: atomic_t in struct net_device (32-bit).
- IB PortCounters (ports/<n>/counters): they saturate rather than wrap; their widths are
  IB_PORT_COUNTER_BITS below (IBA vol. 1, 16.1.3.5) and infiniband.py reads them from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

_U32: Final = 1 << 32
_MAX_DELTA: Final = (1 << 63) - 1

# mlx5 hw_counters that are not Q counters (64-bit); every other mlx5 hw_counter is a Q
# counter (32-bit).
_MLX5_64BIT: Final = frozenset(
    {
        "rx_icrc_encapsulated",
        "np_ecn_marked_roce_packets",
        "np_cnp_sent",
        "rp_cnp_handled",
        "rp_cnp_ignored",
    }
)
CARRIER_CHANGES_BITS: Final = 32

IB_PORT_COUNTER_BITS: Final[Mapping[str, int]] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_xmit_discards": 16,
    "excessive_buffer_overrun_errors": 4,
    "local_link_integrity_errors": 4,
    "VL15_dropped": 16,
}


def hw_counter_width(driver_map: str, name: str) -> int:
    """Bits of an RDMA hw_counter of the driver map named `driver_map` ("mlx5", "bnxt"...)."""
    if driver_map == "mlx5" and name not in _MLX5_64BIT:
        return 32
    return 64


def delta(first: int | None, last: int | None, *, width: int = 64) -> int | None:
    """Growth of a counter between two samples, or None when either read failed (or holds
    a value the counter cannot: negative, or past its width).

    A counter that went backwards either wrapped (only 32-bit counters do in practice: the
    mlx5 Q counters behind the RDMA error counters, carrier_changes) or was reset (driver
    reload, netdev re-created). A 64-bit counter that went backwards was reset, and its
    current value is all we know to have happened since. A 32-bit one wrapped, unless the
    wrapped growth would be implausibly large (over half the range), which again means reset.
    """
    if first is None or last is None:
        return None
    top = 1 << width
    if not (0 <= first < top and 0 <= last < top):
        # A value the counter cannot hold (negative, or past its width): a hostile or
        # corrupt read says nothing about what happened, so it reads as "not readable".
        return None
    if last >= first:
        grown = last - first
    elif width == 32:
        wrapped = last + _U32 - first
        grown = wrapped if wrapped <= _U32 // 2 else last
    else:
        grown = last
    # Reports carry int64 (Kubernetes' JSON integers); no real window grows a counter by
    # 2^63 events, so such a delta is as unreadable as the values behind it.
    return grown if grown <= _MAX_DELTA else None


def deltas(
    first: Mapping[str, int] | None,
    last: Mapping[str, int] | None,
    names: tuple[str, ...],
    *,
    width: int = 64,
) -> dict[str, int]:
    """Deltas of the named counters present in both samples (ethtool -S: 64-bit)."""
    if first is None or last is None:
        return {}
    out: dict[str, int] = {}
    for name in names:
        d = delta(first.get(name), last.get(name), width=width)
        if d is not None:
            out[name] = d
    return out


def hw_deltas(
    driver_map: str,
    first: Mapping[str, int] | None,
    last: Mapping[str, int] | None,
    names: tuple[str, ...],
) -> dict[str, int]:
    """Deltas of RDMA hw_counters, each at its width (`hw_counter_width`)."""
    if first is None or last is None:
        return {}
    out: dict[str, int] = {}
    for name in names:
        d = delta(first.get(name), last.get(name), width=hw_counter_width(driver_map, name))
        if d is not None:
            out[name] = d
    return out


def per_second(count: int, elapsed_seconds: float) -> float:
    """A delta as a rate; 0 over an empty window (callers skip those first)."""
    return count / elapsed_seconds if elapsed_seconds > 0 else 0.0
