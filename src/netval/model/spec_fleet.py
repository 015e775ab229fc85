"""The fleet-level sections of the NetworkValidation spec: `spec.consistency` (issue 22, each
node against its cohort) and `spec.topology` (issue 21, the fabric against its labels). Both
are judged by the operator across nodes, not by an agent alone.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field, model_validator

from netval.model.spec_base import SpecModel as _Spec


class FindingSeverity(StrEnum):
    WARN = "warn"
    FAIL = "fail"


MAX_FACT_MAP: Final = 64
_FACT_KEY: Final = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


def _fact_map(value: dict[str, Any]) -> dict[str, Any]:
    """A map keyed by fact names (`netval.model.facts.FactKey`): bounded, names well-formed
    (the CRD bounds it with maxProperties; a structural schema cannot check key names)."""
    if len(value) > MAX_FACT_MAP:
        raise ValueError(f"at most {MAX_FACT_MAP} fact keys, got {len(value)}")
    bad = [k for k in value if not _FACT_KEY.match(k)]
    if bad:
        raise ValueError(f"not a fact key (lower_snake_case, at most 48 chars): {bad[0]!r}")
    return value


FactAllowed = Annotated[
    list[Annotated[str, Field(max_length=256)]], Field(min_length=1, max_length=32)
]


class ConsistencyRollout(_Spec):
    """A staged rollout: these values are Transitioning, not Outliers, until `until`."""

    allowed: FactAllowed
    until: datetime


class Consistency(_Spec):
    """`spec.consistency` (issue 22): every node judged against the declared intent and
    against its cohort (same NIC model, and same `cohortLabel` value when set). On by
    default; the defaults are in docs/checks.md ("Fleet consistency")."""

    enabled: bool = True
    cohort_label: Annotated[str | None, Field(min_length=1, max_length=317)] = None
    # An Outlier needs a majority of at least this share of a cohort of at least minCohort.
    majority_percent: Annotated[float, Field(gt=50, le=100)] = 80.0
    min_cohort: Annotated[int, Field(ge=2, le=100_000)] = 5
    outlier_severity: FindingSeverity = FindingSeverity.WARN
    violation_severity: FindingSeverity = FindingSeverity.FAIL
    expect: Annotated[dict[str, FactAllowed], AfterValidator(_fact_map)] = Field(
        default_factory=dict
    )
    rollout: Annotated[dict[str, ConsistencyRollout], AfterValidator(_fact_map)] = Field(
        default_factory=dict
    )
    max_outliers_per_key: Annotated[int, Field(ge=1, le=100)] = 10


class TopologyVerdict(StrEnum):
    """The status `topology.agreement` gives a node whose fabric disagrees with its labels."""

    WARN = "warn"
    FAIL = "fail"


# A node-label key ("prefix/name", Kubernetes' qualified-name length bounds)
LabelKeyName = Annotated[str, Field(min_length=1, max_length=317, pattern=r"^[^\s=,]+$")]


# A Kubernetes object name (DNS subdomain)
ObjectName = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]


class KueueTopologyPublication(_Spec):
    """`spec.topology.publishKueueTopology`: keep a Kueue `Topology` object generated from the
    levels in use (netval.operator.topology.kueue_writer; docs/topology.md, "Kueue")."""

    enabled: bool = False
    # The Topology's name; null: netval-<validation>
    name: ObjectName | None = None


class TopologySpec(_Spec):
    """`spec.topology` (issue 21; docs/topology.md): discovery and verification."""

    # Read LLDP frames on the judged fabric netdevs (needs CAP_NET_RAW, or a local lldpd)
    lldp: bool = False
    # The node-label keys of the declared topology, top level first; empty: auto-detected
    # from the common schemes (netval.model.topology.LEVEL_SCHEMES)
    levels: Annotated[list[LabelKeyName], Field(max_length=8)] = Field(default_factory=list)
    agreement: TopologyVerdict = TopologyVerdict.WARN
    # Trace the router hops toward east-west peers (peers.enabled; unprivileged UDP probes)
    paths: bool = False
    # Where no levels are declared: write topology.netval.io/leaf on the targeted Nodes from
    # discovery, only on change (netval.operator.topology.labels; docs/topology.md)
    publish_labels: bool = False
    publish_kueue_topology: KueueTopologyPublication = Field(
        default_factory=KueueTopologyPublication
    )

    @model_validator(mode="after")
    def _unique_levels(self) -> TopologySpec:
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"topology levels must be unique, got {self.levels}")
        return self
