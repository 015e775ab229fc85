"""A short detection campaign (bench/detection.py, docs/detection.md) as a test: every process
real (the `netval operator`, a `netval agent` per node, Mosquitto over TLS) on 2 leaves x 2
nodes and a spine of namespaces. Behaviour is asserted, never timing:

- a healthy but busy soak (an agent stopped for 0.15 s every ~2 s, as a node whose CPU is
  taken for a moment): no agent reports a `peer.path_mtu` failure (a busy responder's late
  answer is no MTU black hole, issue 33);
- a configuration fault (ECN notification point off in the recorded /sys tree) is named on
  its node with `ecn.np_enabled`, and nothing else is flagged at all;
- a node's port down is named on its node with `link.carrier`, and nothing else is flagged:
  the nodes whose paths to it fail are observers (`PathObserver`), not `degraded`;
- a silent MTU black hole on a leaf uplink fails the cross-leaf cell of `status.eastWest`,
  the operator names the leaf pair in `status.eastWest.linkSuspects`, and no node is gated
  (localized) or flagged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import mosquitto
from detection_campaign import Outcome, Plan, campaign_env, run_injections, run_soak
from detection_fabric import Layout
from detection_score import gated

pytestmark = [pytest.mark.netns, pytest.mark.timeout(600)]

GATING = frozenset({"label=unhealthy", "label=suspect", "taint"})
PLAN = Plan(
    interval=5,
    seed=33,
    classes=("ecn_np_off", "port_down", "mtu_blackhole"),
    injections=1,
    soak=45.0,
    stall_every=2.0,  # a busy soak: an agent stopped for 0.15 s every ~2 s
    hold_intervals=3.0,
    settle=60.0,
)


def test_a_short_campaign_names_each_fault_and_nothing_else(tmp_path: Path) -> None:
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    if shutil.which("nft") is None or shutil.which("tc") is None:
        pytest.skip("nftables and tc (iproute2) are needed for the fabric")
    pytest.importorskip("kmock", reason="kmock is not installed (pip install kmock==0.8)")
    layout = Layout(leaves=2, per_leaf=2)
    outcome = Outcome(PLAN, layout)
    with campaign_env(layout, tmp_path, PLAN) as (env, observer):
        outcome.soak = run_soak(env, observer, PLAN, print)
        run_injections(env, observer, PLAN, outcome, print)
        looks = list(observer.looks)
        diagnostics = env.diagnostics()
    assert outcome.soak.path_mtu_failures == (), outcome.soak.path_mtu_failures
    print(f"\nsoak flag events (measured only): {outcome.soak.reasons or 'none'}")
    scored = {s.fault: s for s in outcome.scored}
    assert set(scored) == set(PLAN.classes), outcome.notes

    config = scored["ecn_np_off"]
    assert config.detected, diagnostics
    assert config.wrong == {}, config.wrong

    down = scored["port_down"]
    assert down.detected, diagnostics
    assert down.wrong == {}, down.wrong

    link = scored["mtu_blackhole"]
    assert link.detected, diagnostics
    assert link.localized, ([k.links for k in looks if k.links][:1],
                            [sorted(gated(k)) for k in looks if gated(k)])  # fmt: skip
    assert link.wrong == {}, link.wrong
    for s in outcome.scored:  # another node flagged is measured; gated, it fails the test
        gating = {n: w for n, (_t, w) in s.wrong.items() if w & GATING}
        assert gating == {}, (s.fault, gating)
    assert not any("agents exited" in n for n in outcome.notes), outcome.notes
