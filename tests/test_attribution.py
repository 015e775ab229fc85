"""rdma.errors: attribution, not accusation (docs/checks.md, "Attribution").

Requester-side retry counters warn (attribution requester) unless the node's own port fails
in the same window (local, naming the evidence). Hostile counter values never crash the
judgement and never blame a node without evidence (hypothesis).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netval.agent.checks import port_evidence, run_node_checks
from netval.agent.checks.context import CheckContext
from netval.agent.checks.drivers import MAPS, DriverCounters
from netval.agent.checks.rate_policy import CORRUPTION, family_of
from netval.model import CheckResult, Checks, Status
from netval.model.attribution import Attribution, Evidence, attribution_of, evidence_of
from netval.model.snapshot import NodeSnapshot, Sample
from node_kit import merged, roce_sample

PORTS = ("eth0", "eth1")
MLX5_PORT = {
    "rx_pcs_symbol_err_phy": 0,
    "rx_crc_errors_phy": 0,
    "link_down_events_phy": 0,
    "rx_discards_phy": 0,
    "tx_discards_phy": 0,
    "rx_prio3_discards": 0,
    "rx_prio3_pause_duration": 0,
    "tx_prio3_pause_duration": 0,
    "tx_pause_storm_warning_events": 0,
    "tx_pause_storm_error_events": 0,
}


def _one(n: int, hw: dict[str, int], ethtool: dict[str, int], changes: int) -> Sample:
    return roce_sample(
        hw,
        ethtool,
        netdev=PORTS[n],
        device=f"mlx5_{n}",
        carrier_changes=changes,
        board_id="MT_0000000838",
        gid=f"0000:0000:0000:0000:0000:ffff:0a00:000{n + 1}",
    )


def _sample(
    hw: tuple[dict[str, int], dict[str, int]],
    ethtool: tuple[dict[str, int], dict[str, int]] = (MLX5_PORT, MLX5_PORT),
    changes: tuple[int, int] = (2, 2),
) -> Sample:
    return merged(*(_one(n, hw[n], ethtool[n], changes[n]) for n in range(2)))


def _errors(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.subject: r for r in results if r.check.value == "rdma.errors"}


TIMEOUTS_0 = {"local_ack_timeout_err": 100, "req_transport_retries_exceeded": 1}
TIMEOUTS_1 = {"local_ack_timeout_err": 180, "req_transport_retries_exceeded": 4}
QUIET = {"local_ack_timeout_err": 100, "req_transport_retries_exceeded": 1}


def _peer_died(**last: Any) -> NodeSnapshot:
    """Both ports' requester QPs time out toward a dead peer over 10 s; `last` changes the
    second sample (own-port evidence)."""
    first = _sample((TIMEOUTS_0, TIMEOUTS_0))
    second = _sample((TIMEOUTS_1, TIMEOUTS_1), **last)
    return NodeSnapshot("gpu-1", "now", 10.0, (first, second))


def test_requester_retries_warn_naming_counters_and_rate() -> None:
    errors = _errors(run_node_checks(_peer_died(), Checks()))
    for subject in ("mlx5_0/1", "mlx5_1/1"):
        r = errors[subject]
        assert r.status is Status.WARN
        assert r.observed["attribution"] == "requester"
        assert r.observed["counters"] == {
            "local_ack_timeout_err": 80,
            "req_transport_retries_exceeded": 3,
        }
        assert r.observed["ratePerSecond"] == 8.3
        assert "evidence" not in r.observed
        assert "attribution requester" in r.message
        assert attribution_of(r.observed) is Attribution.REQUESTER


def test_a_flapping_link_makes_its_own_port_fail_not_the_other() -> None:
    snap = _peer_died(changes=(8, 2))  # eth0 flapped 3 times in the window
    errors = _errors(run_node_checks(snap, Checks()))
    assert errors["mlx5_0/1"].status is Status.FAIL
    assert errors["mlx5_0/1"].observed["attribution"] == "local"
    assert evidence_of(errors["mlx5_0/1"].observed) == (Evidence.LINK_FLAPS,)
    assert "this port's own checks fail in the same window (link.flaps)" in (
        errors["mlx5_0/1"].message
    )
    assert errors["mlx5_1/1"].status is Status.WARN
    assert errors["mlx5_1/1"].observed["attribution"] == "requester"


@pytest.mark.parametrize(
    ("counters", "evidence"),
    [
        ({"rx_prio3_discards": 500}, Evidence.PFC_DISCARDS),
        ({"tx_pause_storm_error_events": 1}, Evidence.PAUSE_STORM),
        ({"link_down_events_phy": 1}, Evidence.PHY_ERRORS),
        ({"rx_crc_errors_phy": 50_000, "rx_pcs_symbol_err_phy": 50_000}, Evidence.PHY_ERRORS),
    ],
)
def test_port_counter_evidence_in_the_same_window(
    counters: dict[str, int], evidence: Evidence
) -> None:
    bad = {**MLX5_PORT, **counters}
    snap = _peer_died(ethtool=(bad, MLX5_PORT))
    results = run_node_checks(snap, Checks())
    failing = {(r.check.value, r.subject.split("/prio")[0]) for r in results if r.status.is_bad}
    assert (evidence.value, "eth0") in failing
    errors = _errors(results)
    assert errors["mlx5_0/1"].status is Status.FAIL
    assert evidence_of(errors["mlx5_0/1"].observed) == (evidence,)
    assert errors["mlx5_1/1"].status is Status.WARN


def test_a_warning_level_pause_is_no_evidence() -> None:
    # 8 % of the window paused: pfc.pause_storm warns (5 %), it does not fail (20 %).
    paused = {**MLX5_PORT, "rx_prio3_pause_duration": 800_000}
    results = run_node_checks(_peer_died(ethtool=(paused, MLX5_PORT)), Checks())
    storm = [r for r in results if r.check.value == "pfc.pause_storm" and r.subject == "eth0/prio3"]
    assert [r.status for r in storm] == [Status.WARN]
    assert _errors(results)["mlx5_0/1"].status is Status.WARN


def test_receiver_not_ready_is_the_application_never_the_node() -> None:
    first = _sample(({"rnr_nak_retry_err": 0, "out_of_buffer": 0},) * 2)
    second = _sample(
        ({"rnr_nak_retry_err": 40, "out_of_buffer": 900},) * 2,
        changes=(8, 2),  # even with its link flapping, RNR is not the fabric
    )
    errors = _errors(run_node_checks(NodeSnapshot("n", "now", 10.0, (first, second)), Checks()))
    for r in errors.values():
        assert r.status is Status.WARN
        assert r.observed["attribution"] == "application"
        assert r.observed["counters"] == {"rnr_nak_retry_err": 40, "out_of_buffer": 900}
        assert "not the fabric" in r.message


def test_damaged_packets_received_point_at_the_port_itself() -> None:
    first = _sample(({"rx_icrc_encapsulated": 0},) * 2)
    second = _sample(({"rx_icrc_encapsulated": 30}, {"rx_icrc_encapsulated": 0}))
    errors = _errors(run_node_checks(NodeSnapshot("n", "now", 10.0, (first, second)), Checks()))
    assert errors["mlx5_0/1"].status is Status.FAIL
    assert errors["mlx5_0/1"].observed["attribution"] == "local"
    assert errors["mlx5_0/1"].observed["evidence"] == ["rdma.errors"]
    assert errors["mlx5_1/1"].status is Status.PASS
    assert "attribution" not in errors["mlx5_1/1"].observed


def test_bond_slave_evidence_counts_for_the_lag_port() -> None:
    """A RoCE LAG: the RDMA port's traffic runs on bond0, whose NIC ports hold the PHY
    counters; a slave that drops its link is evidence against the LAG's port."""
    bad = {**MLX5_PORT, "link_down_events_phy": 2}

    def sample(hw: dict[str, int], slave0: dict[str, int]) -> Sample:
        node = _sample((hw, {}), (slave0, MLX5_PORT))
        bond = replace(node.netdevs["eth1"], name="bond0", driver=None, bond_slaves=PORTS)
        dev = node.rdma["mlx5_0"]
        port = replace(dev.ports[1], gids=(replace(dev.ports[1].gids[0], ndev="bond0"),))
        netdevs = {**node.netdevs, "bond0": replace(bond, ethtool=None)}
        return Sample(netdevs, {"mlx5_0": replace(dev, ports={1: port})})

    snap = NodeSnapshot("n", "now", 10.0, (sample(TIMEOUTS_0, MLX5_PORT), sample(TIMEOUTS_1, bad)))
    (r,) = _errors(run_node_checks(snap, Checks())).values()
    assert r.status is Status.FAIL
    assert r.observed["evidence"] == ["link.phy_errors"]


def test_an_evidence_check_that_raises_is_no_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: CheckContext) -> list[CheckResult]:
        raise RuntimeError("boom")

    monkeypatch.setattr(port_evidence, "EVIDENCE_CHECKS", ((Evidence.LINK_FLAPS, broken),))
    errors = _errors(run_node_checks(_peer_died(changes=(8, 2)), Checks()))
    assert {r.status for r in errors.values()} == {Status.WARN}


@pytest.mark.parametrize("driver", MAPS, ids=[m.name for m in MAPS])
def test_requester_counters_of_every_driver_warn_without_evidence(driver: DriverCounters) -> None:
    """Each driver's requester-side counters (mlx5, bnxt_re, irdma on ice/i40e/idpf, ionic,
    efa), grown alone on a clean port, warn as requester."""
    names = [n for n in driver.rdma_errors if family_of(n).requester]
    assert names, driver.name
    for name in names:

        def sample(value: int, name: str = name) -> Sample:
            base = _sample(({name: 0}, {name: 0}))
            dev = base.rdma["mlx5_0"]
            port = replace(dev.ports[1], hw_counters={name: value})
            rdma = {"mlx5_0": replace(dev, driver=driver.drivers[0], ports={1: port})}
            return replace(base, rdma={**base.rdma, **rdma})

        snap = NodeSnapshot("n", "now", 10.0, (sample(0), sample(5000)))
        got = _errors(run_node_checks(snap, Checks()))["mlx5_0/1"]
        assert got.observed["driver"] == driver.drivers[0], name
        assert got.status is Status.WARN, (driver.name, name, got.message)
        assert got.observed["attribution"] == "requester", name
        assert got.observed["counters"] == {name: 5000}


# -- hostile counter values (hypothesis) -----------------------------------------------------

_RDMA_NAMES = sorted({n for m in MAPS for n in m.rdma_errors if m.name == "mlx5"})
_NON_CORRUPTING = [n for n in _RDMA_NAMES if n not in CORRUPTION.counters]
_hostile_int = st.one_of(
    st.integers(min_value=0, max_value=2**32 + 5),
    st.integers(min_value=2**63 - 5, max_value=2**64 + 5),
    st.integers(min_value=-(2**64), max_value=-1),
    st.just(2**32 - 1),
    st.just(2**64 - 1),
)


def _counters(names: list[str]) -> st.SearchStrategy[dict[str, int]]:
    return st.dictionaries(st.sampled_from(names), _hostile_int, max_size=len(names))


def _ethtool() -> st.SearchStrategy[dict[str, int]]:
    return st.fixed_dictionaries(
        {},
        optional={name: _hostile_int for name in MLX5_PORT},
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hw=st.tuples(_counters(_RDMA_NAMES), _counters(_RDMA_NAMES)),
    hw_last=st.tuples(_counters(_RDMA_NAMES), _counters(_RDMA_NAMES)),
    eth=st.tuples(_ethtool(), _ethtool()),
    eth_last=st.tuples(_ethtool(), _ethtool()),
    changes=st.tuples(_hostile_int, _hostile_int, _hostile_int, _hostile_int),
    elapsed=st.sampled_from([0.001, 1.0, 30.0, 86_400.0]),
)
def test_hostile_counters_never_crash_and_never_blame_without_evidence(
    hw: tuple[dict[str, int], dict[str, int]],
    hw_last: tuple[dict[str, int], dict[str, int]],
    eth: tuple[dict[str, int], dict[str, int]],
    eth_last: tuple[dict[str, int], dict[str, int]],
    changes: tuple[int, int, int, int],
    elapsed: float,
) -> None:
    """Wraps, resets (counters going backwards), values past 2^64 or negative, files that
    are there in one sample and not the other: rdma.errors never raises, and it fails only
    naming evidence that the same run's own checks failed on that port, or a corruption
    counter of that port over its limit."""
    first = _sample(hw, eth, changes[:2])
    last = _sample(hw_last, eth_last, changes[2:])
    results = run_node_checks(NodeSnapshot("n", "now", elapsed, (first, last)), Checks())
    assert not [r for r in results if r.status is Status.ERROR], results
    failed = {(r.check.value, r.subject.split("/prio")[0]) for r in results if r.status.is_bad}
    for n, (subject, r) in enumerate(sorted(_errors(results).items())):
        if r.status is not Status.FAIL:
            continue
        assert attribution_of(r.observed) is Attribution.LOCAL
        evidence = evidence_of(r.observed)
        assert evidence, r
        mine = {subject, PORTS[n]}
        for e in evidence:
            if e is Evidence.PORT_COUNTERS:
                blamed = r.observed["counters"]
                assert isinstance(blamed, dict)
                assert set(blamed) & CORRUPTION.counters, r
            else:
                assert any((e.value, s) in failed for s in mine), (e, r)


@settings(max_examples=100, deadline=None)
@given(
    hw=st.tuples(_counters(_NON_CORRUPTING), _counters(_NON_CORRUPTING)),
    hw_last=st.tuples(_counters(_NON_CORRUPTING), _counters(_NON_CORRUPTING)),
)
def test_clean_ports_are_never_blamed_whatever_the_rdma_counters_say(
    hw: tuple[dict[str, int], dict[str, int]],
    hw_last: tuple[dict[str, int], dict[str, int]],
) -> None:
    """With the node's own links, PHYs, PFC and pause clean, no RDMA counter (corruption
    aside) makes rdma.errors fail: at worst a warning that names who it points at."""
    snap = NodeSnapshot("n", "now", 10.0, (_sample(hw), _sample(hw_last)))
    for r in _errors(run_node_checks(snap, Checks())).values():
        assert r.status in (Status.PASS, Status.WARN, Status.SKIP), r
        if r.status is Status.WARN:
            assert attribution_of(r.observed) is not Attribution.LOCAL
