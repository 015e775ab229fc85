"""The east-west wire formats between agents and the operator (untrusted on both sides).

- `EndpointPayload`: what an agent announces, retained, on its own ``endpoint`` topic. Only
  the operator reads it (issue 24: an agent reading every endpoint received N of them
  after every broker restart, N^2 across the fleet).
- `AssignmentPayload`: the operator's retained per-node ``assignment``: the node's domain
  and, with peers enabled, the endpoints of the peers it probes in this epoch and the
  throughput slots it samples in (`netval.operator.ingest.peer_sets`). Unknown keys are
  ignored, so the storage schedule (`storage`) shares the message.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, IPvAnyAddress

# The largest assignment either side accepts: below the broker's default max_packet_size
# (MAX_REPORT_PACKET_BYTES) with room for the topic, and above the largest peer set the
# operator builds (MAX_ASSIGNED_PEERS entries of at most ~120 bytes each).
MAX_ASSIGNMENT_BYTES: Final = 1 << 20
MAX_ASSIGNED_PEERS: Final = 4096
MAX_THROUGHPUT_SLOTS: Final = 1024
# Peer probes and throughput samples run in wall-clock slots of the agent interval, at
# least this long; both sides compute epochs and slots from it.
MIN_SLOT_SECONDS: Final = 5.0

LabelValue = Annotated[str | None, Field(max_length=63)]
DomainKey = Annotated[str, Field(max_length=63)]  # "": nodes without a known domain
NodeName = Annotated[str, Field(min_length=1, max_length=253)]
Port = Annotated[int, Field(ge=1, le=65535)]


# A load-test rail as announced: [interface name, address, has an RDMA port].
RailEndpoint = tuple[Annotated[str, Field(min_length=1, max_length=15)], IPvAnyAddress, bool]
MAX_ANNOUNCED_RAILS: Final = 16


class EndpointPayload(BaseModel):
    """What an agent announces. Unknown keys are ignored so newer agents can add some."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    address: IPvAnyAddress
    port: Port
    domain: LabelValue = None
    # its load-test rails in order, and other interfaces a load test may name
    # (netval.agent.loadtest.rails); bounded: 16 of each
    rails: Annotated[list[RailEndpoint], Field(max_length=MAX_ANNOUNCED_RAILS)] = Field(
        default_factory=list
    )
    interfaces: Annotated[list[RailEndpoint], Field(max_length=MAX_ANNOUNCED_RAILS)] = Field(
        default_factory=list
    )


class AssignmentPayload(BaseModel):
    """What the operator tells one agent (docs/checks.md, "East-west")."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    domain: LabelValue = None
    epoch: Annotated[int, Field(ge=0)] = 0
    # the fleet's domains (with an announced endpoint): the throughput rotation's length,
    # which a sample's lifetime follows; the peer set holds only some of them
    domains: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    # domain -> [node, address, port] of each peer this node may probe or sample this epoch
    peers: dict[DomainKey, list[tuple[NodeName, IPvAnyAddress, Port]]] = Field(default_factory=dict)
    # [slot, node]: the wall-clock throughput slots in which this node samples a peer
    throughput: Annotated[
        list[tuple[Annotated[int, Field(ge=0)], NodeName]],
        Field(max_length=MAX_THROUGHPUT_SLOTS),
    ] = Field(default_factory=list)

    def peer_count(self) -> int:
        return sum(len(members) for members in self.peers.values())
