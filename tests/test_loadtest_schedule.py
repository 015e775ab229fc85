"""When NetworkLoadTests run (pure): cron times, one run per validation, the end of a run;
and the operator's ceiling setting (loadTests.maxRateMbps)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netval.operator.loadtest.schedule import (
    RESULT_GRACE_SECONDS,
    Cron,
    Due,
    due_at,
    next_fire,
    pick_starts,
    run_over,
)
from netval.operator.settings import (
    ENV_LOADTEST_MAX_RATE,
    OperatorConfigError,
    operator_settings_from_env,
)

T0 = datetime(2026, 12, 4, 15, 17, 30, tzinfo=UTC)  # a Friday


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ("* * * * *", datetime(2026, 12, 4, 15, 18, tzinfo=UTC)),
        ("30 2 * * 6", datetime(2026, 12, 5, 2, 30, tzinfo=UTC)),  # Saturday 02:30
        ("0 0 1 1 *", datetime(2027, 1, 1, tzinfo=UTC)),
        ("*/20 * * * *", datetime(2026, 12, 4, 15, 20, tzinfo=UTC)),
        ("0 9-17/4 * * 1-5", datetime(2026, 12, 4, 17, 0, tzinfo=UTC)),  # 9, 13, 17 on weekdays
        ("0 9-17/4 * * 1-4", datetime(2026, 12, 7, 9, 0, tzinfo=UTC)),  # not Fridays: Monday
        ("0 0 29 2 *", datetime(2028, 2, 29, tzinfo=UTC)),
        ("0 0 13 * 5", datetime(2026, 12, 11, tzinfo=UTC)),  # both set: either (a Friday)
        ("0 12 * * 0", datetime(2026, 12, 6, 12, tzinfo=UTC)),  # Sunday, as 0 ...
        ("0 12 * * 7", datetime(2026, 12, 6, 12, tzinfo=UTC)),  # ... and as 7
    ],
)
def test_next_fire(schedule: str, expected: datetime) -> None:
    assert next_fire(schedule, T0) == expected


def test_a_schedule_that_never_fires() -> None:
    assert next_fire("0 0 31 2 *", T0) is None


@given(
    minute=st.integers(0, 59),
    hour=st.integers(0, 23),
    after=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)
    ),
)
def test_next_fire_is_the_first_matching_minute_after(
    minute: int, hour: int, after: datetime
) -> None:
    at = next_fire(f"{minute} {hour} * * *", after)
    assert at is not None and at > after and (at.hour, at.minute) == (hour, minute)
    assert at - after <= timedelta(days=1)
    assert Cron.parse(f"{minute} {hour} * * *").minutes == {minute}


def test_one_shot_runs_once_and_scheduled_after_its_last_start() -> None:
    assert due_at("", has_run=False, last_start=None, seen_at=T0) == T0
    assert due_at("", has_run=True, last_start=T0, seen_at=T0) is None
    last = datetime(2026, 12, 5, 2, 30, tzinfo=UTC)
    assert due_at("30 2 * * 6", has_run=True, last_start=last, seen_at=T0) == last + timedelta(
        days=7
    )


def test_one_run_per_validation_the_longest_due_first() -> None:
    due = [
        Due("b", "pool", T0 - timedelta(seconds=5)),
        Due("a", "pool", T0 - timedelta(seconds=9)),
        Due("c", "other", T0),
        Due("d", "busy", T0),
        Due("later", "free", T0 + timedelta(minutes=1)),
    ]
    starts, waiting = pick_starts(due, {"busy": "x"}, T0)
    assert [d.test for d in starts] == ["a", "c"]
    assert waiting == {"b": "a", "d": "x"}


def test_a_run_ends_when_every_result_is_in_or_after_its_deadline() -> None:
    end = T0 + timedelta(minutes=1)
    assert run_over(T0, end, all_published=True, unanswered=0)
    assert not run_over(T0, end, all_published=False, unanswered=0)
    assert not run_over(end, end, all_published=True, unanswered=3)
    assert run_over(end + timedelta(seconds=RESULT_GRACE_SECONDS), end, all_published=True,
                    unanswered=3)  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    return {"NETVAL_MQTT_URL": "mqtt://broker:1883", **extra}


def test_the_ceiling_setting() -> None:
    assert operator_settings_from_env(_env()).loadtest_max_rate_mbps == 0.0
    settings = operator_settings_from_env(_env(**{ENV_LOADTEST_MAX_RATE: "25000"}))
    assert settings.loadtest_max_rate_mbps == 25_000.0
    for bad in ("-1", "fast", "nan", "1e99"):
        with pytest.raises(OperatorConfigError, match=ENV_LOADTEST_MAX_RATE):
            operator_settings_from_env(_env(**{ENV_LOADTEST_MAX_RATE: bad}))
