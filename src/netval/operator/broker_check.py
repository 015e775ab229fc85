"""The operator's start check of the broker's ACL: can a node's identity publish a report,
state or endpoint for another node (it must not)?

With per-node identity (operator/identity) the operator issues a short-lived credential for a
reserved probe node, probes with it, and revokes it; `netval doctor` runs the same probe with
whatever credential it is given (a node's). The operator's own identity is not the one to
probe: it legitimately writes node topics (it clears a deleted validation's retained ones).

A broker that lets it probably enforces no per-node ACL at all (an external broker set up
without netval's rules, docs/operations.md "External brokers"): then any credential speaks
for any node, and the operator's node = topic = body check is the only defence left. The
check logs each violation and exports `netval_broker_acl_violations` (absent until the check
has run, and when it could not run). It runs once, in the background, and never stops the
operator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from netval.infra.broker_acl import AclProbe, probe_node_topics
from netval.infra.mqtt_settings import MqttSettings

__all__ = ["BrokerAclCheck"]

log = logging.getLogger(__name__)

METRIC: Final = "netval_broker_acl_violations"


class BrokerAclCheck(Collector):
    """One run of the check; as a collector, its outcome as a gauge."""

    def __init__(
        self, settings: MqttSettings, *, timeout: float = 5.0, own_client_id: bool = False
    ) -> None:
        if not own_client_id:  # never take over the ingest session
            suffix = f"{settings.client_id}-acl" if settings.client_id else None
            settings = settings.with_client_id(suffix)
        # else: a per-node credential, which the broker binds to its own client id
        self.settings = settings
        self.own_client_id = own_client_id
        self.timeout = timeout
        self.result: AclProbe | None = None

    async def run(self) -> AclProbe:
        result = await asyncio.to_thread(
            probe_node_topics,
            self.settings,
            self.settings.ssl_context(),
            timeout=self.timeout,
            exact_client_id=self.own_client_id,
        )
        self.result = result
        if result.error is not None:
            log.warning("broker ACL check could not run: %s", result.error)
        elif result.violations:
            for topic in result.violations:
                log.error(
                    "broker ACL: identity %r may publish to %s, a node's topic: the broker "
                    'does not enforce netval\'s ACL (docs/operations.md "Broker ACL")',
                    result.identity,
                    topic,
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
