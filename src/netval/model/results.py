"""Check results and the node report: what agents publish and the operator ingests.

The report crosses a trust boundary (MQTT), so it is a pydantic model that rejects unknown
fields; `netval probe --output json` prints exactly this shape.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue

from netval.model.ids import CheckId, Status, worst
from netval.model.redaction import redact_message

REPORT_SCHEMA: Final = "netval.io/report/v1"

# Bounds keep a hostile or broken agent from making the operator hold huge payloads.
MAX_RESULTS_PER_REPORT: Final = 4096
_Name = Annotated[str, Field(min_length=1, max_length=253)]


class CheckResult(BaseModel):
    """One judgement of one subject (netdev, netdev/prioN, rdma device/port, endpoint, peer)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


class Report(BaseModel):
    """A node's verdict for one probe cycle of one validation."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_: Annotated[str, Field(alias="schema", pattern=r"^netval\.io/report/v1$")] = (
        REPORT_SCHEMA
    )
    validation: _Name
    generation: Annotated[int, Field(ge=0)]
    node: _Name
    started_at: Annotated[datetime, Field(alias="startedAt")]
    duration_ms: Annotated[float, Field(alias="durationMs", ge=0)]
    status: Status
    results: Annotated[list[CheckResult], Field(max_length=MAX_RESULTS_PER_REPORT)]
    traceparent: str | None = None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    def to_dict(self) -> dict[str, JsonValue]:
        return self.model_dump(mode="json", by_alias=True)


def node_status(results: list[CheckResult]) -> Status:
    """The worst result; a node with nothing judged has status skip."""
    return worst(r.status for r in results)
