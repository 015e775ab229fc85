"""The enrollment server under load and faults, over its real interfaces (HTTPS, the test
API's TokenReview; tests/test_enrollment.py's fixture): what it answers before spending a
TokenReview, its bounded queue, the reviews it reuses, and a request whose client went away.
The token pre-check and the certificate requests (hostile but well-shaped CSRs) are fuzzed
with hypothesis.
"""

from __future__ import annotations

import base64
import functools
import http.client
import json
import math
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kube import KubeCluster, wait_for
from netval.operator.identity.token_check import TokenRejected, check_token
from test_enrollment import Enrollment, csr_for, jwt_shaped, running_enrollment


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


def test_every_request_signs_the_key_it_sends_and_reviews_once(enrollment: Enrollment) -> None:
    """A restarted container (a new key) or a renewal asks again: each gets a certificate
    for the key it sent, no broker is involved, and one TokenReview serves them all."""
    e = enrollment
    token = e.agent_token("agent-a", "node-a")
    certificates = set()
    for reason in ("start", "start", "renew", "refused"):
        status, answer = e.post(token, {"node": "node-a", "reason": reason,
                                        "csr": csr_for("pool/node-a")})  # fmt: skip
        assert status == 200, answer
        certificates.add(answer["certificate"])
    assert len(certificates) == 4 and e.ca.issued == 4 and e.authority.reviews == 1
    status, _ = e.post(
        token, {"node": "node-a", "reason": "because", "csr": csr_for("pool/node-a")}
    )
    assert status == 400


def _retry_after(e: Enrollment, token: str) -> tuple[int, str | None, dict[str, Any]]:
    import urllib.error
    import urllib.request

    body = json.dumps({"node": "node-b", "csr": csr_for("pool/node-b")}).encode()
    request = urllib.request.Request(e.url, data=body, method="POST",
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
    worker = threading.Thread(
        target=lambda: results.append(e.post(first_token, {"csr": csr_for("pool/node-a")}))
    )
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
    body = json.dumps({"csr": csr_for("pool/node-a")}).encode()
    conn.request("POST", "/v1/enroll", body=body, headers={"Authorization": f"Bearer {token}"})
    assert gate.entered.wait(20), "the review never started"
    conn.close()  # the agent gave up (its timeout): nobody would receive the certificate
    gate.release.set()
    wait_for(lambda: e.service.server.outcomes["gone"] == 1, 20, what="the request dropped")
    assert e.ca.issued == 0


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


# --- certificate signing requests: untrusted input, fuzzed -------------------------------


@functools.cache
def _keys() -> dict[str, Any]:
    """Keys of every kind a hostile agent might send (made once: RSA-8192 takes seconds)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    return {
        "p256": ec.generate_private_key(ec.SECP256R1()),
        "p384": ec.generate_private_key(ec.SECP384R1()),
        "p521": ec.generate_private_key(ec.SECP521R1()),
        "k256": ec.generate_private_key(ec.SECP256K1()),
        "rsa1024": rsa.generate_private_key(65537, 1024),
        "rsa2048": rsa.generate_private_key(65537, 2048),
        "rsa2048e3": rsa.generate_private_key(3, 2048),
        "rsa8192": rsa.generate_private_key(65537, 8192),
        "ed25519": ed25519.Ed25519PrivateKey.generate(),
    }


def _csr(
    key: str, names: list[tuple[Any, str]], extensions: list[Any], forged: bool = False
) -> bytes:
    """A CSR for `key`; `forged`: its signature's last byte altered (it still parses: the
    last byte of the DER is inside the signature value)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(oid, value) for oid, value in names])
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    signer = _keys()[key]
    algorithm = None if isinstance(signer, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    der = builder.sign(signer, algorithm).public_bytes(serialization.Encoding.DER)
    if forged:
        der = der[:-1] + bytes([der[-1] ^ 0x01])
    return _pem(der)


def _pem(der: bytes) -> bytes:
    body = base64.encodebytes(der).decode().replace("\n", "")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return ("-----BEGIN CERTIFICATE REQUEST-----\n" + "\n".join(lines)
            + "\n-----END CERTIFICATE REQUEST-----\n").encode()  # fmt: skip


def _csr_cases() -> st.SearchStrategy[tuple[bytes, str | None]]:
    """(CSR bytes, the refusal reason expected; None: acceptable)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cn = NameOID.COMMON_NAME
    own = "pool/node-a"
    names = st.sampled_from([
        ([(cn, own)], None),
        ([(cn, "pool/node-b")], "wrong_subject"),
        ([(cn, "other/node-a")], "wrong_subject"),
        ([(cn, own), (NameOID.ORGANIZATION_NAME, "system:masters")], "wrong_subject"),
        ([(cn, own), (cn, "pool/node-b")], "wrong_subject"),
        ([(NameOID.ORGANIZATION_NAME, own)], "wrong_subject"),
        ([(cn, own + "\x00pool/node-b")], "wrong_subject"),
        ([(cn, "netval-operator")], "wrong_subject"),
        ([], "wrong_subject"),
    ])  # fmt: skip
    extensions = st.sampled_from([
        ([], None),
        ([x509.SubjectAlternativeName([x509.DNSName("pool.node-b")])], "extensions"),
        ([x509.BasicConstraints(ca=True, path_length=None)], "extensions"),
        ([x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH])], "extensions"),
    ])  # fmt: skip
    keys = st.sampled_from([
        ("p256", None), ("p384", None), ("rsa2048", None), ("p521", "key_type"),
        ("k256", "key_type"), ("rsa1024", "key_size"), ("rsa8192", "key_size"),
        ("rsa2048e3", "key_size"), ("ed25519", "key_type"),
    ])  # fmt: skip
    # the order the server checks in: size, parse, key, signature, subject, extensions
    order = ["too_large", "not_pem", "key_type", "key_size", "bad_signature", "wrong_subject",
             "extensions"]  # fmt: skip

    def build(
        key: tuple[str, str | None], name: Any, ext: Any, forged: bool
    ) -> tuple[bytes, str | None]:
        expected = [r for r in (key[1], name[1], ext[1]) if r is not None]
        if forged:
            expected.append("bad_signature")
        pem = _csr(key[0], name[0], ext[0], forged)
        reason = min(expected, key=order.index) if expected else None
        return pem, reason

    built = st.builds(build, keys, names, extensions, st.booleans())
    garbage = st.one_of(
        st.binary(max_size=300).map(lambda b: (b, None)),
        st.binary(min_size=1, max_size=300).map(
            lambda b: (
                b"-----BEGIN CERTIFICATE REQUEST-----\n"
                + base64.encodebytes(b)
                + b"-----END CERTIFICATE REQUEST-----\n",
                "not_pem",
            )
        ),
        st.just((_csr("p256", [(NameOID.COMMON_NAME, own)], []) * 2, "not_pem")),
        st.just((b"x" * 9000, "too_large")),
    )
    return st.one_of(built, garbage)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(case=_csr_cases())
def test_hostile_certificate_requests_get_a_clear_refusal_and_are_counted(
    enrollment: Enrollment, case: tuple[bytes, str | None]
) -> None:
    """Valid-shaped but hostile CSRs (another node's or validation's name, extra subject
    attributes, a NUL, SANs, CA or server usage asked for, weak, exotic or huge keys, a
    signature by another key) and garbage: 400 `bad_csr` naming the reason, counted by it,
    nothing signed; only the agent's own plain request is signed."""
    e = enrollment
    pem, reason = case
    token = _token(e)
    before_issued, before = e.ca.issued, dict(e.service.server.csr_refusals)
    try:
        text = pem.decode()
    except UnicodeDecodeError:
        text = pem.decode("latin-1")
    status, answer = e.post(token, {"csr": text})
    if status == 200:
        assert reason is None, (reason, answer)
        assert answer["username"] == "pool/node-a" and e.ca.issued == before_issued + 1
        return
    assert status == 400 and answer["error"] == "bad_csr", answer
    assert "certificate" not in answer and e.ca.issued == before_issued
    counted = {k: v - before.get(k, 0) for k, v in e.service.server.csr_refusals.items()}
    (got,) = [k for k, v in counted.items() if v == 1]
    assert got.value in answer["message"]
    if reason is not None:
        assert got.value == reason, (reason, answer["message"])


_TOKENS: dict[int, str] = {}


def _token(e: Enrollment) -> str:
    """One agent pod and token per enrollment fixture (hypothesis reuses the fixture)."""
    if id(e) not in _TOKENS:
        _TOKENS[id(e)] = e.agent_token("agent-a", "node-a")
    return _TOKENS[id(e)]
