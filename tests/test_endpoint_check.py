"""An announced east-west endpoint counts only at the announcing node's own address
(`netval.operator.ingest.endpoint_check`): the rule, and through the real operator process
(a node claiming another node's address is refused, counted, told in an Event, and left out
of every peer set)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mosquitto
from fleet_sim import Agents
from kube import KubeCluster, wait_for
from netval.model.ids import Status
from netval.operator.ingest.endpoint_check import (
    EndpointCheck,
    Refusal,
    VerifiedEndpoints,
    fabric_networks,
    judge,
    node_addresses,
)
from netval.operator.ingest.peer_sets import EndpointTable

NODE_STATUS = {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                             {"type": "Hostname", "address": "gpu-a"},
                             {"type": "InternalIP", "address": "fd00::1"}]}  # fmt: skip


def test_the_rule() -> None:
    own = node_addresses(NODE_STATUS)
    assert own == {"10.0.0.1", "fd00::1"}  # host names are no addresses
    fabric = fabric_networks(["192.168.64.0/20", "fd10::/64"])
    assert judge("10.0.0.1", own, ()) is None
    assert judge("fd00:0:0:0::1", own, ()) is None  # the same address, written otherwise
    assert judge("10.0.0.2", own, ()) is Refusal.NOT_NODE_ADDRESS  # a neighbour's
    assert judge("192.168.70.9", own, fabric) is None  # in the declared fabric
    assert judge("192.168.80.9", own, fabric) is Refusal.NOT_NODE_ADDRESS
    assert judge("fd10::9", own, fabric) is None
    assert judge("not-an-ip", own, fabric) is Refusal.NOT_AN_ADDRESS
    assert node_addresses({"addresses": [{"address": 7}, "x", {"address": "999.1.1.1"}]}) == set()
    assert node_addresses(None) == set()


def test_refusals_are_counted_once_per_node_and_address_and_unknown_nodes_wait() -> None:
    table, check = EndpointTable(), EndpointCheck()
    endpoints = VerifiedEndpoints(table, check)
    table.update("pool", "gpu-a", b'{"address": "10.0.0.1", "port": 7471}')
    table.update("pool", "gpu-b", b'{"address": "10.0.0.1", "port": 7471}')  # gpu-a's
    assert endpoints.of("pool") == {}  # no Node addresses known yet: nothing used, nothing refused
    assert check.news() == [] and not check.refusals
    check.note_node("gpu-a", node_addresses(NODE_STATUS))
    check.note_node("gpu-b", frozenset({"10.0.0.2"}))
    for _ in range(3):  # every round judges again; the refusal is counted once
        assert endpoints.of("pool") == {"gpu-a": ("10.0.0.1", 7471)}
    assert check.refusals == {Refusal.NOT_NODE_ADDRESS: 1}
    assert check.news() == [("pool", "gpu-b", ("10.0.0.1", 7471))] and check.news() == []
    table.update("pool", "gpu-b", b'{"address": "10.0.0.2", "port": 7471}')  # its own now
    assert endpoints.of("pool") == {"gpu-a": ("10.0.0.1", 7471), "gpu-b": ("10.0.0.2", 7471)}
    table.update("pool", "gpu-b", b'{"address": "10.0.0.1", "port": 7471}')  # again: told again
    endpoints.of("pool")
    assert check.refusals[Refusal.NOT_NODE_ADDRESS] == 2 and len(check.news()) == 1


def test_load_test_rails_count_only_when_every_address_is_the_nodes() -> None:
    table, check = EndpointTable(), EndpointCheck()
    endpoints = VerifiedEndpoints(table, check, lambda v: fabric_networks(["192.168.64.0/20"]))
    own = {"rails": [["eth1", "192.168.64.1", True], ["eth2", "192.168.65.1", True]]}
    forged = {"rails": [["eth1", "192.168.64.2", True], ["eth2", "10.0.0.1", True]]}
    for node, rails in (("gpu-a", own), ("gpu-b", forged)):
        payload = {"address": "192.168.64.1" if node == "gpu-a" else "192.168.64.2",
                   "port": 7471, **rails}  # fmt: skip
        table.update("pool", node, json.dumps(payload).encode())
    assert set(table.rails_of("pool")) == {"gpu-a", "gpu-b"}
    assert endpoints.rails_of("pool") == {}  # Node addresses not known yet: they wait
    check.note_node("gpu-a", node_addresses(NODE_STATUS))
    check.note_node("gpu-b", frozenset({"10.0.0.2"}))
    for _ in range(2):
        # gpu-b's second rail is gpu-a's address: none of its rails is used, counted once
        assert set(endpoints.rails_of("pool")) == {"gpu-a"}
    assert check.refusals == {Refusal.NOT_NODE_ADDRESS: 1}
    assert check.news() == [("pool", "gpu-b", ("10.0.0.1", 0))]
    assert set(endpoints.of("pool")) == {"gpu-a", "gpu-b"}  # both endpoints in the fabric


@given(
    address=st.one_of(st.ip_addresses().map(str), st.text(max_size=40)),
    own=st.frozensets(st.ip_addresses().map(str), max_size=4),
    cidrs=st.lists(
        st.builds(
            lambda ip, n: str(
                ipaddress.ip_network(f"{ip}/{min(n, ip.max_prefixlen)}", strict=False)
            ),
            st.ip_addresses(),
            st.integers(0, 128),
        ),
        max_size=4,
    ),
)
def test_any_announcement_is_the_nodes_or_refused(
    address: str, own: frozenset[str], cidrs: list[str]
) -> None:
    why = judge(address, own, fabric_networks(cidrs))
    if why is None:
        ip = ipaddress.ip_address(address)
        assert any(ipaddress.ip_address(a) == ip for a in own) or any(
            ip in ipaddress.ip_network(c)
            for c in cidrs
            if ipaddress.ip_network(c).version == ip.version
        )
    else:
        assert why in (Refusal.NOT_NODE_ADDRESS, Refusal.NOT_AN_ADDRESS)


@pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)
def test_an_endpoint_claiming_another_nodes_address_is_refused_and_counted(
    kube: KubeCluster, mosquitto_broker: mosquitto.MosquittoBroker, tmp_path: Path
) -> None:
    """`netval operator` (the real process): three nodes with their addresses in the Node
    objects; gpu-c announces gpu-a's address. gpu-a's and gpu-b's endpoints reach their
    peers' assignments, gpu-c's does not; the refusal is counted on /metrics and told in a
    Warning Event; once gpu-c announces its own address it is used."""
    from verdict_process_kit import FLEET, events, metrics, start_operator

    kube.ensure_namespace("netval-system")
    addresses = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3"}
    for node, address in addresses.items():
        kube.create({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": node, "labels": {FLEET: "a", "topology.kubernetes.io/zone": "z1"}},
                     "status": {"addresses": [{"type": "InternalIP", "address": address}]}})  # fmt: skip
    kube.create({
        "apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
        "metadata": {"name": "pool-a"},
        "spec": {"nodeSelector": {FLEET: "a"}, "interval": "5s",
                 "checks": {"peers": {"enabled": True}}},
    })  # fmt: skip
    proc = start_operator(kube, mosquitto_broker, tmp_path / "op", kueue=False)
    topic = "netval/v1/pool-a/{}/{}"
    with Agents([mosquitto_broker], period=1.0) as agents:
        agents.set(list(addresses), Status.PASS)
        agents.start()
        announce = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.1"}
        for node, address in announce.items():
            agents.publish_raw(0, topic.format(node, "endpoint"),
                               json.dumps({"address": address, "port": 7471}).encode())  # fmt: skip
        watcher = agents.watch(topic.format("+", "assignment"))
        try:

            def peers_of(node: str) -> dict[str, str] | None:
                payload = watcher.latest(topic.format(node, "assignment"))
                if not payload:
                    return None
                doc: dict[str, Any] = json.loads(payload)
                return {p[0]: p[1] for ps in (doc.get("peers") or {}).values() for p in ps}

            wait_for(lambda: peers_of("gpu-a") == {"gpu-b": "10.0.0.2"}, 60,
                     what="gpu-a's peers: gpu-b only, gpu-c's claim left out")  # fmt: skip
            # (the assignments are published one after another: gpu-b's may come later)
            wait_for(lambda: peers_of("gpu-b") == {"gpu-a": "10.0.0.1"}, 30, what="gpu-b's peers")
            line = 'netval_operator_endpoints_refused_total{reason="not_node_address"} 1.0'
            wait_for(lambda: line in metrics(proc), 30, what="the refusal counted")
            (event,) = wait_for(lambda: events(kube, "EndpointRefused"), 30, what="the Event")
            assert "gpu-c" in event["message"] and "10.0.0.1:7471" in event["message"]
            agents.publish_raw(0, topic.format("gpu-c", "endpoint"),
                               json.dumps({"address": "10.0.0.3", "port": 7471}).encode())  # fmt: skip
            wait_for(lambda: peers_of("gpu-a") == {"gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3"}, 60,
                     what="gpu-c's own address used")  # fmt: skip
            assert line in metrics(proc)  # counted once
        finally:
            watcher.close()
            assert proc.terminate() == 0
