"""Storage results: one constructor (messages clipped), and the reachability and latency
verdicts of a measured `Reach`."""

from __future__ import annotations

from typing import Final

from pydantic import JsonValue

from netval.agent.checks.context import result
from netval.agent.storage.reach import Reach
from netval.model.ids import CheckId, Status
from netval.model.redaction import redact
from netval.model.results import CheckResult
from netval.model.spec import StorageEndpoint

__all__ = [
    "endpoint_result",
    "reach_results",
    "unjudged",
]

_MAX_MESSAGE: Final = 1024


def _clip(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."


def endpoint_result(
    check: CheckId,
    endpoint: StorageEndpoint,
    status: Status,
    message: str,
    observed: dict[str, JsonValue] | None = None,
    expected: dict[str, JsonValue] | None = None,
) -> CheckResult:
    # Every storage message passes here: whatever path, URL or exception text it quotes, no
    # query value or userinfo leaves the agent.
    return result(check, endpoint.name, status, _clip(redact(message)), observed, expected)


def unjudged(endpoint: StorageEndpoint, why: str) -> list[CheckResult]:
    return [
        endpoint_result(CheckId.STORAGE_LATENCY, endpoint, Status.SKIP, f"not measured: {why}"),
        endpoint_result(CheckId.STORAGE_THROUGHPUT, endpoint, Status.SKIP, f"not measured: {why}"),
    ]


def reach_results(endpoint: StorageEndpoint, reach: Reach) -> list[CheckResult]:
    reachable = endpoint_result(
        CheckId.STORAGE_REACHABLE,
        endpoint,
        Status.PASS if reach.ok else Status.FAIL,
        reach.message,
        {"reachable": reach.ok, "protocol": endpoint.protocol.value, **reach.observed},
        {"reachable": True},
    )
    if not reach.ok or reach.latency_ms is None:
        return [
            reachable,
            endpoint_result(
                CheckId.STORAGE_LATENCY, endpoint, Status.SKIP, "not measured: endpoint unreachable"
            ),
        ]
    observed: dict[str, JsonValue] = {"latencyMs": reach.latency_ms, "connectMs": reach.connect_ms}
    expected: dict[str, JsonValue] = {"maxLatencyMs": endpoint.max_latency_ms}
    too_slow = reach.latency_ms > endpoint.max_latency_ms
    latency = endpoint_result(
        CheckId.STORAGE_LATENCY,
        endpoint,
        Status.FAIL if too_slow else Status.PASS,
        f"{reach.latency_ms:g} ms (connect {reach.connect_ms:g} ms) "
        f"{'exceeds' if too_slow else 'within'} the maximum of {endpoint.max_latency_ms:g} ms",
        observed,
        expected,
    )
    return [reachable, latency]
