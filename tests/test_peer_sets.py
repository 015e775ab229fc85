"""The operator's per-node peer sets (issue 24): bounded, rotating per epoch to cover every
pair, the fleet's throughput schedule unchanged, and assignments agents accept."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netval.model.peer_assignment import MAX_ASSIGNMENT_BYTES, AssignmentPayload
from netval.model.peer_selection import throughput_schedule
from netval.model.spec import NetworkValidationSpec
from netval.operator.ingest.assignments import assignments
from netval.operator.ingest.peer_sets import (
    EPOCH_CYCLES,
    SET_DOMAINS,
    WINDOW_CYCLES,
    EndpointTable,
    coverage_epochs,
    epoch_of,
    peer_sets,
    window_size,
)
from netval.operator.state.store import Store


def fabric(nodes: int, domains: int) -> tuple[list[str], dict[str, str | None]]:
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    return names, {n: f"rack-{i % domains}" for i, n in enumerate(names)}


def endpoints_of(names: list[str]) -> dict[str, tuple[str, int]]:
    return {n: (f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 7471) for i, n in enumerate(names)}


def test_a_peer_set_is_bounded_and_names_only_announced_nodes() -> None:
    names, domains = fabric(1000, 16)
    endpoints = endpoints_of(names[:-10])  # ten agents not ready yet
    sets = peer_sets(names, domains, endpoints, samples=2, epoch=3)
    w = 2 * WINDOW_CYCLES
    assert sets.keys() == set(names)  # the not-ready ones probe once they are
    for node, peer_set in sets.items():
        throughput_targets = {t for _, t in peer_set.throughput}
        windows = {
            d: [m for m, *_ in members if m not in throughput_targets]
            for d, members in peer_set.peers.items()
        }
        assert len([d for d, ms in windows.items() if ms]) <= SET_DOMAINS
        assert domains[node] in windows  # its own domain, every epoch
        for domain, members in peer_set.peers.items():
            assert len(windows[domain]) <= w and node not in [m for m, *_ in members]
            assert all(m in endpoints and domains[m] == domain for m, *_ in members)
            assert all((a, p) == endpoints[m] for m, a, p in members)


@pytest.mark.parametrize(("nodes", "racks"), [(300, 4), (264, 12), (400, 25)])
def test_sets_rotate_per_epoch_until_every_pair_was_probed(nodes: int, racks: int) -> None:
    names, domains = fabric(nodes, racks)
    endpoints = endpoints_of(names)
    largest = math.ceil(nodes / racks)
    bound = coverage_epochs(largest, 2, racks)
    seen: dict[str, set[str]] = {n: set() for n in names}
    reached: dict[str, set[str]] = {d: set() for d in set(domains.values()) if d}
    for epoch in range(bound):
        for node, peer_set in peer_sets(names, domains, endpoints, samples=2, epoch=epoch).items():
            seen[node] |= {m for members in peer_set.peers.values() for m, *_ in members}
            if epoch == 0:
                reached[str(domains[node])] |= set(peer_set.peers)
    assert all(seen[n] == set(names) - {n} for n in names)
    # the members of a domain tile the other domains: all reached in one epoch here
    assert all(r == set(reached) for r in reached.values())


def test_the_operator_hands_out_the_fleet_throughput_schedule_of_two_epochs() -> None:
    names, domains = fabric(120, 5)
    endpoints = endpoints_of(names[:100])
    sets = peer_sets(names, domains, endpoints, samples=2, epoch=2)
    announced = {n: domains[n] for n in names[:100]}
    for slot in range(2 * EPOCH_CYCLES, 4 * EPOCH_CYCLES):
        handed = {(n, t) for n, s in sets.items() for sl, t in s.throughput if sl == slot}
        fleet = {(p.prober, p.target) for p in throughput_schedule(announced, slot)}
        assert handed == fleet
        targets = [t for _, t in handed]
        assert len(targets) == len(set(targets))  # no node the target of two probers
    for peer_set in sets.values():  # a prober can reach each target it samples
        names_in_set = {m for members in peer_set.peers.values() for m, *_ in members}
        assert {t for _, t in peer_set.throughput} <= names_in_set


def test_the_window_is_bounded_whatever_samples_per_domain_says() -> None:
    assert window_size(2, 8) == 8
    assert window_size(64, 8) == 256  # 8 x 256 = 2048 entries, half the budget
    assert window_size(64, 3000) == 1


def test_the_endpoint_table_keeps_valid_announcements_and_says_what_changed() -> None:
    table = EndpointTable()
    assert table.update("v", "a", b'{"address": "10.0.0.1", "port": 7471, "domain": null}')
    assert not table.update("v", "a", b'{"address": "10.0.0.1", "port": 7471, "domain": "r"}')
    assert table.update("v", "a", b'{"address": "10.0.0.1", "port": 7472}')
    assert table.of("v") == {"a": ("10.0.0.1", 7472)}
    assert table.update("v", "a", b'{"address": "nope", "port": 7472}')  # invalid: removed
    assert not table.update("v", "b", b"")
    assert table.of("v") == {} and table.of("other") == {}


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_the_endpoint_table_never_raises(payload: bytes) -> None:
    EndpointTable().update("v", "a", payload)


def test_assignments_carry_the_epoch_s_peer_set_and_fit_one_message() -> None:
    gpu = {"nvidia.com/gpu.present": "true"}
    store = Store(label_keys={**gpu, "rack": ""})
    names, domains = fabric(2000, 64)
    for n in names:
        store.on_node(n, {**gpu, "rack": str(domains[n])})
    spec = NetworkValidationSpec.model_validate(
        {
            "nodeSelector": gpu,
            "interval": "30s",
            "checks": {"peers": {"enabled": True, "topologyKey": "rack"}},
        }
    )
    store.upsert_validation("pool", generation=1, spec=spec, body={}, status=None)
    table = EndpointTable()
    for n, (address, port) in endpoints_of(names).items():
        table.update("pool", n, json.dumps({"address": address, "port": port}).encode())
    now = 1_800_000_000.0
    out = assignments(store, table, now)
    assert len(out) == 2000
    payload = out[f"netval/v1/pool/{names[0]}/assignment"]
    assert len(payload) < MAX_ASSIGNMENT_BYTES
    parsed = AssignmentPayload.model_validate_json(payload)
    assert parsed.domain == domains[names[0]] and parsed.epoch == epoch_of(spec, now)
    # 8 domains' windows, plus the domains of its throughput targets
    assert SET_DOMAINS <= len(parsed.peers) <= SET_DOMAINS + len(parsed.throughput)
    assert parsed.peer_count() >= SET_DOMAINS * 8
    # the same epoch: the same bytes (set_retained publishes nothing); the next: others
    assert assignments(store, table, now + 1) == out
    later = assignments(store, table, now + EPOCH_CYCLES * 30)
    assert later[f"netval/v1/pool/{names[0]}/assignment"] != payload


def test_the_operator_decodes_endpoints_for_the_table_and_bounds_them() -> None:
    from netval.model.topics import DropReason
    from netval.operator.ingest.decode import Dropped, EndpointAnnounce, decode_message

    body = b'{"address": "10.0.0.1", "port": 7471}'
    assert decode_message("netval/v1/v/gpu-a/endpoint", body) == EndpointAnnounce(
        "v", "gpu-a", body
    )
    assert decode_message("netval/v1/v/gpu-a/endpoint", b"") == EndpointAnnounce("v", "gpu-a", b"")
    big = decode_message("netval/v1/v/gpu-a/endpoint", b"x" * 5000)
    assert isinstance(big, Dropped) and big.reason is DropReason.TOO_LARGE


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda peers, slots: json.dumps({"peers": peers, "throughput": slots}).encode(),
            st.dictionaries(
                st.text(max_size=70),
                st.lists(st.tuples(st.text(max_size=5), st.text(max_size=12), st.integers())),
                max_size=3,
            ),
            st.lists(st.tuples(st.integers(), st.text(max_size=5)), max_size=3),
        ),
    )
)
def test_the_agent_never_raises_on_an_assignment(payload: bytes) -> None:
    """Untrusted on the agent's side too: dropped and counted, or taken whole."""
    from netval.agent.peers.service import PeerService

    svc = PeerService(
        validation="v",
        node="a",
        spec=NetworkValidationSpec.model_validate({"checks": {"peers": {"enabled": True}}}),
    )
    svc.handle("netval/v1/v/a/assignment", payload)
    assert sum(svc.dropped.values()) == 1 or svc.assigned
