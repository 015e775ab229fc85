"""`status.nics`: the validation's NICs in aggregate, and its failing NICs (bounded).

Counts cover every NIC the fresh targeted nodes' reports list (`netval.model.nics`); the
entries name at most MAX_NIC_ENTRIES NICs, failing ones first, then those still recovering
(tainted until `recoveryReports`), then those that only warn: never one entry per NIC of the
fleet. `deviceTaints` says whether DeviceTaintRules are in force for the validation
(`spec.gating.deviceTaints`), and why not when they are not.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

MAX_NIC_ENTRIES: Final = 50
MAX_NIC_CHECKS: Final = 8


class NicState(StrEnum):
    FAILING = "failing"
    RECOVERING = "recovering"  # passing again, its device taint held until recoveryReports
    WARNING = "warning"


class DeviceTaints(StrEnum):
    ACTIVE = "Active"
    UNAVAILABLE = "Unavailable"  # asked for, not possible: failing NICs gate their node


class _Status(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class NicEntry(_Status):
    node: str
    device: str  # the RDMA device
    state: NicState
    pci_address: str | None = None
    netdevs: Annotated[list[str], Field(max_length=8)] = Field(default_factory=list)
    checks: Annotated[list[str], Field(max_length=MAX_NIC_CHECKS)] = Field(default_factory=list)
    tainted: bool = False  # a DeviceTaintRule keeps new claims off its device(s)


class NicStatus(_Status):
    total: Annotated[int, Field(ge=0)] = 0  # NICs of the fresh targeted nodes' reports
    failing: Annotated[int, Field(ge=0)] = 0
    warning: Annotated[int, Field(ge=0)] = 0  # NICs whose worst result warns
    tainted: Annotated[int, Field(ge=0)] = 0  # NICs whose device(s) the verdict taints
    nodes_degraded: Annotated[int, Field(ge=0)] = 0  # labelled degraded for their NICs
    device_taints: DeviceTaints | None = None  # None: spec.gating.deviceTaints is off
    message: Annotated[str, Field(max_length=1024)] = ""
    entries: Annotated[list[NicEntry], Field(max_length=MAX_NIC_ENTRIES)] = Field(
        default_factory=list
    )


__all__ = ["MAX_NIC_ENTRIES", "DeviceTaints", "NicEntry", "NicState", "NicStatus"]
