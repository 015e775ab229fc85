"""Pure checks: (snapshot, expectations) -> results. No I/O happens below this package."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Final

from netval.agent.checks import (
    ecn,
    gid,
    infiniband,
    link,
    mtu,
    pfc,
    port_counters,
    rdma,
    rdma_errors,
)
from netval.agent.checks.context import CheckContext
from netval.agent.checks.judged import judged_subjects
from netval.model.ids import CheckGroup, CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import NodeSnapshot
from netval.model.spec import Checks

CheckFn = Callable[[CheckContext], list[CheckResult]]
# Runs one check group: (group name, the group's checks) -> its results.
GroupRunner = Callable[[str, Callable[[], list[CheckResult]]], list[CheckResult]]
# Told of a check that raised (the agent logs the traceback; the report carries none).
OnRaise = Callable[[CheckId, Exception], None]
MAX_ERROR_TEXT: Final = 300

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
    CheckId.RDMA_ERRORS: rdma_errors.check_errors,
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


def check_raised(check: CheckId, subject: str, exc: BaseException) -> CheckResult:
    """The `error` result standing in for a check that raised: it names the check and the
    exception (type and message, cut short), never a traceback."""
    text = str(exc).replace("\n", " ")
    if len(text) > MAX_ERROR_TEXT:
        text = text[: MAX_ERROR_TEXT - 3] + "..."
    kind = type(exc).__name__
    return CheckResult(
        check=check,
        subject=subject,
        status=Status.ERROR,
        message=f"check {check.value} raised {kind}: {text}"
        if text
        else f"check {check.value} raised {kind}",
        observed={"exception": kind},
    )


def run_node_checks(
    snapshot: NodeSnapshot,
    checks: Checks,
    run_group: GroupRunner = _run,
    *,
    on_raise: OnRaise | None = None,
) -> list[CheckResult]:
    """The node checks' results in report order, one check group at a time through
    `run_group` (the agent's runner wraps each group in a span).

    Each check is isolated: one that raises gives one `error` result (subject: the node)
    and the others still run, so a bug or a surprising snapshot names the broken check
    instead of dropping the report."""
    try:
        ctx = make_context(snapshot, checks)
    except Exception as exc:  # nothing can be judged: say so for every check
        for check_id in NODE_CHECKS:
            if on_raise is not None:
                on_raise(check_id, exc)
        return [check_raised(check_id, snapshot.node, exc) for check_id in NODE_CHECKS]
    groups: dict[CheckGroup, list[tuple[CheckId, CheckFn]]] = {}
    for check_id, fn in NODE_CHECKS.items():
        groups.setdefault(check_id.group, []).append((check_id, fn))
    results: list[CheckResult] = []
    for group, members in groups.items():
        judge = partial(_judge, members, ctx, snapshot.node, on_raise)
        results.extend(run_group(group.value, judge))
    return results


def _judge(
    members: list[tuple[CheckId, CheckFn]],
    ctx: CheckContext,
    node: str,
    on_raise: OnRaise | None,
) -> list[CheckResult]:
    results: list[CheckResult] = []
    for check_id, fn in members:
        try:
            results.extend(fn(ctx))
        except Exception as exc:
            if on_raise is not None:
                on_raise(check_id, exc)
            results.append(check_raised(check_id, node, exc))
    return results


__all__ = [
    "NODE_CHECKS",
    "CheckContext",
    "CheckFn",
    "GroupRunner",
    "OnRaise",
    "check_raised",
    "make_context",
    "node_check_groups",
    "run_node_checks",
]
