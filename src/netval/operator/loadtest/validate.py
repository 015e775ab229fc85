"""A NetworkLoadTest spec against its NetworkValidation and the cluster ceiling. Pure.

The outcome is either a `RunSettings` (what a run will do: phases, endpoints, the per-flow
cap) or a `SpecProblem` that becomes the Complete/Passed conditions (reason InvalidSpec or
ValidationNotFound) with a message naming the field at fault, so a bad spec never leaves the
test Pending without a word.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from netval.model.loadtest import (
    DEFAULT_ENGINE_PORT,
    LoadEngine,
    LoadPhase,
    LoadReason,
    NetworkLoadTestSpec,
    PairScope,
)
from netval.model.spec import NetworkValidationSpec, StorageEndpoint, StorageProtocol

# What the agent's bulk reader speaks (netval.agent.storage.throughput: a ranged GET).
READABLE_PROTOCOLS: Final = frozenset({StorageProtocol.HTTP, StorageProtocol.S3})


@dataclass(frozen=True, slots=True)
class SpecProblem:
    reason: LoadReason
    field: str  # "spec.storage.endpoints"
    message: str  # says the field first

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class RunSettings:
    """A spec checked against its validation: what a run does."""

    validation: str
    phases: tuple[LoadPhase, ...]  # in run order: eastWest first
    pairs: PairScope
    endpoints: tuple[str, ...]  # storage endpoints to read, in the validation's order
    duration_seconds: float
    max_rate_mbps: float  # per flow, the ceiling applied; 0: none
    skip_busy_nodes: bool
    engine: LoadEngine = LoadEngine.AUTO
    streams: int = 4
    # the rails by name (the load test's eastWest.interfaces); empty: each node's own
    interfaces: tuple[str, ...] = ()
    dscp: int | None = None
    port: int = DEFAULT_ENGINE_PORT
    reserve_nodes: bool = False
    sender_limited_percent: float = 60.0
    min_coverage_percent: float = 80.0


def parse_spec(raw: Mapping[str, Any] | None) -> NetworkLoadTestSpec | SpecProblem:
    """The typed spec, or InvalidSpec naming the first bad field (the API server checks the
    shape; a cron range or an old object's field may still be wrong)."""
    try:
        return NetworkLoadTestSpec.model_validate(dict(raw or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(["spec", *(str(p) for p in first["loc"])])
        msg = str(first["msg"]).removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return SpecProblem(LoadReason.INVALID_SPEC, where, f"{where}: {msg}{more}")


def _readable(endpoint: StorageEndpoint) -> bool:
    return endpoint.protocol in READABLE_PROTOCOLS and bool(endpoint.path)


def check_spec(
    spec: NetworkLoadTestSpec,
    validation: NetworkValidationSpec | None,
    *,
    max_rate_ceiling_mbps: float | None = None,
) -> RunSettings | SpecProblem:
    """`spec` against its validation (None: not found) and the operator's ceiling."""
    name = spec.validation
    if validation is None:
        return SpecProblem(
            LoadReason.VALIDATION_NOT_FOUND,
            "spec.validation",
            f"spec.validation: NetworkValidation {name!r} not found",
        )
    peers = validation.checks.peers.enabled
    by_name = {e.name: e for e in validation.checks.storage.endpoints}
    if spec.storage.endpoints:
        unknown = [e for e in spec.storage.endpoints if e not in by_name]
        if unknown:
            return _invalid(
                "spec.storage.endpoints",
                f"{', '.join(repr(u) for u in unknown)} not in checks.storage.endpoints of "
                f"NetworkValidation {name!r} (it has: {', '.join(by_name) or 'none'})",
            )
        unreadable = [e for e in spec.storage.endpoints if not _readable(by_name[e])]
        if unreadable:
            return _invalid(
                "spec.storage.endpoints",
                f"{', '.join(repr(u) for u in unreadable)} cannot be read in bulk (an http or "
                "s3 endpoint with a path is needed)",
            )
        endpoints = tuple(e for e in by_name if e in spec.storage.endpoints)
    else:
        endpoints = tuple(e.name for e in by_name.values() if _readable(e))
    if spec.phases is None:
        phases = tuple(
            p
            for p, possible in ((LoadPhase.EAST_WEST, peers), (LoadPhase.STORAGE, endpoints))
            if possible
        )
        if not phases:
            return _invalid(
                "spec.phases",
                f"NetworkValidation {name!r} can run no phase: checks.peers.enabled is false "
                "and it has no http or s3 storage endpoint with a path",
            )
    else:
        if LoadPhase.EAST_WEST in spec.phases and not peers:
            return _invalid(
                "spec.phases",
                f"eastWest needs checks.peers.enabled on NetworkValidation {name!r}",
            )
        if LoadPhase.STORAGE in spec.phases and not endpoints:
            return _invalid(
                "spec.phases",
                f"storage needs an http or s3 endpoint with a path in NetworkValidation {name!r}",
            )
        phases = tuple(p for p in LoadPhase if p in spec.phases)
    if LoadPhase.STORAGE not in phases:
        endpoints = ()
    rate = spec.max_rate_mbps
    if max_rate_ceiling_mbps:
        if rate > max_rate_ceiling_mbps:
            return _invalid(
                "spec.maxRateMbps",
                f"{rate:g} is above the cluster ceiling loadTests.maxRateMbps "
                f"({max_rate_ceiling_mbps:g})",
            )
        rate = rate or max_rate_ceiling_mbps  # 0 (no cap of its own): the ceiling caps it
    return RunSettings(
        validation=name,
        phases=phases,
        pairs=spec.east_west.pairs,
        endpoints=endpoints,
        duration_seconds=spec.duration_seconds,
        max_rate_mbps=rate,
        skip_busy_nodes=spec.skip_busy_nodes,
        engine=spec.east_west.engine,
        streams=spec.east_west.streams,
        interfaces=tuple(spec.east_west.interfaces),
        dscp=spec.east_west.dscp,
        port=spec.east_west.port,
        reserve_nodes=spec.reserve_nodes,
        sender_limited_percent=spec.sender_limited_percent,
        min_coverage_percent=spec.min_coverage_percent,
    )


def _invalid(field: str, detail: str) -> SpecProblem:
    return SpecProblem(LoadReason.INVALID_SPEC, field, f"{field}: {detail}")


def settle(
    raw: Mapping[str, Any] | None,
    validation: NetworkValidationSpec | None,
    *,
    max_rate_ceiling_mbps: float | None = None,
) -> RunSettings | SpecProblem:
    """`parse_spec` then `check_spec`: what a handler calls with the object's spec."""
    spec = parse_spec(raw)
    if isinstance(spec, SpecProblem):
        return spec
    return check_spec(spec, validation, max_rate_ceiling_mbps=max_rate_ceiling_mbps)
