"""Paged lists of the Kubernetes API (synchronous: run them in a worker thread)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, Final, cast

# The apiserver answers a list with metadata only when asked for this representation.
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
PAGE: Final = 500


def paged_items(
    lister: Callable[..., Any],
    *args: Any,
    page: int = PAGE,
    metadata_only: bool = False,
    **kwargs: Any,
) -> Iterator[dict[str, Any]]:
    """Every item of a list call (a `CoreV1Api.list_*` method and its arguments, a label
    selector say), `page` at a time, as plain dicts; `metadata_only`: as
    PartialObjectMetadata (names, labels, annotations, resourceVersion; no spec or status).

    Synchronous (run it in a worker thread). One response never holds every object the
    selector matches (10,000 Pods or Nodes are 100 MiB), and the apiserver serves each page
    from one consistent snapshot (the continue token)."""
    headers = {"Accept": METADATA_LIST} if metadata_only else None
    after: str | None = None
    while True:
        extra: dict[str, Any] = {"_continue": after} if after else {}
        if headers is not None:
            extra["_headers"] = headers
        response = lister(*args, limit=page, _preload_content=False, **extra, **kwargs)
        body = json.loads(cast(Any, response).data)
        yield from body.get("items") or []
        after = (body.get("metadata") or {}).get("continue") or None
        if after is None:
            return
