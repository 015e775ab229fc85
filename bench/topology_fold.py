"""Topology costs: the operator's fold for 10,000 nodes, and the agent's per-frame and
per-cycle discovery cost.

Run from the repository root:

    python bench/topology_fold.py                 # 10,000 nodes, 8 rails each
    python bench/topology_fold.py --nodes 2000

Operator: `fold_topology` (netval.operator.topology.summary) over 10,000 nodes, each with
8 rail netdevs and an LLDP neighbour on each, two declared levels (a spine group of 512
nodes, a leaf domain of 32), 1% of nodes recabled (one rail on another leaf) and 1% with no
neighbour on one rail. Reported: the median of --repeat runs, and the size of the
`status.topology` JSON it produces (the CRD status must stay well under 64 KiB).

Agent: the LLDP listener sleeps in the event loop (`add_reader` on one AF_PACKET socket), so
an idle listener costs no CPU; each frame costs one parse (timed here on a 3-TLV+name
frame), and each cycle one `TopologyDiscovery.section` build for 8 netdevs (timed here
without the socket: the per-cycle work is the table lookups and the section model), and
one L3 probe (`trace` to loopback: one UDP datagram, its ICMP port-unreachable read from the
error queue); a path of h routers costs h + 1 probes, and each silent hop 0.5 s of waiting
on the tracer's own task (no CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

from netval.agent.topology.discovery import topology_section
from netval.agent.topology.listener import LldpListener
from netval.agent.topology.lldp_frames import parse_lldpdu, tlv
from netval.model.spec import TopologySpec
from netval.model.topology import InterfaceTopology, LldpNeighbour, TopologyReport
from netval.operator.topology.agreement import NetdevView, netdev_views
from netval.operator.topology.summary import fold_topology

RAILS = 8
LEAF_SIZE = 32
SPINE_SIZE = 512


def fleet(
    nodes: int,
) -> tuple[list[str], dict[str, dict[str, str]], dict[str, tuple[NetdevView, ...]]]:
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    labels: dict[str, dict[str, str]] = {}
    seen: dict[str, tuple[NetdevView, ...]] = {}
    for i, node in enumerate(names):
        leaf = i // LEAF_SIZE
        labels[node] = {"x/spine": f"sg-{i // SPINE_SIZE}", "x/leaf": f"blk-{leaf}"}
        interfaces = []
        for rail in range(RAILS):
            switch = f"leaf-{leaf}-r{rail}"
            if i % 100 == 7 and rail == 3:
                switch = f"leaf-{leaf + 1}-r{rail}"  # recabled
            gone = i % 100 == 11 and rail == 5
            interfaces.append(
                InterfaceTopology(
                    interface=f"rail{rail}",
                    neighbours=[]
                    if gone
                    else [
                        LldpNeighbour(
                            chassis_id=f"02:00:00:00:{leaf % 256:02x}:{rail:02x}",
                            port_id=f"Ethernet{i % LEAF_SIZE}",
                            system_name=switch,
                            ttl_seconds=120,
                        )
                    ],
                    none_reason="no LLDP frame in 120s of listening" if gone else None,
                )
            )
        # as the operator holds it (NodeRecord.topology): plain tuples
        seen[node] = netdev_views(TopologyReport(interfaces=interfaces))
    return names, labels, seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    names, labels, seen = fleet(args.nodes)
    spec = TopologySpec(levels=["x/spine", "x/leaf"])
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        fold = fold_topology(spec, names, labels, seen)
        times.append(time.perf_counter() - t0)
    size = len(fold.status.model_dump_json(by_alias=True, exclude_none=True))
    print(
        f"operator fold: {args.nodes} nodes x {RAILS} rails: median "
        f"{statistics.median(times) * 1000:.0f} ms over {args.repeat} runs; "
        f"status.topology {size / 1024:.1f} KiB; disagreements {fold.status.disagreements}, "
        f"conflicts {fold.status.conflicts}, undiscovered {fold.status.undiscovered.count}"
    )

    frame = b"".join(
        [
            tlv(1, bytes([4]) + bytes.fromhex("02aabbccddee")),
            tlv(2, b"\x05Ethernet12"),
            tlv(3, (120).to_bytes(2, "big")),
            tlv(4, b"to gpu-00001 rail0"),
            tlv(5, b"leaf-17-r0"),
            tlv(0, b""),
        ]
    )
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        parse_lldpdu(frame)
    per_frame = (time.perf_counter() - t0) / n
    listener = LldpListener()
    netdevs = [f"rail{r}" for r in range(RAILS)]
    listener.watch(netdevs)
    for name in netdevs:
        listener.on_frame(name, frame)
    cycles = 2_000
    t0 = time.perf_counter()
    for _ in range(cycles):
        frames = {d: listener.neighbours(d) for d in netdevs}
        topology_section(netdevs, frames, {}, listened=60.0, lldpd_error=None, drivers={})
    per_cycle = (time.perf_counter() - t0) / cycles
    print(
        f"agent: {per_frame * 1e6:.1f} us per LLDP frame parsed; {per_cycle * 1e6:.0f} us per "
        f"cycle for the section of {RAILS} netdevs (one frame per netdev per 30 s by default: "
        f"{RAILS * per_frame / 30 * 100:.5f}% of a core)"
    )


def trace_cost(rounds: int = 200) -> None:
    """One probe answered at once (loopback: port unreachable at TTL 1): the CPU of a probe
    and its ICMP read; a path of h routers costs h + 1 of them."""
    from netval.agent.topology.l3path import trace

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    for _ in range(rounds):
        assert trace("127.0.0.1").reached
    wall = (time.perf_counter() - t0) / rounds
    cpu = (time.process_time() - cpu0) / rounds
    print(
        f"agent: one answered UDP probe (trace to loopback): {wall * 1e6:.0f} us wall, "
        f"{cpu * 1e6:.0f} us CPU"
    )


if __name__ == "__main__":
    main()
    trace_cost()
