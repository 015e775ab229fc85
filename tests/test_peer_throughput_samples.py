"""The throughput samples an agent keeps reporting (`netval.agent.peers.throughput_samples`):
a failed sample stops counting once a later cycle's echoes to that peer pass (issue 33: a
failed sample was still reported "measured 81 s ago" ~100 s after the fault cleared)."""

from __future__ import annotations

from typing import Any

import pytest

from netval.agent.peers.reprobe import fine_paths
from netval.agent.peers.throughput_samples import (
    SAMPLE_GUARD,
    ThroughputSamples,
    clear_of_samples,
)
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult


def res(check: CheckId, peer: str, status: Status = Status.PASS, msg: str = "m") -> CheckResult:
    return CheckResult(check=check, subject=peer, status=status, message=msg)


def echoes(peer: str, status: Status = Status.PASS) -> list[CheckResult]:
    checks = (CheckId.PEER_LATENCY, CheckId.PEER_LOSS, CheckId.PEER_PATH_MTU)
    return [res(c, peer, status) for c in checks]


def test_a_path_is_fine_when_latency_and_loss_pass_and_path_mtu_does_not_fail() -> None:
    mixed = [res(CheckId.PEER_LATENCY, "q"), res(CheckId.PEER_LOSS, "q", Status.FAIL)]
    assert fine_paths(mixed) == set()
    skipped = res(CheckId.PEER_PATH_MTU, "x", Status.SKIP)  # latency and loss missing
    assert fine_paths([*echoes("ok"), skipped, *echoes("bad", Status.FAIL)]) == {"ok"}


def test_a_failed_throughput_sample_stops_counting_once_the_path_is_fine_again() -> None:
    kept = ThroughputSamples(keep=4)
    failed = res(CheckId.PEER_THROUGHPUT, "b1", Status.FAIL, "could not measure")
    ok = res(CheckId.PEER_THROUGHPUT, "b2", Status.PASS, "812.0 Mbit/s")
    kept.record("b1", failed, at=100.0)
    kept.record("b2", ok, at=100.0)
    kept.path_fine("b1", 90.0)  # echoes from before the sample: they say nothing of it
    got: list[Any] = kept.results(now=130.0, ttl=100.0, fresh=5.0)
    assert [r.subject for r in got] == ["b2", "b1"]
    assert got[1].message == "could not measure (measured 30 s ago)"
    assert got[1].observed["ageSeconds"] == 30.0
    kept.path_fine("b1", 110.0)
    kept.path_fine("b2", 110.0)  # a measurement stays
    assert [r.subject for r in kept.results(now=131.0, ttl=100.0, fresh=5.0)] == ["b2"]
    assert kept.results(now=201.0, ttl=100.0, fresh=5.0) == []  # past the TTL


def test_echoes_wait_until_the_fleet_s_throughput_samples_are_over() -> None:
    """Samples run 0.25 s to 1.25 s after every 5 s slot boundary (0.2 s guard either side);
    echoes take 1 s: a cycle that would overlap waits for the window's end."""
    slot, start, sample, echo = 5.0, 0.25, 1.0, 1.0
    end = start + sample + SAMPLE_GUARD  # 1.45 s into the slot
    base = 1_000_000.0  # a slot boundary
    assert clear_of_samples(base + 0.5, slot, start, sample, echo) == pytest.approx(end - 0.5)
    assert clear_of_samples(base + 0.0, slot, start, sample, echo) == pytest.approx(end)
    assert clear_of_samples(base + 2.0, slot, start, sample, echo) == 0.0  # room until 4.05
    assert clear_of_samples(base + 3.0, slot, start, sample, echo) == 0.0
    # 4.5 s: the echoes would run into the next slot's samples: wait past them
    assert clear_of_samples(base + 4.5, slot, start, sample, echo) == pytest.approx(0.5 + end)
