"""Glue between a validation's state and its fleet: fold a report's facts, re-judge what
changed, and hand each node's verdict to its record (`node_verdicts.set_fleet_verdict`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from netval.model.results import Report
from netval.model.spec import NetworkValidationSpec
from netval.operator.consistency.fingerprint import UNLABELLED, observe
from netval.operator.consistency.fold import configure
from netval.operator.state.node_verdicts import settle_fleet
from netval.operator.state.validation import ValidationState


def fold_report(
    state: ValidationState,
    report: Report,
    spec: NetworkValidationSpec | None,
    node_labels: Mapping[str, Mapping[str, str]],
    now: datetime,
) -> None:
    """An accepted report: an unchanged fingerprint costs one digest compare, nothing else;
    a changed one marks its cohort, re-judged once when health is next read."""
    if report.facts is None or report.node not in state.nodes:
        return
    label = spec.consistency.cohort_label if spec is not None else None
    value = node_labels.get(report.node, {}).get(label, UNLABELLED) if label else None
    observe(state.fleet, report.node, report.facts, value, now)


def configure_spec(state: ValidationState, spec: NetworkValidationSpec, now: datetime) -> None:
    configure(state.fleet, spec.consistency)


def apply_changes(state: ValidationState, now: datetime) -> None:
    """Re-judge the cohorts marked dirty (or all, past a rollout's end); cheap when none is."""
    settle_fleet(state, now)
