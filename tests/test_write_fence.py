"""The write fence (operator/leadership/fence.py): when this replica may send a write and
how long that write may take, and every write of a client from `kube.api` asking it in the
sending thread, over real HTTP (tests/kube.py): a refused write never reaches the API, a
sent one is bounded to land before another replica could take the Lease, reviews (which
store nothing, and a standby makes them) are not fenced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3.exceptions
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from kube import KubeCluster
from netval.operator.kube.api import FencedPool, KubeApi
from netval.operator.leadership.fence import WRITE_FENCE, WRITE_MARGIN, NotLeading, WriteFence
from operator_env import add_node

LEASE, DEADLINE = 10.0, 7.0


def test_an_unarmed_fence_lets_every_write_through_unbounded() -> None:
    fence = WriteFence()
    assert fence.write_timeout("PATCH /x") is None


def test_an_armed_fence_is_shut_until_the_lease_is_acquired_and_after_it_is_lost() -> None:
    fence = WriteFence()
    fence.arm(LEASE, DEADLINE)
    with pytest.raises(NotLeading, match="PATCH /x: not sent"):
        fence.write_timeout("PATCH /x")
    fence.renewed(time.monotonic())
    assert fence.leading()
    fence.shut()
    with pytest.raises(NotLeading):
        fence.write_timeout("PATCH /x")


@given(sent=st.floats(0, 1000), elapsed=st.floats(0, 30))
def test_a_write_is_sent_only_before_the_renew_deadline_and_lands_before_a_takeover(
    sent: float, elapsed: float
) -> None:
    """Another replica may lead no earlier than `sent + LEASE` (the Lease write sent at
    `sent` was committed later, and it counts from when it saw that): a write allowed at
    `now` is bounded to end by then, less the margin."""
    fence = WriteFence()
    fence.arm(LEASE, DEADLINE)
    fence.renewed(sent)
    now = sent + elapsed
    if elapsed >= DEADLINE:
        with pytest.raises(NotLeading):
            fence.write_timeout("PUT /y", now=now)
        return
    bound = fence.write_timeout("PUT /y", now=now)
    assert bound is not None
    assert now + bound <= sent + LEASE - WRITE_MARGIN + 1e-9
    assert bound >= LEASE - DEADLINE - WRITE_MARGIN - 1e-9  # time enough for a write


def test_an_older_renewal_reported_late_does_not_move_the_fence_back() -> None:
    fence = WriteFence()
    fence.arm(LEASE, DEADLINE)
    fence.renewed(100.0)
    fence.renewed(95.0)  # an attempt sent earlier that answered later
    assert fence.write_timeout("PATCH /x", now=106.0) is not None


@pytest.fixture
def armed() -> Iterator[WriteFence]:
    WRITE_FENCE.arm(LEASE, DEADLINE)
    yield WRITE_FENCE
    WRITE_FENCE.disarm()


def _requests(kube: KubeCluster, method: str, prefix: str) -> int:
    async def count() -> int:
        return sum(
            1
            for r in kube.api._requests
            if str(r.method.value) == method and str(r.url.path).startswith(prefix)
        )

    return kube.call(count)


def test_a_replica_that_is_not_leading_sends_no_write_reads_and_reviews_still_go(
    kube: KubeCluster, armed: WriteFence
) -> None:
    add_node(kube, "gpu-a", {"nvidia.com/gpu.present": "true"})
    api = KubeApi(kube.api_client(), attempts=3, backoff=(0.0, 0.0))
    try:
        with pytest.raises(NotLeading):
            asyncio.run(api.set_node_label("gpu-a", "healthy"))
        assert _requests(kube, "PATCH", "/api/v1/nodes/") == 0  # not one attempt, no retry
        assert asyncio.run(api.list_node_names()) == {"gpu-a"}  # a read is no write
        # a TokenReview stores nothing: a standby's enrollment server makes them
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": "t"}}  # fmt: skip
        client.AuthenticationV1Api(api.api_client).create_token_review(review)
        assert _requests(kube, "POST", "/apis/authentication.k8s.io/") == 1
        armed.renewed(time.monotonic())  # leading: the same write goes
        assert asyncio.run(api.set_node_label("gpu-a", "healthy")) is True
        labels = kube.get("v1", "nodes", "gpu-a")["metadata"]["labels"]
        assert labels["netval.io/fabric"] == "healthy"
    finally:
        api.close()


def test_a_write_sent_late_in_a_term_is_bounded_to_land_before_a_takeover(
    kube: KubeCluster, armed: WriteFence
) -> None:
    """The renewal was 5 s ago (deadline 7 s, lease 10 s): a hung PATCH is sent once, with a
    timeout within the 4 s left before the margin, not the client's 15 s read timeout."""
    add_node(kube, "gpu-a", {"nvidia.com/gpu.present": "true"})
    armed.renewed(time.monotonic() - 5.0)
    kube.inject("PATCH", r"/api/v1/nodes/gpu-a", hang=30)
    api = KubeApi(kube.api_client(), attempts=1)
    pool = api.api_client.rest_client.pool_manager
    assert isinstance(pool, FencedPool)
    sent: list[dict[str, Any]] = []
    inner = pool.inner

    class Spy:
        def request(self, *args: Any, **kwargs: Any) -> Any:
            sent.append(kwargs)
            return inner.request(*args, **kwargs)

    pool.inner = Spy()
    try:
        with pytest.raises(urllib3.exceptions.HTTPError):  # timed out (urllib3 did not retry)
            asyncio.run(api.set_node_label("gpu-a", "healthy"))
        assert _requests(kube, "PATCH", "/api/v1/nodes/") == 1
        assert len(sent) == 1 and sent[0]["retries"] is False
        # connect and send are each bounded by `total`: the write lands within 2 x total
        assert 2 * sent[0]["timeout"].total <= LEASE - 5.0 - WRITE_MARGIN
    finally:
        pool.inner = inner
        kube.clear_faults()
        api.close()
