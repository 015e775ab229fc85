"""The throughput samples an agent keeps reporting between its slots.

A sample is taken only in this node's throughput slots (rarely: every ~n x M / 2 slots), so
the latest one to each peer stays in the reports, with its age once older than a slot, until
it is older than the TTL or more than `keep` newer samples to other peers exist: the
operator then always has several per domain pair.

A *failed* sample (nothing could be measured: connect or a step timed out, too few bytes)
says the path was broken when it was taken. It stops counting once a fresher measurement
says the path to that peer is fine (`path_fine`: the echoes of a later cycle passed latency,
loss and path MTU), so a fault that cleared does not linger for the TTL (issue 33: a failed
sample was still reported "measured 81 s ago" about 100 s after the fault was repaired).
A passing sample stays: it is a measurement, whatever came after.

The samples of the whole fleet run in the same window of every slot (`SLOT_OFFSET` after
the boundary, for at most a quarter of the slot), and a sample fills the queues of the ports
it crosses: echoes sent then to or from a sampling node measure the loss and latency our own
sample made, not the fabric's (measured: a node whose cycle began 0.19 s into the slot lost
3-6 % of its echoes to every peer whenever a sample ran towards it). `clear_of_samples`
says how long a cycle waits so that its echoes stay out of that window.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from pydantic import JsonValue

from netval.model.ids import Status
from netval.model.results import CheckResult

THROUGHPUT_KEEP: Final = 16
SAMPLE_GUARD: Final = 0.2  # seconds either side of the samples' window (clock skew, teardown)


def clear_of_samples(
    now: float, slot_seconds: float, start: float, sample_seconds: float, echo_seconds: float
) -> float:
    """Seconds to wait from `now` (Unix time) so that echoes sent for `echo_seconds` stay
    clear of the window, `start` to `start + sample_seconds` after every slot boundary (with
    SAMPLE_GUARD either side), in which the fleet's throughput samples run."""
    phase = now % slot_seconds
    begin, end = start - SAMPLE_GUARD, start + sample_seconds + SAMPLE_GUARD
    for shift in (-slot_seconds, 0.0, slot_seconds):
        if phase < end + shift and phase + echo_seconds > begin + shift:
            return end + shift - phase
    return 0.0


class ThroughputSamples:
    def __init__(self, keep: int = THROUGHPUT_KEEP) -> None:
        self.keep = keep
        self._samples: OrderedDict[str, tuple[CheckResult, float]] = OrderedDict()
        self._fine: dict[str, float] = {}  # peer -> when its path last measured fine

    def record(self, peer: str, result: CheckResult, at: float) -> None:
        self._samples[peer] = (result, at)
        self._samples.move_to_end(peer)
        while len(self._samples) > self.keep:
            self._samples.popitem(last=False)

    def path_fine(self, peer: str, at: float) -> None:
        """The path to `peer` measured fine at `at` (a later cycle's echoes all passed)."""
        self._fine[peer] = at
        sample = self._samples.get(peer)
        if sample is not None and sample[0].status is not Status.PASS and sample[1] < at:
            del self._samples[peer]
        if len(self._fine) > 4 * self.keep:  # peers rotate: keep only the recent ones
            for old in sorted(self._fine, key=self._fine.__getitem__)[: len(self._fine) // 2]:
                del self._fine[old]

    def results(self, now: float, ttl: float, fresh: float) -> list[CheckResult]:
        """The samples younger than `ttl`, newest first; those older than `fresh` say so."""
        for peer in [p for p, (_, at) in self._samples.items() if now - at > ttl]:
            del self._samples[peer]
        out: list[CheckResult] = []
        for result, at in reversed(self._samples.values()):
            age = max(0.0, now - at)
            if age < fresh:
                out.append(result)
                continue
            observed: dict[str, JsonValue] = {**result.observed, "ageSeconds": round(age, 1)}
            out.append(
                result.model_copy(
                    update={
                        "message": f"{result.message} (measured {age:.0f} s ago)"[:1024],
                        "observed": observed,
                    }
                )
            )
        return out
