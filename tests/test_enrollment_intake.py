"""The enrollment server under load and faults, over its real interfaces (HTTPS, the test
API's TokenReview, the chart's Mosquitto with dynamic security; tests/test_enrollment.py's
fixture): what it answers before spending a TokenReview, its bounded queue, the reviews it
reuses, the credentials it hands back instead of rotating them, and a request whose client
went away. The token pre-check itself is fuzzed with hypothesis.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kube import KubeCluster, wait_for
from netval.operator.identity.token_check import TokenRejected, check_token
from test_enrollment import Enrollment, jwt_shaped, running_enrollment


@pytest.fixture
def enrollment(tmp_path: Path, kube: KubeCluster) -> Iterator[Enrollment]:
    with running_enrollment(tmp_path, kube) as env:
        yield env


class GatedReviews:
    """Wraps the test API's TokenReview: each review waits for `release` (bounded), so a
    test can hold requests inside the server."""

    def __init__(self, e: Enrollment) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        inner = e.authority.review

        def review(spec: dict[str, Any]) -> dict[str, Any]:
            self.entered.set()
            self.release.wait(20)
            return inner(spec)

        e.kube.api.token_reviewer = review


def test_a_start_enrollment_gets_the_fresh_credential_back_and_a_loop_is_throttled(
    enrollment: Enrollment,
) -> None:
    e = enrollment
    e.loop.run(e.service.stop())
    e.service = e.start_service(timedelta(hours=24), min_reissue=60)
    token = e.agent_token("agent-a", "node-a")
    status, first = e.post(token, {"node": "node-a"})
    assert status == 200
    a = e.mqtt(first["username"], first["password"], client_id=first["clientId"])
    assert not a.connect().is_failure
    # A restarted container (or a retried request) asks again: the same credential, no
    # broker write, the live session untouched; one TokenReview for all of them.
    for _ in range(3):
        status, again = e.post(token, {"node": "node-a", "reason": "start"})
        assert (status, again["password"]) == (200, first["password"])
    assert e.service.issuer.issued == 1 and e.service.server.outcomes["reused"] == 3
    assert e.authority.reviews == 1
    # "The broker refused it" gets a new one, but not in a loop.
    status, answer = e.post(token, {"node": "node-a", "reason": "refused"})
    assert status == 429 and "password" not in answer and answer["error"] == "throttled"
    assert not a.disconnects
    status, _ = e.post(e.agent_token("agent-b", "node-b"), {"node": "node-b"})
    assert status == 200


def test_refused_and_renew_rotate_and_the_old_password_stops_working(
    enrollment: Enrollment,
) -> None:
    e = enrollment
    token = e.agent_token("agent-a", "node-a")
    _, first = e.post(token, {"node": "node-a"})
    for reason in ("refused", "renew"):
        status, new = e.post(token, {"node": "node-a", "reason": reason})
        assert status == 200 and new["password"] != first["password"], reason
        old = e.mqtt(first["username"], first["password"], client_id=first["clientId"])
        assert old.connect().is_failure
        first = new
    assert e.service.issuer.issued == 3 and e.authority.reviews == 1
    status, _ = e.post(token, {"node": "node-a", "reason": "because"})
    assert status == 400


def test_no_token_review_while_the_broker_cannot_be_asked(enrollment: Enrollment) -> None:
    e = enrollment
    token = e.agent_token("agent-a", "node-a")
    e.loop.run(e.service.admin.stop())
    for _ in range(3):
        status, answer = e.post(token, {"node": "node-a"})
        assert status == 503 and answer["error"] == "unavailable"
    assert e.authority.reviews == 0
    assert e.service.server.outcomes == {"unavailable": 3}


def _retry_after(e: Enrollment, token: str) -> tuple[int, str | None, dict[str, Any]]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(e.url, data=b'{"node": "node-b"}', method="POST",
                                     headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    context = ssl.create_default_context(cafile=str(e.tls.ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=20) as response:
            return response.status, None, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Retry-After"), json.loads(exc.read())


def test_past_the_queue_bound_a_request_gets_429_with_retry_after(enrollment: Enrollment) -> None:
    e = enrollment
    e.service.server.max_active, e.service.server.max_waiting = 1, 0
    first_token, second_token = (
        e.agent_token("agent-a", "node-a"),
        e.agent_token("agent-b", "node-b"),
    )
    gate = GatedReviews(e)
    results: list[tuple[int, dict[str, Any]]] = []
    worker = threading.Thread(target=lambda: results.append(e.post(first_token, {})))
    worker.start()
    try:
        assert gate.entered.wait(20), "the first review never started"
        status, retry_after, answer = _retry_after(e, second_token)
        assert (status, answer["error"]) == (429, "busy") and retry_after and int(retry_after) >= 1
    finally:
        gate.release.set()
        worker.join(30)
    assert results and results[0][0] == 200
    assert e.service.server.outcomes["busy"] == 1 and e.service.server.queued == 0
    status, _, _ = _retry_after(e, second_token)  # drained: admitted again
    assert status == 200


def test_a_request_whose_client_went_away_is_not_issued(enrollment: Enrollment) -> None:
    e = enrollment
    token = e.agent_token("agent-a", "node-a")
    gate = GatedReviews(e)
    context = ssl.create_default_context(cafile=str(e.tls.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", e.service.server.port, context=context)
    conn.request("POST", "/v1/enroll", body=b"{}", headers={"Authorization": f"Bearer {token}"})
    assert gate.entered.wait(20), "the review never started"
    conn.close()  # the agent gave up (its timeout): nobody would receive a password
    gate.release.set()
    wait_for(lambda: e.service.server.outcomes["gone"] == 1, 20, what="the request dropped")
    assert e.service.issuer.issued == 0 and e.clients_of("node-a") == []


# --- the token pre-check, fuzzed ----------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_CLAIM = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True), st.text(max_size=8),
    st.none(), st.booleans(), st.just(10**400), st.just(253402300799), st.lists(st.integers(), max_size=2),
)  # fmt: skip


def _payloads() -> st.SearchStrategy[str]:
    claims = st.fixed_dictionaries(
        {}, optional={"aud": st.one_of(st.just("netval"), st.just(["netval"]), _JSON),
                      "exp": _CLAIM, "nbf": _CLAIM, "kubernetes.io": _JSON},
    )  # fmt: skip
    deep = st.integers(min_value=1, max_value=5000).map(lambda n: "[" * n + "]" * n)
    raw_json = st.one_of(
        claims.map(json.dumps),
        deep,
        st.just('{"aud": "netval", "exp": NaN}'),
        st.just('{"aud": "netval", "exp": Infinity}'),
        st.just('{"aud": "netval", "exp": 1e999}'),
        _JSON.map(json.dumps),
    )
    return raw_json.map(lambda text: _b64(text.encode()))


_SEGMENTS = st.one_of(_payloads(), st.text(max_size=40), st.binary(max_size=60).map(_b64))


@settings(max_examples=400, deadline=None)
@given(
    header=st.one_of(st.just(_b64(b'{"alg": "RS256"}')), _SEGMENTS),
    payload=_SEGMENTS,
    signature=st.text(max_size=20),
    extra=st.one_of(st.just(""), st.text(max_size=5), st.just("x" * 20000)),
)
def test_any_token_gets_claims_or_a_clear_refusal(
    header: str, payload: str, signature: str, extra: str
) -> None:
    token = f"{header}.{payload}.{signature}{extra}"
    now = time.time()
    try:
        claims = check_token(token, now=now)
    except TokenRejected as exc:
        assert exc.status in (401, 403) and str(exc)
        assert token not in str(exc)
        return
    assert math.isfinite(claims.cache_until) and claims.cache_until <= now + 3600
    assert claims.expires_at > now - 60


def test_the_pre_check_passes_projected_tokens_and_bounds_the_cache_by_warnafter() -> None:
    now = time.time()
    assert check_token(jwt_shaped(), now=now).cache_until <= now + 3600
    # An API server extending token expiry for old clients: exp a year out, warnafter 1 h.
    extended = jwt_shaped(lifetime=365 * 86400, **{"kubernetes.io": {"warnafter": now + 600}})
    claims = check_token(extended, now=now)
    assert claims.cache_until == now + 600 and claims.expires_at > now + 86400
    for token, status in ((jwt_shaped(lifetime=-3600), 403), (jwt_shaped(aud=["api"]), 403),
                          (jwt_shaped(exp=None), 403), ("a.b", 401), ("x" * 20000, 401)):  # fmt: skip
        try:
            check_token(token, now=now)
            raise AssertionError(f"{token[:40]} passed")
        except TokenRejected as exc:
            assert exc.status == status, (token[:40], exc)


def test_concurrent_requests_of_one_pod_get_one_credential(enrollment: Enrollment) -> None:
    """A retried request (the agent's timeout, a proxy's retry) racing the first: one issue,
    both answers carry the same password, whichever finishes first."""
    e = enrollment
    token = e.agent_token("agent-a", "node-a")
    gate = GatedReviews(e)
    results: list[tuple[int, dict[str, Any]]] = []
    workers = [threading.Thread(target=lambda: results.append(e.post(token, {}))) for _ in range(3)]
    for worker in workers:
        worker.start()
    assert gate.entered.wait(20)
    gate.release.set()
    for worker in workers:
        worker.join(30)
    assert [status for status, _ in results] == [200, 200, 200]
    assert len({answer["password"] for _, answer in results}) == 1
    assert e.service.issuer.issued == 1


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=30), st.integers(-(10**9), 10**12).map(str)))
@example("²")
@example(" 7 ")
@example("Fri, 04 Dec 2026 13:00:00 GMT")
def test_any_retry_after_header_is_a_bounded_delay_or_none(value: str | None) -> None:
    from netval.agent.enroll import MAX_RETRY_AFTER, retry_after_seconds

    delay = retry_after_seconds(value)
    assert delay is None or 0 <= delay <= MAX_RETRY_AFTER
    if value is not None and value.strip().isdigit() and value.strip().isascii():
        assert delay == min(float(int(value.strip()[:6])), MAX_RETRY_AFTER)
