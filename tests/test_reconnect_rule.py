"""The one reconnect rule of netval's MQTT connections (`netval.infra.mqtt_client`:
`ReconnectRule`, `reconnect_loop`), used by the agent's publisher and the operator's ingest
(each with its policy). Pure and deterministic: a fake clock, a seeded RNG, sessions
and pauses that are plain coroutines. The connections themselves go through a real broker
in test_broker_restart.py, test_agent_faults.py, test_ingest_faults.py and
test_enrollment_storms.py."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiomqtt import MqttError
from aiomqtt.exceptions import MqttConnectError
from hypothesis import given
from hypothesis import strategies as st

from netval.infra.mqtt_client import (
    ReconnectPolicy,
    ReconnectRule,
    SessionEnd,
    backoff_delay,
    credential_refused,
    reconnect_loop,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rule(clock: FakeClock, seed: int = 7, **policy: float) -> ReconnectRule:
    return ReconnectRule(ReconnectPolicy(**policy), rng=random.Random(seed), clock=clock)


def test_failed_connects_back_off_exponentially_with_full_jitter_up_to_the_cap() -> None:
    clock = FakeClock()
    r = rule(clock, base=0.5, cap=4.0)
    expected = random.Random(7)
    for n in range(1, 9):
        end = r.ended(MqttError("[Errno 111] Connection refused"))
        assert (end.failures, end.connected, end.reset, end.refused) == (n, False, False, False)
        assert end.delay == backoff_delay(n, base=0.5, cap=4.0, rng=expected)
        assert 0 <= end.delay <= min(4.0, 0.5 * 2 ** (n - 1))


def test_only_a_session_that_held_resets_the_backoff() -> None:
    clock = FakeClock()
    r = rule(clock, stable_after=10.0)
    for _ in range(3):
        r.ended(TimeoutError())
    r.connected()
    clock.now += 9.9  # up, but dropped before it held: a takeover fight is not hammered
    short = r.ended(MqttError("lost"))
    assert (short.connected, short.reset, short.failures) == (True, False, 4)
    r.connected()
    clock.now += 10.0
    held = r.ended(MqttError("lost"))
    assert (held.connected, held.reset, held.failures) == (True, True, 1)
    after = r.ended(MqttError("refused"))  # no connected() since: not a session
    assert (after.connected, after.reset, after.failures) == (False, False, 2)


def test_the_refusal_hook_classifies_ends() -> None:
    clock = FakeClock()
    refused = MqttConnectError(5)  # MQTT 3.1.1: not authorized
    assert credential_refused(refused) and not credential_refused(MqttConnectError(3))
    r = rule(clock)
    assert r.ended(refused).refused and not r.ended(MqttError("[Errno 111]")).refused
    assert not r.ended(None).refused
    custom = ReconnectRule(ReconnectPolicy(), clock=clock, refused=lambda e: "no" in str(e))
    assert custom.ended(RuntimeError("no")).refused


def test_a_policy_must_make_sense() -> None:
    for bad in ({"base": 0.0}, {"base": 2.0, "cap": 1.0}, {"stable_after": -1.0}):
        with pytest.raises(ValueError, match="need"):
            ReconnectPolicy(**bad)


@given(st.integers(0, 2**31), st.integers(1, 200), st.floats(0.01, 5), st.floats(5, 120))
def test_a_delay_is_never_negative_nor_past_the_cap(
    seed: int, failures: int, base: float, cap: float
) -> None:
    delay = backoff_delay(failures, base=base, cap=cap, rng=random.Random(seed))
    assert 0 <= delay <= cap


def run_loop(
    outcomes: list[BaseException | None], *, stop_after: int | None = None
) -> tuple[list[SessionEnd], list[float]]:
    """`reconnect_loop` over sessions that end as `outcomes` say (None: connected for a
    minute, then the session returned), stopping after `stop_after` ends (all of them)."""
    clock = FakeClock()
    r = rule(clock)
    ends: list[SessionEnd] = []
    pauses: list[float] = []
    left = list(outcomes)
    stop_at = len(outcomes) if stop_after is None else stop_after

    async def session() -> None:
        outcome = left.pop(0)
        if outcome is None:
            r.connected()
            clock.now += 60
            return
        raise outcome

    async def pause(delay: float) -> None:
        pauses.append(delay)

    def stopping() -> bool:
        return len(ends) >= stop_at

    asyncio.run(reconnect_loop(session, r, on_end=ends.append, stopping=stopping, pause=pause))
    return ends, pauses


def test_the_loop_reconnects_after_every_end_with_the_rules_delay() -> None:
    boom = ValueError("a paho surprise")
    ends, pauses = run_loop([MqttError("a"), MqttError("b"), None, boom, MqttError("c")])
    assert [e.failures for e in ends] == [1, 2, 1, 2, 3]
    assert ends[2].reset and ends[2].error is None
    assert ends[3].error is boom  # an unexpected error ends a session, not the loop
    assert pauses == [e.delay for e in ends[:-1]]  # no pause once stopping


def test_a_stopping_loop_reports_the_end_and_does_not_pause() -> None:
    ends, pauses = run_loop([MqttError("a"), MqttError("b"), MqttError("c")], stop_after=2)
    assert [e.failures for e in ends] == [1, 2] and pauses == [ends[0].delay]


def test_a_cancelled_loop_stops_at_once() -> None:
    async def main() -> None:
        entered = asyncio.Event()

        async def session() -> None:
            entered.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(
            reconnect_loop(session, rule(FakeClock()), on_end=pytest.fail)  # type: ignore[arg-type]
        )
        await asyncio.wait_for(entered.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_every_mqtt_connection_reconnects_by_the_one_rule() -> None:
    """The agent's publisher and the ingest run `reconnect_loop` and keep no backoff of
    their own (`backoff_delay` is the rule's; enrollment's HTTP retries aside)."""
    import inspect

    from netval.agent import publish
    from netval.operator.ingest import subscriber

    for module in (publish, subscriber):
        source = inspect.getsource(module)
        assert "reconnect_loop(" in source and "ReconnectRule(" in source, module.__name__
        assert "backoff_delay" not in source and "asyncio.sleep(backoff" not in source


def test_the_operator_tries_at_once_then_backs_off_briefly() -> None:
    """The operator is one client, not the fleet: its first attempt after losing the broker
    goes at once, the next ones wait at most 2 s (the agents' ceiling stays 30 s)."""
    import random

    from netval.infra.mqtt_client import OPERATOR_RECONNECT, ReconnectPolicy, ReconnectRule

    now = [0.0]
    rule = ReconnectRule(OPERATOR_RECONNECT, rng=random.Random(3), clock=lambda: now[0])
    rule.connected()
    now[0] = 100.0  # a session that held: the count starts over
    delays = [rule.ended(ConnectionError("lost")).delay for _ in range(12)]
    assert delays[0] == 0.0
    assert all(0 <= d <= OPERATOR_RECONNECT.cap for d in delays[1:])
    assert max(delays) <= 2.0 and sum(delays) < 20.0
    fleet = ReconnectRule(ReconnectPolicy(), rng=random.Random(3), clock=lambda: now[0])
    assert fleet.ended(ConnectionError("lost")).delay > 0  # jittered, never "at once"
