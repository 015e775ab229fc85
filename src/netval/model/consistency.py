"""The fleet-consistency summary in the NetworkValidation status (`status.consistency`).

Computed by the operator (`netval.operator.consistency`) from the nodes' facts; read by
`netval status --consistency` and the HTML report. Bounded whatever the fleet's size: at most
`MAX_KEYS` (cohort, key) rows (rows with findings first), `MAX_NAMED` named outliers per row
with a count of the rest, `MAX_SPLIT_GROUPS` groups per split and `MAX_VIOLATIONS` violations.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

MAX_KEYS: Final = 128
MAX_NAMED: Final = 100  # the spec's maxOutliersPerKey is at most this
MAX_SPLIT_GROUPS: Final = 8
MAX_VIOLATIONS: Final = 50


class FindingKind(StrEnum):
    VIOLATION = "Violation"  # outside the declared intent (spec expectations, consistency.expect)
    OUTLIER = "Outlier"  # differs from a cohort majority of >= majorityPercent
    SPLIT = "Split"  # no value holds the majority: the groups are reported, none picked
    TRANSITIONING = "Transitioning"  # a rollout value before its `until`


class _Out(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class NodeValue(_Out):
    node: str
    value: str
    since: datetime


class ValueGroup(_Out):
    value: str
    nodes: Annotated[int, Field(ge=0)]


class KeySummary(_Out):
    """One fact key in one cohort."""

    cohort: str
    key: str
    nodes: Annotated[int, Field(ge=0)]  # cohort members that report the key
    majority: str | None = None  # None: split, or cohort below minCohort
    share: Annotated[float, Field(ge=0, le=1)] = 0.0  # of the most common value
    outliers: Annotated[list[NodeValue], Field(max_length=MAX_NAMED)] = Field(default_factory=list)
    more_outliers: Annotated[int, Field(ge=0)] = 0
    split: Annotated[list[ValueGroup], Field(max_length=MAX_SPLIT_GROUPS)] = Field(
        default_factory=list
    )
    transitioning: Annotated[int, Field(ge=0)] = 0


class Violation(_Out):
    node: str
    key: str
    value: str
    since: datetime


class ConsistencyStatus(_Out):
    cohorts: Annotated[int, Field(ge=0)] = 0
    nodes: Annotated[int, Field(ge=0)] = 0  # targeted nodes with facts
    keys: Annotated[list[KeySummary], Field(max_length=MAX_KEYS)] = Field(default_factory=list)
    more_keys: Annotated[int, Field(ge=0)] = 0
    violations: Annotated[list[Violation], Field(max_length=MAX_VIOLATIONS)] = Field(
        default_factory=list
    )
    more_violations: Annotated[int, Field(ge=0)] = 0
