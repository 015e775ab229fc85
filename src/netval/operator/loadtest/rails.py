"""The rails of a run's participants, from their announced endpoints. Pure.

A node announces its rails in order (`[name, address, rdma]`, netval.agent.loadtest.rails)
and other interfaces a load test may name. A run's rail i of a node is:

- with the load test's `eastWest.interfaces`: the node's announced interface of that name
  (a rail or another interface), absent if it announced none of that name;
- else its announced rail i; a node that announced no rails (an agent without them) has one
  rail, its responder's address (the responder binds the first rail); a node that announced
  nothing at all is planned on every rail asked for, so its absence counts (NotMeasured).

Flows run rail i to rail i (rail-optimised fabrics): on the rails both ends have. Each
node's rails are a bit mask (`NodeRails`), so a run of 10,000 nodes holds two ints per node;
the addresses are read from the endpoint table when a stage is published.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from netval.model.loadplan import Engine
from netval.model.loadtest import MAX_RAILS, LoadEngine
from netval.operator.ingest.peer_sets import Address, AnnouncedRails

NO_RAILS: Final = ((), ())


@dataclass(frozen=True, slots=True)
class NodeRails:
    mask: int  # bit i: the node has rail i
    rdma: int  # bit i: its rail i has an RDMA port

    @property
    def count(self) -> int:
        return self.mask.bit_count()


def addresses(
    interfaces: Sequence[str], announced: AnnouncedRails | None, endpoint: Address | None
) -> list[tuple[str, bool] | None]:
    """A node's rails for a run, by index: (address, rdma), None where it has none."""
    rails, others = announced or NO_RAILS
    if interfaces:
        by_name = {name: (address, rdma) for name, address, rdma in (*others, *rails)}
        return [by_name.get(name) for name in interfaces[:MAX_RAILS]]
    if rails:
        return [(address, rdma) for _name, address, rdma in rails[:MAX_RAILS]]
    return [(endpoint[0], False)] if endpoint is not None else []


def node_rails(found: Sequence[tuple[str, bool] | None]) -> NodeRails:
    mask = rdma = 0
    for i, rail in enumerate(found[:MAX_RAILS]):
        if rail is not None:
            mask |= 1 << i
            if rail[1]:
                rdma |= 1 << i
    return NodeRails(mask, rdma)


def rails_of(
    nodes: Sequence[str],
    interfaces: Sequence[str],
    announced: Mapping[str, AnnouncedRails],
    endpoints: Mapping[str, Address],
) -> dict[str, NodeRails]:
    """Each node's rails. A node that announced nothing is taken to have every rail asked
    for (the named interfaces, else one): its flows are planned, fail, and count as not
    measured, rather than vanish from the plan."""
    out: dict[str, NodeRails] = {}
    for n in nodes:
        said, endpoint = announced.get(n), endpoints.get(n)
        if said is None and endpoint is None:
            out[n] = NodeRails(mask=(1 << min(len(interfaces), MAX_RAILS)) - 1 or 1, rdma=0)
        else:
            out[n] = node_rails(addresses(interfaces, said, endpoint))
    return out


def common_rails(a: NodeRails, b: NodeRails) -> list[int]:
    both = a.mask & b.mask
    return [i for i in range(MAX_RAILS) if both >> i & 1]


def rail_engine(setting: LoadEngine, a: NodeRails, b: NodeRails, rail: int) -> Engine:
    """The engine of rail `rail` between `a` and `b`: `auto` is perftest when both ends'
    rail is an RDMA port (RoCE, InfiniBand), iperf3 otherwise."""
    if setting is LoadEngine.PERFTEST:
        return Engine.PERFTEST
    if setting is LoadEngine.IPERF3:
        return Engine.IPERF3
    return Engine.PERFTEST if (a.rdma & b.rdma) >> rail & 1 else Engine.IPERF3
