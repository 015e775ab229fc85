"""NIC statistics (ETHTOOL_GSTATS) through pyroute2's ioctl ethtool, one handle per netdev.

The names of a driver's statistics are fetched once per netdev and cached: for mlx5 there
are over a thousand, and decoding them costs far more than reading the values.
"""

from __future__ import annotations

from typing import Final

from pyroute2.ethtool.ioctl import ETH_SS_STATS, IoctlEthtool

# Above this many statistics a netdev's values are not worth holding per cycle.
MAX_STATS: Final = 20_000


class EthtoolStats:
    def __init__(self) -> None:
        self._handles: dict[str, IoctlEthtool] = {}
        self.last_error: dict[str, str] = {}

    def read(self, ifname: str) -> dict[str, int] | None:
        """All statistics of `ifname`, or None when the driver has none or the read failed."""
        handle = self._handles.get(ifname)
        try:
            if handle is None:
                handle = IoctlEthtool(ifname)
                self._handles[ifname] = handle
            # The kernel writes as many values as the driver has *now*, whatever length we
            # pass: re-check the count (one cheap ioctl) so a changed set (channels added)
            # refreshes the names instead of overrunning the buffer.
            count = handle.get_stringset_length(ETH_SS_STATS)
            if count == 0 or count > MAX_STATS:
                self.last_error[ifname] = f"driver reports {count} statistics"
                return None
            if handle.stat_names is not None and len(handle.stat_names) != count:
                handle.stat_names = None
            stats = handle.get_statistics()
        except Exception as exc:
            self.last_error[ifname] = f"{type(exc).__name__}: {exc}"
            self.forget(ifname)
            return None
        self.last_error.pop(ifname, None)
        return {name: int(value) for name, value in stats}

    def forget(self, ifname: str) -> None:
        handle = self._handles.pop(ifname, None)
        if handle is not None:
            handle.close()

    def close(self) -> None:
        for name in list(self._handles):
            self.forget(name)
