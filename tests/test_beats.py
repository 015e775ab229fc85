"""Beats (issue 23), pure: the material digest agent and operator share, the agent's full-or-beat
cadence, the beat's decoding from untrusted bytes (fuzzed), and what a beat does to the
operator's state (match, mismatch, before any report, reordered, after a restart's replay)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netval.agent.config import AgentConfig
from netval.agent.report_digest import ReportCadence
from netval.model import CheckId, CheckResult, Report, Status
from netval.model.beat import MAX_BEAT_BYTES, Beat, mask_numbers, report_digest
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import DropReason, TopicKind, topic
from netval.operator.agents.agent_configmap import agent_config_document
from netval.operator.ingest.decode import BeatMessage, Dropped, decode_message
from netval.operator.state import validation as vs
from netval.operator.state.beats import BeatOutcome, ingest_beat
from netval.operator.state.store import Store
from state_kit import node_health

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
BEAT_TOPIC = topic("pool-a", "gpu-a", TopicKind.BEAT)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def report(
    node: str = "gpu-a",
    *,
    status: Status = Status.PASS,
    message: str = "MTU 9000",
    started: datetime = NOW,
    facts: dict[str, str] | None = None,
    subject: str = "ens1np0",
    observed: int = 9000,
) -> Report:
    result = CheckResult(
        check=CheckId.MTU_INTERFACE,
        subject=subject,
        status=status,
        message=message,
        observed={"mtu": observed},
    )
    return Report(
        validation="pool-a",
        generation=1,
        node=node,
        started_at=started,
        duration_ms=2.0,
        status=status,
        results=[result],
        facts=facts,
    )


def beat_for(r: Report, *, seq: int = 1, at: datetime | None = None, digest: str = "") -> Beat:
    return Beat(
        seq=seq,
        cycle_at=at or r.started_at + timedelta(seconds=30),
        digest=digest or report_digest(r),
        worst=r.status,
    )


# -- the digest ---------------------------------------------------------------------------------


def test_measured_numbers_and_times_are_not_material() -> None:
    base = report()
    same = [
        report(started=NOW + timedelta(seconds=30)),  # another cycle
        report(observed=8999),  # observed values move every cycle
        base.model_copy(update={"duration_ms": 7.5, "traceparent": "00-" + "1" * 32 + "-x"}),
    ]
    assert {report_digest(r) for r in same} == {report_digest(base)}
    loss = report(message="loss 0.31 % over 12 s, limit 0.1 %")
    assert report_digest(loss) == report_digest(report(message="loss 0.02 % over 9 s, limit 1 %"))
    assert mask_numbers("loss 0.31 %, 1e-05 drops, rail 7") == "loss # %, # drops, rail #"


def test_status_subjects_words_and_facts_are_material() -> None:
    base = report_digest(report())
    changed = [
        report(status=Status.FAIL),
        report(subject="ens2np0"),
        report(message="MTU 9000 (jumbo)"),
        report(facts={"fw_ver": "28.39.1002"}),
        report(node="gpu-b"),
        report().model_copy(update={"generation": 2}),
    ]
    digests = {report_digest(r) for r in changed}
    assert base not in digests and len(digests) == len(changed)
    assert report_digest(report(facts={"fw_ver": "a"})) != report_digest(
        report(facts={"fw_ver": "b"})
    )


def _with_peers(*peers: tuple[str, str, Status]) -> Report:
    results = [
        CheckResult(
            check=CheckId.PEER_LATENCY,
            subject=peer,
            status=status,
            message=f"rtt p99 0.{len(peer)} ms to {peer} (10.0.0.{len(peer)}:7471)",
            observed={"domain": domain},
        )
        for peer, domain, status in peers
    ]
    r = report()
    return r.model_copy(update={"results": [*r.results, *results]})


def test_which_east_west_peers_a_cycle_probed_is_not_material_a_failing_path_is() -> None:
    """Peers rotate every cycle by design (samplesPerDomain per domain): a passing peer result
    counts by its domain, so an unchanged fabric beats with peers enabled too."""
    one = _with_peers(("gpu-b", "rack-1", Status.PASS), ("gpu-c", "rack-2", Status.PASS))
    other = _with_peers(("gpu-d", "rack-1", Status.PASS), ("gpu-e7", "rack-2", Status.PASS))
    assert report_digest(one) == report_digest(other)
    new_domain = _with_peers(("gpu-b", "rack-1", Status.PASS), ("gpu-c", "rack-3", Status.PASS))
    warned = _with_peers(("gpu-b", "rack-1", Status.WARN), ("gpu-c", "rack-2", Status.PASS))
    failing = _with_peers(("gpu-b", "rack-1", Status.FAIL), ("gpu-c", "rack-2", Status.PASS))
    failing_other = _with_peers(("gpu-d", "rack-1", Status.FAIL), ("gpu-c", "rack-2", Status.PASS))
    digests = [report_digest(r) for r in (one, new_domain, warned, failing, failing_other)]
    assert len(set(digests)) == len(digests)


def test_the_operator_computes_the_agent_s_digest_from_the_published_bytes() -> None:
    sent = report(facts={"mtu": "9000", "nic_model": "15b3:1021"}, message="MTU 9000")
    decoded = decode_message(
        topic("pool-a", "gpu-a", TopicKind.REPORT), sent.to_json().encode(), now=NOW
    )
    assert isinstance(decoded, Report)
    assert report_digest(decoded) == report_digest(sent)
    assert len(report_digest(sent)) == 32


# -- the agent's cadence ------------------------------------------------------------------------


def test_an_unchanged_node_beats_between_full_reports_every_full_every_cycles() -> None:
    cadence = ReportCadence(full_every=3)
    out = [cadence.next(report(started=NOW + timedelta(seconds=i)), session=1) for i in range(7)]
    assert [b is None for b in out] == [True, False, False, True, False, False, True]
    beats = [b for b in out if b is not None]
    assert [b.seq for b in beats] == [1, 2, 4, 5]  # the cycle number, full reports included
    assert {b.digest for b in beats} == {report_digest(report())}
    assert all(b.worst is Status.PASS for b in beats)


def test_a_change_or_a_new_connection_sends_the_full_report_at_once() -> None:
    cadence = ReportCadence(full_every=100)
    assert cadence.next(report(), session=0) is None
    # handed over before the connection came up: sent in the first one, its beats follow it
    assert cadence.next(report(), session=0) is not None
    cadence.sent(1)
    assert cadence.next(report(), session=1) is not None
    assert cadence.next(report(status=Status.FAIL, message="MTU 1500"), session=1) is None
    cadence.sent(1)
    assert cadence.next(report(status=Status.FAIL, message="MTU 1500"), session=1) is not None
    # a reconnect since it was sent: the broker may have lost it
    assert cadence.next(report(status=Status.FAIL, message="MTU 1500"), session=2) is None
    cadence.forget()  # the standing report was never sent
    assert cadence.next(report(status=Status.FAIL, message="MTU 1500"), session=2) is None
    assert ReportCadence(full_every=1).next(report(), session=1) is None


def test_spec_report_full_every_defaults_and_bounds() -> None:
    assert NetworkValidationSpec().report.full_every == 10
    assert NetworkValidationSpec.model_validate({"report": {"fullEvery": 1}}).report.full_every == 1
    for bad in (0, 1001, "ten"):
        with pytest.raises(ValueError):
            NetworkValidationSpec.model_validate({"report": {"fullEvery": bad}})


def test_full_every_reaches_the_agent_through_the_configmap() -> None:
    spec = NetworkValidationSpec.model_validate({"report": {"fullEvery": 25}})
    doc = agent_config_document("pool-a", 3, spec)
    assert doc["spec"]["report"] == {"fullEvery": 25}
    assert AgentConfig.model_validate(doc).spec.report.full_every == 25


def test_the_beat_is_tens_of_bytes_in_the_shape_the_bench_speaks() -> None:
    beat = beat_for(report(), seq=12)
    payload = beat.to_json().encode()
    assert len(payload) < 128
    doc = json.loads(payload)
    assert set(doc) == {"schema", "seq", "cycleAt", "digest", "worst"}
    assert (doc["schema"], doc["seq"], doc["worst"]) == (1, 12, "pass")
    # what bench/scale.py publishes decodes as a beat
    bench = (
        b'{"schema":1,"seq":7,"cycleAt":"2026-12-04T11:59:30+00:00",'
        b'"digest":"0123456789abcdef0123456789abcdef","worst":"pass"}'
    )
    decoded = decode_message(BEAT_TOPIC, bench, now=NOW)
    assert isinstance(decoded, BeatMessage) and decoded.beat.seq == 7
    assert (decoded.validation, decoded.node) == ("pool-a", "gpu-a")


# -- decoding untrusted beats -------------------------------------------------------------------


@FUZZ
@given(payload=st.binary(max_size=2 * MAX_BEAT_BYTES))
def test_garbage_on_the_beat_topic_is_dropped_never_raised(payload: bytes) -> None:
    decoded = decode_message(BEAT_TOPIC, payload, now=NOW)
    assert decoded is None or isinstance(decoded, Dropped | BeatMessage)
    if isinstance(decoded, Dropped):
        assert decoded.reason in (DropReason.INVALID_BEAT, DropReason.TOO_LARGE)


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@FUZZ
@given(
    seq=st.one_of(st.integers(), _JSONISH),
    cycle_at=st.one_of(
        st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
        st.datetimes().map(lambda d: d.isoformat()),  # naive
        _JSONISH,
    ),
    digest=st.one_of(st.text(alphabet="0123456789abcdefABCDEF", max_size=40), _JSONISH),
    worst=st.one_of(st.sampled_from([s.value for s in Status]), _JSONISH),
    extra=st.dictionaries(st.sampled_from(["node", "x", "schema"]), _JSONISH, max_size=2),
)
def test_hostile_beats_decode_within_bounds_or_are_dropped(
    seq: object, cycle_at: object, digest: object, worst: object, extra: dict[str, object]
) -> None:
    doc = {"schema": 1, "seq": seq, "cycleAt": cycle_at, "digest": digest, "worst": worst, **extra}
    decoded = decode_message(BEAT_TOPIC, json.dumps(doc).encode(), now=NOW)
    if isinstance(decoded, BeatMessage):
        beat = decoded.beat
        assert 0 <= beat.seq <= 2**63 - 1
        assert NOW - timedelta(days=1) <= beat.cycle_at <= NOW + timedelta(minutes=10)
        assert len(beat.digest) == 32
    else:
        assert isinstance(decoded, Dropped)
        assert decoded.reason in (DropReason.INVALID_BEAT, DropReason.TOO_LARGE)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", 2**63),  # past int64
        ("seq", -1),
        ("seq", 1.5),
        ("seq", "1"),
        ("cycleAt", "9999-12-31T23:59:59+00:00"),
        ("cycleAt", "0001-01-01T00:00:00+00:00"),
        ("cycleAt", "2026-12-04T12:00:00"),  # no zone: whose clock?
        ("digest", "0123456789ABCDEF0123456789ABCDEF"),
        ("schema", 2),
        ("worst", "grand"),
    ],
)
def test_hostile_but_well_formed_beats_are_refused(field: str, value: object) -> None:
    doc = json.loads(beat_for(report()).to_json())
    doc[field] = value
    decoded = decode_message(BEAT_TOPIC, json.dumps(doc).encode(), now=NOW)
    assert isinstance(decoded, Dropped) and decoded.reason is DropReason.INVALID_BEAT, decoded


def test_the_largest_sequence_number_is_a_beat() -> None:
    doc = json.loads(beat_for(report()).to_json())
    doc["seq"] = 2**63 - 1
    assert isinstance(decode_message(BEAT_TOPIC, json.dumps(doc).encode(), now=NOW), BeatMessage)
    assert decode_message(BEAT_TOPIC, b"", now=NOW) is None  # the retained beat cleared
    big = decode_message(BEAT_TOPIC, b" " * (MAX_BEAT_BYTES + 1), now=NOW)
    assert isinstance(big, Dropped) and big.reason is DropReason.TOO_LARGE


# -- what a beat does to the operator's state ---------------------------------------------------


def _state(*nodes: str) -> vs.ValidationState:
    state = vs.ValidationState(name="pool-a", interval_seconds=60.0)
    vs.set_targeted(state, nodes, NOW)
    return state


def test_a_matching_beat_refreshes_freshness_and_nothing_else() -> None:
    state = _state("gpu-a")
    r = report()
    vs.ingest_report(state, r, NOW)
    state.dirty = False
    rec = state.nodes["gpu-a"]
    failures, buckets, streak = rec.failures, rec.check_buckets, rec.ok_streak
    later = NOW + timedelta(seconds=170)  # stale after 180 s without the beat
    assert ingest_beat(state, "gpu-a", beat_for(r, at=later), later) is BeatOutcome.MATCHED
    assert rec.reported_at == later and not state.dirty  # still fresh: no status to compute
    assert (rec.failures, rec.check_buckets) == (failures, buckets)
    assert rec.ok_streak == streak + 1  # taint recovery counts it as a report
    # the same beat again (a retained replay): freshness at most, never a second count
    assert ingest_beat(state, "gpu-a", beat_for(r, at=later), later) is BeatOutcome.MATCHED
    assert rec.ok_streak == streak + 1
    assert vs.is_fresh(state, "gpu-a", later + timedelta(seconds=179))


def test_a_beat_that_brings_a_stale_node_back_dirties_the_status() -> None:
    state = _state("gpu-a")
    r = report()
    vs.ingest_report(state, r, NOW)
    state.dirty = False
    late = NOW + timedelta(seconds=400)
    assert not vs.is_fresh(state, "gpu-a", late)
    assert ingest_beat(state, "gpu-a", beat_for(r, at=late), late) is BeatOutcome.MATCHED
    assert vs.is_fresh(state, "gpu-a", late) and state.dirty


def test_a_mismatching_beat_leaves_the_report_unconfirmed_until_the_next_one() -> None:
    state = _state("gpu-a")
    r = report()
    vs.ingest_report(state, r, NOW)
    state.dirty = False
    later = NOW + timedelta(seconds=30)
    other = report_digest(report(status=Status.FAIL))
    outcome = ingest_beat(state, "gpu-a", beat_for(r, at=later, digest=other), later)
    assert outcome is BeatOutcome.MISMATCHED
    assert not vs.is_fresh(state, "gpu-a", later) and state.dirty
    assert node_health(state, "gpu-a", later) == "unknown"
    assert vs.next_deadline(state, later) is None  # nothing but a report brings it back
    # the report the beat spoke of arrives: fresh again, its beat applied
    changed = report(status=Status.FAIL, message="MTU 1500", started=NOW + timedelta(seconds=20))
    assert vs.ingest_report(state, changed, later) is vs.IngestResult.ACCEPTED
    assert vs.is_fresh(state, "gpu-a", later)
    assert node_health(state, "gpu-a", later) == "unhealthy"


def test_a_beat_before_its_report_is_applied_when_the_report_comes() -> None:
    state = _state("gpu-a")
    r = report()
    beat_at = NOW + timedelta(seconds=50)
    beat = beat_for(r, at=beat_at)
    assert ingest_beat(state, "gpu-a", beat, beat_at) is BeatOutcome.NO_REPORT
    assert not vs.is_fresh(state, "gpu-a", beat_at)
    # the report was delayed (a broker replay after the beat): its receive time is older
    vs.ingest_report(state, r, NOW + timedelta(seconds=10), retained=True)
    assert state.nodes["gpu-a"].reported_at == beat_at
    assert not state.beats_ahead


def test_a_beat_older_than_the_held_report_is_ignored() -> None:
    state = _state("gpu-a")
    old = report()
    new = report(
        status=Status.WARN, message="MTU 9000 on 7 of 8", started=NOW + timedelta(seconds=60)
    )
    vs.ingest_report(state, new, NOW + timedelta(seconds=61))
    stale_beat = beat_for(old, at=NOW + timedelta(seconds=30))
    outcome = ingest_beat(state, "gpu-a", stale_beat, NOW + timedelta(seconds=62))
    assert outcome is BeatOutcome.OUT_OF_ORDER
    assert vs.is_fresh(state, "gpu-a", NOW + timedelta(seconds=62))


def test_after_a_restart_the_retained_beat_vouches_for_the_retained_report() -> None:
    """The operator's replay: a report published 9 cycles ago (stale by its own time) and the
    node's last beat; the node counts fresh from the beat's cycle time, never from now."""
    store = Store()
    now = datetime.now(UTC)
    r = report(started=now - timedelta(seconds=9 * 60))
    store.ingest_report(r, True)  # parked: Kopf has not resumed the CR yet
    beat = beat_for(r, seq=9, at=now - timedelta(seconds=5))
    assert store.ingest_beat(BeatMessage("pool-a", "gpu-a", beat), True) is BeatOutcome.PARKED
    spec = NetworkValidationSpec.model_validate({"interval": "60s"})
    store.on_node("gpu-a", {})
    state = store.upsert_validation("pool-a", generation=1, spec=spec, body={}, status=None)
    assert state.nodes["gpu-a"].reported_at == beat.cycle_at
    assert vs.is_fresh(state, "gpu-a", now)
    # a beat for a validation never created is dropped with the parked report
    store.ingest_beat(BeatMessage("ghost", "gpu-a", beat), True)
    assert store.remove_validation("ghost") == {"gpu-a"} and not store.beats_pending
