"""Check results and the node report: what agents publish and the operator ingests.

The report crosses a trust boundary (MQTT), so it is a pydantic model that rejects unknown
fields; `netval probe --output json` prints exactly this shape.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    field_validator,
)

from netval.model.facts import MAX_FACTS, Facts
from netval.model.ids import CheckGroup, CheckId, Status, worst
from netval.model.nics import Nics, unique_devices
from netval.model.redaction import redact_message
from netval.model.topology import TopologyReport

REPORT_SCHEMA: Final = "netval.io/report/v1"

# Bounds keep a hostile or broken agent from making the operator hold huge payloads.
MAX_RESULTS_PER_REPORT: Final = 4096
# Every number and time is bounded, so nothing downstream (timedelta arithmetic, medians,
# the status patch the API server parses as int64/float64 JSON) can overflow or turn NaN.
MAX_INT: Final = 2**63 - 1  # Kubernetes' JSON integers are int64
_MIN_INT: Final = -(2**63)
MAX_DURATION_MS: Final = 86_400_000.0  # one day: no probe cycle lasts longer
MAX_JSON_DEPTH: Final = 16  # nesting of observed/expected values
# startedAt must lie in [now - STARTED_AT_PAST, now + STARTED_AT_FUTURE] when the validator
# is given a clock (`context={"now": ...}`; the operator's decoder does): a report older than
# a day is stale under any sane interval, and ten minutes covers clock skew.
STARTED_AT_PAST: Final = timedelta(days=1)
STARTED_AT_FUTURE: Final = timedelta(minutes=10)
_Name = Annotated[str, Field(min_length=1, max_length=253)]


def check_json_value(value: dict[str, JsonValue] | list[JsonValue], depth: int = 0) -> None:
    """Raise ValueError unless the object or array `value` holds only finite floats, int64
    integers and at most MAX_JSON_DEPTH levels of nesting (the JSON parser accepts NaN,
    Infinity and 1e400). Runs on every result of every report: one pass, type() tests, no
    call per scalar (str, bool and null need no test)."""
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    for item in value.values() if type(value) is dict else value:
        kind = type(item)
        if kind is float:
            if item - item != 0.0:  # type: ignore[operator]  # inf - inf and nan - nan are nan
                raise ValueError(f"non-finite number {item!r}")
        elif kind is int:
            if not _MIN_INT <= item <= MAX_INT:  # type: ignore[operator]
                raise ValueError("integer outside int64")
        elif kind is dict or kind is list:
            check_json_value(item, depth + 1)  # type: ignore[arg-type]


_OPERATOR_GROUPS: Final = frozenset({CheckGroup.FLEET, CheckGroup.TOPOLOGY})


class CheckResult(BaseModel):
    """One judgement of one subject (netdev, netdev/prioN, rdma device/port, endpoint, peer)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    check: CheckId
    subject: Annotated[str, Field(min_length=1, max_length=253)]
    status: Status
    # Redacted wherever a result is made or parsed (agent, operator ingest, `report --from`):
    # a presigned path or a password in a message never reaches a report, status or Event.
    message: Annotated[
        str, Field(max_length=1024), AfterValidator(lambda m: redact_message(m, 1024))
    ]
    observed: dict[str, JsonValue] = Field(default_factory=dict)
    expected: dict[str, JsonValue] = Field(default_factory=dict)

    @field_validator("observed", "expected")
    @classmethod
    def _bounded(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        check_json_value(value)
        return value


class Report(BaseModel):
    """A node's verdict for one probe cycle of one validation."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False
    )

    schema_: Annotated[str, Field(alias="schema", pattern=r"^netval\.io/report/v1$")] = (
        REPORT_SCHEMA
    )
    validation: _Name
    generation: Annotated[int, Field(ge=0, le=MAX_INT)]
    node: _Name
    started_at: Annotated[datetime, Field(alias="startedAt")]
    duration_ms: Annotated[float, Field(alias="durationMs", ge=0, le=MAX_DURATION_MS)]
    status: Status
    results: Annotated[list[CheckResult], Field(max_length=MAX_RESULTS_PER_REPORT)]
    traceparent: Annotated[str, Field(max_length=256)] | None = None
    # The node's configuration fingerprint (issue 22): bounded, printable ASCII; the operator
    # judges it against the node's cohort (check fleet.consistency). None: an older agent.
    facts: Annotated[Facts, Field(max_length=MAX_FACTS)] | None = None

    @field_validator("results")
    @classmethod
    def _agents_judge_nodes_only(cls, value: list[CheckResult]) -> list[CheckResult]:
        # fleet.* and topology.* are the operator's verdicts across nodes: an agent cannot
        # vouch for itself
        if any(r.check.group in _OPERATOR_GROUPS for r in value):
            raise ValueError(
                "fleet.* and topology.* results are judged by the operator, not reported"
            )
        return value

    # issue 21: LLDP neighbours of the judged fabric netdevs (spec.topology.lldp), else absent
    topology: TopologyReport | None = None
    # the node's RDMA NICs: device, PCI function, netdevs (netval.model.nics); None: an older
    # agent, whose results the operator does not tie to NICs
    nics: Annotated[Nics, AfterValidator(unique_devices)] | None = None

    @field_validator("started_at")
    @classmethod
    def _recent(cls, value: datetime, info: ValidationInfo) -> datetime:
        now = info.context.get("now") if isinstance(info.context, dict) else None
        if isinstance(now, datetime):
            at = value if value.tzinfo is not None else value.replace(tzinfo=now.tzinfo)
            if not now - STARTED_AT_PAST <= at <= now + STARTED_AT_FUTURE:
                raise ValueError(
                    f"startedAt {value.isoformat()} is not within"
                    f" {STARTED_AT_PAST} before and {STARTED_AT_FUTURE} after now"
                )
        return value

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude=self._absent())

    def to_dict(self) -> dict[str, JsonValue]:
        return self.model_dump(mode="json", by_alias=True, exclude=self._absent())

    def _absent(self) -> set[str] | None:
        # Optional sections added after v1 are left out when absent, so a report without
        # them is byte for byte what it was.
        absent = {name for name in ("topology", "nics") if getattr(self, name) is None}
        return absent or None


def node_status(results: list[CheckResult]) -> Status:
    """The worst result; a node with nothing judged has status skip."""
    return worst(r.status for r in results)
