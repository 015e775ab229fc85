"""NetworkLoadTest on two more real fabrics (tests/loadtest_netns.py), real agents and iperf3:

- unshaped veth ports, faster than six agents on two cores can fill: the hosts, not the
  fabric, limit every flow, so the run says SenderLimited / Inconclusive and never gives a
  passing ratio near 1.0;
- two rails per node, each plane shaped 3:1 like tests/test_loadtest_netns.py: both rails'
  uplinks carry the load-test bytes at once, and the run reports a cell per rail plane.
"""

from __future__ import annotations

import threading
import time

import pytest

from loadtest_netns import LEAVES, RATE_MBIT, make_plan, run_all, running_fabric
from netval.model.loadtest import CellReason, LoadReason, RunPhase
from netval.operator.loadtest.status import verdict

pytestmark = [pytest.mark.netns, pytest.mark.timeout(200)]


def test_an_unshaped_fabric_is_sender_limited_and_the_run_inconclusive(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with running_fabric(tmp_path_factory.mktemp("unshaped"), rate_mbit=None) as fabric:
        plan = make_plan(fabric, "unshaped", "5s", 0)
        run, results = run_all(fabric, plan)
    assert all(r.error is None for r in results)
    assert run.east_west is not None and run.coverage_percent == 100.0
    for c in run.east_west.cells:
        assert c.reason is CellReason.SENDER_LIMITED, c
        assert c.oversubscription is None, c
    intra = next(c for c in run.east_west.cells if c.a == c.b)
    # the numbers behind it: below 60 % of the 10000 Mb/s the veth reports, CPU-bound
    assert intra.port_mbps == 10_000.0 and intra.per_node_mbps is not None
    assert intra.per_node_mbps < 6_000, intra
    # the senders' engines were CPU-bound (the receivers usually are not: sending costs more)
    assert "senders" in intra.note and intra.cpu_bound_percent is not None
    assert intra.cpu_bound_percent >= 50, intra
    assert run.max_oversubscription is None
    phase, truth, reason, text = verdict(run, 80.0)
    assert (phase, truth, reason) == (RunPhase.INCONCLUSIVE, "Unknown", LoadReason.INCONCLUSIVE)
    assert "sender-limited" in text
    print(f"\n{text}")


def test_two_rails_per_node_load_both_planes_at_once_and_report_both(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with running_fabric(tmp_path_factory.mktemp("rails"), rate_mbit=RATE_MBIT, rails=2) as fabric:
        assert all(len(fabric.rails[n][0]) == 2 for n in fabric.rails)  # both announced
        plan = make_plan(fabric, "two-rails", "5s", 0)
        cross_stage = plan.stages[1]
        window = next(w for w in plan.windows_of(cross_stage) if w.id.endswith("cross"))
        carried: dict[int, int] = {}

        def measure() -> None:
            # scheduling, not synchronisation: the counters across the measured part
            while time.time() < window.measure_start.timestamp():
                time.sleep(0.1)
            before = {r: fabric.uplink_tx_bytes(r) for r in (0, 1)}
            while time.time() < window.end.timestamp():
                time.sleep(0.1)
            for r in (0, 1):
                carried[r] = fabric.uplink_tx_bytes(r) - before[r]

        counter = threading.Thread(target=measure, daemon=True)
        counter.start()
        run, _results = run_all(fabric, plan)
        counter.join(30)
    seconds = window.measured_seconds
    for r in (0, 1):
        mbps = carried[r] * 8 / seconds / 1e6
        print(f"\nuplink of rail {r}: {mbps:.1f} Mbit/s during the cross window")
        # each plane's uplink loaded at once: one after the other, neither would carry more
        # than half the window's bytes (a flow starting late on a loaded machine costs some)
        assert mbps >= 0.6 * RATE_MBIT, carried
    assert run.east_west is not None
    cells = {(c.a, c.b, c.rail): c for c in run.east_west.cells}
    assert set(cells) == {(a, b, r) for a, b in (("leaf-a", "leaf-a"), ("leaf-a", "leaf-b"),
                                                  ("leaf-b", "leaf-b")) for r in (0, 1)}  # fmt: skip
    for r in (0, 1):
        cross = cells[("leaf-a", "leaf-b", r)]
        assert cross.flows == 6 and cross.reason is None, cross
        assert cross.oversubscription is not None and abs(cross.oversubscription / 3 - 1) <= 0.25
        for leaf in LEAVES:
            assert cells[(leaf, leaf, r)].oversubscription == 1.0
    assert verdict(run, 80.0)[0] is RunPhase.SUCCEEDED
