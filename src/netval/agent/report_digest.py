"""Full report or beat: the agent's pure decision, one per cycle (docs/architecture.md,
"Reports and beats").

A cycle's report goes out in full when its material content (`netval.model.beat.report_digest`)
differs from the standing one (the last report handed to the publisher), when `full_every`
cycles passed since the last full one, or when the connection was made again since the standing
report was sent (a broker restarted without persistence lost the retained report, and an
operator started after it would hold none to match beats against). Otherwise the cycle is a `Beat` carrying the standing
report's digest.
"""

from __future__ import annotations

from dataclasses import dataclass

from netval.model.beat import Beat, report_digest
from netval.model.results import Report
from netval.model.spec import DEFAULT_FULL_EVERY


@dataclass(slots=True)
class ReportCadence:
    full_every: int = DEFAULT_FULL_EVERY
    seq: int = -1  # the last cycle's sequence number (the first cycle is 0)
    digest: str | None = None  # the standing report's
    beats_since_full: int = 0
    # the connection the standing report was acknowledged in (None: not sent yet, its beats
    # follow it out of the publisher)
    sent_in: int | None = None

    def next(self, report: Report, *, session: int) -> Beat | None:
        """None: publish `report` in full (it becomes the standing report); else the beat
        to publish instead. `session`: the publisher's connection count so far."""
        self.seq += 1
        digest = report_digest(report)
        if (
            digest != self.digest
            or (self.sent_in is not None and self.sent_in != session)
            or self.beats_since_full + 1 >= max(1, self.full_every)
        ):
            self.digest = digest
            self.sent_in = None
            self.beats_since_full = 0
            return None
        self.beats_since_full += 1
        return Beat(seq=self.seq, cycle_at=report.started_at, digest=digest, worst=report.status)

    def sent(self, session: int) -> None:
        """The standing report was acknowledged by the broker in connection `session`."""
        self.sent_in = session

    def forget(self) -> None:
        """The standing report was not sent (too large, replaced): the next is full."""
        self.digest = None


__all__ = ["ReportCadence"]
