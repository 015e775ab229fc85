"""The urllib3 pool manager every Kubernetes client of the operator sends through
(`kube.api.bound_requests` installs it): each write asks the process's write fence
(`leadership.fence`) right before it is sent, in the thread that sends it. A write the fence
refuses is not sent (NotLeading); one it lets through gets a timeout within the time left
for it to land and is sent once (a urllib3 retry would be a later write that skipped the
fence). Reads, and reviews (POSTs that store nothing; a standby makes TokenReviews for
enrollment), are not fenced."""

from __future__ import annotations

from typing import Any, Final

import urllib3

from netval.operator.leadership.fence import WriteFence

WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
UNFENCED_PATHS: Final = ("/apis/authentication.k8s.io/", "/apis/authorization.k8s.io/")


class FencedPool:
    """A urllib3 pool manager whose writes ask the fence first (see the module's doc); the
    kubernetes client sends every request through its pool manager's `request`."""

    def __init__(self, inner: Any, fence: WriteFence, longest: float) -> None:
        self.inner = inner
        self.fence = fence
        self.longest = longest  # seconds, the longest timeout a write gets

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in WRITE_METHODS and not any(p in url for p in UNFENCED_PATHS):
            bound = self.fence.write_timeout(f"{method.upper()} {urllib3.util.parse_url(url).path}")
            if bound is not None:
                kwargs["timeout"] = _within(kwargs.get("timeout"), min(bound / 2, self.longest))
                kwargs["retries"] = False
        return self.inner.request(method, url, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _within(timeout: Any, limit: float) -> urllib3.Timeout:
    """The caller's timeout, cut to `limit`, half of the time the write has to land: `total`
    bounds the connect and, separately, the send (urllib3 sends under the connect timeout)."""
    connect = read = limit
    if isinstance(timeout, urllib3.Timeout):
        if isinstance(timeout.connect_timeout, int | float):
            connect = min(connect, timeout.connect_timeout)
        if isinstance(timeout.read_timeout, int | float):
            read = min(read, timeout.read_timeout)
    return urllib3.Timeout(connect=connect, read=read, total=limit)
