"""The operator's reconnect grace is per broker shard and ends for a node once it is heard;
a node's messages on a shard not its own are dropped, counted and cleared there (the pure
parts: the store's clock, one ingest session's handling; the brokers themselves:
tests/test_verdict_process.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from netval.infra.mqtt_settings import MqttSettings
from netval.model.shards import shard_of
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import DropReason
from netval.operator.ingest.subscriber import ReportIngest
from netval.operator.state import validation as vs
from netval.operator.state.hearing import Deafness
from netval.operator.state.store import Store
from operator_env import report, report_msg, state_msg

SPEC = NetworkValidationSpec.model_validate({"nodeSelector": {"gpu": "1"}, "interval": "10s"})
NODES = [f"gpu-{i:02d}" for i in range(40)]
ON = {0: [n for n in NODES if shard_of(n, 2) == 0], 1: [n for n in NODES if shard_of(n, 2) == 1]}


def at(monkeypatch: pytest.MonkeyPatch, when: datetime) -> None:
    monkeypatch.setattr("netval.operator.state.store.utcnow", lambda: when)


def sharded_store() -> tuple[Store, vs.ValidationState]:
    store = Store(label_keys={"gpu"}, shards=2)
    for node in NODES:
        store.on_node(node, {"gpu": "1"})
    state = store.upsert_validation("pool-a", generation=1, spec=SPEC, body={}, status=None)
    return store, state


def test_a_shards_reconnect_gives_only_its_nodes_the_grace_until_heard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = datetime.now(UTC)
    store, state = sharded_store()
    a0, b0 = ON[0][:2]
    a1 = ON[1][0]
    at(monkeypatch, now)
    for node in (a0, b0, a1):
        store.ingest_report(report(node), False)
    window = state.stale_after  # 30 s
    # the operator's session on shard 0 comes back at +25 s (grace 30 s: heard at +55 s)
    back = now + timedelta(seconds=25)
    store.note_deaf(back, timedelta(seconds=30), shard=0)
    later = now + window + timedelta(seconds=1)
    assert vs.is_fresh(state, a0, later) and vs.is_fresh(state, b0, later)
    assert not vs.is_fresh(state, a1, later)  # shard 1's reconnect never happened: stale
    # a0 is heard again at +26 s and then goes silent: the normal rule, from +26 s
    at(monkeypatch, back + timedelta(seconds=1))
    store.ingest_report(report(a0), False)
    silent = back + timedelta(seconds=1) + window + timedelta(seconds=1)
    assert not vs.is_fresh(state, a0, silent)
    assert vs.is_fresh(state, b0, silent)  # not heard since: still within its grace
    assert not vs.is_fresh(state, b0, back + timedelta(seconds=30) + window + timedelta(seconds=1))
    # the deadline the status writer waits for honours both
    due = vs.next_deadline(state, back + timedelta(seconds=2))
    assert due is not None and due <= back + timedelta(seconds=1) + window + timedelta(seconds=1)


def test_an_older_reconnect_never_replaces_a_newer_one() -> None:
    d = Deafness(shards=2)
    now = datetime.now(UTC)
    d.note(1, now, now + timedelta(seconds=30))
    d.note(1, now - timedelta(seconds=5), now)
    assert d.spells[1].reconnected_at == now and 0 not in d.spells
    assert d.shard("gpu-07") == shard_of("gpu-07", 2)
    assert Deafness().shard("anything") == 0


def test_a_message_on_a_shard_not_the_nodes_is_dropped_counted_and_cleared() -> None:
    got: list[str] = []
    settings = MqttSettings(host="127.0.0.1", port=1, tls=False, username=None, password=None,
                            ca_file=None, client_id="t")  # fmt: skip
    ingest = ReportIngest(
        settings,
        on_report=lambda r, retained: got.append(r.node),
        on_state=lambda change: got.append(f"state {change.node}"),
        shard=0,
        shards=2,
    )
    mine, theirs = ON[0][0], ON[1][0]
    for topic, payload in (report_msg(report(mine)), report_msg(report(theirs)),
                           state_msg(theirs, b"offline"), state_msg(theirs, b"")):  # fmt: skip
        ingest.handle(topic, payload, retained=True)
    assert got == [mine]
    assert ingest.stats.dropped[DropReason.WRONG_SHARD] == 2  # a clear (empty) is no message
    # the retained ones are cleared on this shard (an empty payload is a clear already)
    assert list(ingest._clears) == [
        f"netval/v1/pool-a/{theirs}/report",
        f"netval/v1/pool-a/{theirs}/state",
    ]


def test_the_verdicts_freshness_is_the_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gating.facts` inlines `state.validation.heard` (it runs for every node every window):
    both say the same of fresh, silent, offline, unconfirmed and never-reported nodes, with
    and without a shard's reconnect grace."""
    from netval.model.beat import Beat
    from netval.operator.gating.facts import node_facts
    from netval.operator.ingest.decode import BeatMessage, StateChange

    now = datetime.now(UTC)
    store, state = sharded_store()
    at(monkeypatch, now - timedelta(seconds=40))
    for node in NODES[:10]:
        store.ingest_report(report(node), False)
    at(monkeypatch, now)
    for node in NODES[5:20]:
        store.ingest_report(report(node), False)
    store.on_state(StateChange("pool-a", NODES[6], False))
    store.on_state(StateChange("pool-a", NODES[30], False))
    beat = Beat(seq=5, cycle_at=now, digest="0" * 32, worst="pass")
    store.ingest_beat(BeatMessage("pool-a", NODES[8], beat), False)  # contradicts its report
    for deaf in (False, True):
        if deaf:
            store.note_deaf(now - timedelta(seconds=20), timedelta(seconds=30), shard=0)
        for moment in (now, now + timedelta(seconds=25), now + timedelta(seconds=60)):
            facts = node_facts(state, store.node_fabric, moment)
            assert {n: f.heard for n, f in facts.items()} == {
                n: vs.heard(state, n, moment) for n in state.targeted
            }
