"""bench/scale.py, small: one connection per node against the chart's broker (the shared
login in plaintext; per-node certificates over TLS) and the operator's runtime in its own
process, both modes; the run completes and prints every figure (no wall-clock asserts: the
figures are the bench's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mosquitto

REPO = Path(__file__).resolve().parents[1]
KEYS = {
    "connect_all_s",
    "connected",
    "broker_rss_mib",
    "broker_cpu_pct",
    "operator_rss_mib",
    "operator_cpu_pct",
    "clients_cpu_pct",
    "msgs_per_s",
    "reports_per_s",
    "beats_per_s",
    "operator_reports_per_s",
    "detect_p50_s",
    "detect_p99_s",
    "api_writes_steady_per_s",
    "api_writes_burst_per_s",
    "replay_s",
}


def test_quick_run_prints_every_figure_for_both_modes(tmp_path: Path) -> None:
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--quick", "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert "| nodes | mode |" in run.stdout
    figs = json.loads(out.read_text())
    assert [(f["mode"], f["nodes"]) for f in figs] == [("full", 500), ("beats", 500)]
    for fig in figs:
        assert not KEYS - set(fig), KEYS - set(fig)
        assert fig["connected"] == fig["nodes"] == fig["connected_end"]
        assert fig["connect_refused"] == 0 and not fig["connect_errors"]
        assert fig["replay_retained"] >= fig["nodes"]  # every node's report replayed
        assert fig["burst_counted"] == fig["burst_nodes"]  # every failing node reached status
        assert fig["operator_problems"] == []
    full, beats = figs
    assert full["beats_per_s"] == 0 and full["reports_per_s"] > 0
    # beats: 1 % of the nodes report per interval, the rest beat, and the operator counts
    # the beats as proof that each standing report is current
    assert beats["beats_per_s"] > beats["reports_per_s"]
    assert beats["operator_beats_per_s"] > 0  # the operator reads them itself


def test_the_operator_stand_in_implements_every_call_and_refuses_others() -> None:
    from test_bench_standins import kube_calls

    sys.path.insert(0, str(REPO / "bench"))
    from scale_operator import CountingKube

    kube = CountingKube(1)
    missing = sorted(c for c in kube_calls() if not hasattr(type(kube), c))
    assert not missing, f"bench/scale_operator.py's CountingKube lacks {missing}"
    with pytest.raises(AttributeError, match="stand-in"):
        kube.a_method_added_later  # noqa: B018


RESTART_KEYS = {
    "restart_broker_listening_s",
    "restart_all_connected_s",
    "restart_all_reported_s",
    "restart_connect_attempts",
    "restart_would_reenroll",
    "restart_writes_outage",
    "restart_writes_after",
    "restart_nodes_written",
    "rollout_replay_s",
    "rollout_writes",
    "rollout_rss_mib",
}


@pytest.mark.parametrize("scenario", ["broker-restart", "broker-replace"])
def test_quick_broker_restart_and_rollout_bring_every_node_back(
    tmp_path: Path, scenario: str
) -> None:
    """Over TLS with per-node certificates (the chart's default): the broker restarted with
    its data, or replaced by an empty one: every node back with the certificate it holds."""
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), "--quick", "--nodes", "300",
         "--modes", "beats", "--transport", "tls", "--scenario", scenario, "operator-rollout",
         "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert "| broker listening again |" in run.stdout
    (fig,) = json.loads(out.read_text())
    assert not RESTART_KEYS - set(fig), RESTART_KEYS - set(fig)
    # every node lost its connection, came back and reported again (a live report or a
    # beat matching its standing report), with the credential it had: no re-enrollment
    assert fig["restart_nodes_lost"] == fig["restart_nodes_reconnected"] == 300
    assert fig["restart_nodes_reported"] == 300
    assert fig["restart_would_reenroll"] == 0
    # the new operator counted every node from the retained reports and beats
    assert fig["rollout_replay_retained"] >= 1
