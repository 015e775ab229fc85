"""The east-west summary in the NetworkValidation status (`status.eastWest`).

Computed by the operator (`netval.operator.state.east_west_matrix`) from the agents'
``peer.*`` results; read by `netval status`. Bounded: at most `MAX_CELLS` domain-pair cells (flagged and failing
cells kept first), `MAX_FLAGGED` flagged pairs, `MAX_SUSPECTS` suspect nodes and
`MAX_LINK_SUSPECTS` suspect links (`netval.operator.state.localize`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from pydantic.alias_generators import to_camel

UNASSIGNED: Final = "(unassigned)"  # the domain of nodes without the topology label
MAX_CELLS: Final = 136  # every pair of 16 domains (16 x 17 / 2); ~34 KiB at most
MAX_FLAGGED: Final = 32
MAX_SUSPECTS: Final = 10
MAX_SUSPECT_CHECKS: Final = 4
MAX_LINK_SUSPECTS: Final = 8


class _Out(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Cell(_Out):
    """One unordered domain pair (a <= b; a == b: inside one domain): medians of its pairs."""

    a: str
    b: str
    pairs: Annotated[int, Field(ge=0)]  # node pairs with a measurement in this cell
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    loss_percent: float | None = None
    path_mtu: Annotated[int | None, Field(alias="pathMTU")] = None
    throughput_mbps: float | None = None
    throughput_samples: int = 0
    throughput_ratio: float | None = None  # cross cells only
    # 1 / throughput_ratio: a path capacity ratio of lone flows (4.0 reads 4:1), not
    # oversubscription, which needs concurrent flows (NetworkLoadTest measures it)
    capacity_ratio: float | None = None
    failing: int = 0  # failing latency/loss/path-MTU results
    flagged: bool = False

    @property
    def intra(self) -> bool:
        return self.a == self.b


class FlaggedPair(_Out):
    """A cross-domain cell whose throughput ratio is below minThroughputRatio."""

    a: str
    b: str
    throughput_ratio: float
    capacity_ratio: float


class Suspect(_Out):
    """A node whose probes fail to many peers while those peers pass with others."""

    node: str
    domain: str
    failing_peers: int
    peers: int
    checks: Annotated[list[str], Field(max_length=MAX_SUSPECT_CHECKS)]
    # failing peers / peers, times how well its bad peers do elsewhere (1: perfectly)
    confidence: Annotated[float, Field(ge=0, le=1)] = 0.0


class LinkKind(StrEnum):
    UPLINK = "uplink"  # domain `a`'s way out: its cross-domain paths fail, to every domain
    DOMAIN_PAIR = "domainPair"  # the fabric between domains `a` and `b` (either uplink, or
    # the spine between them: with two domains nothing separates them)


class LinkSuspect(_Out):
    """A shared link whose paths fail while the paths around it do not (network tomography:
    the failing node pairs through it, the node pairs around it as the witnesses)."""

    kind: LinkKind
    a: str
    b: str | None = None  # the other domain of a domainPair
    failing_paths: Annotated[
        int, Field(ge=0)
    ]  # node pairs through it with a failing latency/loss/path-MTU result
    paths: Annotated[int, Field(ge=0)]  # node pairs through it with a result
    failing_around: Annotated[
        int, Field(ge=0)
    ]  # node pairs around it (inside its domains, between other domains)
    paths_around: Annotated[int, Field(ge=0)]
    checks: Annotated[list[str], Field(max_length=MAX_SUSPECT_CHECKS)]
    confidence: Annotated[float, Field(ge=0, le=1)]  # share failing through x share fine around


class EastWest(_Out):
    domains: int
    nodes: int
    min_throughput_ratio: float
    cells: Annotated[list[Cell], Field(max_length=MAX_CELLS)]
    omitted_cells: int = 0  # cells left out to respect MAX_CELLS
    flagged: Annotated[list[FlaggedPair], Field(max_length=MAX_FLAGGED)] = Field(
        default_factory=list
    )
    suspects: Annotated[list[Suspect], Field(max_length=MAX_SUSPECTS)] = Field(default_factory=list)
    link_suspects: Annotated[list[LinkSuspect], Field(max_length=MAX_LINK_SUSPECTS)] = Field(
        default_factory=list
    )
    # nodes whose failing path results all point at a suspect elsewhere: observers, whose
    # path results do not make them degraded (`gating.verdict`, Why.OBSERVER)
    observers: int = 0
    failing_pairs: int = 0  # node pairs with a failing latency/loss/path-MTU result
    unexplained_failing_pairs: int = 0  # of those, not explained by a suspect (node or link)

    def cell(self, a: str, b: str) -> Cell | None:
        lo, hi = sorted((a, b))
        return next((c for c in self.cells if (c.a, c.b) == (lo, hi)), None)

    def to_status(self) -> dict[str, JsonValue]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
