"""The identity service's Prometheus metrics: enrollment answers by outcome, credentials
issued, revoked and expired, and the dynamic security admin connection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from netval.operator.identity.service import IdentityService

OUTCOMES: Final = (
    "issued", "reused", "denied", "throttled", "busy", "gone", "unauthenticated", "bad_request",
    "unavailable",
)  # fmt: skip


class IdentityCollector(Collector):
    def __init__(self, service: IdentityService) -> None:
        self._service = service

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._service
        answers = CounterMetricFamily(
            "netval_operator_enrollments", "Enrollment requests answered, by outcome",
            labels=["outcome"],
        )  # fmt: skip
        for outcome in OUTCOMES:
            answers.add_metric([outcome], s.server.outcomes.get(outcome, 0))
        yield answers
        credentials = CounterMetricFamily(
            "netval_operator_mqtt_credentials", "Per-node MQTT credentials, by what happened",
            labels=["event"],
        )  # fmt: skip
        for event, value in (("issued", s.issuer.issued), ("revoked", s.issuer.revoked),
                             ("expired", s.issuer.expired)):  # fmt: skip
            credentials.add_metric([event], value)
        yield credentials
        yield GaugeMetricFamily(
            "netval_operator_enrollments_queued",
            "Enrollment requests admitted and not answered yet (reviewed, issued or waiting)",
            value=s.server.queued,
        )
        yield GaugeMetricFamily(
            "netval_operator_dynsec_connected",
            "1 while the dynamic security admin connection is up",
            value=int(s.admin.connected),
        )
