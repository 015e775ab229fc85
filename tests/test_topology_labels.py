"""Publication of discovered topology as Node labels (spec.topology.publishLabels): the pure
plan, and through the real operator (Kopf, the kmock API, a real broker) with recorded
reports carrying a topology section: Node writes are counted, steady state makes none."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model.spec import NetworkValidationSpec
from netval.model.topology import InterfaceTopology, LldpNeighbour, TopologyReport
from netval.operator.term_runtime import OperatorRuntime
from netval.operator.topology.agreement import peer_topology_key
from netval.operator.topology.labels import (
    desired_leaves,
    label_value,
    leaf_of,
    plan_label_changes,
    publishes,
)
from operator_env import NODES, NV, publish, report, report_msg, validation
from test_operator import scrape

LEAF = "topology.netval.io/leaf"
VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SPEC = {"topology": {"lldp": True, "publishLabels": True}, "gating": {"nodeLabel": False}}


@given(st.text(max_size=300))
def test_any_switch_name_gives_a_valid_label_value(name: str) -> None:
    value = label_value(name)
    assert len(value) <= 63 and VALUE.match(value)


def test_a_clean_name_is_kept_and_a_changed_one_gets_a_hash() -> None:
    assert label_value("leaf-1.dc2") == "leaf-1.dc2"
    assert label_value("leaf 1") != label_value("leaf/1")  # alike once cleaned: hashes differ
    assert label_value("leaf 1").startswith("leaf-1-")
    long = label_value("x" * 200)
    assert len(long) == 63 and long.startswith("x" * 54 + "-")


def test_the_leaf_is_the_set_of_rail_switches_and_only_when_every_netdev_sees_one() -> None:
    assert leaf_of([("ens1", "leaf-1", "Eth1", None)]) == "leaf-1"
    rails = [("ens2", "rail-b", "p", None), ("ens1", "rail-a", "p", None)]
    assert leaf_of(rails) == leaf_of(list(reversed(rails)))
    assert leaf_of([*rails, ("ens3", None, "", "no LLDP")]) is None
    assert leaf_of([]) is None


def test_the_plan_writes_changes_only_and_removes_where_nothing_publishes() -> None:
    current = {"a": {LEAF: "leaf-1"}, "b": {}, "c": {LEAF: "leaf-1"}, "d": {LEAF: "old"}}
    desired = desired_leaves([{"a": [("e", "leaf-1", "", None)], "b": [("e", "leaf-2", "", None)]}])
    changes = plan_label_changes(current, desired, frozenset({"a", "b", "c"}))
    # a: unchanged; b: new; c: targeted, no discovery: left; d: no longer published: removed
    assert changes == {"b": {LEAF: "leaf-2"}, "d": {LEAF: None}}
    assert plan_label_changes({"a": {LEAF: "leaf-1"}}, {"a": "leaf-1"}, frozenset("a")) == {}


def test_publication_is_opt_in_and_only_where_nothing_is_declared() -> None:
    on = NetworkValidationSpec.model_validate({"topology": {"publishLabels": True}})
    assert not publishes(NetworkValidationSpec(), [{}])
    assert publishes(on, [{}])
    assert publishes(on, [{LEAF: "leaf-1"}])  # its own labels are no declaration
    assert not publishes(on, [{"fabric.topograph.run/tier-1": "s1"}])
    declared = on.model_copy(update={"topology": on.topology.model_copy(update={"levels": ["x"]})})
    assert not publishes(declared, [{}])


def test_peers_topology_key_defaults_to_the_published_leaf() -> None:
    assert peer_topology_key(NetworkValidationSpec(), [{LEAF: "leaf-1"}, {}]) == LEAF


def topology_report(node: str, switch: str | None) -> bytes:
    neighbours = [LldpNeighbour(chassis_id="02:aa", port_id="Eth1", system_name=switch)]
    iface = InterfaceTopology(
        interface="ens1np0",
        neighbours=neighbours if switch else [],
        none_reason=None if switch else "no LLDP frame within 120s",
    )
    r = report(node, started=datetime.now(UTC)).model_copy(
        update={"topology": TopologyReport(interfaces=[iface])}
    )
    return report_msg(r)[1]


def node_patches(cluster: KubeCluster, node: str) -> int:
    return sum(1 for m, p in cluster.requests() if m == "PATCH" and p == f"/api/v1/nodes/{node}")


def leaf_label(cluster: KubeCluster, node: str) -> str | None:
    labels = cluster.get("v1", "nodes", node)["metadata"].get("labels") or {}
    return labels.get(LEAF)


def test_labels_are_written_once_per_change(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, _ = operator
    writer = runtime.topology_labels
    seen = {"gpu-a": "leaf-1", "gpu-b": "leaf-1", "gpu-c": "leaf 2", "gpu-d": None}

    def send() -> None:
        publish(
            mosquitto_broker,
            [(f"netval/v1/pool-a/{n}/report", topology_report(n, s)) for n, s in seen.items()],
        )

    def settle() -> None:
        """Three more rounds of the writer after the watch echoed every write."""
        wait_for(lambda: not writer.written, what="writes watched back")
        start = writer.rounds
        wait_for(lambda: writer.rounds >= start + 3, what="three more rounds")

    cluster.create(validation(**SPEC))
    send()
    wait_for(
        lambda: (
            [leaf_label(cluster, n) for n in NODES[:3]]
            == ["leaf-1", "leaf-1", label_value("leaf 2")]
        ),
        timeout=30,
        what="leaf labels published",
    )
    settle()
    assert [node_patches(cluster, n) for n in NODES] == [1, 1, 1, 0]
    assert leaf_label(cluster, "gpu-d") is None  # no discovery: no label

    # Steady state: new reports seeing the same switches make no Node write at all.
    before = runtime.store.states["pool-a"].nodes["gpu-a"].reported_at
    send()
    wait_for(
        lambda: runtime.store.states["pool-a"].nodes["gpu-a"].reported_at != before,
        what="new reports ingested",
    )
    settle()
    assert [node_patches(cluster, n) for n in NODES] == [1, 1, 1, 0]
    assert "netval_operator_topology_label_writes_total 3.0" in scrape(runtime).splitlines()

    # gpu-b recabled to leaf-3: exactly one PATCH, to gpu-b.
    seen["gpu-b"] = "leaf-3"
    send()
    wait_for(lambda: leaf_label(cluster, "gpu-b") == "leaf-3", timeout=30, what="recabled")
    settle()
    assert [node_patches(cluster, n) for n in NODES] == [1, 2, 1, 0]

    # Publication turned off: the labels are removed, one PATCH per labelled node.
    cluster.patch(
        NV, "networkvalidations", "pool-a", {"spec": {"topology": {"publishLabels": False}}}
    )
    wait_for(lambda: all(leaf_label(cluster, n) is None for n in NODES), timeout=30, what="removed")
    settle()
    assert [node_patches(cluster, n) for n in NODES] == [2, 3, 2, 0]


# -- routed fabrics: a leaf from the next hop, the spine block from the paths ---------------

SPINE = "topology.netval.io/spine"


def routed_report(next_hop: str | None, *paths: list[str | None]) -> TopologyReport:
    from netval.model.topology import L3Path

    iface = InterfaceTopology(interface="f0", none_reason="no LLDP frame", next_hop=next_hop)
    return TopologyReport(
        interfaces=[iface],
        paths=[
            L3Path(peer=f"p{i}", destination="10.9.0.1", hops=h, reached=True)
            for i, h in enumerate(paths)
        ],
    )


def test_route_view_takes_the_second_hop_of_paths_across_a_spine_only() -> None:
    from netval.operator.topology.routed import route_view

    report = routed_report(
        "10.1.1.1",
        ["10.1.1.1", "10.0.0.1", "10.2.1.1"],  # across spine 10.0.0.1
        ["10.1.1.1"],  # a peer under the same leaf: no spine
        ["10.1.1.1", None, "10.2.1.1"],  # the spine did not answer
    )
    assert route_view(report) == (("10.1.1.1",), ("10.0.0.1",))
    assert route_view(TopologyReport()) is None


def test_a_next_hop_leaf_only_without_lldp_and_only_when_shared() -> None:
    from netval.operator.topology.routed import next_hop_leaf, shared_only

    none = [("f0", None, "", "no LLDP frame")]
    assert next_hop_leaf(none, (("10.1.1.1",), ())) == "10.1.1.1"
    assert next_hop_leaf([("f0", "leaf-1", "p", None)], (("10.1.1.1",), ())) is None
    assert next_hop_leaf(none, ((None,), ())) is None
    assert next_hop_leaf(none, None) is None
    # per-link /31s: every node its own gateway, which names no shared domain
    assert shared_only({"a": "10.1.1.1", "b": "10.1.1.1", "c": "10.1.9.1"}) == {
        "a": "10.1.1.1",
        "b": "10.1.1.1",
    }


def test_spine_blocks_group_the_spines_nodes_saw_and_need_two_leaves() -> None:
    from netval.operator.topology.routed import spine_blocks

    leaves = {"a1": "L1", "a2": "L1", "a3": "L1", "b1": "L2", "b2": "L2", "c1": "L3", "c2": "L3"}
    leaves |= {"d1": "L4", "d2": "L4"}
    seen = {
        # ECMP: the leaf's nodes name different spines of one block; two of them saw each
        "a1": ["10.0.0.2"],
        "a2": ["10.0.0.1", "10.0.0.2"],
        "a3": ["10.0.0.1"],
        "b1": ["10.0.0.2"],
        "b2": ["10.0.0.2"],
        "c1": ["10.9.0.1"],  # pod 2's spines, one leaf each: says nothing the leaf does not
        "c2": ["10.9.0.1"],
        "d1": ["10.9.0.2"],
        "d2": ["10.9.0.2"],
    }
    blocks = spine_blocks(seen, leaves, {})
    assert blocks == dict.fromkeys(["a1", "a2", "a3", "b1", "b2"], "10.0.0.1")
    # A value the block's nodes carry that names one of its spines is kept (no renaming when
    # a smaller address shows up later).
    assert spine_blocks(seen, leaves, {"a1": "10.0.0.2", "b1": "10.0.0.2"})["a2"] == "10.0.0.2"
    # Spines answering from per-link addresses: each leaf sees its own, so nothing is named.
    per_link = {"a1": ["10.0.1.2"], "a2": ["10.0.1.2"], "b1": ["10.0.2.2"], "b2": ["10.0.2.2"]}
    assert spine_blocks(per_link, leaves, {}) == {}


def test_one_node_cannot_merge_two_spine_blocks() -> None:
    from netval.operator.topology.routed import leaf_spines, spine_blocks

    leaves = {f"{leaf.lower()}{i}": leaf for leaf in ("A", "B", "C", "D") for i in (1, 2)}
    pod1, pod2 = ["10.0.0.1"], ["10.9.0.1"]
    honest = {"a1": pod1, "a2": pod1, "b1": pod1, "b2": pod1}
    honest |= {"c1": pod2, "c2": pod2, "d1": pod2, "d2": pod2}
    two_blocks = spine_blocks(honest, leaves, {})
    assert {two_blocks["a1"], two_blocks["c1"]} == {"10.0.0.1", "10.9.0.1"}
    # a1's trace names a spine of the other pod (forged, or a path that left the fabric):
    # no other node of leaf A saw it, so it joins nothing and a1 keeps its leaf's block
    forged = honest | {"a1": [*pod1, *pod2]}
    assert leaf_spines(forged, leaves)["A"] == {"10.0.0.1"}
    assert spine_blocks(forged, leaves, {}) == two_blocks
    # a node without a leaf value labels only itself, by a spine some leaf agreed on
    assert spine_blocks(forged | {"x": pod2 + pod1}, leaves, {})["x"] == "10.0.0.1"
    assert spine_blocks(forged | {"x": ["10.7.7.7"]}, leaves, {}) == two_blocks
    # two nodes of a leaf that agree are the leaf's word: the blocks merge
    merged = spine_blocks(honest | {"a1": pod1 + pod2, "a2": pod1 + pod2}, leaves, {})
    assert set(merged.values()) == {"10.0.0.1"}


def test_one_patch_per_node_for_leaf_and_spine() -> None:
    current = {"a": {LEAF: "L1"}, "b": {LEAF: "L1", SPINE: "s"}, "c": {SPINE: "old"}}
    changes = plan_label_changes(
        current, {"a": "L1", "b": "L1"}, frozenset({"a", "b"}), {"a": "s", "b": "s"}
    )
    assert changes == {"a": {SPINE: "s"}, "c": {SPINE: None}}


def test_a_routed_fabric_gets_leaf_and_spine_labels_once(
    cluster: KubeCluster,
    operator: tuple[OperatorRuntime, InMemorySpanExporter],
    mosquitto_broker: MosquittoBroker,
) -> None:
    runtime, _ = operator
    writer = runtime.topology_labels
    # gpu-a/b under the ToR 10.1.1.1, gpu-c/d under 10.1.2.1; ECMP over spines .1 and .2
    # (each spine of a leaf's block seen by two of its nodes: the leaf agrees on it)
    fabric = {
        "gpu-a": ("10.1.1.1", ("10.0.0.1", "10.0.0.2"), "10.1.2.1"),
        "gpu-b": ("10.1.1.1", ("10.0.0.2", "10.0.0.1"), "10.1.2.1"),
        "gpu-c": ("10.1.2.1", ("10.0.0.2",), "10.1.1.1"),
        "gpu-d": ("10.1.2.1", ("10.0.0.1", "10.0.0.2"), "10.1.1.1"),
    }

    def send() -> None:
        messages = []
        for node, (gateway, spines, far) in fabric.items():
            paths = [[gateway, spine, far] for spine in spines]
            r = report(node, started=datetime.now(UTC)).model_copy(
                update={"topology": routed_report(gateway, *paths)}
            )
            messages.append(report_msg(r))
        publish(mosquitto_broker, messages)

    def labels(node: str) -> tuple[str | None, str | None]:
        have = cluster.get("v1", "nodes", node)["metadata"].get("labels") or {}
        return have.get(LEAF), have.get(SPINE)

    spec = {"topology": {"paths": True, "publishLabels": True}, "gating": {"nodeLabel": False}}
    cluster.create(validation(**spec))
    send()
    want = {n: (gw, "10.0.0.1") for n, (gw, _, _) in fabric.items()}
    wait_for(lambda: {n: labels(n) for n in NODES} == want, timeout=30, what="published")
    wait_for(lambda: not writer.written, what="writes watched back")
    start = writer.rounds
    wait_for(lambda: writer.rounds >= start + 3, what="three more rounds")
    assert [node_patches(cluster, n) for n in NODES] == [1, 1, 1, 1]  # leaf and spine at once

    before = runtime.store.states["pool-a"].nodes["gpu-a"].reported_at
    send()
    wait_for(
        lambda: runtime.store.states["pool-a"].nodes["gpu-a"].reported_at != before,
        what="new reports ingested",
    )
    start = writer.rounds
    wait_for(lambda: writer.rounds >= start + 3, what="three more rounds")
    assert [node_patches(cluster, n) for n in NODES] == [1, 1, 1, 1]  # steady: no write
