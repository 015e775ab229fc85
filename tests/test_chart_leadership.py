"""The chart's leader-election timings (`operator.leaderElection`): by default the
operator's own defaults (10/7/2 s), passed as NETVAL_LEASE_*; what a user sets is what the
operator reads, and timings the operator would refuse are refused at install."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from chart_kit import env_of, operator_container, render
from netval.operator.leadership.settings import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD,
    election_settings_from_env,
)

LEASE_ENV = ("NETVAL_LEASE_DURATION_SECONDS", "NETVAL_LEASE_RENEW_DEADLINE_SECONDS",
             "NETVAL_LEASE_RETRY_PERIOD_SECONDS")  # fmt: skip


def _operator_env(values: dict[str, Any]) -> dict[str, str]:
    for path, text in render(values).items():
        if not path.endswith("operator-deployment.yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc and doc.get("kind") == "Deployment":
                (container,) = doc["spec"]["template"]["spec"]["containers"]
                return env_of(container)
    raise AssertionError("no operator Deployment rendered")


def test_the_chart_passes_the_operators_own_lease_defaults() -> None:
    env = env_of(operator_container("default"))
    assert [float(env[k]) for k in LEASE_ENV] == [
        DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD]  # fmt: skip
    settings = election_settings_from_env("netval-system", env)  # the operator starts with them
    assert settings.lease_duration == 10.0


def test_the_lease_timings_set_in_values_reach_the_operator() -> None:
    env = _operator_env({"operator": {"leaderElection": {"leaseDurationSeconds": 15,
                                                          "renewDeadlineSeconds": 10}}})  # fmt: skip
    assert [env[k] for k in LEASE_ENV] == ["15", "10", "2"]


@pytest.mark.parametrize("bad", [{"leaseDurationSeconds": "ten"}, {"retryPeriodSeconds": 0},
                                 {"leaseDuration": 10}])  # fmt: skip
def test_lease_timings_the_operator_would_refuse_are_refused_at_install(
    bad: dict[str, Any],
) -> None:
    with pytest.raises(Exception, match="leaderElection"):
        render({"operator": {"leaderElection": bad}})
