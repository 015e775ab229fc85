"""The write fence: whether this process may send a Kubernetes write now, and how long the
write may take to land.

The elector opens it with each successful Lease write and shuts it when leadership is lost
or released; every write of the operator asks it right before the request is sent (the
HTTP layer of every client from `kube.api.load_kube_client`, threads included, and Kopf's
own session). Time is this process's monotonic clock, which also runs while the process is
frozen (SIGSTOP): a thread that resumes after a freeze finds the fence shut before it sends.

Why a write that passes cannot land after another replica's: the Lease write that last
renewed it was sent at `renewed_at`, so it was committed later, and another replica counts
its `leaseDuration` from when it saw that record, later still. Another leader can therefore
write no earlier than `renewed_at + lease_duration`. The fence lets a write be sent only
until `renewed_at + renew_deadline` (the elector's own "still leading"), and bounds it to
land by `renewed_at + lease_duration - margin` (its request timeout: `write_timeout`).

A process never armed (standalone, the CLI's tools, tests in process) is not fenced.
"""

from __future__ import annotations

import threading
import time
from typing import Final

# Seconds kept between a write's own bound and the earliest takeover: what the API server
# may take between reading a request and committing it.
WRITE_MARGIN: Final = 1.0


class NotLeading(RuntimeError):
    """A write refused: this replica does not hold the Lease, or cannot know it still does."""


class WriteFence:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed = False
        self._lease_duration = 0.0
        self._renew_deadline = 0.0
        self._renewed_at: float | None = None  # monotonic; None while shut

    def arm(self, lease_duration: float, renew_deadline: float) -> None:
        """From now on writes need the Lease (shut until the first acquisition)."""
        with self._lock:
            self._armed = True
            self._lease_duration = lease_duration
            self._renew_deadline = renew_deadline
            self._renewed_at = None

    def disarm(self) -> None:
        """Not fenced any more (the process that armed it ended; tests)."""
        with self._lock:
            self._armed = False
            self._renewed_at = None

    def renewed(self, sent_at: float) -> None:
        """A Lease write sent at monotonic `sent_at` succeeded."""
        with self._lock:
            if self._renewed_at is None or sent_at > self._renewed_at:
                self._renewed_at = sent_at

    def shut(self) -> None:
        """Leadership lost or released: no write from now on."""
        with self._lock:
            self._renewed_at = None

    @property
    def armed(self) -> bool:
        return self._armed

    def leading(self, now: float | None = None) -> bool:
        with self._lock:
            return self._open_until(now) is not None

    def _open_until(self, now: float | None) -> float | None:
        if self._renewed_at is None:
            return None
        now = time.monotonic() if now is None else now
        if now >= self._renewed_at + self._renew_deadline:
            return None
        return self._renewed_at + self._lease_duration - WRITE_MARGIN

    def write_timeout(self, what: str, now: float | None = None) -> float | None:
        """Seconds the write `what` may take to land if sent now (None: not fenced);
        raises NotLeading if it must not be sent."""
        with self._lock:
            if not self._armed:
                return None
            now = time.monotonic() if now is None else now
            until = self._open_until(now)
            if until is None or until <= now:
                raise NotLeading(f"{what}: not sent, this replica is not (or no longer) leading")
            return until - now


# The process's fence: `netval operator` arms it when it elects a leader.
WRITE_FENCE: Final = WriteFence()
