"""Fleet consistency (issue 22): the pure judgement, the fold into node records, the bounded
status, and the spec section."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from netval.model.consistency import MAX_KEYS, FindingKind
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult, Report
from netval.model.spec import Consistency, NetworkValidationSpec
from netval.operator.consistency.fingerprint import Fleet, cohort_of, observe
from netval.operator.consistency.fold import configure, refresh
from netval.operator.consistency.ingest import apply_changes, configure_spec, fold_report
from netval.operator.consistency.judge import Settings, judge_cohort
from netval.operator.consistency.status import consistency_status
from netval.operator.state import validation as vs
from netval.operator.state.aggregation import compute_status
from state_kit import node_health

NOW = datetime(2026, 1, 1, tzinfo=UTC)
MODEL = "15B3:1021"


def fleet_of(fw: list[str], **extra: str) -> dict[str, dict[str, str]]:
    return {
        f"n{i:02d}": {"nic_model": MODEL, "fw_ver": v, "mtu": "9000", **extra}
        for i, v in enumerate(fw)
    }


def kinds(verdict_findings: dict[str, list[object]], node: str) -> list[FindingKind]:
    return [f.kind for f in verdict_findings.get(node, [])]  # type: ignore[attr-defined]


def key(verdict: object, name: str) -> object:
    return next(k for k in verdict.keys if k.key == name)  # type: ignore[attr-defined]


# -- pure judgement ----------------------------------------------------------------------


def test_small_cohort_gives_no_finding_not_even_a_split() -> None:
    v = judge_cohort(MODEL, fleet_of(["a", "a", "a", "b"]), Settings(), NOW)
    assert not v.judged and v.findings == {}
    fw = key(v, "fw_ver")
    assert fw.majority is None and fw.outliers == [] and fw.split == []  # type: ignore[attr-defined]
    split = judge_cohort(MODEL, fleet_of(["a", "a", "b", "b"]), Settings(), NOW)
    assert key(split, "fw_ver").split == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("same", "odd", "outlier"),
    [(4, 1, True), (8, 2, True), (7, 2, False), (3, 1, False), (79, 20, False), (80, 20, True)],
)
def test_the_80_percent_boundary(same: int, odd: int, outlier: bool) -> None:
    """4 of 5 and 8 of 10 are exactly 80 %: a majority; 7 of 9 (77.8 %) is a Split."""
    members = fleet_of(["a"] * same + ["b"] * odd)
    v = judge_cohort(MODEL, members, Settings(min_cohort=4), NOW)
    fw = key(v, "fw_ver")
    if outlier:
        assert fw.majority == "a" and len(fw.outliers) == odd  # type: ignore[attr-defined]
        odd_node = next(n for n, f in members.items() if f["fw_ver"] == "b")
        assert kinds(v.findings, odd_node) == [FindingKind.OUTLIER]  # type: ignore[arg-type]
    else:
        assert fw.majority is None and v.findings == {}  # type: ignore[attr-defined]
        assert [g for g, _ in fw.split] == ["a", "b"]  # type: ignore[attr-defined]


def test_split_reports_the_groups_and_blames_nobody() -> None:
    v = judge_cohort(MODEL, fleet_of(["a"] * 3 + ["b"] * 3 + ["c"]), Settings(), NOW)
    fw = key(v, "fw_ver")
    assert fw.split == [("a", 3), ("b", 3), ("c", 1)]  # type: ignore[attr-defined]
    assert fw.majority is None and v.findings == {}  # type: ignore[attr-defined]
    assert key(v, "mtu").majority == "9000"  # type: ignore[attr-defined]


def test_rollout_window_before_and_after_until() -> None:
    until = NOW + timedelta(hours=1)
    settings = Settings(rollout={"fw_ver": (frozenset({"new"}), until)})
    members = fleet_of(["old"] * 5 + ["new"] * 5)
    before = judge_cohort(MODEL, members, settings, NOW)
    fw = key(before, "fw_ver")
    assert fw.majority == "old" and fw.transitioning == 5 and fw.outliers == []  # type: ignore[attr-defined]
    assert kinds(before.findings, "n09") == [FindingKind.TRANSITIONING]  # type: ignore[arg-type]
    after = judge_cohort(MODEL, members, settings, until)
    # the same spec, the time passed: half new, half old is a Split now, not a silent pass
    assert key(after, "fw_ver").split == [("new", 5), ("old", 5)]  # type: ignore[attr-defined]
    few = fleet_of(["old"] * 9 + ["new"])
    late = judge_cohort(MODEL, few, settings, until + timedelta(seconds=1))
    assert kinds(late.findings, "n09") == [FindingKind.OUTLIER]  # type: ignore[arg-type]


def test_violation_beside_an_outlier() -> None:
    members = fleet_of(["a"] * 8 + ["b", "a"])
    members["n09"]["mtu"] = "1500"
    settings = Settings(expect={"mtu": frozenset({"9000"})})
    v = judge_cohort(MODEL, members, settings, NOW)
    assert kinds(v.findings, "n08") == [FindingKind.OUTLIER]  # type: ignore[arg-type]
    # n09 is off the intent and off the majority: reported once, as the Violation
    assert kinds(v.findings, "n09") == [FindingKind.VIOLATION]  # type: ignore[arg-type]
    assert key(v, "mtu").outliers == [("n09", "1500")]  # type: ignore[attr-defined]


def test_violation_needs_no_cohort() -> None:
    v = judge_cohort(
        MODEL, fleet_of(["a"], mtu="1500"), Settings(expect={"mtu": frozenset({"9000"})}), NOW
    )
    assert kinds(v.findings, "n00") == [FindingKind.VIOLATION]  # type: ignore[arg-type]


def test_cohort_is_the_nic_model_and_the_label() -> None:
    assert cohort_of({"nic_model": MODEL, "board_id": "x"}, None) == MODEL
    assert cohort_of({"board_id": "x"}, None) == "x"
    assert cohort_of({}, "pool-a") == "(unknown model) / pool-a"


# -- the fold: fingerprints, cohorts, leaving nodes --------------------------------------


def settings_fleet(**spec: object) -> Fleet:
    fleet = Fleet()
    configure(fleet, Consistency.model_validate(spec))
    return fleet


def test_unchanged_fingerprint_is_one_compare_and_no_rejudgement() -> None:
    fleet = settings_fleet()
    members = fleet_of(["a"] * 9 + ["b"])
    for node, facts in members.items():
        assert observe(fleet, node, facts, None, NOW)
    out = refresh(fleet, set(members), NOW)
    assert out["n09"] is not None and out["n09"].status is Status.WARN
    assert out["n00"] is not None and out["n00"].status is Status.PASS
    assert not observe(fleet, "n00", dict(members["n00"]), None, NOW + timedelta(seconds=30))
    assert refresh(fleet, set(members), NOW) == {}


def test_a_node_leaving_the_validation_no_longer_counts() -> None:
    """Five nodes on "a", the sixth on "b": b is an Outlier; once three "a" nodes leave, the
    cohort is below minCohort and b is not compared at all."""
    fleet = settings_fleet()
    members = fleet_of(["a"] * 5 + ["b"])
    for node, facts in members.items():
        observe(fleet, node, facts, None, NOW)
    targeted = set(members)
    assert refresh(fleet, targeted, NOW)["n05"].status is Status.WARN  # type: ignore[union-attr]
    from netval.operator.consistency.fingerprint import touch

    for node in ("n00", "n01", "n02"):
        targeted.discard(node)
        touch(fleet, node)
    out = refresh(fleet, targeted, NOW)
    assert out["n00"] is None and out["n05"] is not None
    assert out["n05"].status is Status.SKIP


def test_outlier_severity_fail_reaches_the_node_record_and_failures() -> None:
    state = vs.ValidationState(name="v", generation=1, interval_seconds=30)
    nodes = [f"n{i:02d}" for i in range(10)]
    vs.set_targeted(state, nodes, NOW)
    vs.set_agents_ready(state, True, NOW)
    spec = NetworkValidationSpec.model_validate({"consistency": {"outlierSeverity": "fail"}})
    configure_spec(state, spec, NOW)
    for i, node in enumerate(nodes):
        facts = {"nic_model": MODEL, "fw_ver": "old" if i == 3 else "new"}
        report = _report(node, facts)
        assert vs.ingest_report(state, report, NOW).stored
        fold_report(state, report, spec, {}, NOW)
    assert node_health(state, "n03", NOW) == "unhealthy"
    assert node_health(state, "n04", NOW) == "healthy"
    status = compute_status(state, NOW, previous=None)
    assert status.nodes.failing == 1 and status.nodes.passing == 9
    assert [(f.node, f.check, f.subject) for f in status.failures] == [
        ("n03", CheckId.FLEET_CONSISTENCY.value, "fw_ver")
    ]
    assert status.checks[CheckId.FLEET_CONSISTENCY.value].fail == 1
    # the next report of n03, still on old firmware, keeps the verdict and its since
    later = NOW + timedelta(seconds=30)
    vs.ingest_report(state, _report("n03", {"nic_model": MODEL, "fw_ver": "old"}, later), later)
    again = compute_status(state, later, previous=None)
    assert again.failures[0].since == NOW
    # n03 updated: the cohort is consistent
    fixed = _report("n03", {"nic_model": MODEL, "fw_ver": "new"}, later + timedelta(seconds=30))
    vs.ingest_report(state, fixed, later)
    fold_report(state, fixed, spec, {}, later)
    assert node_health(state, "n03", later) == "healthy"
    summary = consistency_status(state.fleet, max_named=10)
    assert summary is not None and summary.keys[0].outliers == []


def test_rollout_end_needs_no_spec_change() -> None:
    state = vs.ValidationState(name="v", generation=1, interval_seconds=3600)
    nodes = [f"n{i:02d}" for i in range(10)]
    vs.set_targeted(state, nodes, NOW)
    until = NOW + timedelta(minutes=5)
    spec = NetworkValidationSpec.model_validate(
        {"consistency": {"rollout": {"fw_ver": {"allowed": ["new"], "until": until.isoformat()}}}}
    )
    configure_spec(state, spec, NOW)
    for i, node in enumerate(nodes):
        report = _report(node, {"nic_model": MODEL, "fw_ver": "new" if i == 0 else "old"})
        vs.ingest_report(state, report, NOW)
        fold_report(state, report, spec, {}, NOW)
    assert state.fleet_verdicts == {}  # judged when health is next read, once per burst
    apply_changes(state, NOW)
    assert state.fleet_verdicts["n00"].status is Status.PASS
    assert "Transitioning" in state.fleet_verdicts["n00"].message
    assert vs.next_deadline(state, NOW) is not None
    apply_changes(state, until)
    assert state.fleet_verdicts["n00"].status is Status.WARN


def test_status_is_bounded() -> None:
    fleet = settings_fleet(maxOutliersPerKey=3)
    members = {
        f"n{i:04d}": {
            "nic_model": MODEL,
            **{f"k{j:03d}": "x" if i % 10 else "y" for j in range(40)},
        }
        for i in range(200)
    }
    for node, facts in members.items():
        observe(fleet, node, facts, None, NOW)
    for j in range(50):  # fifty more cohorts
        for i in range(5):
            observe(fleet, f"m{j}-{i}", {"nic_model": f"M{j}", "fw_ver": str(i % 2)}, None, NOW)
    refresh(fleet, set(fleet.nodes), NOW)
    summary = consistency_status(fleet, max_named=3)
    assert summary is not None
    assert len(summary.keys) == MAX_KEYS and summary.more_keys > 0
    first = summary.keys[0]
    assert len(first.outliers) == 3 and first.more_outliers == 17
    assert len(summary.model_dump_json()) < 64_000


def test_spec_section_defaults_and_bounds() -> None:
    c = NetworkValidationSpec().consistency
    assert (c.enabled, c.majority_percent, c.min_cohort) == (True, 80.0, 5)
    assert (c.outlier_severity, c.violation_severity) == ("warn", "fail")
    with pytest.raises(ValidationError, match="fact key"):
        Consistency.model_validate({"expect": {"Bad Key": ["x"]}})
    with pytest.raises(ValidationError):
        Consistency.model_validate({"majorityPercent": 50})
    with pytest.raises(ValidationError, match="at most 64"):
        Consistency.model_validate({"expect": {f"k{i}": ["x"] for i in range(65)}})


def _report(node: str, facts: dict[str, str], at: datetime = NOW) -> Report:
    return Report(
        validation="v",
        generation=1,
        node=node,
        started_at=at,
        duration_ms=1.0,
        status=Status.PASS,
        results=[
            CheckResult(
                check=CheckId.MTU_INTERFACE, subject="eth0", status=Status.PASS, message="ok"
            )
        ],
        facts=facts,
    )


def test_cohort_label_splits_cohorts_through_the_store() -> None:
    """Five nodes per pool: in pool-a one node is odd; pool-b's other firmware is its own
    cohort's majority, not an outlier of pool-a."""
    from netval.operator.state.store import Store

    store = Store()
    nodes = {f"a{i}": "pool-a" for i in range(5)} | {f"b{i}": "pool-b" for i in range(5)}
    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": {"gpu": "true"}, "consistency": {"cohortLabel": "pool"}}
    )
    # the validation first: the Node events then keep its cohortLabel (a key referenced
    # later is filled in by a metadata listing, test_node_labels)
    store.upsert_validation("v", generation=1, spec=spec, body={}, status=None)
    for node, pool in nodes.items():
        store.on_node(node, {"gpu": "true", "pool": pool})
    now = datetime.now(UTC)
    for node, pool in nodes.items():
        fw = "old" if node == "a4" or pool == "pool-b" else "new"
        store.ingest_report(_report(node, {"nic_model": MODEL, "fw_ver": fw}, now), False)
    state = store.states["v"]
    assert node_health(state, "a4", now) == "degraded"
    assert {node_health(state, n, now) for n in nodes if n != "a4"} == {"healthy"}
    assert sorted(state.fleet.cohorts) == [f"{MODEL} / pool-a", f"{MODEL} / pool-b"]
