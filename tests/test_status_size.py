"""The status stays under 64 KiB at any fleet size (issue 23): aggregates only.

The worst case the renderer can meet, through the real path (`Store.ingest_report`, then
`status.compute.validation_status`, what the status writer patches): 30,000 targeted nodes
in CI (every section reaches its bound from about 3,000 on; `NETVAL_STATUS_SIZE_NODES=100000`
runs the issue's 100,000 in about 100 s, measured under 64 KiB as well),
every one failing a dozen checks on its own subjects with messages at the agent's length
limit, facts that disagree across the fleet (consistency), LLDP neighbours that contradict the
declared topology labels (topology), and failing east-west paths to peers in other domains
(eastWest), plus a tripped Gating condition with its longest message.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest

from netval.model import CheckId, CheckResult, Report, Status
from netval.model.ids import CheckGroup
from netval.model.spec import NetworkValidationSpec
from netval.model.topology import InterfaceTopology, LldpNeighbour, TopologyReport
from netval.operator.state.store import Store
from netval.operator.state.validation import ValidationState, set_agents_ready
from netval.operator.status import compute
from netval.operator.status.compute import validation_status
from netval.operator.status.size_budget import STATUS_BUDGET, fit_status, status_bytes

LIMIT = 64 * 1024
N = int(os.environ.get("NETVAL_STATUS_SIZE_NODES", "30000"))
ZONES = 1000
LEVEL = "x/leaf"
POOL = {"netval.example/fleet": "a"}
NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
LONG = (
    "x" * 990
)  # with the prefix at the model's 1024-character limit, past the status's truncation
LOCAL_CHECKS = [c for c in CheckId if c.group not in (CheckGroup.PEER,)][:12]


def _report(i: int, node: str, n: int) -> Report:
    results = [
        CheckResult(check=check, subject=f"{node}-nic{j}", status=Status.FAIL,
                    message=f"{check.value} on {node}: {LONG}"[:1024])
        for j, check in enumerate(LOCAL_CHECKS)
    ]  # fmt: skip
    for k in range(3):  # failing paths to peers in three other domains
        peer = f"n{(i + 1 + k * 7919) % n:06d}"
        results.append(
            CheckResult(check=CheckId.PEER_LOSS, subject=peer, status=Status.FAIL,
                        message=f"loss to {peer}: {LONG}"[:1024],
                        observed={"lossPercent": 50.0, "domain": f"z{(i + 1 + k) % ZONES}"})
        )  # fmt: skip
    neighbour = LldpNeighbour(chassis_id=f"c{i}", port_id=f"p{i}", system_name=f"leaf-{i % 997}")
    return Report(
        validation="big",
        generation=1,
        node=node,
        started_at=NOW,
        duration_ms=1.0,
        status=Status.FAIL,
        results=results,
        # one node in ten its own firmware, driver, board...: many keys with many outliers
        facts={f"fact{k:02d}": f"{node}-{k}" if i % 10 == 0 else "common" for k in range(30)},
        topology=TopologyReport(
            interfaces=[InterfaceTopology(interface="ens1np0", neighbours=[neighbour])]
        ),
    )


def _fleet(n: int) -> tuple[Store, ValidationState, NetworkValidationSpec]:
    store = Store(label_keys=POOL)
    spec = NetworkValidationSpec.model_validate(
        {
            "nodeSelector": POOL,
            "checks": {"peers": {"enabled": True, "topologyKey": "zone"}},
            "topology": {"lldp": True, "levels": [LEVEL]},
            "consistency": {"maxOutliersPerKey": 100},  # the most the CRD allows
        }
    )
    # the validation first: the store keeps the label keys it references (zone, the level)
    state = store.upsert_validation("big", generation=1, spec=spec, body={}, status=None)
    nodes = [f"n{i:06d}" for i in range(n)]
    for i, node in enumerate(nodes):
        store.on_node(node, {**POOL, LEVEL: f"blk-{i % 50}", "zone": f"z{i % ZONES}"})
    set_agents_ready(state, True, NOW)
    for i, node in enumerate(nodes):
        store.ingest_report(_report(i, node, n), False)
    assert len(state.nodes) == n
    return store, state, spec


@pytest.mark.timeout(600)  # 100,000 reports through the store: ~100 s on a loaded 2-core box
def test_status_stays_under_64_kib_with_every_node_failing() -> None:
    store, state, spec = _fleet(N)
    status = validation_status(state, spec, node_labels=store.node_labels, previous=None, now=NOW)
    assert status.nodes.failing == N
    assert status.consistency is not None and status.topology is not None
    assert status.east_west is not None and status.east_west.cells
    size = len(json.dumps(status.to_patch()))
    assert size < LIMIT, size


def test_fitting_halves_name_lists_and_keeps_every_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 such nodes: each section within its own bound, together over the budget."""
    store, state, spec = _fleet(3000)
    monkeypatch.setattr(compute, "fit_status", lambda s: s)
    raw = validation_status(state, spec, node_labels=store.node_labels, previous=None, now=NOW)
    assert status_bytes(raw) > STATUS_BUDGET
    fitted = fit_status(raw)
    assert status_bytes(fitted) <= STATUS_BUDGET
    assert fit_status(fitted) is fitted  # within the budget: untouched
    rc, fc = raw.consistency, fitted.consistency
    assert rc is not None and fc is not None
    assert len(fc.keys) + fc.more_keys == len(rc.keys) + rc.more_keys
    shown = {(k.cohort, k.key): len(k.outliers) + k.more_outliers for k in fc.keys}
    assert shown == {
        (k.cohort, k.key): len(k.outliers) + k.more_outliers
        for k in rc.keys
        if (k.cohort, k.key) in shown
    }
    assert any(k.more_outliers for k in fc.keys)
    # what a reader counts is exact whatever was cut
    assert fitted.nodes == raw.nodes and fitted.checks == raw.checks
    assert fitted.conditions == raw.conditions
    assert fitted.east_west == raw.east_west or (
        fitted.east_west is not None and raw.east_west is not None
        and len(fitted.east_west.cells) + fitted.east_west.omitted_cells
        == len(raw.east_west.cells) + raw.east_west.omitted_cells
    )  # fmt: skip
