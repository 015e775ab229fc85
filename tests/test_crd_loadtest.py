"""The NetworkLoadTest CRD agrees with its pydantic models, is structural, and refuses bad specs.

The same model walk as tests/test_crd.py (imported from there), over
`crds/networkloadtests.netval.io.yaml` and `netval.model.loadtest`; the load test's own model
validators and their CRD counterparts are registered with that walk here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import test_crd
from netval.model.duration import parse_duration
from netval.model.loadtest import (
    LoadCondition,
    LoadConditionType,
    LoadReason,
    NetworkLoadTestSpec,
    NetworkLoadTestStatus,
    RunPhase,
    _unique,
    check_cron,
    check_duration,
)
from netval.model.manifest import API_VERSION
from test_crd import compare_model, kube_errors, structural_problems

ROOT = Path(__file__).resolve().parent.parent
CRD_PATH = ROOT / "crds" / "networkloadtests.netval.io.yaml"
KIND = "NetworkLoadTest"

DURATION_RULE = {
    "rule": "duration(self) >= duration('5s') && duration(self) <= duration('300s')",
    "message": "duration must be 5s..300s",
}


def _duration_rule(value: Any) -> bool:
    if not isinstance(value, str):
        return True
    try:
        return 5.0 <= parse_duration(value) <= 300.0
    except ValueError:
        return False


# The load test's validators, with what the API server does instead: the cron ranges are
# checked by the model and the operator (InvalidSpec naming spec.schedule); the CRD checks
# the shape with the field's pattern.
test_crd.MODEL_VALIDATORS.update(
    {
        (LoadCondition, "_redacted"): {},
    }
)
test_crd.FIELD_VALIDATORS.update(
    {
        _unique: {"x-kubernetes-list-type": "set"},
        check_cron: {},
        check_duration: {"x-kubernetes-validations": [DURATION_RULE]},
    }
)
test_crd.CEL_RULES[DURATION_RULE["rule"]] = _duration_rule


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return doc


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    return test_crd.root_schema(crd)


def manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "t"}, "spec": spec}


def test_names_scope_and_printer_columns(crd: dict[str, Any]) -> None:
    assert crd["metadata"]["name"] == "networkloadtests.netval.io"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["shortNames"] == ["netload"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["PHASE", "PASSED", "NODES", "MAX-OVERSUB", "LAST-RUN", "AGE"]
    # every column's path exists in the status model
    paths = {c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert ".status.lastRun.maxOversubscription" in paths
    assert ".status.lastRun.finishedAt" in paths


def test_spec_matches_the_model(schema: dict[str, Any]) -> None:
    assert compare_model(NetworkLoadTestSpec, schema["properties"]["spec"], "spec") == []


def test_status_matches_the_model(schema: dict[str, Any]) -> None:
    assert compare_model(NetworkLoadTestStatus, schema["properties"]["status"], "status") == []


def test_the_schema_is_structural(schema: dict[str, Any]) -> None:
    assert structural_problems(schema) == []


def test_drift_is_reported(schema: dict[str, Any]) -> None:
    spec = copy.deepcopy(schema["properties"]["spec"])
    spec["properties"]["historyLimit"]["maximum"] = 50
    spec["properties"]["eastWest"]["properties"]["pairs"]["enum"].remove("all")
    problems = compare_model(NetworkLoadTestSpec, spec, "spec")
    assert "spec.historyLimit: maximum is 50 in the CRD, 20 in the model" in problems
    assert any(p.startswith("spec.eastWest.pairs: enum") for p in problems), problems


FULL = {
    "validation": "roce-training-pool",
    "schedule": "30 2 * * 1-5",
    "historyLimit": 5,
    "duration": "20s",
    "phases": ["eastWest", "storage"],
    "eastWest": {"pairs": "crossDomain"},
    "storage": {"endpoints": ["datasets"]},
    "maxRateMbps": 0,
    "skipBusyNodes": True,
    "expect": {"maxOversubscription": 1.5, "minStorageMBpsPerNode": 500, "maxLatencyInflation": 10},
}


def test_the_issue_example_is_accepted_by_both(schema: dict[str, Any]) -> None:
    assert kube_errors(schema, manifest(FULL)) == []
    spec = NetworkLoadTestSpec.model_validate(FULL)
    assert spec.duration_seconds == 20.0
    minimal = NetworkLoadTestSpec.model_validate({"validation": "v"})
    assert (minimal.schedule, minimal.history_limit, minimal.phases) == ("", 5, None)


def test_defaults_fill_in_as_the_model_says(schema: dict[str, Any]) -> None:
    filled = test_crd.apply_defaults(schema["properties"]["spec"], {"validation": "v"})
    model = NetworkLoadTestSpec.model_validate({"validation": "v"})
    assert filled == model.model_dump(mode="json", by_alias=True, exclude_none=True)


@pytest.mark.parametrize(
    ("field", "value", "crd_error", "model_error"),
    [
        ("duration", "4s", "duration: duration must be 5s..300s", "duration must be 5s..300s"),
        ("duration", "301s", "duration: duration must be 5s..300s", "duration must be 5s..300s"),
        ("duration", "20", "duration: '20' does not match", "String should match pattern"),
        ("schedule", "* * * *", "schedule: '* * * *' does not match", "String should match"),
        ("schedule", "@daily", "schedule: '@daily' does not match", "String should match"),
        ("schedule", "61 * * * *", None, "schedule minute field '61': values must be 0..59"),
        ("schedule", "0 5-2 * * *", None, "range '5-2' runs backwards"),
        ("schedule", "*/0 * * * *", None, "step must be 1..59"),
        ("schedule", "0 0 0 * *", None, "day of month field '0': values must be 1..31"),
        ("historyLimit", 21, "historyLimit: 21 is greater than the maximum", "less than or equal"),
        ("phases", ["eastWest", "eastWest"], "phases: duplicate entries", "entries must be unique"),
        ("phases", ["north"], "phases.0: 'north' is not one of", "Input should be"),
        ("phases", [], "phases: [] should be non-empty", "at least 1 item"),
        ("eastWest", {"pairs": "some"}, "eastWest.pairs: 'some' is not one of", "Input should"),
        ("maxRateMbps", -1, "maxRateMbps: -1 is less than the minimum", "greater than or equal"),
        ("validation", "Bad_Name", "validation: 'Bad_Name' does not match", "should match"),
        (
            "expect",
            {"maxOversubscription": 0.5},
            "expect.maxOversubscription: 0.5 is less than the minimum",
            "greater than or equal to 1",
        ),
        (
            "expect",
            {"minStorageMBpsPerNode": 0},
            "expect.minStorageMBpsPerNode: 0 is less than or equal to the minimum",
            "greater than 0",
        ),
    ],
)
def test_bad_specs_are_refused(
    schema: dict[str, Any], field: str, value: Any, crd_error: str | None, model_error: str
) -> None:
    spec = {**FULL, field: value}
    errors = kube_errors(schema, manifest(spec))
    if crd_error is None:  # the API server takes it; the operator says InvalidSpec
        assert errors == []
    else:
        assert any(e.startswith(f"spec.{crd_error}") for e in errors), errors
    with pytest.raises(ValueError, match="validation error") as exc:
        NetworkLoadTestSpec.model_validate(spec)
    assert model_error in str(exc.value)
    assert field in str(exc.value)


@given(
    st.lists(
        st.one_of(st.just("*"), st.integers(0, 70).map(str), st.text("0123456789*,/-", max_size=6)),
        min_size=5,
        max_size=5,
    )
)
def test_cron_check_never_raises_anything_but_value_error(fields: list[str]) -> None:
    text = " ".join(fields)
    try:
        assert check_cron(text) == text
    except ValueError as exc:
        assert "schedule" in str(exc)


def test_status_round_trips_through_the_schema(schema: dict[str, Any]) -> None:
    import datetime as dt

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    status = NetworkLoadTestStatus(
        observed_generation=1,
        phase=RunPhase.FAILED,
        conditions=[
            LoadCondition(
                type=LoadConditionType.COMPLETE,
                status="True",
                reason=LoadReason.INVALID_SPEC,
                message="spec.storage.endpoints: 'x' is not an endpoint of validation v",
                last_transition_time=now,
                observed_generation=1,
            )
        ],
    )
    obj = {**manifest(FULL), "status": status.to_patch()}
    obj["status"] = {k: v for k, v in obj["status"].items() if v is not None}
    assert kube_errors(schema, obj) == []


def test_the_bundled_examples_are_accepted_and_settle_against_their_validation(
    schema: dict[str, Any],
) -> None:
    """Every NetworkLoadTest under examples/ passes the CRD, the model and the operator's
    settling against the example validation it names (what `kubectl apply` of both does)."""
    from netval.model.spec import NetworkValidationSpec
    from netval.operator.loadtest.validate import RunSettings, settle

    docs = [
        doc
        for path in sorted((ROOT / "examples").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict)
    ]
    validations = {
        d["metadata"]["name"]: NetworkValidationSpec.model_validate(d["spec"])
        for d in docs
        if d.get("kind") == "NetworkValidation"
    }
    tests = [d for d in docs if d.get("kind") == KIND]
    assert tests, "examples/ has no NetworkLoadTest"
    for doc in tests:
        assert doc["apiVersion"] == API_VERSION
        assert kube_errors(schema, doc) == [], doc["metadata"]["name"]
        settled = settle(doc["spec"], validations.get(doc["spec"]["validation"]))
        assert isinstance(settled, RunSettings), settled
