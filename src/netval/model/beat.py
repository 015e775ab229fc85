"""The beat: what an agent publishes instead of its full report when nothing material changed.

An agent publishes its full report (retained, QoS 1) when it differs materially from the last
one it published, and at least every `spec.report.fullEvery` cycles; every other cycle it
publishes a `Beat` on ``netval/v1/<validation>/<node>/beat``: "my standing report, the one
whose digest is this, is still what I measure". The operator refreshes the node's freshness
from a beat whose digest matches the report it holds, and trusts nothing from one that does
not (docs/architecture.md, "Reports and beats").

"Material" is what a reader of the status can tell apart: the report's identity (validation,
generation, node), its status, every result's (check, subject, status) and its message with
the measured numbers masked, the facts and the topology section. Measured values (``observed``,
the numbers in a message, the cycle's times) move every cycle and are not material: a beat
does not carry them, the next full report does. East-west (``peer.*``) results name the peer
probed, which rotates every cycle by design: a passing or warning one is material only as
(check, the peer's topology domain, status); a failing one (fail, error) with its peer and
words, like any other result. `report_digest` is the one function agent and
operator both compute, so they agree byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from netval.model.ids import CheckGroup, Status
from netval.model.results import MAX_INT, STARTED_AT_FUTURE, STARTED_AT_PAST, CheckResult, Report

BEAT_SCHEMA: Final = 1
DIGEST_BYTES: Final = 16  # blake2b-128: collisions are no concern between two reports of a node
# A beat is ~110 bytes; anything much larger is not a beat (dropped unread).
MAX_BEAT_BYTES: Final = 1024
# A run of digits with an optional fraction and exponent: "0.31 %", "12 drops", "1e-05".
_NUMBER: Final = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


class Beat(BaseModel):
    """`{"schema":1,"seq":N,"cycleAt":"<iso>","digest":"<32 hex>","worst":"pass"}`."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_: Annotated[Literal[1], Field(alias="schema")] = BEAT_SCHEMA
    # per agent process, +1 every cycle (full report or beat): a beat seen again (the retained
    # replay) is told from a new one, so it is not counted twice toward taint recovery
    seq: Annotated[int, Field(ge=0, le=MAX_INT, strict=True)]
    cycle_at: Annotated[AwareDatetime, Field(alias="cycleAt")]
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    worst: Status

    @field_validator("cycle_at")
    @classmethod
    def _recent(cls, value: datetime, info: ValidationInfo) -> datetime:
        # the report's startedAt bounds, given a clock (the operator's decoder gives one)
        now = info.context.get("now") if isinstance(info.context, dict) else None
        if isinstance(now, datetime) and not now - STARTED_AT_PAST <= value <= now + (
            STARTED_AT_FUTURE
        ):
            raise ValueError(
                f"cycleAt {value.isoformat()} is not within {STARTED_AT_PAST} before and"
                f" {STARTED_AT_FUTURE} after now"
            )
        return value

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)


def mask_numbers(message: str) -> str:
    """`message` with every measured number replaced by ``#`` (not material)."""
    return _NUMBER.sub("#", message)


def _material_result(r: CheckResult) -> tuple[str, str, str, str]:
    if r.check.group is CheckGroup.PEER and not r.status.is_bad:
        domain = r.observed.get("domain")
        return (
            r.check.value,
            f"domain:{domain if isinstance(domain, str) else ''}",
            r.status.value,
            "",
        )
    return (r.check.value, r.subject, r.status.value, mask_numbers(r.message))


def material_content(report: Report) -> dict[str, object]:
    """What of `report` a beat vouches for (see the module docstring), JSON-ready."""
    results = sorted({_material_result(r) for r in report.results})
    return {
        "validation": report.validation,
        "generation": report.generation,
        "node": report.node,
        "status": report.status.value,
        "results": [list(r) for r in results],
        "facts": report.facts,
        "topology": report.topology.model_dump(mode="json", by_alias=True)
        if report.topology is not None
        else None,
    }


def report_digest(report: Report) -> str:
    """Hex blake2b-128 of the canonical JSON of `material_content` (sorted keys, no spaces)."""
    canonical = json.dumps(
        material_content(report), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    return hashlib.blake2b(canonical.encode(), digest_size=DIGEST_BYTES).hexdigest()


__all__ = [
    "BEAT_SCHEMA",
    "MAX_BEAT_BYTES",
    "Beat",
    "mask_numbers",
    "material_content",
    "report_digest",
]
