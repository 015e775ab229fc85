"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import mosquitto as _mosquitto


@pytest.fixture
def mosquitto_broker(tmp_path: Path) -> Iterator[_mosquitto.MosquittoBroker]:
    """A real Mosquitto broker on a free 127.0.0.1 port (password auth, no persistence),
    one per test. ``.address`` is (host, port, username, password); ``.stop()`` and
    ``.restart()`` keep the port. Skips when mosquitto is not installed."""
    if not _mosquitto.available():
        pytest.skip(_mosquitto.MISSING_REASON)
    workdir = tmp_path / "mosquitto"
    workdir.mkdir()
    broker = _mosquitto.MosquittoBroker(workdir)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()
