"""A closed `KubeApi` (its leadership term ended) starts no further attempt of a call: a
retry after the term could land after the next leader's first write."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netval.operator.kube.api import ClosedError, KubeApi


def test_a_call_failing_when_the_term_ends_is_not_retried() -> None:
    api = KubeApi(client.ApiClient(), backoff=(0.0, 0.0))
    calls: list[int] = []

    def patch() -> None:
        calls.append(1)
        api.close()  # the term ends while this attempt is on the wire
        raise ApiException(status=503)

    with pytest.raises(ClosedError, match="patch: the client was closed"):
        api._retrying(patch)
    assert calls == [1]


def test_an_open_client_retries_a_503() -> None:
    api = KubeApi(client.ApiClient(), backoff=(0.0, 0.0))
    calls: list[int] = []

    def patch() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ApiException(status=503)
        return "ok"

    assert api._retrying(patch) == "ok"
    assert calls == [1, 1]
    api.close()
