"""One shared copy of equal immutable values (a fleet's nodes report the same NICs, publish
the same devices): a bounded table, past its bound a value is kept as it came."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class Shared(Generic[T]):
    """`shared(value)`: the equal value seen first, or `value` itself (then remembered, while
    fewer than `limit` are)."""

    __slots__ = ("_seen", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: dict[T, T] = {}

    def __call__(self, value: T) -> T:
        found = self._seen.get(value)
        if found is not None:
            return found
        if len(self._seen) < self.limit:
            self._seen[value] = value
        return value

    def __len__(self) -> int:
        return len(self._seen)


__all__ = ["Shared"]
