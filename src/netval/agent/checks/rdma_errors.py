"""rdma.errors: RDMA hw_counters as rates, each family against its limit, and who they point
at (docs/checks.md, "rdma.errors", "Counter policy", "Attribution").

Requester-side retry and timeout counters warn with attribution `requester`: they rise on
every node that talks to a peer that died. They fail with attribution `local` only when the
port's own checks fail in the same window (port_evidence.py). Counters only this port can
raise (damaged packets received) fail as `local` on their own; receiver and responder
completion counters warn as `application`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from netval.agent.checks.context import (
    CheckContext,
    port_counter_inputs,
    port_driver,
    result,
    skipped,
)
from netval.agent.checks.counters import hw_deltas, per_second
from netval.agent.checks.port_evidence import PortEvidence
from netval.agent.checks.rate_policy import CounterFamily, Verdict, family_of
from netval.model.attribution import Attribution, ErrorsKey, Evidence
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult


def check_errors(ctx: CheckContext) -> list[CheckResult]:
    if not ctx.judged.ports:
        return [
            skipped(
                CheckId.RDMA_ERRORS,
                ctx.node,
                "no RDMA devices on this node (/sys/class/infiniband)",
            )
        ]
    evidence = PortEvidence(ctx)
    out: list[CheckResult] = []
    for port in ctx.judged.ports:
        inputs = port_counter_inputs(
            ctx,
            CheckId.RDMA_ERRORS,
            port,
            f"unknown RDMA driver for {port.device}: its error counter names are not mapped",
        )
        if isinstance(inputs, CheckResult):
            out.append(inputs)
            continue
        driver, first_hw = inputs
        grown = hw_deltas(driver.name, first_hw, port.hw_counters, driver.rdma_errors)
        if not grown:
            out.append(
                skipped(
                    CheckId.RDMA_ERRORS,
                    port.subject,
                    f"none of the {driver.name} error counters "
                    f"({', '.join(driver.rdma_errors)}) is in hw_counters",
                )
            )
            continue
        if ctx.snapshot.elapsed_seconds <= 0:
            out.append(skipped(CheckId.RDMA_ERRORS, port.subject, "zero-length sampling window"))
            continue
        own_port = partial(evidence.for_port, port)
        driver_seen = port_driver(ctx, port).observed
        out.append(judge_error_rates(ctx, port.subject, grown, own_port, driver_seen))
    return out


@dataclass(frozen=True, slots=True)
class _Finding:
    """One family over its limit, with the counters that grew."""

    family: CounterFamily
    grown: dict[str, int]
    texts: list[str]


@dataclass(frozen=True, slots=True)
class _Verdict:
    status: Status
    attribution: Attribution | None
    blamed: list[_Finding]  # the findings the attribution rests on
    evidence: list[Evidence]


def _decide(over: list[_Finding], own_port: Callable[[], list[Evidence]]) -> _Verdict:
    """Status and attribution from the families over their limit. Own-port evidence is
    asked for only when a requester-side family needs it."""
    by_side: dict[Attribution | None, list[_Finding]] = {}
    for finding in over:
        by_side.setdefault(finding.family.side, []).append(finding)
    requester = by_side.get(Attribution.REQUESTER, [])
    local = by_side.get(Attribution.LOCAL, [])
    local_fail = [f for f in local if f.family.verdict is Verdict.FAIL]
    evidence = own_port() if requester else []
    if local_fail or evidence:
        blamed = local_fail + (requester if evidence else [])
        named = evidence + ([Evidence.PORT_COUNTERS] if local_fail else [])
        return _Verdict(Status.FAIL, Attribution.LOCAL, blamed, named)
    for side in (
        Attribution.REQUESTER,
        Attribution.APPLICATION,
        Attribution.LOCAL,
        Attribution.UNCLASSIFIED,
    ):
        if by_side.get(side):
            return _Verdict(Status.WARN, side, by_side[side], [])
    return _Verdict(Status.PASS, None, [], [])


def judge_error_rates(
    ctx: CheckContext,
    subject: str,
    grown: dict[str, int],
    own_port: Callable[[], list[Evidence]] = list,
    driver: Mapping[str, str | None] | None = None,
) -> CheckResult:
    """rdma.errors of one port: each counter's rate against its family's policy
    (rate_policy.py), and who the families over their limit point at."""
    spec = ctx.checks.rdma
    elapsed = ctx.snapshot.elapsed_seconds
    span = ctx.interval_text()
    over: dict[CounterFamily, _Finding] = {}
    reported: list[str] = []
    rates: dict[str, float] = {}
    for name, count in grown.items():
        rate = per_second(count, elapsed)
        rates[name] = round(rate, 6)
        if not count:
            continue
        family = family_of(name)
        limit = family.limit(spec)
        text = f"{name} +{count} ({rate:.3g}/s)"
        if family.verdict is not Verdict.INFO and limit is not None and rate > limit:
            finding = over.setdefault(family, _Finding(family, {}, []))
            finding.grown[name] = count
            finding.texts.append(text)
        else:
            reported.append(text)
    verdict = _decide(list(over.values()), own_port)
    observed: dict[str, object] = {
        **grown,
        "perSecond": rates,
        "elapsedSeconds": elapsed,
        **(driver or {}),
    }
    if verdict.attribution is not None:
        blamed = {k: v for f in verdict.blamed for k, v in f.grown.items()}
        observed[ErrorsKey.ATTRIBUTION] = verdict.attribution.value
        observed[ErrorsKey.COUNTERS] = blamed
        observed[ErrorsKey.RATE_PER_SECOND] = round(per_second(sum(blamed.values()), elapsed), 6)
        if verdict.evidence:
            observed[ErrorsKey.EVIDENCE] = [e.value for e in verdict.evidence]
    expected = {
        "maxRetryErrorsPerSecond": spec.retry_errors_limit,
        "maxRetransmitsPerSecond": spec.max_retransmits_per_second,
        "warnReceiverErrorsPerSecond": spec.warn_receiver_errors_per_second,
        "warnCompletionErrorsPerSecond": spec.warn_completion_errors_per_second,
    }
    message = _message(ctx, verdict, list(over.values()), reported, span)
    return result(CheckId.RDMA_ERRORS, subject, verdict.status, message, observed, expected)


def _message(
    ctx: CheckContext,
    verdict: _Verdict,
    over: list[_Finding],
    reported: list[str],
    span: str,
) -> str:
    # The findings the verdict rests on first, then the others over their limits.
    ordered = verdict.blamed + [f for f in over if f not in verdict.blamed]
    findings = [
        f"{', '.join(f.texts)} in {span}, over {f.family.key} limit "
        f"{f.family.limit(ctx.checks.rdma):g}/s ({f.family.meaning})"
        for f in ordered
    ]
    tail = f"; reported only: {', '.join(reported)}" if reported else ""
    if not findings:
        if reported:
            return f"no RDMA counter family over its limit in {span}; {', '.join(reported)}"
        return f"no RDMA transport errors in {span}"
    head = "; ".join(findings)
    if verdict.attribution is Attribution.LOCAL and verdict.evidence:
        checks = [e.value for e in verdict.evidence if e is not Evidence.PORT_COUNTERS]
        if checks:
            head += (
                f"; this port's own checks fail in the same window ({', '.join(checks)}): "
                "attributed to this node"
            )
    elif verdict.attribution is Attribution.REQUESTER:
        head += (
            "; requester-side counters rise on every node that talks to a peer that died, "
            "and none of this port's own checks (link, PHY, PFC, pause) fails in the same "
            "window: "
            "attribution requester (the peer or the path), a warning, not this node's fault"
        )
    return head + tail
