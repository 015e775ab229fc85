"""The operator's start check of the broker's ACL, and the hold it puts on gating.

Each term probes (`netval.infra.broker_acl.probe_broker_acl`) whether a node's identity can
publish another node's report, beat, endpoint, load result or state (its last will
included), or read another node's assignment or load-test plan, with the operator's own
session as the observer of what got through. With per-node identity (operator/identity) the
probe identity is a certificate the identity CA mints for a reserved node; without it (an
external broker) the login `NETVAL_ACL_PROBE_USERNAME`/`_PASSWORD_FILE` names (the chart:
the agents' login); with neither, a warning says the ACL is unchecked.

While the verdict is `violated`, any agent can speak for any node: a forged failing report
would taint a healthy node, a forged passing one would hide a failing node. So gating is
held (`AclHold`): no Node label or taint is written, every validation's `Gating` condition
is False `BrokerAclViolated`, a Warning Event says so, `netval_operator_gating_held` is 1;
status and admission go on from the reports. Until a term's check has an answer (seconds;
at most `PENDING_AT_MOST`) Node writes wait too, so a violation found a few seconds into a
term finds nothing written on forged reports. `NETVAL_GATING_ON_ACL_VIOLATION=proceed` (the
chart's `operator.brokerAcl.onViolation`) turns the hold off (logged, still counted). The
check runs once per term, in the background, and never stops the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import kopf
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from netval.infra.broker_acl import AclProbe, AclVerdict, probe_broker_acl
from netval.infra.mqtt_settings import MqttSettings
from netval.operator.thread_pools import PROCESS_POOLS, Concern

__all__ = ["AclHold", "BrokerAclCheck", "start_acl_check", "stop_acl_check"]

log = logging.getLogger(__name__)

METRIC: Final = "netval_broker_acl_violations"
TASK_MEMO_KEY: Final = "broker_acl_check"  # Kopf memo: the term's check task
HOLD_MEMO_KEY: Final = "broker_acl_hold"  # Kopf memo: the term's AclHold
PENDING_AT_MOST: Final = 90.0  # seconds Node writes wait for a check that has not answered


@dataclass
class AclHold:
    """Gating's input from the ACL check: a reason to hold, or None."""

    enabled: bool = True  # False: NETVAL_GATING_ON_ACL_VIOLATION=proceed
    probe: AclProbe | None = field(default=None, repr=False)
    pending_until: float = 0.0  # monotonic: a check runs and has not answered until then

    def expect(self) -> None:
        """A check starts now: Node writes wait for its answer (bounded)."""
        if self.enabled and self.probe is None:
            self.pending_until = time.monotonic() + PENDING_AT_MOST

    def answered(self, probe: AclProbe) -> None:
        self.probe = probe
        self.pending_until = 0.0

    def writes_wait(self) -> bool:
        """No Node write now: violated, or a check's answer still pending."""
        return self.held or time.monotonic() < self.pending_until

    def reason(self) -> str | None:
        probe = self.probe
        if not self.enabled or probe is None or probe.verdict is not AclVerdict.VIOLATED:
            return None
        shown = ", ".join(probe.violations[:4]) + (", ..." if len(probe.violations) > 4 else "")
        return (
            f"gating held: the broker's ACL lets identity {probe.identity!r} {shown} of "
            "another node, so any agent can speak for any node; no label or taint is "
            'written until a check passes (docs/operations.md "Broker ACL")'
        )

    @property
    def held(self) -> bool:
        return self.reason() is not None


class BrokerAclCheck(Collector):
    """One run of the check; as a collector, its outcome as gauges."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        observer: MqttSettings | None = None,
        own: tuple[str, str] | None = None,
        timeout: float = 5.0,
        own_client_id: bool = False,
        hold: AclHold | None = None,
    ) -> None:
        # own_client_id: the identity's own client id (a certificate identity's broker binds
        # it anyway); else the probe takes one of its own (never the ingest session's)
        self.settings = settings
        self.observer = observer
        self.own = own
        self.own_client_id = own_client_id
        self.timeout = timeout
        self.hold = hold if hold is not None else AclHold()
        self.result: AclProbe | None = None

    async def run(self) -> AclProbe:
        observer = self.observer
        result = await PROCESS_POOLS.run(
            Concern.BROKER_PROBE,
            lambda: probe_broker_acl(
                self.settings,
                self.settings.ssl_context(),
                observer=observer,
                observer_tls=observer.ssl_context() if observer is not None else None,
                own=self.own,
                timeout=self.timeout,
                exact_client_id=self.own_client_id,
            ),
        )
        self.result = result
        self.hold.answered(result)
        verdict = result.verdict
        if verdict is AclVerdict.UNCHECKED:
            log.warning("broker ACL check could not run: %s", result.error)
        elif verdict is AclVerdict.VIOLATED:
            for what in result.violations:
                log.error(
                    "broker ACL: identity %r can %s of another node: the broker does not "
                    'enforce netval\'s ACL (docs/operations.md "Broker ACL")',
                    result.identity,
                    what,
                )
            if self.hold.enabled:
                log.error("gating held until the broker enforces the ACL (a restart checks again)")
            else:
                log.warning("gating goes on regardless (NETVAL_GATING_ON_ACL_VIOLATION=proceed)")
        elif verdict is AclVerdict.UNCONFIRMED:
            log.warning(
                "broker ACL check as %r: not confirmed (no answer for %s; own topics %s)",
                result.identity,
                ", ".join(result.unacknowledged) or "-",
                {True: "work", False: "did not get through", None: "not tried"}[result.control],
            )
        else:
            log.info(
                "broker ACL check: %r cannot speak for another node nor read its topics "
                "(enforced: %d kinds)",
                result.identity,
                len(result.outcomes),
            )
        return result

    def collect(self) -> Iterator[GaugeMetricFamily]:
        result = self.result
        if result is not None and result.error is None:
            yield GaugeMetricFamily(
                METRIC,
                "Topic kinds of another node (publish report/beat/endpoint/loadresult/state, "
                "last will, read assignment/loadplan) the probed MQTT identity got through; "
                "anything above 0 means no per-node ACL",
                value=len(result.violations),
            )
        yield GaugeMetricFamily(
            "netval_operator_gating_held",
            "1 while gating (Node labels and taints) is held because the broker's ACL check "
            "found a violation",
            value=int(self.hold.held),
        )


def term_hold(memo: kopf.Memo, enabled: bool) -> AclHold:
    """The term's hold (made once per term), which the node gating round reads."""
    hold = memo.get(HOLD_MEMO_KEY)
    if not isinstance(hold, AclHold):
        hold = memo[HOLD_MEMO_KEY] = AclHold(enabled)
    return hold


def start_acl_check(
    memo: kopf.Memo, probe: MqttSettings | None, observer: MqttSettings | None, hold: AclHold
) -> None:
    """A term's start without per-node identity: the check with the configured probe
    credential, in the background (its gauges in the term's registry); idempotent."""
    if memo.get(TASK_MEMO_KEY) is not None:
        return
    if probe is None:
        log.warning(
            "broker ACL not checked: no per-node identity and no probe credential (%s): "
            "if the broker enforces no per-node ACL any agent can speak for any node "
            '(docs/operations.md "Broker ACL"); or run `netval doctor` with a node\'s login',
            "NETVAL_ACL_PROBE_USERNAME/_PASSWORD_FILE",
        )
        memo[TASK_MEMO_KEY] = False
        return
    check = BrokerAclCheck(probe, observer=observer, hold=hold)
    hold.expect()
    registry = memo.get("metrics_registry")
    if isinstance(registry, CollectorRegistry):
        registry.register(check)
    memo[TASK_MEMO_KEY] = asyncio.create_task(check.run(), name="netval-broker-acl-check")


async def stop_acl_check(memo: kopf.Memo) -> None:
    task = memo.get(TASK_MEMO_KEY)
    if isinstance(task, asyncio.Task) and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
