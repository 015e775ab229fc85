"""Per-NIC health from the operator's state to the node verdict (gating.facts, state.nic_health):
reports and beats counted per NIC, k of N counting reports within k, a NIC without a DRA
device taking the node path, an operator verdict being the node's, and the rules in the
cluster as the decision before after an operator restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dra_kit import rail, rail_report
from netval.model.beat import Beat, report_digest
from netval.model.ids import Status
from netval.model.nics import Nic
from netval.model.spec import NetworkValidationSpec
from netval.operator.gating.facts import DeviceGate, node_facts, policy
from netval.operator.gating.verdict import Why, decide_validation
from netval.operator.state.beats import ingest_beat
from netval.operator.state.nic_health import failing_count, streak_within
from netval.operator.state.node_verdicts import set_blame
from netval.operator.state.store import Store

SPEC = NetworkValidationSpec.model_validate({
    "nodeSelector": {"pool": "a"}, "interval": "60s",
    "gating": {"taint": True, "deviceTaints": True, "maxFailedDevicesPerNode": 1,
               "recoveryReports": 3, "maxUnhealthyPercent": 100},
})  # fmt: skip
EVERYTHING = DeviceGate(lambda node, nic: True)


def store(*nodes: str) -> Store:
    s = Store(label_keys={"pool"})
    for n in nodes:
        s.on_node(n, {"pool": "a"})
    s.upsert_validation("pool-a", generation=1, spec=SPEC, body={}, status=None)
    return s


def feed(s: Store, node: str, failing: tuple[int, ...] = (), *, at: datetime | None = None) -> None:
    r = rail_report(node, failing=failing)
    if at is not None:
        r = r.model_copy(update={"started_at": at})
    s.ingest_report(r, False)


def decide(
    s: Store, gate: DeviceGate = EVERYTHING
) -> tuple[dict[str, Why], dict[str, tuple[str, ...]]]:
    state = s.states["pool-a"]
    now = datetime.now(UTC)
    v = decide_validation(policy("pool-a", SPEC, devices=True),
                          node_facts(state, s.node_fabric, now, gate, 1))  # fmt: skip
    state.verdict = v
    return {n: d.why for n, d in v.nodes.items()}, dict(v.devices)


def test_one_failing_nic_then_its_recovery_counted_per_nic() -> None:
    s = store("a", "b")
    feed(s, "b")
    feed(s, "a", (3,))
    whys, devices = decide(s)
    assert whys["a"] is Why.DEVICES_FAILING and devices == {"a": ("mlx5_3",)}
    for n in range(1, 4):  # passing again: the NIC is held until 3 passing reports
        feed(s, "a", at=datetime.now(UTC) + timedelta(seconds=n))
        whys, devices = decide(s)
        expected = Why.PASSING if n >= 3 else Why.DEVICES_RECOVERING
        assert whys["a"] is expected, n
        assert devices == ({} if n >= 3 else {"a": ("mlx5_3",)})


def test_beats_of_a_passing_report_count_for_the_nic() -> None:
    s = store("a")
    feed(s, "a", (3,))
    decide(s)
    feed(s, "a", at=datetime.now(UTC) + timedelta(seconds=1))
    state = s.states["pool-a"]
    rec = state.nodes["a"]
    for seq in (1, 2):
        beat = Beat(seq=seq, cycle_at=datetime.now(UTC) + timedelta(seconds=1 + seq),
                    digest=rec.digest, worst=Status.PASS)  # fmt: skip
        ingest_beat(state, "a", beat, datetime.now(UTC) + timedelta(seconds=1 + seq))
    assert decide(s)[0]["a"] is Why.PASSING  # one report and two beats: 3 passing


def test_two_nics_then_one_recovers_after_recovery_reports_within_k() -> None:
    s = store("a")
    feed(s, "a", (2, 3))
    whys, devices = decide(s)
    assert whys["a"] is Why.FAILING and not devices
    rec = s.states["pool-a"].nodes["a"]
    assert failing_count(rec) == 2
    for n in range(1, 4):  # mlx5_2 passes again, mlx5_3 still fails: within k = 1
        feed(s, "a", (3,), at=datetime.now(UTC) + timedelta(seconds=n))
        whys, devices = decide(s)
        assert streak_within(s.states["pool-a"].nodes["a"], 1) == n
        assert whys["a"] is (Why.DEVICES_FAILING if n >= 3 else Why.FAILING), n
    # mlx5_2 passed 3 times while the node recovered: only the failing mlx5_3 is tainted
    assert devices == {"a": ("mlx5_3",)}


def test_a_nic_without_a_dra_device_is_the_nodes() -> None:
    s = store("a")
    feed(s, "a", (3,))
    pci, _, _ = rail(3)
    only_others = DeviceGate(lambda node, nic: nic.pci_address != pci)
    whys, devices = decide(s, only_others)
    assert whys["a"] is Why.FAILING and not devices


def test_an_operator_verdict_is_the_nodes_not_a_nics() -> None:
    s = store("a")
    feed(s, "a", (3,))
    rec = s.states["pool-a"].nodes["a"]
    rec.retries = None
    set_blame(rec, "a", None)  # no blame: NIC only
    assert decide(s)[0]["a"] is Why.DEVICES_FAILING
    from netval.operator.state.node_verdicts import fold_verdict

    fold_verdict(rec, "fleet.consistency", Status.FAIL, ())
    assert failing_count(rec) > 1 and decide(s)[0]["a"] is Why.FAILING


def test_rules_in_the_cluster_hold_a_passing_nic_after_a_restart() -> None:
    s = store("a")  # a new operator: no memory of mlx5_3 failing
    feed(s, "a")
    tainted = DeviceGate(lambda node, nic: True, {"a": frozenset({"mlx5_3"})})
    whys, devices = decide(s, tainted)
    assert whys["a"] is Why.DEVICES_RECOVERING and devices == {"a": ("mlx5_3",)}
    for n in (1, 2):
        feed(s, "a", at=datetime.now(UTC) + timedelta(seconds=n))
    assert decide(s, tainted)[0]["a"] is Why.PASSING  # 3 passing reports since the restart
    # a NIC the report no longer lists holds nothing: its rule goes
    s2 = store("b")
    r = rail_report("b")
    s2.ingest_report(r.model_copy(update={"nics": [Nic(rdma_device="mlx5_0")]}), False)
    assert decide(s2, DeviceGate(lambda node, nic: True, {"b": frozenset({"mlx5_3"})}))[1] == {}


def test_reports_without_nics_are_judged_as_a_whole() -> None:
    s = store("a")
    r = rail_report("a", failing=(3,)).model_copy(update={"nics": None})
    s.ingest_report(r, False)
    whys, devices = decide(s)
    assert whys["a"] is Why.FAILING and not devices
    assert report_digest(r) == report_digest(rail_report("a", failing=(3,)).model_copy(
        update={"nics": None, "started_at": r.started_at}))  # fmt: skip
