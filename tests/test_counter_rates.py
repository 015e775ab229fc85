"""Counter checks judge rates: recorded captures give one verdict over 1 s, 30 s and 300 s.

The captures and where each comes from: tests/data/counter_captures/captures.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from netval.agent.checks import run_node_checks
from netval.agent.checks.counters import hw_counter_width
from netval.agent.checks.drivers import MAPS
from netval.agent.checks.rate_policy import UNCLASSIFIED, ber_allowance, family_of
from netval.agent.collect.snapshot_dir import load_snapshot
from netval.model import (
    CheckResult,
    Checks,
    NetworkValidationSpec,
    NodeSnapshot,
    Sample,
    Status,
)
from netval.model.spec import deprecated_fields_set
from node_kit import roce_sample

CAPTURES = json.loads(
    (Path(__file__).parent / "data" / "counter_captures" / "captures.json").read_text()
)["captures"]
WINDOWS = (1.0, 30.0, 300.0)


def _sample(hw: dict[str, int], ethtool: dict[str, int], **kw: Any) -> Sample:
    return roce_sample(hw, ethtool, **kw)


def _replay(capture: dict[str, Any], window: float) -> NodeSnapshot:
    """The capture's rates over `window` seconds: its values are the first sample, the
    growth at its rate the second."""
    rate = 1.0 / capture["window_seconds"]

    def grown(values: dict[str, int]) -> dict[str, int]:
        return {k: v + round(v * rate * window) for k, v in values.items()}

    hw, eth = capture.get("hw_counters", {}), capture.get("ethtool", {})
    kw: dict[str, Any] = {
        "rdma_driver": capture.get("rdma_driver", "mlx5_core"),
        "netdev_driver": capture.get("netdev_driver", "mlx5_core"),
        "speed_mbps": capture.get("speed_mbps", 400_000),
    }
    first = _sample(hw, eth, **kw)
    last = _sample(grown(hw), grown(eth), **kw)
    return NodeSnapshot("n1", "now", window, (first, last))


def _one(results: list[CheckResult], check: str) -> CheckResult:
    (found,) = [r for r in results if r.check.value == check]
    return found


@pytest.mark.parametrize("capture", CAPTURES, ids=[c["id"] for c in CAPTURES])
def test_a_capture_gets_one_verdict_over_any_window(capture: dict[str, Any]) -> None:
    assert capture["source"], "every capture says where it comes from"
    for check, verdict in capture["expected"].items():
        statuses = {}
        for window in WINDOWS:
            result = _one(run_node_checks(_replay(capture, window), Checks()), check)
            statuses[window] = result.status.value
        assert statuses == dict.fromkeys(WINDOWS, verdict), (check, statuses)
    if "expected_attribution" in capture:
        result = _one(run_node_checks(_replay(capture, 30.0), Checks()), "rdma.errors")
        assert result.observed["attribution"] == capture["expected_attribution"]


def test_adaptive_routing_reordering_is_reported_never_judged() -> None:
    (capture,) = [c for c in CAPTURES if c["id"] == "adaptive-routing-healthy"]
    result = _one(run_node_checks(_replay(capture, 30.0), Checks()), "rdma.errors")
    assert result.status is Status.PASS
    assert "out_of_sequence +126000 (4.2e+03/s)" in result.message
    per_second = result.observed["perSecond"]
    assert isinstance(per_second, dict) and per_second["out_of_sequence"] == 4200


def test_retry_exceeded_warns_naming_the_family_and_the_attribution() -> None:
    hw0 = {"req_transport_retries_exceeded": 0, "out_of_sequence": 0}
    hw1 = {"req_transport_retries_exceeded": 3, "out_of_sequence": 900}
    snap = NodeSnapshot("n1", "now", 10.0, (_sample(hw0, {}), _sample(hw1, {})))
    result = _one(run_node_checks(snap, Checks()), "rdma.errors")
    assert result.status is Status.WARN
    assert result.message.startswith(
        "req_transport_retries_exceeded +3 (0.3/s) in 10s, over retry limit 0.1/s"
    )
    assert "attribution requester" in result.message
    assert "reported only: out_of_sequence +900 (90/s)" in result.message
    assert result.observed["attribution"] == "requester"
    assert result.observed["counters"] == {"req_transport_retries_exceeded": 3}
    assert result.observed["ratePerSecond"] == 0.3


def test_retries_with_crc_errors_on_the_port_fail_as_local() -> None:
    """The byteps capture's timeouts, on a port whose PHY shows the public 100G CRC capture
    (mlx5-ethtool-100g-crc-errors) in the same window: the node's own link explains them."""
    (timeouts,) = [c for c in CAPTURES if c["id"] == "mlx5-byteps-179-timeouts"]
    (crc,) = [c for c in CAPTURES if c["id"] == "mlx5-ethtool-100g-crc-errors"]
    both = {**timeouts, "ethtool": crc["ethtool"], "speed_mbps": crc["speed_mbps"]}
    results = run_node_checks(_replay(both, 30.0), Checks())
    assert _one(results, "link.phy_errors").status is Status.FAIL
    errors = _one(results, "rdma.errors")
    assert errors.status is Status.FAIL
    assert errors.observed["attribution"] == "local"
    assert errors.observed["evidence"] == ["link.phy_errors"]
    assert "this port's own checks fail in the same window (link.phy_errors)" in errors.message


def test_out_of_buffer_warns_as_an_application_symptom() -> None:
    snap = NodeSnapshot(
        "n1",
        "now",
        30.0,
        (_sample({"out_of_buffer": 10}, {}), _sample({"out_of_buffer": 70}, {})),
    )
    result = _one(run_node_checks(snap, Checks()), "rdma.errors")
    assert result.status is Status.WARN
    assert "did not post receive buffers" in result.message
    assert "not the fabric" in result.message


def test_every_mapped_rdma_counter_has_a_family() -> None:
    """A counter added to a driver map must be placed in the policy table (rate_policy.py)."""
    unclassified = {
        (m.name, name) for m in MAPS for name in m.rdma_errors if family_of(name) is UNCLASSIFIED
    }
    assert unclassified == set()


@pytest.mark.parametrize(
    ("driver", "first", "last", "expected"),
    [
        # mlx5 Q counters are 32-bit: 0xFFFFFFFB -> 10 wrapped, 15 of growth
        ("mlx5_core", 0xFFFF_FFFB, 10, 15),
        # bnxt_re counters are 64-bit: going backwards is a reset, not a wrap
        ("bnxt_en", (1 << 32) + 100, 50, 50),
    ],
)
def test_rdma_errors_reads_each_counter_at_its_width(
    driver: str, first: int, last: int, expected: int
) -> None:
    name = "local_ack_timeout_err"
    snap = NodeSnapshot(
        "n1",
        "now",
        10.0,
        (
            _sample({name: first}, {}, rdma_driver=driver, netdev_driver=driver),
            _sample({name: last}, {}, rdma_driver=driver, netdev_driver=driver),
        ),
    )
    assert _one(run_node_checks(snap, Checks()), "rdma.errors").observed[name] == expected


def test_cnp_flow_and_rdma_errors_share_the_width_rule() -> None:
    # The mlx5 congestion counters are 64-bit (be64 reads), its Q counters 32-bit.
    assert hw_counter_width("mlx5", "np_cnp_sent") == 64
    assert hw_counter_width("mlx5", "rx_icrc_encapsulated") == 64
    assert hw_counter_width("mlx5", "out_of_sequence") == 32
    assert hw_counter_width("bnxt", "out_of_sequence") == 64
    hw0 = {"np_ecn_marked_roce_packets": 0, "np_cnp_sent": (1 << 32) + 5, "rp_cnp_handled": 0}
    hw1 = {"np_ecn_marked_roce_packets": 0, "np_cnp_sent": 3, "rp_cnp_handled": 0}
    snap = NodeSnapshot("n1", "now", 10.0, (_sample(hw0, {}), _sample(hw1, {})))
    # a 64-bit counter that went backwards was reset: 3 sent since, not a 2^32 wrap
    assert _one(run_node_checks(snap, Checks()), "ecn.cnp_flow").observed["cnpSent"] == 3


def _phy(errors: int, window: float, speed: int) -> CheckResult:
    zero = {"rx_pcs_symbol_err_phy": 0, "rx_crc_errors_phy": 0, "link_down_events_phy": 0}
    grown = dict(zero, rx_pcs_symbol_err_phy=errors, rx_crc_errors_phy=errors)
    snap = NodeSnapshot(
        "n1",
        "now",
        window,
        (_sample({}, zero, speed_mbps=speed), _sample({}, grown, speed_mbps=speed)),
    )
    return _one(run_node_checks(snap, Checks()), "link.phy_errors")


def test_one_post_fec_error_per_interval_at_400g_is_within_spec() -> None:
    result = _phy(1, 30.0, 400_000)
    assert result.status is Status.PASS
    assert "post-FEC BER 8.33e-14 (limit 1e-13)" in result.message
    assert result.expected["maxPostFecBer"] == 1e-13


def test_post_fec_errors_above_the_ieee_limit_fail() -> None:
    result = _phy(500, 30.0, 400_000)
    assert result.status is Status.FAIL
    assert "more errors past FEC than a link at the IEEE 802.3 limit shows" in result.message


def test_ber_limit_follows_link_speed_and_spec() -> None:
    # 100G: 1e-12; 30 errors in 30 s at 100G is a BER of 1e-11
    assert _phy(30, 30.0, 100_000).status is Status.FAIL
    assert _phy(3, 30.0, 100_000).status is Status.PASS
    assert ber_allowance(4e11 * 30, 1e-13) == 5
    snap_checks = Checks.model_validate({"link": {"maxPostFecBer": 1e-9}})
    zero = {"rx_pcs_symbol_err_phy": 0, "rx_crc_errors_phy": 0, "link_down_events_phy": 0}
    grown = dict(zero, rx_pcs_symbol_err_phy=30)
    snap = NodeSnapshot("n1", "now", 30.0, (_sample({}, zero), _sample({}, grown)))
    assert _one(run_node_checks(snap, snap_checks), "link.phy_errors").status is Status.PASS


def test_link_down_events_still_fail_on_any_growth() -> None:
    zero = {"rx_pcs_symbol_err_phy": 0, "link_down_events_phy": 0}
    snap = NodeSnapshot(
        "n1", "now", 300.0, (_sample({}, zero), _sample({}, dict(zero, link_down_events_phy=1)))
    )
    assert _one(run_node_checks(snap, Checks()), "link.phy_errors").status is Status.FAIL


def test_port_level_discard_fallback_warns_never_fails() -> None:
    """bnxt has no per-priority drop counter: port-level drops include lossy classes."""
    e0 = {"rx_stat_discard": 0, "tx_stat_discard": 0}
    e1 = {"rx_stat_discard": 1, "tx_stat_discard": 0}
    kw: dict[str, Any] = {"rdma_driver": "bnxt_en", "netdev_driver": "bnxt_en"}
    snap = NodeSnapshot("n1", "now", 30.0, (_sample({}, e0, **kw), _sample({}, e1, **kw)))
    result = _one(run_node_checks(snap, Checks()), "pfc.discards")
    assert result.status is Status.WARN
    assert "port-level, includes lossy classes" in result.message
    assert result.observed["counterLevel"] == "port"


def test_lossless_priority_drops_fail_as_a_rate() -> None:
    e0 = {"rx_prio3_discards": 0, "rx_discards_phy": 0, "tx_discards_phy": 0}
    e1 = dict(e0, rx_prio3_discards=30, rx_discards_phy=30)
    snap = NodeSnapshot("n1", "now", 30.0, (_sample({}, e0), _sample({}, e1)))
    assert _one(run_node_checks(snap, Checks()), "pfc.discards").status is Status.FAIL
    allowed = Checks.model_validate({"pfc": {"maxDiscardsPerSecond": 1.0}})
    assert _one(run_node_checks(snap, allowed), "pfc.discards").status is Status.PASS


@pytest.mark.parametrize(
    ("warnings", "errors", "expected"),
    [(3, 0, Status.WARN), (0, 1, Status.FAIL), (5, 2, Status.FAIL), (0, 0, Status.PASS)],
)
def test_pause_storm_warning_event_warns_error_event_fails(
    warnings: int, errors: int, expected: Status
) -> None:
    names = ("tx_pause_storm_warning_events", "tx_pause_storm_error_events")
    e0 = dict.fromkeys(names, 0)
    e1 = dict(zip(names, (warnings, errors), strict=True))
    snap = NodeSnapshot("n1", "now", 10.0, (_sample({}, e0), _sample({}, e1)))
    results = [
        r
        for r in run_node_checks(snap, Checks())
        if r.check.value == "pfc.pause_storm" and r.subject == "eth0"
    ]
    assert [r.status for r in results] == [expected]


def test_deprecated_per_interval_fields_convert_with_the_interval() -> None:
    spec = NetworkValidationSpec.model_validate(
        {
            "interval": "5m",
            "checks": {"rdma": {"maxErrorsPerInterval": 30}, "pfc": {"maxDiscardsPerInterval": 60}},
        }
    )
    assert spec.checks.rdma.retry_errors_limit == pytest.approx(0.1)
    assert spec.checks.pfc.discards_limit == pytest.approx(0.2)
    assert deprecated_fields_set(spec) == [
        "spec.checks.rdma.maxErrorsPerInterval is deprecated: read as maxRetryErrorsPerSecond "
        "0.1 (per interval 5m); set maxRetryErrorsPerSecond instead",
        "spec.checks.pfc.maxDiscardsPerInterval is deprecated: read as maxDiscardsPerSecond "
        "0.2 (per interval 5m); set maxDiscardsPerSecond instead",
    ]
    # the agent's config is the operator's dump of the spec: read again, it means the same
    again = NetworkValidationSpec.model_validate(spec.model_dump(mode="json", by_alias=True))
    assert again.checks.rdma.retry_errors_limit == pytest.approx(0.1)
    assert again.checks.pfc.discards_limit == pytest.approx(0.2)
    # the per-second field wins when both are set
    both = NetworkValidationSpec.model_validate(
        {"checks": {"rdma": {"maxErrorsPerInterval": 30, "maxRetryErrorsPerSecond": 2}}}
    )
    assert both.checks.rdma.retry_errors_limit == 2
    assert deprecated_fields_set(both) == [
        "spec.checks.rdma.maxErrorsPerInterval is deprecated and ignored: "
        "maxRetryErrorsPerSecond is set"
    ]
    # a bare checks document has no interval: the default one (30 s)
    bare = Checks.model_validate({"rdma": {"maxErrorsPerInterval": 3}})
    assert bare.rdma.retry_errors_limit == pytest.approx(0.1)
    assert Checks().rdma.retry_errors_limit == 0.1
    assert Checks().pfc.discards_limit == 0.0
    with pytest.raises(ValidationError):
        Checks.model_validate({"rdma": {"maxErrorsPerInterval": -1}})


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@given(
    interval=st.one_of(st.sampled_from(["5s", "30s", "1m", "5m", "1h"]), _json),
    old=st.one_of(st.integers(min_value=0, max_value=10**9), _json),
    new=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6), _json),
)
def test_deprecated_conversion_takes_any_input(interval: Any, old: Any, new: Any) -> None:
    """The spec is user input: the conversion never raises anything but a validation error,
    and a valid old count alone is always read as count / interval."""
    rdma: dict[str, Any] = {"maxErrorsPerInterval": old}
    if new is not None:
        rdma["maxRetryErrorsPerSecond"] = new
    try:
        spec = NetworkValidationSpec.model_validate(
            {"interval": interval, "checks": {"rdma": rdma}}
        )
    except ValidationError:
        return
    if new is None:
        wanted = 0.1 if old is None else old / spec.interval_seconds
        assert spec.checks.rdma.retry_errors_limit == pytest.approx(wanted)


def test_bundled_pause_storm_snapshot_warns_on_the_warning_event() -> None:
    snapshots = Path(__file__).resolve().parent.parent / "examples" / "snapshots"
    results = run_node_checks(load_snapshot(snapshots / "fault-pause-storm"), Checks())
    storm = {r.subject: r.status for r in results if r.check.value == "pfc.pause_storm"}
    # tx_pause_storm_warning_events +3 warns; the 73% of tx pause on priority 3 fails
    assert storm["ens1np0"] is Status.WARN
    assert storm["ens1np0/prio3"] is Status.FAIL
