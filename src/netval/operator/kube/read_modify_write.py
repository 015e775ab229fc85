"""One read-modify-write with the resourceVersion, for every object netval rewrites in place:
Node labels and taints, Pod scheduling gates, Workload admission checks, finalizers.

A JSON merge patch replaces whole lists (taints, scheduling gates, finalizers, admission
checks), so the list written must be the one read, changed. The patch carries the
resourceVersion it was computed from: a concurrent writer turns it into a 409, and the change
is computed again on a fresh read instead of overwriting what the other writer did. A 404 (on
the read or the write) means the object is gone: nothing to do.

The helper only sequences the caller's calls: the reads and writes go through the caller's
clients (the operator's are fenced, `kube.fenced_pool`), so every attempt asks the write fence.
`read_modify_write` is for code already in a worker thread, `read_modify_write_async` for code
on the event loop whose change must be computed there (it reads the operator's state).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Generic, TypeVar

from kubernetes.client.exceptions import ApiException

T = TypeVar("T")
Obj = dict[str, Any]

WRITE_ATTEMPTS: Final = 5  # conflicts in a row before giving up (StillConflicting)


class Unwritten(StrEnum):
    UNCHANGED = "unchanged"  # `change` had nothing (left) to do
    GONE = "gone"  # 404, or a read that found nothing


@dataclass(frozen=True, slots=True)
class Written(Generic[T]):
    value: T  # what `write` returned


class StillConflicting(RuntimeError):
    """Every attempt met a concurrent writer (409)."""


def _gone_or_raise(exc: ApiException) -> Unwritten | None:
    """GONE on 404, None on 409 (read again and retry); any other failure is the caller's."""
    if exc.status == 404:
        return Unwritten.GONE
    if exc.status == 409:
        return None
    raise exc


def read_modify_write(
    what: str,
    read: Callable[[], Obj | None],
    change: Callable[[Obj], Obj | None],
    write: Callable[[Obj], T],
    *,
    current: Obj | None = None,
    attempts: int = WRITE_ATTEMPTS,
) -> Written[T] | Unwritten:
    """`write(change(obj))` until it applies. `current` is the object as last seen (None:
    `read` it first); `change` returns the merge patch, with the resourceVersion of what it
    was given, or None when there is nothing to do."""
    for _ in range(attempts):
        if current is None:
            try:
                current = read()
            except ApiException as exc:
                if exc.status == 404:
                    return Unwritten.GONE
                raise
            if current is None:
                return Unwritten.GONE
        patch = change(current)
        if patch is None:
            return Unwritten.UNCHANGED
        try:
            return Written(write(patch))
        except ApiException as exc:
            if (gone := _gone_or_raise(exc)) is not None:
                return gone
        current = None
    raise StillConflicting(f"{what}: still conflicting after {attempts} attempts")


async def read_modify_write_async(
    what: str,
    read: Callable[[], Awaitable[Obj | None]],
    change: Callable[[Obj], Obj | None],
    write: Callable[[Obj], Awaitable[T]],
    *,
    current: Obj | None = None,
    attempts: int = WRITE_ATTEMPTS,
) -> Written[T] | Unwritten:
    """`read_modify_write` with awaited reads and writes, `change` on the event loop."""
    for _ in range(attempts):
        if current is None:
            try:
                current = await read()
            except ApiException as exc:
                if exc.status == 404:
                    return Unwritten.GONE
                raise
            if current is None:
                return Unwritten.GONE
        patch = change(current)
        if patch is None:
            return Unwritten.UNCHANGED
        try:
            return Written(await write(patch))
        except ApiException as exc:
            if (gone := _gone_or_raise(exc)) is not None:
                return gone
        current = None
    raise StillConflicting(f"{what}: still conflicting after {attempts} attempts")
