"""Acquire, renew and release the Lease as client-go's leaderelection does.

- A Lease held by another replica counts as expired only when its record has not changed for
  `leaseDurationSeconds` by this replica's own monotonic clock (no trust in other clocks).
- The leader renews every retry period; when no renewal succeeded for the renew deadline it
  has lost leadership (`hold` returns), which is before any other replica could take the
  Lease (renew deadline < lease duration), so its writers can stop in time.
- Every write carries the resourceVersion read just before: of two replicas writing at once,
  one gets 409 and stays standby.
- `release` (clean stop) empties holderIdentity: a standby takes over at its next retry
  instead of waiting for the Lease to expire.
- Each successful Lease write opens the write fence (`fence`) from the time it was sent; a
  loss or a release shuts it before anything else happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import replace
from datetime import UTC, datetime
from enum import StrEnum

from netval.operator.kube.api import error_text
from netval.operator.leadership.fence import WRITE_FENCE, WriteFence
from netval.operator.leadership.lease import LeaseClient, LeaseConflict, LeaseRecord, microtime
from netval.operator.leadership.settings import ElectionSettings

log = logging.getLogger("netval.operator.leadership")


class Attempt(StrEnum):
    LEADING = "leading"  # acquired or renewed
    HELD = "held"  # another replica holds an unexpired Lease
    FAILED = "failed"  # the API did not answer, or a conflict: try again


class LeaderElector:
    def __init__(
        self, settings: ElectionSettings, lease: LeaseClient, fence: WriteFence = WRITE_FENCE
    ) -> None:
        self.settings = settings
        self.lease = lease
        self.fence = fence
        self.leading = False
        self.acquisitions = 0  # terms this replica started
        self.losses = 0  # terms that ended because renewal failed
        self.holder = ""  # the holder as last seen ("" unknown or released)
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # monotonic time the observed record last changed
        self._resource_version: str | None = None
        self.renewed_at = 0.0  # monotonic send time of the last successful Lease write

    def _observe(self, record: LeaseRecord, resource_version: str) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()
        self._resource_version = resource_version
        self.holder = record.holder

    async def try_acquire_or_renew(self) -> Attempt:
        me = self.settings.identity
        now = microtime(datetime.now(UTC))
        duration = max(1, round(self.settings.lease_duration))
        try:
            found = await self.lease.get()
            if found is None:
                record = LeaseRecord(me, duration, now, now, 0)
                sent_at = time.monotonic()
                self._observe(record, await self.lease.create(record))
                self._renewed(sent_at)
                return Attempt.LEADING
            current, resource_version = found
            self._observe(current, resource_version)
            expired = time.monotonic() - self._observed_at > current.lease_duration
            if current.holder and current.holder != me and not expired:
                return Attempt.HELD
            if current.holder == me:
                record = replace(current, lease_duration=duration, renew_time=now)
            else:
                record = LeaseRecord(me, duration, now, now, current.transitions + 1)
            sent_at = time.monotonic()
            self._observe(record, await self.lease.replace(record, resource_version))
            self._renewed(sent_at)
            return Attempt.LEADING
        except LeaseConflict:
            return Attempt.FAILED
        except Exception as exc:  # the API is down or slow: the caller's deadline decides
            log.warning("leader election: Lease %s/%s: %s", self.lease.namespace,
                        self.lease.name, error_text(exc))  # fmt: skip
            return Attempt.FAILED

    def _renewed(self, sent_at: float) -> None:
        self.renewed_at = max(self.renewed_at, sent_at)
        self.fence.renewed(sent_at)

    def _jittered(self) -> float:
        return self.settings.retry_period * random.uniform(1.0, 1.2)  # noqa: S311 - not crypto

    async def acquire(self) -> None:
        """Until this replica holds the Lease (cancel to give up)."""
        announced = ""
        while True:
            if await self.try_acquire_or_renew() is Attempt.LEADING:
                break
            if self.holder and self.holder != announced:
                log.info("standing by: the Lease is held by %s", self.holder)
                announced = self.holder
            await asyncio.sleep(self._jittered())
        self.leading = True
        self.acquisitions += 1
        log.info("leading: acquired Lease %s/%s as %s", self.lease.namespace, self.lease.name,
                 self.settings.identity)  # fmt: skip

    async def hold(self) -> None:
        """Renew until leadership is lost; returns then (cancel to stop renewing)."""
        # counted from when the last successful Lease write was sent, as the fence counts:
        # leadership ends when the fence shuts, not up to a slow answer's time later
        deadline = self.settings.renew_deadline
        while True:
            await asyncio.sleep(self.settings.retry_period)
            remaining = deadline - (time.monotonic() - self.renewed_at)
            attempt = Attempt.FAILED
            if remaining > 0:
                # asyncio.timeout, not wait_for: no new task, which Kopf would take for one
                # of its own and cancel when it stops
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        attempt = await self.try_acquire_or_renew()
            if attempt is Attempt.LEADING:
                continue
            if attempt is Attempt.HELD or time.monotonic() - self.renewed_at >= deadline:
                self.fence.shut()
                self.leading = False
                self.losses += 1
                log.error("lost leadership: no renewal of Lease %s/%s for %.1fs (holder now %r)",
                          self.lease.namespace, self.lease.name,
                          time.monotonic() - self.renewed_at, self.holder)  # fmt: skip
                return

    async def release(self) -> None:
        """Give the Lease up (clean stop): best effort, bounded by the client's timeout."""
        if not self.leading:
            return
        self.fence.shut()
        self.leading = False
        try:
            found = await self.lease.get()
            if found is None or found[0].holder != self.settings.identity:
                return
            current, resource_version = found
            now = microtime(datetime.now(UTC))
            released = replace(current, holder="", lease_duration=1, renew_time=now)
            await self.lease.replace(released, resource_version)
            log.info("released Lease %s/%s", self.lease.namespace, self.lease.name)
        except Exception as exc:
            log.warning("could not release Lease %s/%s (it expires by itself): %s",
                        self.lease.namespace, self.lease.name, error_text(exc))  # fmt: skip
