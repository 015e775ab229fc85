"""What every check function receives: the snapshot, the expectations, the judged subjects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from pydantic import JsonValue

from netval.agent.checks.judged import Judged
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.snapshot import Netdev, NodeSnapshot
from netval.model.spec import Checks


@dataclass(frozen=True, slots=True)
class CheckContext:
    snapshot: NodeSnapshot
    checks: Checks
    judged: Judged

    @property
    def node(self) -> str:
        return self.snapshot.node

    def netdev_pair(self, name: str) -> tuple[Netdev | None, Netdev | None]:
        return self.snapshot.first.netdevs.get(name), self.snapshot.last.netdevs.get(name)

    def interval_text(self) -> str:
        return f"{self.snapshot.elapsed_seconds:g}s"


def result(
    check: CheckId,
    subject: str,
    status: Status,
    message: str,
    observed: Mapping[str, object] | None = None,
    expected: Mapping[str, object] | None = None,
) -> CheckResult:
    # Values are ints, floats, strings, bools, None or lists of them; pydantic validates
    # them as JSON values on construction.
    return CheckResult(
        check=check,
        subject=subject,
        status=status,
        message=message,
        observed=cast(dict[str, JsonValue], dict(observed or {})),
        expected=cast(dict[str, JsonValue], dict(expected or {})),
    )


def skipped(check: CheckId, subject: str, reason: str) -> CheckResult:
    return result(check, subject, Status.SKIP, reason)


NO_DELTAS = "needs two samples to judge counter deltas"
