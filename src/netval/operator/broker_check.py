"""The operator's start check of the broker's ACL: can a node's identity publish a report,
state or endpoint for another node (it must not)?

With per-node identity (operator/identity) the operator issues a short-lived credential for a
reserved probe node, probes with it, and revokes it. Without it (an external broker) each
term probes with the credential `NETVAL_ACL_PROBE_USERNAME`/`_PASSWORD_FILE` names (the chart:
the agents' login), `start_acl_check`; with neither, a warning says the ACL is unchecked.
`netval doctor` runs the same probe with whatever credential it is given (a node's). The
operator's own identity is not the one to probe: it legitimately writes node topics (it
clears a deleted validation's retained ones).

A broker that lets it probably enforces no per-node ACL at all (an external broker set up
without netval's rules, docs/operations.md "External brokers"): then any credential speaks
for any node, and the operator's node = topic = body check is the only defence left. The
check logs each violation and exports `netval_broker_acl_violations` (absent until the check
has run, and when it could not run). It runs once, in the background, and never stops the
operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Final

import kopf
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from netval.infra.broker_acl import AclProbe, AclVerdict, probe_node_topics
from netval.infra.mqtt_settings import MqttSettings
from netval.operator.thread_pools import PROCESS_POOLS, Concern

__all__ = ["BrokerAclCheck", "start_acl_check", "stop_acl_check"]

log = logging.getLogger(__name__)

METRIC: Final = "netval_broker_acl_violations"
TASK_MEMO_KEY: Final = "broker_acl_check"  # Kopf memo: the term's check task


class BrokerAclCheck(Collector):
    """One run of the check; as a collector, its outcome as a gauge."""

    def __init__(
        self, settings: MqttSettings, *, timeout: float = 5.0, own_client_id: bool = False
    ) -> None:
        # own_client_id: a per-node credential, which the broker binds to its own client id;
        # else the probe takes a client id of its own (never the ingest session's)
        self.settings = settings
        self.own_client_id = own_client_id
        self.timeout = timeout
        self.result: AclProbe | None = None

    async def run(self) -> AclProbe:
        result = await PROCESS_POOLS.run(
            Concern.BROKER_PROBE,
            probe_node_topics,
            self.settings,
            self.settings.ssl_context(),
            timeout=self.timeout,
            exact_client_id=self.own_client_id,
        )
        self.result = result
        verdict = result.verdict
        if verdict is AclVerdict.UNCHECKED:
            log.warning("broker ACL check could not run: %s", result.error)
        elif verdict is AclVerdict.VIOLATED:
            for topic in result.violations:
                log.error(
                    "broker ACL: identity %r may publish to %s, a node's topic: the broker "
                    'does not enforce netval\'s ACL (docs/operations.md "Broker ACL")',
                    result.identity,
                    topic,
                )
        elif verdict is AclVerdict.UNCONFIRMED:
            log.warning(
                "broker ACL check: no acknowledgement for %d probe publish(es) as %r: the "
                "ACL is not confirmed",
                len(result.unacknowledged),
                result.identity,
            )
        else:
            log.info("broker ACL check: %r cannot publish for a node (enforced)", result.identity)
        return result

    def collect(self) -> Iterator[GaugeMetricFamily]:
        result = self.result
        if result is None or result.error is not None:
            return
        yield GaugeMetricFamily(
            METRIC,
            "Node topics (report, state, endpoint of a node it does not own) the probed MQTT "
            "identity could publish to; anything above 0 means no per-node ACL",
            value=len(result.violations),
        )


def start_acl_check(memo: kopf.Memo, probe: MqttSettings | None) -> None:
    """A term's start without per-node identity: the check with the configured probe
    credential, in the background (its gauge in the term's registry); idempotent."""
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
    check = BrokerAclCheck(probe)
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
