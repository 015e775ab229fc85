"""One line of `netval doctor`: a check, its state, what it saw, and the fix when it failed."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # not applicable here (Kueue not used, no webhook), or needs a failed check


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    state: State
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.state is State.FAIL

    def line(self) -> str:
        text = f"{self.state.value.upper():4}  {self.name:20} {self.detail}"
        return f"{text}; fix: {self.fix}" if self.failed and self.fix else text


def ok(name: str, detail: str) -> CheckResult:
    return CheckResult(name, State.PASS, detail)


def fail(name: str, detail: str, fix: str) -> CheckResult:
    return CheckResult(name, State.FAIL, detail, fix)


def skip(name: str, detail: str) -> CheckResult:
    return CheckResult(name, State.SKIP, detail)
