"""Counter deltas: counters are judged per interval, never as absolute values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

_U32: Final = 1 << 32


def delta(first: int | None, last: int | None, *, width: int = 64) -> int | None:
    """Growth of a counter between two samples, or None when either read failed.

    A counter that went backwards either wrapped (only 32-bit counters do in practice: the
    mlx5 Q counters behind the RDMA error counters, carrier_changes) or was reset (driver
    reload, netdev re-created). A 64-bit counter that went backwards was reset, and its
    current value is all we know to have happened since. A 32-bit one wrapped, unless the
    wrapped growth would be implausibly large (over half the range), which again means reset.
    """
    if first is None or last is None:
        return None
    if last >= first:
        return last - first
    if width == 32 and first < _U32:
        wrapped = last + _U32 - first
        if wrapped <= _U32 // 2:
            return wrapped
    return last


def deltas(
    first: Mapping[str, int] | None,
    last: Mapping[str, int] | None,
    names: tuple[str, ...],
    *,
    width: int = 64,
) -> dict[str, int]:
    """Deltas of the named counters present in both samples."""
    if first is None or last is None:
        return {}
    out: dict[str, int] = {}
    for name in names:
        d = delta(first.get(name), last.get(name), width=width)
        if d is not None:
            out[name] = d
    return out
