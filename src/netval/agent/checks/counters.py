"""Counter deltas: counters are judged per interval, never as absolute values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

_U32: Final = 1 << 32


def delta(first: int | None, last: int | None) -> int | None:
    """Growth of a counter between two samples, or None when either read failed.

    A counter that went backwards either wrapped at 32 bits (mlx5 Q counters and
    carrier_changes are 32-bit) or was reset (driver reload, port reset). A 32-bit wrap is
    only possible when the first value fits in 32 bits; otherwise the counter restarted from
    zero and its current value is all we know to have happened since.
    """
    if first is None or last is None:
        return None
    if last >= first:
        return last - first
    if first < _U32:
        return last + _U32 - first
    return last


def deltas(
    first: Mapping[str, int] | None, last: Mapping[str, int] | None, names: tuple[str, ...]
) -> dict[str, int]:
    """Deltas of the named counters present in both samples."""
    if first is None or last is None:
        return {}
    out: dict[str, int] = {}
    for name in names:
        d = delta(first.get(name), last.get(name))
        if d is not None:
            out[name] = d
    return out
