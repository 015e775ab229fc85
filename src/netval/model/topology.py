"""Fabric topology as a node sees it (the report's `topology` section) and as the operator
folds it (`status.topology`); docs/topology.md states the schema and its bounds.

A report crosses a trust boundary: every text here comes from a switch's LLDP frames or a
local lldpd, so it is sanitised (printable characters only, cut to a bound) wherever the
model is built or parsed, the agent and the operator alike.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

MAX_TOPOLOGY_INTERFACES: Final = 64  # judged fabric netdevs per node (8 rails x bonds fit)
MAX_NEIGHBOURS_PER_INTERFACE: Final = 4  # one is normal; more means a hub or a leak
MAX_TEXT: Final = 255  # an LLDP string TLV carries at most 255 octets
MAX_REASON: Final = 512
REPLACEMENT: Final = "?"


def sanitise(text: str, limit: int = MAX_TEXT) -> str:
    """`text` with every non-printable character replaced and cut to `limit` characters:
    switch-supplied strings reach status, terminals and HTML."""
    return "".join(ch if ch.isprintable() else REPLACEMENT for ch in text[:limit])


def _clean(limit: int) -> AfterValidator:
    return AfterValidator(lambda text: sanitise(text, limit))


SwitchText = Annotated[str, Field(max_length=4 * MAX_TEXT), _clean(MAX_TEXT)]
Reason = Annotated[str, Field(max_length=4 * MAX_REASON), _clean(MAX_REASON)]


TOPOLOGY_LABEL_PREFIX: Final = "topology.netval.io/"  # every netval topology label key


class NetvalTopologyLabel(StrEnum):
    """netval's own level keys, written from discovery (docs/topology.md, "Publication")."""

    SPINE = "topology.netval.io/spine"
    LEAF = "topology.netval.io/leaf"


# The node-label schemes auto-detection knows, each top level first; the first scheme any
# targeted node carries a key of is used (docs/topology.md, "Levels").
LEVEL_SCHEMES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    # NVIDIA Topograph: tier-1 is the switch nearest the node
    (
        "topograph",
        tuple(f"fabric.topograph.run/tier-{n}" for n in (4, 3, 2, 1)),
    ),
    # GKE (compact placement / TAS): block, sub-block, host
    (
        "gke",
        (
            "cloud.google.com/gce-topology-block",
            "cloud.google.com/gce-topology-subblock",
            "cloud.google.com/gce-topology-host",
        ),
    ),
    # AWS EC2 instance topology: layer 1 is farthest from the instance
    (
        "aws",
        tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3, 4)),
    ),
    ("netval", (NetvalTopologyLabel.SPINE.value, NetvalTopologyLabel.LEAF.value)),
)


def auto_level_keys() -> tuple[str, ...]:
    """Every key auto-detection may choose (what a Node cache must keep to detect levels)."""
    return tuple(key for _, keys in LEVEL_SCHEMES for key in keys)


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class NeighbourSource(StrEnum):
    FRAMES = "frames"  # LLDP frames the agent received itself (AF_PACKET)
    LLDPD = "lldpd"  # the node's own lldpd (lldpcli -f json show neighbors)


class LldpNeighbour(_Model):
    """One LLDP neighbour of one netdev: the switch and the switch port it is cabled to."""

    chassis_id: SwitchText
    port_id: SwitchText
    system_name: SwitchText | None = None
    port_description: SwitchText | None = None
    ttl_seconds: Annotated[int, Field(ge=0, le=65535)] = 0
    source: NeighbourSource = NeighbourSource.FRAMES

    @property
    def switch(self) -> str:
        """What identifies the switch: its system name, else its chassis id."""
        return self.system_name or self.chassis_id


class InterfaceTopology(_Model):
    """What one judged fabric netdev sees: its LLDP neighbour(s), or why none."""

    interface: Annotated[str, Field(min_length=1, max_length=15), _clean(15)]
    neighbours: Annotated[list[LldpNeighbour], Field(max_length=MAX_NEIGHBOURS_PER_INTERFACE)] = (
        Field(default_factory=list)
    )
    # set exactly when `neighbours` is empty: why nothing was seen (and what commonly causes it)
    none_reason: Reason | None = None
    # the IPv4 next-hop router of a route through this netdev (routed fabrics), if any
    next_hop: Annotated[str, Field(max_length=64), _clean(64)] | None = None

    @property
    def switch(self) -> str | None:
        return self.neighbours[0].switch if self.neighbours else None


MAX_PATHS: Final = 16
MAX_HOPS: Final = 16

Hop = Annotated[str, Field(max_length=64), _clean(64)] | None


class L3Path(_Model):
    """The router hops toward one east-west peer (TTL-limited UDP probes, IP_RECVERR)."""

    peer: Annotated[str, Field(min_length=1, max_length=253), _clean(253)]
    destination: Annotated[str, Field(max_length=64), _clean(64)]
    hops: Annotated[list[Hop], Field(max_length=MAX_HOPS)] = Field(default_factory=list)
    reached: bool = False


class TopologyReport(_Model):
    """The report's `topology` section: one entry per judged fabric netdev."""

    interfaces: Annotated[list[InterfaceTopology], Field(max_length=MAX_TOPOLOGY_INTERFACES)] = (
        Field(default_factory=list)
    )
    # why LLDP is not read at all on this node (no CAP_NET_RAW and no lldpd), if so
    unavailable: Reason | None = None
    # spec.topology.paths: router hops toward a few east-west peers (the latest of each)
    paths: Annotated[list[L3Path], Field(max_length=MAX_PATHS)] = Field(default_factory=list)


# -- status.topology: the operator's aggregate (bounded: aggregates only, never per node pair) --

MAX_DOMAINS_PER_LEVEL: Final = 96
MAX_NAMED_NODES: Final = 10
MAX_LISTED_DISAGREEMENTS: Final = 20


class _Out(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class LevelDomain(_Out):
    name: str
    nodes: Annotated[int, Field(ge=0)]


class LevelSummary(_Out):
    """One level: how many domains, their sizes, and the first domains by name."""

    key: str
    domains: Annotated[int, Field(ge=0)]
    min_nodes: Annotated[int, Field(ge=0)] = 0
    max_nodes: Annotated[int, Field(ge=0)] = 0
    unlabelled: Annotated[int, Field(ge=0)] = 0  # targeted nodes without this label
    listed: Annotated[list[LevelDomain], Field(max_length=MAX_DOMAINS_PER_LEVEL)] = Field(
        default_factory=list
    )


class Undiscovered(_Out):
    """Nodes reporting a topology section with no neighbour on some judged netdev."""

    count: Annotated[int, Field(ge=0)] = 0
    nodes: Annotated[list[str], Field(max_length=MAX_NAMED_NODES)] = Field(default_factory=list)
    example: str | None = None  # one node's reason, e.g. the firmware LLDP agent hint


class DisagreementEntry(_Out):
    node: str
    interface: str
    declared: str
    seen: str
    expected: str | None = None


class ConflictEntry(_Out):
    """A domain whose nodes see more than one switch on one netdev."""

    domain: str
    interface: str
    switches: dict[str, int]  # at most 8 (the fold cuts it; the CRD says maxProperties)


MAX_DOMAIN_PAIRS: Final = 32


class DomainPair(_Out):
    """The latest measured figures between two domains of the east-west level (a < b):
    from the continuous samples and, when a NetworkLoadTest ran, from its last run."""

    a: str
    b: str
    pairs: Annotated[int, Field(ge=0)] = 0  # node pairs sampled (continuous samples)
    capacity_ratio: float | None = None  # intra / cross throughput of lone flows (4.0: 4:1)
    latency_p99_ms: float | None = None
    loss_percent: float | None = None
    oversubscription: float | None = None  # NetworkLoadTest: every node sending at once
    loaded_latency_p99_ms: float | None = None


class TopologyStatus(_Out):
    levels: Annotated[list[LevelSummary], Field(max_length=8)] = Field(default_factory=list)
    levels_source: str = "none"  # "declared" (spec.topology.levels), "detected" or "none"
    discovered: Annotated[int, Field(ge=0)] = 0  # nodes with a neighbour on every netdev
    undiscovered: Undiscovered = Field(default_factory=Undiscovered)
    disagreements: Annotated[int, Field(ge=0)] = 0
    listed_disagreements: Annotated[
        list[DisagreementEntry], Field(max_length=MAX_LISTED_DISAGREEMENTS)
    ] = Field(default_factory=list)
    conflicts: Annotated[int, Field(ge=0)] = 0
    listed_conflicts: Annotated[list[ConflictEntry], Field(max_length=MAX_LISTED_DISAGREEMENTS)] = (
        Field(default_factory=list)
    )
    # per domain pair of the east-west level (peers.topologyKey's), worst first
    pairs_key: str | None = None
    domain_pairs: Annotated[list[DomainPair], Field(max_length=MAX_DOMAIN_PAIRS)] = Field(
        default_factory=list
    )
    omitted_pairs: Annotated[int, Field(ge=0)] = 0
    load_test: str | None = None  # "<NetworkLoadTest>/<run id>" the load figures come from


__all__ = [
    "LEVEL_SCHEMES",
    "MAX_NEIGHBOURS_PER_INTERFACE",
    "MAX_TEXT",
    "MAX_TOPOLOGY_INTERFACES",
    "TOPOLOGY_LABEL_PREFIX",
    "ConflictEntry",
    "DisagreementEntry",
    "DomainPair",
    "InterfaceTopology",
    "L3Path",
    "LevelDomain",
    "LevelSummary",
    "LldpNeighbour",
    "NeighbourSource",
    "NetvalTopologyLabel",
    "TopologyReport",
    "TopologyStatus",
    "Undiscovered",
    "auto_level_keys",
    "sanitise",
]
