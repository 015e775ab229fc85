"""A fleet of GPU nodes with 8 ConnectX rails each, as tests and bench/device_taints.py build
it: the agents' reports (each NIC's port state and netdev MTU, the `nics` section) and
dranet's ResourceSlice of each node. Light (netval's model only): the bench's processes
import it too."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from netval.model import CheckId, CheckResult, Report, Status
from netval.model.nics import Nic

GROUP = "resource.k8s.io"
DRANET = "dra.net"


def rail(i: int) -> tuple[str, str, str]:
    """Rail i: (PCI address 0000:<18+i>:00.0, RDMA device mlx5_<i>, netdev ens<i>np0)."""
    return (f"0000:{0x18 + i:02x}:00.0", f"mlx5_{i}", f"ens{i}np0")


def dranet_slice(
    node: str,
    nics: list[tuple[str, str | None, str | None]],
    *,
    version: str = "v1",
    generation: int = 1,
    driver: str = DRANET,
    full: bool = False,
) -> dict[str, Any]:
    """A slice as dranet publishes a node's NICs: (PCI address, RDMA device, netdev) each,
    device `pci-<address>`, pool and nodeName the node's name; `full`: with every attribute
    dranet publishes for a ConnectX rail (kubernetes-sigs/dranet's OKE GB200 example)."""
    devices = []
    for i, (pci, rdma, netdev) in enumerate(nics):
        attrs: dict[str, Any] = {
            f"{driver}/pciAddress": {"string": pci},
            f"{driver}/rdma": {"bool": rdma is not None},
            f"{driver}/numaNode": {"int": i // 4},
        }
        if rdma is not None:
            attrs[f"{driver}/rdmaDevice"] = {"string": rdma}
        if netdev is not None:
            attrs[f"{driver}/ifName"] = {"string": netdev}
        if full:
            attrs.update({
                f"{driver}/mac": {"string": f"60:5e:65:14:{len(node) % 256:02x}:{i:02x}"},
                f"{driver}/mtu": {"int": 9000},
                f"{driver}/pciDevice": {"string": "CX8 Family [ConnectX-8]"},
                f"{driver}/pciVendor": {"string": "Mellanox Technologies"},
                f"{driver}/sriov": {"bool": True},
                f"{driver}/sriovVfs": {"int": 0},
                f"{driver}/state": {"string": "up"},
                f"{driver}/type": {"string": "device"},
                f"{driver}/virtual": {"bool": False},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 + i:02x}"},
            })  # fmt: skip
        devices.append({"name": "pci-" + re.sub(r"[:.]", "-", pci), "attributes": attrs})
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-x1"},
        "spec": {"driver": driver, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}},
    }  # fmt: skip


def rail_slice(
    node: str, rails: int = 8, version: str = "v1", *, full: bool = False
) -> dict[str, Any]:
    """A GPU node's `rails` ConnectX NICs (`rail`)."""
    return dranet_slice(node, [rail(i) for i in range(rails)], version=version, full=full)


def rail_report(
    node: str,
    *,
    failing: tuple[int, ...] | frozenset[int] = (),
    warning: tuple[int, ...] = (),
    rails: int = 8,
    validation: str = "pool-a",
) -> Report:
    """What an agent on a GPU node with `rails` NICs reports: each NIC's port state and its
    netdev's MTU; the `failing` rails' ports are down, the `warning` rails' netdevs see a
    pause storm (a warning of pfc.pause_storm)."""
    results = []
    for i in range(rails):
        down = i in failing
        results.append(
            CheckResult(
                check=CheckId.RDMA_PORT_STATE,
                subject=f"mlx5_{i}/1",
                status=Status.FAIL if down else Status.PASS,
                message="port state 1: DOWN, expected ACTIVE" if down else "ACTIVE",
            )
        )
        results.append(
            CheckResult(
                check=CheckId.MTU_INTERFACE,
                subject=f"ens{i}np0",
                status=Status.PASS,
                message="MTU 9000",
                observed={"mtu": 9000},
                expected={"mtu": 9000},
            )
        )
        if i in warning:
            results.append(
                CheckResult(
                    check=CheckId.PFC_PAUSE_STORM,
                    subject=f"ens{i}np0/prio3",
                    status=Status.WARN,
                    message="pause frames 40% of the time on priority 3",
                )
            )
    nics = [
        Nic(rdma_device=rdma, pci_address=pci, netdevs=(netdev,))
        for pci, rdma, netdev in (rail(i) for i in range(rails))
    ]
    worst = max((r.status for r in results), key=lambda s: s.severity)
    return Report(validation=validation, generation=1, node=node,
                  started_at=datetime.now(UTC) - timedelta(seconds=1), duration_ms=2.0,
                  status=worst, results=results, nics=nics)  # fmt: skip


__all__ = ["DRANET", "GROUP", "dranet_slice", "rail", "rail_report", "rail_slice"]
