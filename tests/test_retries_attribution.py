"""Attribution, operator side: an `rdma.errors` warning attributed to the requester
(netval.model.attribution; reports built in that shape, as the agent's check sends them)
makes a node degraded, never excluded, unless the east-west results point at the node too;
when many nodes warn so, the status names the likely culprit. Gate release waits for the
exclusions not written yet. On a real Store, through the status computation."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleet_sim import node_report, requester_warning
from netval.model import CheckResult, Report, Status
from netval.model.keys import FabricHealth
from netval.model.spec import NetworkValidationSpec
from netval.model.status import CulpritState
from netval.operator.admission.gate_release import GateReleaser
from netval.operator.gating.facts import verdict_of
from netval.operator.gating.verdict import Why
from netval.operator.ingest.decode import StateChange
from netval.operator.state.store import Store
from netval.operator.status.compute import validation_status
from netval.operator.status.retries import MIN_NODES, retries_summary
from test_east_west import latency, loss

POOL = "pool-a"
NODES = [f"n{i}" for i in range(6)]


def store_with(spec: dict[str, Any], nodes: list[str] = NODES) -> Store:
    store = Store(label_keys={"gpu", "topology.kubernetes.io/zone"})
    for node in nodes:
        store.on_node(node, {"gpu": "1", "topology.kubernetes.io/zone": "rack-1"})
    store.upsert_validation(POOL, generation=1, body={}, status=None,
                            spec=NetworkValidationSpec.model_validate(
                                {"nodeSelector": {"gpu": "1"}, "interval": "60s", **spec}))  # fmt: skip
    store.expected_validations = {POOL}
    return store


def with_peers(node: str, lossy: str, retries: bool) -> Report:
    """`node`'s report: its requester warning (or not) and a loss and latency result to
    every other node; paths to `lossy` lose packets."""
    peers = [p for p in NODES if p != node]
    results: list[CheckResult] = [requester_warning()] if retries else []
    for p in peers:
        results += [latency(p), loss(p, 5.0 if lossy in (node, p) else 0.0)]
    return node_report(node, Status.PASS, POOL, extra=tuple(results))


def test_a_warning_is_a_failure_only_where_the_paths_point() -> None:
    """n3 drops packets: its peers' paths to it fail, and it warns of retries like its peers.
    Only n3 is blamed: failing rdma.errors, excluded; n1 warns of retries too and stays a
    degraded victim."""
    store = store_with({"checks": {"peers": {"enabled": True}}, "gating": {"taint": True}})
    state = store.states[POOL]
    for node in NODES:
        store.ingest_report(with_peers(node, "n3", retries=node in ("n1", "n3")), False)
    now = datetime.now(UTC)
    spec = store.specs[POOL]
    status = validation_status(state, spec, node_labels=store.node_labels, previous=None,
                               now=now, node_fabric=store.node_fabric)  # fmt: skip
    assert status.east_west is not None and [s.node for s in status.east_west.suspects] == ["n3"]
    assert (status.nodes.failing, status.nodes.warning) == (1, 5)
    # (its own failing paths are listed with it now that it fails)
    (failure,) = [f for f in status.failures if f.check == "rdma.errors"]
    assert {f.node for f in status.failures} == {"n3"}
    assert (failure.node, failure.subject) == ("n3", "mlx5_0/1")
    assert "east-west results point at this node" in failure.message
    assert "local_ack_timeout_err" in failure.message
    verdict = verdict_of(POOL, state, spec, store.node_fabric, now)
    assert verdict.nodes["n3"].why is Why.BLAMED and verdict.nodes["n3"].excluded
    assert verdict.nodes["n1"].why is Why.RETRIES_FROM_PEERS
    assert verdict.nodes["n1"].label is FabricHealth.DEGRADED and not verdict.nodes["n1"].excluded
    assert status.nodes.excluded == 1 and status.nodes.admissible == 5

    # the next report of n3 (still warning) stays blamed until the next judgement; once its
    # peers' paths to it are fine, the blame lifts and the warning is a warning again
    store.ingest_report(with_peers("n3", "n3", retries=True), False)
    assert verdict_of(POOL, state, spec, store.node_fabric, now).nodes["n3"].excluded
    for node in NODES:
        store.ingest_report(with_peers(node, "nobody", retries=node in ("n1", "n3")), False)
    later = now + timedelta(seconds=1)
    status = validation_status(state, spec, node_labels=store.node_labels, previous=None,
                               now=later, node_fabric=store.node_fabric)  # fmt: skip
    assert status.nodes.failing == 0 and not status.failures


def _retries_report(node: str) -> Report:
    return node_report(node, Status.WARN, POOL)


def test_many_nodes_warning_name_the_node_that_went_quiet_first() -> None:
    nodes = [f"g{i:02d}" for i in range(12)]
    store = store_with({}, nodes)
    state = store.states[POOL]
    t0 = datetime.now(UTC)
    for node in nodes:
        store.ingest_report(node_report(node, Status.PASS, POOL), False)
    # g01 has been failing for long; g07 goes offline; then 8 nodes warn of retries
    store.ingest_report(node_report("g01", Status.FAIL, POOL), False)
    state.nodes["g01"].failures = tuple(
        (t0 - timedelta(hours=2), *f[1:]) for f in state.nodes["g01"].failures
    )
    store.on_state(StateChange(POOL, "g07", False))
    assert retries_summary(state, t0) is None  # nobody warns yet
    for node in nodes[4:]:
        if node != "g07":
            store.ingest_report(_retries_report(node), False)
    summary = retries_summary(state, datetime.now(UTC))
    assert summary is not None and summary.nodes == 7 >= MIN_NODES
    assert [(c.node, c.state) for c in summary.culprits] == [
        ("g07", CulpritState.OFFLINE), ("g01", CulpritState.FAILING)]  # fmt: skip
    assert summary.message.startswith("requester-side retries on 7 nodes since g07 went offline")
    assert "also g01 (failing)" in summary.message
    assert summary.counters == ["local_ack_timeout_err", "req_transport_retries_exceeded"]
    status = validation_status(state, store.specs[POOL], node_labels=store.node_labels,
                               previous=None, now=datetime.now(UTC))  # fmt: skip
    assert status.retries == summary
    healthy = status.condition(status.conditions[1].type)
    assert healthy is not None and "since g07 went offline" in healthy.message
    # the victims are degraded, admissible, none excluded
    verdict = verdict_of(POOL, state, store.specs[POOL], store.node_fabric, datetime.now(UTC))
    victims = [n for n in nodes[4:] if n != "g07"]
    assert {verdict.nodes[n].why for n in victims} == {Why.RETRIES_FROM_PEERS}
    assert verdict.excluded == {"g01"}


@pytest.mark.parametrize("pending", [set(), {"n2"}, {"cpu-x"}])
def test_gate_release_waits_for_the_exclusions_not_written(pending: set[str]) -> None:
    store = store_with({"gating": {"taint": True}})
    for node in NODES:
        store.ingest_report(node_report(node, Status.FAIL if node == "n2" else Status.PASS,
                                        POOL), False)  # fmt: skip
    state = store.states[POOL]
    state.verdict = verdict_of(POOL, state, store.specs[POOL], store.node_fabric,
                               datetime.now(UTC))  # fmt: skip
    store.exclusions_pending = lambda: pending
    view = store.validation_view(POOL)
    assert view is not None
    waiting = len(pending & set(NODES))
    assert view.pending_exclusions == waiting
    listed: list[str] = []

    class Pools:
        async def run(self, concern: Any, fn: Any, core: Any, name: str, *args: Any) -> int:
            listed.append(name)
            return 0

    class Runtime:
        specs = store.specs
        states = store.states

        class kube:
            pools = Pools()
            core = None

        @staticmethod
        def validation_view(name: str) -> Any:
            found = store.validation_view(name)
            return replace(found, usable=True) if found is not None else None

        @staticmethod
        async def validations_loaded() -> bool:
            return False

    import asyncio

    asyncio.run(GateReleaser({}).pass_once(Runtime()))  # type: ignore[arg-type]
    assert listed == ([] if waiting else [POOL])
