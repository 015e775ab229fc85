"""What the enrollment server remembers between requests, bounded: positive token reviews
(until the token's expiry, `token_check.TokenClaims.cache_until`), so a fleet enrolling
again costs the API server one review per pod, not one per request. In this replica's
memory only; the oldest entries go first when the bound is reached.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

from netval.operator.identity.review import AgentPod

MAX_REVIEWS: Final = 32768  # a 10,000-node fleet with up to 3 agent pods per node

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Expiring(Generic[K, V]):
    """key -> (value, until); oldest insertion evicted past `bound`."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._items: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if now >= item[1]:
            del self._items[key]
            return None
        return item[0]

    def put(self, key: K, value: V, until: float) -> None:
        self._items.pop(key, None)
        self._items[key] = (value, until)
        while len(self._items) > self.bound:
            self._items.popitem(last=False)

    def drop(self, keep: Callable[[V], bool]) -> None:
        """Drop every entry whose value `keep(value)` says False about."""
        for key in [k for k, (v, _) in self._items.items() if not keep(v)]:
            del self._items[key]

    def __len__(self) -> int:
        return len(self._items)


def token_key(token: str) -> str:
    """The cache key of a token: its digest, so the cache never holds a usable token."""
    return hashlib.sha256(token.encode()).hexdigest()


class ReviewCache(_Expiring[str, AgentPod]):
    def forget_node(self, node: str) -> None:
        self.drop(lambda pod: pod.node != node)
