"""A node's configuration facts: the fingerprint the operator compares across a cohort.

The agent derives them from the snapshot its collectors already read (`netval.agent.facts`);
they cross the MQTT trust boundary inside the report, so keys and values are bounded and
restricted to printable ASCII here, and a hostile section is refused with the report.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import Field

MAX_FACTS: Final = 64
MAX_FACT_VALUE: Final = 256
# Several devices or netdevs of one node with different values: the distinct values, sorted,
# joined by this separator ("3;3,4" = one netdev with PFC on 3, another on 3 and 4).
VALUE_SEPARATOR: Final = ";"
NONE_VALUE: Final = "none"  # an empty set (no PFC priority enabled), not an unread one

FactName = Annotated[str, Field(min_length=1, max_length=48, pattern=r"^[a-z][a-z0-9_]*$")]
FactValue = Annotated[str, Field(max_length=MAX_FACT_VALUE, pattern=r"^[\x20-\x7e]*$")]
Facts = dict[FactName, FactValue]


class FactKey(StrEnum):
    """The keys agents report (a key the node cannot read is absent, never guessed)."""

    NIC_MODEL = "nic_model"  # PCI vendor:device of the RDMA devices (device/uevent PCI_ID)
    NIC_SUBSYSTEM = "nic_subsystem"  # PCI subsystem vendor:device (PCI_SUBSYS_ID): the SKU
    BOARD_ID = "board_id"
    FW_VER = "fw_ver"
    RDMA_DRIVER = "rdma_driver"
    NETDEV_DRIVER = "netdev_driver"
    KERNEL_RELEASE = "kernel_release"  # uname(2) on the live agent; absent from recordings
    NODE_TYPE = "node_type"
    RDMA_PORTS = "rdma_ports"
    LINK_LAYER = "link_layer"
    LINK_RATE_GBPS = "link_rate_gbps"
    LINK_WIDTH = "link_width"  # "4X" from the rate text "400 Gb/sec (4X NDR)"
    LINK_SPEED = "link_speed"  # "NDR" from the same text
    NETDEV_SPEED_MBPS = "netdev_speed_mbps"
    MTU = "mtu"
    ROCE_MTU_ACTIVE = "roce_mtu_active"
    IPOIB_MODE = "ipoib_mode"
    PFC_ENABLED = "pfc_enabled"
    TRUST = "trust"
    DSCP_MAP = "dscp_map"
    ECN_NP_ENABLED = "ecn_np_enabled"
    ECN_RP_ENABLED = "ecn_rp_enabled"
    ROCE_V2_GID = "roce_v2_gid"
    DEFAULT_ROCE_TOS = "default_roce_tos"
    # the NIC's PCI function (device/current_link_speed, current_link_width, numa_node) and
    # its driver module's /sys/module/<driver>/version (out-of-tree drivers only)
    PCIE_LINK_SPEED = "pcie_link_speed"  # "16.0 GT/s": Gen4; a Gen3 slot reads "8.0 GT/s"
    PCIE_LINK_WIDTH = "pcie_link_width"  # "x16"; a card trained at x8 halves its bandwidth
    NUMA_NODE = "numa_node"  # "-1": no NUMA affinity given by the platform
    DRIVER_VERSION = "driver_version"
