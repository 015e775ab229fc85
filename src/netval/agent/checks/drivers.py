"""Driver-specific counter names, mapped onto the checks that read them.

Counter names differ per NIC driver. A driver listed here has its counters judged; any other
driver's counter checks are `skip` with the reason, never a false fail. Names follow the
kernel's mlx5 documentation (Documentation/networking/device_drivers/ethernet/mellanox/mlx5/
counters.rst) and the mlx5_ib hw_counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class DriverCounters:
    driver: str
    # ethtool -S names; "{p}" is the priority
    rx_pause_duration: str  # microseconds the far end asked us to pause, per priority
    tx_pause_duration: str  # microseconds we asked the far end to pause, per priority
    pause_storm_events: tuple[str, ...]  # device stall watermarks crossed
    discards: tuple[str, ...]  # port-level drops that a lossless class must never see
    prio_discards: str | None  # per-priority drops, "{p}" is the priority
    # RDMA hw_counters names
    rdma_errors: tuple[str, ...]
    np_ecn_marked: str
    np_cnp_sent: str
    rp_cnp_handled: str
    rp_cnp_ignored: str

    def per_prio(self, template: str, priority: int) -> str:
        return template.format(p=priority)


MLX5: Final = DriverCounters(
    driver="mlx5_core",
    rx_pause_duration="rx_prio{p}_pause_duration",
    tx_pause_duration="tx_prio{p}_pause_duration",
    pause_storm_events=("tx_pause_storm_warning_events", "tx_pause_storm_error_events"),
    discards=("rx_discards_phy", "tx_discards_phy"),
    prio_discards="rx_prio{p}_discards",
    rdma_errors=(
        "out_of_sequence",
        "packet_seq_err",
        "local_ack_timeout_err",
        "implied_nak_seq_err",
        "rnr_nak_retry_err",
        "roce_adp_retrans",
    ),
    np_ecn_marked="np_ecn_marked_roce_packets",
    np_cnp_sent="np_cnp_sent",
    rp_cnp_handled="rp_cnp_handled",
    rp_cnp_ignored="rp_cnp_ignored",
)

_BY_DRIVER: Final = {MLX5.driver: MLX5}
# RDMA device names carry the provider; used when the netdev's driver is unreadable.
_BY_RDMA_PREFIX: Final = {"mlx5_": MLX5}


def counters_for_driver(driver: str | None) -> DriverCounters | None:
    return _BY_DRIVER.get(driver) if driver else None


def counters_for_rdma_device(name: str, netdev_driver: str | None) -> DriverCounters | None:
    known = counters_for_driver(netdev_driver)
    if known is not None:
        return known
    for prefix, counters in _BY_RDMA_PREFIX.items():
        if name.startswith(prefix):
            return counters
    return None


def known_drivers() -> list[str]:
    return sorted(_BY_DRIVER)


def all_hw_counter_names() -> tuple[str, ...]:
    """Every RDMA hw_counter a known driver's checks read: the only ones collectors read."""
    names: set[str] = set()
    for counters in _BY_DRIVER.values():
        names.update(counters.rdma_errors)
        names.update(
            (
                counters.np_ecn_marked,
                counters.np_cnp_sent,
                counters.rp_cnp_handled,
                counters.rp_cnp_ignored,
            )
        )
    return tuple(sorted(names))
