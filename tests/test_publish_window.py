"""The operator's retained publishes overlap in a bounded window (`publish_window`): every
item is put once, never more than `window` await their acknowledgement at once, and an
error that ends the session stops the rest and cancels the ones in flight."""

from __future__ import annotations

import asyncio

import pytest

from netval.operator.ingest.publish_window import PUBLISH_WINDOW, publish_all


class Broker:
    """Acknowledges each publish when the test says so (or at once when `auto`)."""

    def __init__(self, auto: bool = True) -> None:
        self.auto = auto
        self.in_flight = 0
        self.most = 0
        self.put: list[str] = []
        self.cancelled = 0
        self.ack = asyncio.Event()

    async def __call__(self, name: str, payload: bytes) -> bool:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0)  # the round trip
            if name == "boom":
                raise ConnectionError("the session is gone")
            if not self.auto:
                await self.ack.wait()
            self.put.append(name)
            return True
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1


def test_every_item_is_put_once_with_at_most_the_window_in_flight() -> None:
    broker = Broker()
    items = [(f"t{i}", b"x") for i in range(1000)]
    asyncio.run(publish_all(items, broker, window=16))
    assert sorted(broker.put) == sorted(n for n, _ in items)
    assert broker.most == 16


def test_the_default_window_overlaps_but_stays_under_the_broker_s_in_flight_limit() -> None:
    broker = Broker()
    asyncio.run(publish_all(((f"t{i}", b"") for i in range(300)), broker))
    assert broker.most == PUBLISH_WINDOW
    assert 1 < PUBLISH_WINDOW < 100  # the chart broker's max_inflight_messages


def test_a_window_of_one_is_one_at_a_time_in_order() -> None:
    broker = Broker()
    asyncio.run(publish_all(((f"t{i}", b"") for i in range(50)), broker, window=1))
    assert broker.put == [f"t{i}" for i in range(50)]
    assert broker.most == 1


def test_an_error_stops_the_rest_and_cancels_what_is_in_flight() -> None:
    async def main() -> Broker:
        broker = Broker(auto=False)
        items = [("a", b""), ("boom", b""), ("c", b""), *((f"t{i}", b"") for i in range(100))]
        run = asyncio.create_task(publish_all(items, broker, window=3))
        with pytest.raises(ConnectionError):  # while a and c await their acknowledgement
            await run
        return broker

    broker = asyncio.run(main())
    assert broker.cancelled == 2  # a and c, cancelled
    assert broker.in_flight == 0  # nothing left running
    assert broker.put == []  # and the rest never started
