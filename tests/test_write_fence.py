"""The write fence (operator/leadership/fence.py): when this replica may send a write and
how long that write may take, and every write of a client from `kube.api` asking it in the
sending thread, over real HTTP (tests/kube.py): a refused write never reaches the API, a
sent one is bounded to land before another replica could take the Lease, reviews (which
store nothing, and a standby makes them) are not fenced."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
import urllib3.exceptions
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from kube import KubeCluster
from mosquitto import MosquittoBroker
from netval.operator.kube.api import FencedPool, KubeApi
from netval.operator.leadership.fence import WRITE_FENCE, WRITE_MARGIN, NotLeading, WriteFence
from netval.operator.leadership.settings import (
    ENV_LEASE_DURATION,
    ENV_RENEW_DEADLINE,
    ENV_RETRY_PERIOD,
    ElectionConfigError,
    election_settings_from_env,
)
from operator_env import add_node
from test_broker_restart import ingest_for, retained_on
from test_ingest_faults import POOL, until

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


def test_kopfs_own_writes_ask_the_fence_and_its_reads_do_not(
    kube: KubeCluster, armed: WriteFence
) -> None:
    """Kopf's finalizers, annotations and Events go through its own aiohttp session: the
    login netval gives it refuses a write before any connection, and lets a read go."""
    from netval.operator.leadership.kopf_session import login_fenced

    async def main() -> tuple[int, BaseException | None]:
        context = await login_fenced(logger=logging.getLogger("test"),
                                     settings=kopf.OperatorSettings())  # fmt: skip
        assert context is not None
        session = context.aiohttp_session
        server = context.server.rstrip("/")
        refused: BaseException | None = None
        try:
            async with session.get(f"{server}/api/v1/nodes/gpu-a") as response:
                status = response.status
            try:
                await session.patch(f"{server}/api/v1/nodes/gpu-a", json={"metadata": {}})
            except NotLeading as exc:
                refused = exc
        finally:
            await session.close()
        return status, refused

    add_node(kube, "gpu-a", {"nvidia.com/gpu.present": "true"})
    status, refused = asyncio.run(main())
    assert status == 200
    assert isinstance(refused, NotLeading)
    assert _requests(kube, "PATCH", "/api/v1/nodes/") == 0


@pytest.mark.parametrize(
    ("duration", "deadline", "retry", "error"),
    [
        ("", "", "", None),  # the defaults: 10 / 7 / 2
        ("10", "9", "2", "more than 1 s less than"),  # no time left to land a write
        ("10", "7", "6", "must be less than"),
    ],
)
def test_lease_timings_leave_a_write_time_to_land(
    duration: str, deadline: str, retry: str, error: str | None
) -> None:
    env = {ENV_LEASE_DURATION: duration, ENV_RENEW_DEADLINE: deadline, ENV_RETRY_PERIOD: retry}
    if error is None:
        settings = election_settings_from_env("ns", env)
        assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (
            10.0, 7.0, 2.0)  # fmt: skip
        return
    with pytest.raises(ElectionConfigError, match=error):
        election_settings_from_env("ns", env)


def test_a_replica_that_is_not_leading_publishes_no_retained_message(
    mosquitto_broker: MosquittoBroker, armed: WriteFence
) -> None:
    """The operator's retained MQTT messages (agent assignments) are writes too: shut, the
    fence holds them back (counted as failed, kept pending); open, they go out."""
    ingest = ingest_for(mosquitto_broker)
    topic = f"netval/v1/{POOL}/gpu-a/assignment"

    async def main() -> None:
        task = asyncio.create_task(ingest.run())
        try:
            await until(ingest.synced.is_set, "synced")
            ingest.set_retained({topic: b'{"domain":"r1"}'})
            await until(lambda: ingest.stats.retained_failures >= 1, "a publish held back")
            assert await retained_on(mosquitto_broker, "netval/#") == {}
            armed.renewed(time.monotonic())
            ingest.set_retained({topic: b'{"domain":"r1"}'})
            await until(lambda: bool(ingest._published), "published once leading")
            assert await retained_on(mosquitto_broker, "netval/#") == {topic: b'{"domain":"r1"}'}
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())
