"""Nodes with the same per-check verdicts share one (check, bucket) tuple (issue 23, memory at
100,000 nodes); sharing an immutable tuple changes nothing a reader sees: a verdict folded into
one node leaves the others' counts as they were, and the status is what it was."""

from __future__ import annotations

from netval.model.ids import CheckId, Status
from netval.operator.state import node_verdicts
from netval.operator.state.aggregation import compute_status
from netval.operator.state.node_verdicts import fold_verdict, shared_buckets
from netval.operator.state.validation import ingest_report
from test_aggregate import CARRIER_DOWN, CARRIER_OK, MTU_OK, at, report, state

NODES = [f"gpu-{i}" for i in range(6)]


def test_equal_buckets_are_one_object_and_folding_one_node_leaves_the_others() -> None:
    s = state(NODES)
    for node in NODES[:5]:
        ingest_report(s, report(node, started=1, results=[CARRIER_OK, MTU_OK]), at(2))
    ingest_report(s, report(NODES[5], started=1, results=[CARRIER_DOWN, MTU_OK]), at(2))
    recs = [s.nodes[n] for n in NODES]
    assert all(r.check_buckets is recs[0].check_buckets for r in recs[1:5])
    assert recs[5].check_buckets == (("link.carrier", 2), ("mtu.interface", 0))
    before = compute_status(s, at(3), previous=None)
    assert before.checks["link.carrier"].fail == 1 and before.checks["link.carrier"].pass_ == 5

    assert fold_verdict(recs[0], CheckId.FLEET_CONSISTENCY.value, Status.WARN, ())
    assert recs[0].check_buckets == (*recs[1].check_buckets, ("fleet.consistency", 1))
    assert recs[1].check_buckets == (("link.carrier", 0), ("mtu.interface", 0))
    after = compute_status(s, at(3), previous=None)
    assert after.checks["fleet.consistency"].warn == 1
    assert after.checks["link.carrier"] == before.checks["link.carrier"]
    assert fold_verdict(recs[0], CheckId.FLEET_CONSISTENCY.value, None, ())
    assert recs[0].check_buckets is recs[1].check_buckets  # back to the shared one


def test_the_shared_table_is_bounded() -> None:
    saved = dict(node_verdicts._SHARED_BUCKETS)
    try:
        node_verdicts._SHARED_BUCKETS.clear()
        for i in range(node_verdicts.MAX_SHARED_BUCKETS + 10):
            shared_buckets(((f"c{i}", 0),))
        assert len(node_verdicts._SHARED_BUCKETS) == node_verdicts.MAX_SHARED_BUCKETS
        late = ((f"c{node_verdicts.MAX_SHARED_BUCKETS + 20}", 1),)
        assert shared_buckets(late) is late  # kept as it came, still correct
    finally:
        node_verdicts._SHARED_BUCKETS.clear()
        node_verdicts._SHARED_BUCKETS.update(saved)
