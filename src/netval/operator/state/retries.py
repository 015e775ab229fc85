"""A node's warning of requester-side retries, read off its report (pure).

The agent reports a rise of requester-side retry and timeout counters without evidence on
the node's own port as a `warn` result of `rdma.errors` with `observed["attribution"] ==
"requester"` (`netval.model.attribution`). The operator keeps, per node, whether its last
report says so, which counters rose, and since when the node has said so: the node verdict
fails it only when the east-west results point at it too
(`state.node_verdicts.apply_blame`), and the status names the likely culprit when many
nodes say so at once (`status.retries`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from netval.model.attribution import Attribution, ErrorsKey
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult

MAX_COUNTERS: Final = 8  # counter names kept per node (the status shows at most 8 in all)
MAX_NAME: Final = 64


@dataclass(frozen=True, slots=True)
class RetryNote:
    subject: str  # the first such result's subject (device/port)
    counters: tuple[str, ...]  # the counters that rose, sorted, at most MAX_COUNTERS
    since: datetime  # when the node started to report them (kept while it goes on)


def retry_note(
    results: Iterable[CheckResult], previous: RetryNote | None, at: datetime
) -> RetryNote | None:
    """The note of a report's results (None: no requester-attributed warning); `previous`
    (the node's last note) keeps its `since` while the node goes on warning so."""
    subject: str | None = None
    counters: set[str] = set()
    for r in results:
        if r.check is not CheckId.RDMA_ERRORS or r.status is not Status.WARN:
            continue
        observed = r.observed
        if observed.get(ErrorsKey.ATTRIBUTION) != Attribution.REQUESTER:
            continue
        if subject is None:
            subject = r.subject
        named = observed.get(ErrorsKey.COUNTERS)
        if isinstance(named, dict):
            counters.update(str(name)[:MAX_NAME] for name in named)
    if subject is None:
        return None
    since = previous.since if previous is not None else at
    return RetryNote(subject, tuple(sorted(counters)[:MAX_COUNTERS]), since)


__all__ = ["MAX_COUNTERS", "RetryNote", "retry_note"]
