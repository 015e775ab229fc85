"""Go/Kubernetes-style durations ("30s", "1m30s", "2h") as used in the CR spec."""

from __future__ import annotations

import re
from typing import Final

_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_WHOLE: Final = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h))+$")

DURATION_PATTERN: Final = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError with the accepted forms when it is not a duration."""
    if not _WHOLE.match(text):
        raise ValueError(f"{text!r} is not a duration (use forms like 30s, 5m, 1m30s, 2h)")
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
