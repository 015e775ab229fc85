"""Peers ports shared by two validations on a node: found from specs and targeted nodes."""

from __future__ import annotations

from netval.operator.state.peer_ports import PeerListener, conflict_message, peer_port_conflicts


def test_same_port_and_interface_on_shared_nodes_conflict() -> None:
    listeners = {
        "train": PeerListener(7471, None, {"gpu-a", "gpu-b", "gpu-c"}),
        "infer": PeerListener(7471, None, {"gpu-c", "gpu-b", "cpu-1"}),
        "other-port": PeerListener(7472, None, {"gpu-a", "gpu-b"}),
        "other-nic": PeerListener(7471, "ens2np0", {"gpu-a", "gpu-b"}),
        "elsewhere": PeerListener(7471, None, {"gpu-z"}),
    }
    assert peer_port_conflicts(listeners) == {("infer", "train"): ["gpu-b", "gpu-c"]}


def test_no_listeners_no_conflicts() -> None:
    assert peer_port_conflicts({}) == {}
    assert peer_port_conflicts({"one": PeerListener(7471, None, {"gpu-a"})}) == {}


def test_the_message_names_the_other_validation_and_a_bounded_list_of_nodes() -> None:
    nodes = [f"gpu-{i:02d}" for i in range(12)]
    message = conflict_message("infer", 7471, nodes)
    assert message.startswith("peers.port 7471 is also used by NetworkValidation 'infer'")
    assert "12 shared node(s) (gpu-00, gpu-01, gpu-02, gpu-03, gpu-04 and 7 more)" in message
    assert "another peers.port" in message
