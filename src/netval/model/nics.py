"""A node's NICs as its report names them (the report's `nics` section), and which NIC a
result's subject is about.

Checks judge subjects: an RDMA device (`mlx5_3`), one of its ports (`mlx5_3/1`), a netdev
(`ens3np0`) or a netdev's priority (`ens3np0/prio3`). What ties them to one NIC -- the RDMA
device, the netdevs carrying its ports' traffic (a RoCE LAG's bond and its slaves included)
and the PCI function a DRA driver publishes it by -- is what the agent read from sysfs; it
sends it in the report so that the operator can judge each NIC (per-NIC health, DRA device
taints) without guessing from names. The section crosses the MQTT trust boundary: every name
is bounded and restricted to the characters the kernel allows; a hostile section is refused
with the report. Absent (an older agent), nothing is tied to a NIC: the node is judged as
a whole, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_NICS: Final = 64  # RDMA devices per node (8 rails, their VFs and spares fit)
MAX_NETDEVS_PER_NIC: Final = 8  # a port's netdev, a LAG's bond and slaves, IPoIB children
# IB_DEVICE_NAME_MAX (64) in include/rdma/ib_verbs.h; names are [A-Za-z0-9_] plus what udev
# renames use (rocep129s0f0, ibp3s0)
RDMA_NAME_PATTERN: Final = r"^[A-Za-z0-9_.-]{1,64}$"
# IFNAMSIZ - 1 (15) characters, no '/', ':' or whitespace (dev_valid_name in net/core/dev.c)
NETDEV_PATTERN: Final = r"^[^/\s:]{1,15}$"
# <domain>:<bus>:<device>.<function>; domains are 4 hex digits, up to 8 behind a VMD
PCI_PATTERN: Final = r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"

RdmaName = Annotated[str, Field(pattern=RDMA_NAME_PATTERN)]
NetdevName = Annotated[str, Field(pattern=NETDEV_PATTERN)]
PciAddress = Annotated[str, Field(pattern=PCI_PATTERN), AfterValidator(str.lower)]


class Nic(BaseModel):
    """One RDMA NIC: its RDMA device, its PCI function and the netdevs of its ports."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    rdma_device: Annotated[RdmaName, Field(alias="rdmaDevice")]
    pci_address: Annotated[PciAddress | None, Field(alias="pciAddress")] = None
    netdevs: Annotated[tuple[NetdevName, ...], Field(max_length=MAX_NETDEVS_PER_NIC)] = ()


Nics = Annotated[list[Nic], Field(max_length=MAX_NICS)]


def unique_devices(nics: list[Nic]) -> list[Nic]:
    """The report's validator: one entry per RDMA device."""
    names = [n.rdma_device for n in nics]
    if len(set(names)) != len(names):
        raise ValueError("nics: an RDMA device is listed twice")
    return nics


class SubjectIndex:
    """Which NIC (its RDMA device name) a result's subject is about, or None: a subject of no
    NIC (a storage endpoint, a peer, the node), or a netdev two NICs claim."""

    __slots__ = ("_of",)

    def __init__(self, nics: Iterable[Nic] | None) -> None:
        of: dict[str, str | None] = {}
        for nic in nics or ():
            of[nic.rdma_device] = nic.rdma_device
            for netdev in nic.netdevs:
                claimed = of.get(netdev, netdev)
                # a name claimed by another NIC (or equal to a device name) ties to neither
                of[netdev] = nic.rdma_device if claimed in (netdev, nic.rdma_device) else None
        self._of = of

    def nic_of(self, subject: str) -> str | None:
        head, _, _ = subject.partition("/")
        return self._of.get(head)


__all__ = [
    "MAX_NETDEVS_PER_NIC",
    "MAX_NICS",
    "Nic",
    "Nics",
    "SubjectIndex",
    "unique_devices",
]
