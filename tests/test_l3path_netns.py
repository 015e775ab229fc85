"""L3 path discovery on a routed namespace fabric: node -> leaf router -> spine router ->
leaf router -> node. The tracing process runs unprivileged (no CAP_NET_RAW), as the agent
does: TTL-limited UDP probes, the routers' ICMP read from the error queue (IP_RECVERR)."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import pytest

from netns import namespace, unprivileged_argv
from netval.agent.topology.l3path import next_hops, parse_error
from netval.model.topology import TopologyReport
from netval.operator.topology.routed import route_view, spine_blocks
from test_peers_netns import ip

pytestmark = [pytest.mark.netns, pytest.mark.timeout(60)]

TRACE = """
import json, sys
from netval.agent.topology.l3path import read_next_hops, trace
t = trace(sys.argv[1], wait=1.0)
print(json.dumps({"hops": list(t.hops), "reached": t.reached, "next": read_next_hops()}))
"""


SECTION = """
import asyncio, json
from netval.agent.topology.discovery import TopologyDiscovery
from netval.model.snapshot import Netdev, Sample
from netval.model.spec import Checks, TopologySpec

async def main():
    discovery = TopologyDiscovery(peer_addresses=lambda: {"b": "10.1.2.2"})
    sample = Sample(netdevs={"f0": Netdev(name="f0")}, rdma={})
    checks = Checks.model_validate({"link": {"interfaces": ["f0"]}})
    spec = TopologySpec(paths=True)
    for _ in range(100):
        section = await discovery.section(sample, checks, spec)
        if section.paths:
            break
        await asyncio.sleep(0.05)
    discovery.close()
    print(section.model_dump_json(by_alias=True))

asyncio.run(main())
"""


def test_a_routed_path_names_the_leaf_and_spine_routers() -> None:
    with contextlib.ExitStack() as stack:
        a, leaf_a, spine, leaf_b, b = (stack.enter_context(namespace()) for _ in range(5))
        links = [  # (ns, ifname, address, peer ns, peer ifname, peer address)
            (a, "f0", "10.1.1.2/24", leaf_a, "down0", "10.1.1.1/24"),
            (leaf_a, "up0", "10.0.1.1/30", spine, "d1", "10.0.1.2/30"),
            (spine, "d2", "10.0.2.2/30", leaf_b, "up0", "10.0.2.1/30"),
            (leaf_b, "down0", "10.1.2.1/24", b, "f0", "10.1.2.2/24"),
        ]
        for ns, ifname, address, peer, peer_ifname, peer_address in links:
            ip(ns, "link", "add", ifname, "type", "veth", "peer", "name", peer_ifname,
               "netns", peer.name)  # fmt: skip
            ip(ns, "addr", "add", address, "dev", ifname)
            ip(peer, "addr", "add", peer_address, "dev", peer_ifname)
            ip(ns, "link", "set", ifname, "up")
            ip(peer, "link", "set", peer_ifname, "up")
        for router in (leaf_a, spine, leaf_b):
            assert router.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"]).returncode == 0
        ip(a, "route", "add", "default", "via", "10.1.1.1")
        ip(b, "route", "add", "default", "via", "10.1.2.1")
        ip(leaf_a, "route", "add", "default", "via", "10.0.1.2")
        ip(leaf_b, "route", "add", "default", "via", "10.0.2.2")
        ip(spine, "route", "add", "10.1.1.0/24", "via", "10.0.1.1")
        ip(spine, "route", "add", "10.1.2.0/24", "via", "10.0.2.1")

        done = a.run(unprivileged_argv([sys.executable, "-c", TRACE, "10.1.2.2"]), timeout=30)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result == {
            "hops": ["10.1.1.1", "10.0.1.2", "10.0.2.1"],
            "reached": True,
            "next": {"f0": "10.1.1.1"},
        }
        # the agent's section: the next hop per netdev and the path to a peer, unprivileged
        done = a.run(unprivileged_argv([sys.executable, "-c", SECTION]), timeout=30)
        assert done.returncode == 0, done.stderr
        section = json.loads(done.stdout)
        assert section["interfaces"] == [
            {
                "interface": "f0",
                "neighbours": [],
                "noneReason": "LLDP is not read: spec.topology.lldp is off",
                "nextHop": "10.1.1.1",
            }
        ]
        assert section["paths"] == [
            {
                "peer": "b",
                "destination": "10.1.2.2",
                "hops": ["10.1.1.1", "10.0.1.2", "10.0.2.1"],
                "reached": True,
            }
        ]
        # what publication reads of it: the next hop (leaf) and the spine of the cross-leaf path
        view = route_view(TopologyReport.model_validate(section))
        assert view == (("10.1.1.1",), ("10.0.1.2",))
        # an address nobody routes to: the leaf says unreachable, or nothing answers
        done = a.run(unprivileged_argv([sys.executable, "-c", TRACE, "10.9.9.9"]), timeout=30)
        lost = json.loads(done.stdout)
        assert lost["reached"] is False and lost["hops"][:2] == ["10.1.1.1", "10.0.1.2"]


def test_route_table_text_gives_each_netdev_its_gateway() -> None:
    table = (
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "f0\t00000000\t0101010A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "f0\t0001010A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "f1\t0000080A\t0102010A\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
        "junk line\n"
    )
    assert next_hops(table) == {"f0": "10.1.1.1", "f1": "10.1.2.1"}
    assert next_hops("") == {}
    assert parse_error([(0, 11, b"short")]) is None


def routed_fabric(stack: contextlib.ExitStack, spine_source: str | None) -> tuple[Any, Any]:
    """a -> leaf A -> spine -> leaf B -> b; with `spine_source` the spine answers from that
    loopback address (its routes' preferred source), else from each link's own address."""
    a, leaf_a, spine, leaf_b, b = (stack.enter_context(namespace()) for _ in range(5))
    links = [
        (a, "f0", "10.1.1.2/24", leaf_a, "down0", "10.1.1.1/24"),
        (leaf_a, "up0", "10.0.1.1/30", spine, "d1", "10.0.1.2/30"),
        (spine, "d2", "10.0.2.2/30", leaf_b, "up0", "10.0.2.1/30"),
        (leaf_b, "down0", "10.1.2.1/24", b, "f0", "10.1.2.2/24"),
    ]
    for ns, ifname, address, peer, peer_ifname, peer_address in links:
        ip(ns, "link", "add", ifname, "type", "veth", "peer", "name", peer_ifname,
           "netns", peer.name)  # fmt: skip
        ip(ns, "addr", "add", address, "dev", ifname)
        ip(peer, "addr", "add", peer_address, "dev", peer_ifname)
        ip(ns, "link", "set", ifname, "up")
        ip(peer, "link", "set", peer_ifname, "up")
    for router in (leaf_a, spine, leaf_b):
        assert router.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"]).returncode == 0
    ip(a, "route", "add", "default", "via", "10.1.1.1")
    ip(b, "route", "add", "default", "via", "10.1.2.1")
    ip(leaf_a, "route", "add", "default", "via", "10.0.1.2")
    ip(leaf_b, "route", "add", "default", "via", "10.0.2.2")
    source = ["src", spine_source] if spine_source else []
    if spine_source:
        ip(spine, "link", "set", "lo", "up")
        ip(spine, "addr", "add", f"{spine_source}/32", "dev", "lo")
    ip(spine, "route", "add", "10.1.1.0/24", "via", "10.0.1.1", *source)
    ip(spine, "route", "add", "10.1.2.0/24", "via", "10.0.2.1", *source)
    return a, b


def spines_seen(node: Any, destination: str) -> list[str]:
    done = node.run(unprivileged_argv([sys.executable, "-c", TRACE, destination]), timeout=30)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    report = TopologyReport.model_validate(
        {
            "interfaces": [{"interface": "f0", "noneReason": "off", "nextHop": result["next"]["f0"]}],
            "paths": [{"peer": "p", "destination": destination, "hops": result["hops"],
                       "reached": result["reached"]}],
        }
    )  # fmt: skip
    view = route_view(report)
    assert view is not None
    return list(view[1])


@pytest.mark.parametrize("loopback", [True, False])
def test_the_spine_block_is_named_only_when_the_spine_answers_from_one_address(
    loopback: bool,
) -> None:
    with contextlib.ExitStack() as stack:
        a, b = routed_fabric(stack, "10.255.0.1" if loopback else None)
        seen = {"a": spines_seen(a, "10.1.2.2"), "b": spines_seen(b, "10.1.1.2")}
    # their next hops: two leaves; a block needs two nodes of a leaf to agree, and a second
    # node of each leaf would trace the same path
    leaves = {"a": "10.1.1.1", "a2": "10.1.1.1", "b": "10.1.2.1", "b2": "10.1.2.1"}
    both = seen | {"a2": seen["a"], "b2": seen["b"]}
    if loopback:
        assert seen == {"a": ["10.255.0.1"], "b": ["10.255.0.1"]}
        assert spine_blocks(both, leaves, {}) == dict.fromkeys(both, "10.255.0.1")
        assert spine_blocks(seen, leaves, {}) == {}  # one node per leaf: nobody agrees
    else:  # per-link addresses: each leaf sees its own, so no block is named
        assert seen == {"a": ["10.0.1.2"], "b": ["10.0.2.2"]}
        assert spine_blocks(both, leaves, {}) == {}
