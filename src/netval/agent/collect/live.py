"""The live collector: this host's judged interfaces and RDMA devices, one sample per call.

Cost follows what is judged, not what the node has: RDMA devices are listed from
/sys/class/infiniband, their netdevs come from the GID table, and only those plus the
interfaces named in the spec are read. No netlink link dump (pyroute2 parses a 200-veth
dump in ~120 ms), no forks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from netval.agent.checks.drivers import all_hw_counter_names, hw_counter_names_for
from netval.agent.checks.infiniband import port_counter_names
from netval.agent.collect.dcb_netlink import DcbReader
from netval.agent.collect.ethtool_stats import EthtoolStats
from netval.agent.collect.sysfs import SysfsReader
from netval.model.snapshot import Netdev, NodeSnapshot, RdmaDevice, Sample

DEFAULT_SYS_ROOT: Final = Path("/sys")
DEFAULT_RDMA_CM_ROOT: Final = Path("/sys/kernel/config/rdma_cm")
# mlx5 RoCE ports have 255 GID slots, almost all empty; a full scan costs ~1 ms per port,
# so between periodic rescans only the slots seen populated are re-read.
GID_RESCAN_EVERY: Final = 10


class LiveCollector:
    def __init__(
        self,
        *,
        interfaces: Sequence[str] = (),
        sys_root: Path = DEFAULT_SYS_ROOT,
        rdma_cm_root: Path | None = DEFAULT_RDMA_CM_ROOT,
        gid_rescan_every: int = GID_RESCAN_EVERY,
    ) -> None:
        self.interfaces = tuple(interfaces)
        self.reader = SysfsReader(
            sys_root,
            rdma_cm_root=rdma_cm_root,
            strict=False,
            hw_counter_names=all_hw_counter_names(),
            port_counter_names=port_counter_names(),
            hw_counter_names_for=hw_counter_names_for,
        )
        self.ethtool = EthtoolStats()
        self.dcb = DcbReader()
        self._gid_rescan_every = max(1, gid_rescan_every)
        self._populated_gids: dict[tuple[str, int], list[int]] = {}
        self._samples_taken = 0

    def set_interfaces(self, interfaces: Sequence[str]) -> None:
        self.interfaces = tuple(interfaces)

    def close(self) -> None:
        self.ethtool.close()
        self.dcb.close()

    def __enter__(self) -> LiveCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _gid_indices(self, device: str, port: int, gids_dir: Path) -> Iterable[int]:
        cached = self._populated_gids.get((device, port))
        if cached is None or self._samples_taken % self._gid_rescan_every == 0:
            return self.reader.all_gid_indices(gids_dir)
        return cached

    def sample(self) -> Sample:
        rdma: dict[str, RdmaDevice] = {}
        for name in self.reader.rdma_device_names():
            device = self.reader.read_rdma_device(name, gid_indices=self._gid_indices)
            if any(
                len(port.gids) < len(self._populated_gids.get((name, port.port), ()))
                for port in device.ports.values()
            ):
                # A slot seen populated is empty now: after a flap or an address change
                # the GIDs may sit at other indices (rdma.gid_index), so look at them all.
                device = self.reader.read_rdma_device(name)
            rdma[name] = device
            for port in device.ports.values():
                self._populated_gids[(name, port.port)] = [g.index for g in port.gids]
        wanted: list[str] = []
        for device in rdma.values():
            for port in device.ports.values():
                wanted.extend(port.netdevs)
            if device.netdev_hint:
                wanted.append(device.netdev_hint)
            wanted.extend(device.pci_netdevs)  # a dual-port HCA's second port's netdev
        # Only netdevs carrying RDMA traffic can be a LAG whose ports matter: the spec's
        # extra interfaces are not searched for lower_* links.
        rdma_bound = set(wanted)
        wanted.extend(self.interfaces)
        netdevs: dict[str, Netdev] = {}
        queue = list(dict.fromkeys(wanted))
        while queue:
            name = queue.pop(0)
            if name in netdevs:
                continue
            dcb = self.dcb.read(name)
            netdev = self.reader.read_netdev(
                name,
                ethtool=self.ethtool.read(name),
                dcb=dcb,
                dcb_error=self.dcb.last_error,
                read_lower=name in rdma_bound,
            )
            if netdev is None:
                continue
            netdevs[name] = netdev
            # A RoCE LAG's PFC/ECN state and counters live on the bond's slaves.
            queue.extend(s for s in netdev.ports_below if s not in netdevs)
        self._samples_taken += 1
        return Sample(netdevs=netdevs, rdma=rdma)


def collect(
    collector: LiveCollector,
    *,
    node: str,
    samples: int,
    interval: float,
    on_sample: Callable[[int, Sample], None] | None = None,
) -> NodeSnapshot:
    """`samples` samples `interval` seconds apart on a drift-free schedule; `on_sample(i,
    sample)` sees each as it is taken (recording copies sysfs at that moment)."""
    if samples < 1:
        raise ValueError("samples must be at least 1")
    captured_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    taken: list[Sample] = []
    started: list[float] = []
    start = time.monotonic()
    for i in range(samples):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        started.append(time.monotonic())
        sample = collector.sample()
        if on_sample is not None:
            on_sample(i, sample)
        taken.append(sample)
    # Counter rates use the measured spacing, not the requested one.
    measured = (started[-1] - started[0]) / (samples - 1) if samples > 1 else interval
    return NodeSnapshot(
        node=node,
        captured_at=captured_at,
        interval_seconds=round(measured, 3),
        samples=tuple(taken),
    )
