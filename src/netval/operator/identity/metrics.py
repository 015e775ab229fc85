"""The identity service's Prometheus metrics: enrollment answers by outcome, certificate
requests refused by reason, certificates issued."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from netval.operator.identity.csr import CsrReason

if TYPE_CHECKING:
    from netval.operator.identity.service import IdentityService

OUTCOMES: Final = (
    "issued", "denied", "bad_csr", "busy", "gone", "unauthenticated", "bad_request",
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
        refusals = CounterMetricFamily(
            "netval_operator_csr_refusals",
            "Certificate signing requests refused, by reason (a hostile or broken agent)",
            labels=["reason"],
        )
        for reason in CsrReason:
            refusals.add_metric([reason.value], s.server.csr_refusals.get(reason, 0))
        yield refusals
        yield CounterMetricFamily(
            "netval_operator_mqtt_certificates",
            "Client certificates the identity CA signed (agents' enrollments and the "
            "operator's own)",
            value=s.authority.issued,
        )
        yield GaugeMetricFamily(
            "netval_operator_enrollments_queued",
            "Enrollment requests admitted and not answered yet (reviewed or waiting)",
            value=s.server.queued,
        )
        yield GaugeMetricFamily(
            "netval_operator_identity_ca_expiry_seconds",
            "Seconds until the identity CA's certificate expires (renew it well before)",
            value=(s.authority.expires_at - s.authority.clock()).total_seconds(),
        )
