"""Pure checks: (snapshot, expectations) -> results. No I/O happens below this package."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Final

from netval.agent.checks import ecn, gid, infiniband, link, mtu, pfc, port_counters, rdma
from netval.agent.checks.context import CheckContext
from netval.agent.checks.judged import judged_subjects
from netval.model.ids import CheckGroup, CheckId
from netval.model.results import CheckResult
from netval.model.snapshot import NodeSnapshot
from netval.model.spec import Checks

CheckFn = Callable[[CheckContext], list[CheckResult]]
# Runs one check group: (group name, the group's checks) -> its results.
GroupRunner = Callable[[str, Callable[[], list[CheckResult]]], list[CheckResult]]

# The node checks in report order. Storage and peer checks need the network and live with
# the agent runtime, not here.
NODE_CHECKS: Final[dict[CheckId, CheckFn]] = {
    CheckId.LINK_CARRIER: link.check_carrier,
    CheckId.LINK_FLAPS: link.check_flaps,
    CheckId.LINK_PHY_ERRORS: port_counters.check_phy_errors,
    CheckId.MTU_INTERFACE: mtu.check_interface_mtu,
    CheckId.MTU_ROCE: mtu.check_roce_mtu,
    CheckId.MTU_IPOIB: mtu.check_ipoib_mtu,
    CheckId.RDMA_DEVICES: rdma.check_devices,
    CheckId.RDMA_PORT_STATE: rdma.check_port_state,
    CheckId.RDMA_LINK_LAYER: rdma.check_link_layer,
    CheckId.RDMA_RATE: rdma.check_rate,
    CheckId.RDMA_GID_ROCE_V2: gid.check_gid_roce_v2,
    CheckId.RDMA_GID_INDEX: gid.check_gid_index,
    CheckId.RDMA_ERRORS: rdma.check_errors,
    CheckId.IB_PORT_ERRORS: infiniband.check_port_errors,
    CheckId.PFC_PRIORITIES: pfc.check_priorities,
    CheckId.PFC_TRUST: pfc.check_trust,
    CheckId.PFC_PAUSE_STORM: pfc.check_pause_storm,
    CheckId.PFC_DISCARDS: pfc.check_discards,
    CheckId.PFC_GLOBAL_PAUSE: port_counters.check_global_pause,
    CheckId.ECN_NP_ENABLED: ecn.check_np_enabled,
    CheckId.ECN_RP_ENABLED: ecn.check_rp_enabled,
    CheckId.ECN_CNP_FLOW: ecn.check_cnp_flow,
}


def make_context(snapshot: NodeSnapshot, checks: Checks) -> CheckContext:
    return CheckContext(snapshot, checks, judged_subjects(snapshot.last, checks))


def node_check_groups() -> dict[CheckGroup, list[CheckFn]]:
    groups: dict[CheckGroup, list[CheckFn]] = {}
    for check_id, fn in NODE_CHECKS.items():
        groups.setdefault(check_id.group, []).append(fn)
    return groups


def _run(_group: str, judge: Callable[[], list[CheckResult]]) -> list[CheckResult]:
    return judge()


def run_node_checks(
    snapshot: NodeSnapshot, checks: Checks, run_group: GroupRunner = _run
) -> list[CheckResult]:
    """The node checks' results in report order, one check group at a time through
    `run_group` (the agent's runner wraps each group in a span)."""
    ctx = make_context(snapshot, checks)
    results: list[CheckResult] = []
    for group, fns in node_check_groups().items():
        results.extend(run_group(group.value, partial(_judge, fns, ctx)))
    return results


def _judge(fns: list[CheckFn], ctx: CheckContext) -> list[CheckResult]:
    return [r for fn in fns for r in fn(ctx)]


__all__ = [
    "NODE_CHECKS",
    "CheckContext",
    "CheckFn",
    "GroupRunner",
    "make_context",
    "node_check_groups",
    "run_node_checks",
]
