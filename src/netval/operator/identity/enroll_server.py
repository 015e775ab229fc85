"""The enrollment endpoint: `POST /v1/enroll` over HTTPS, `Authorization: Bearer <the
agent's projected ServiceAccount token>`, body `{"node": ..., "reason": "start" | "renew" |
"refused", "csr": "<PEM certificate signing request>"}`.

The identity the certificate is for is the one the API server says the token's pod has
(`review.PodTokenReviewer`: the node it runs on, the validation whose DaemonSet controls
it); a body naming another node is refused (403), and so is a CSR asking for another name
(400, `csr.checked_public_key`), so one node can never obtain a certificate for another. In
order, cheapest first:

1. 401 without a bearer token; 401/403 for a token that can never pass a TokenReview
   (`token_check`: not a JWT, another audience, expired); 400/413 for a bad body.
2. A bounded queue: `max_active` requests reviewed at once, `max_waiting` more waiting;
   past that 429 + Retry-After.
3. The TokenReview (and Pod and DaemonSet reads), or its cached positive answer
   (`intake.ReviewCache`); 503 + Retry-After while the API server cannot be asked.
4. The CSR checked and signed by the identity CA (`authority.IdentityAuthority`): local, no
   broker involved, so an enrollment costs the same whatever the fleet's size.

Answers: 200 `{"username", "certificate", "ca", "expiresAt", "node", "validation"}`.
Neither the token nor any key is ever logged; agents generate their keys themselves and
send only the public half.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Final, Protocol

from aiohttp import web

from netval.operator.identity.authority import IssuedCertificate
from netval.operator.identity.csr import CsrReason, CsrRefused
from netval.operator.identity.intake import MAX_REVIEWS, ReviewCache, token_key
from netval.operator.identity.review import AgentPod, EnrollmentDenied, ReviewUnavailable
from netval.operator.identity.token_check import TokenRejected, check_token

log = logging.getLogger("netval.operator.identity")

ENROLL_PATH: Final = "/v1/enroll"
MAX_BODY: Final = 16384  # a CSR is at most csr.MAX_CSR_BYTES; JSON escapes its newlines
LOG_EVERY_SECONDS: Final = 10.0  # refusals are counted always, logged at most this often
MAX_ACTIVE: Final = 32  # reviews at once (the API server's TokenReviews are the cost)
MAX_WAITING: Final = 512  # queued behind them; more get 429
RETRY_UNAVAILABLE: Final = 5  # seconds: Retry-After while the API server cannot be asked
# enrollments/s before any was answered (the API server's TokenReview pace); measured from
# the answers after that
ASSUMED_RATE: Final = 100.0
REASONS: Final = ("start", "renew", "refused")


class Reviewer(Protocol):
    async def review(self, token: str) -> AgentPod: ...


class Issuer(Protocol):
    def issue_node(
        self, csr_pem: bytes | str | None, validation: str, node: str
    ) -> IssuedCertificate: ...


def _answer(
    status: int, outcome: str, message: str, retry_after: int | None = None
) -> web.Response:
    response = web.json_response({"error": outcome, "message": message}, status=status)
    if retry_after is not None:
        response.headers["Retry-After"] = str(max(1, retry_after))
    return response


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class EnrollmentServer:
    def __init__(
        self,
        reviewer: Reviewer,
        issuer: Issuer,
        *,
        max_active: int = MAX_ACTIVE,
        max_waiting: int = MAX_WAITING,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reviewer = reviewer
        self.issuer = issuer
        self.max_active = max_active
        self.max_waiting = max_waiting
        self.clock = clock
        self.reviews = ReviewCache(MAX_REVIEWS)
        self._slots = asyncio.Semaphore(max_active)
        self.queued = 0  # requests admitted (waiting or working)
        self._answered: deque[float] = deque(maxlen=64)  # monotonic, admitted requests done
        self.outcomes: Counter[str] = Counter()  # issued, denied, bad_csr, busy, ...
        self.csr_refusals: Counter[CsrReason] = Counter()
        self._runner: web.AppRunner | None = None
        self._last_log: dict[str, float] = {}
        self.port: int | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(ENROLL_PATH, self.enroll)
        return app

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> int:
        """Listen; returns the port (0 picks a free one)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host or None, port, ssl_context=tls)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else port
        log.info("serving agent enrollment on %s:%s%s", host or "*", self.port, ENROLL_PATH)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def forget_node(self, node: str) -> None:
        """A deleted node's pods enroll again only through a new TokenReview."""
        self.reviews.forget_node(node)

    def _refused(self, outcome: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_log.get(outcome, float("-inf")) >= LOG_EVERY_SECONDS:
            self._last_log[outcome] = now
            total = self.outcomes[outcome] + 1
            log.warning(f"enrollment %s (%d so far): {message}", outcome, total, *args)

    async def enroll(self, request: web.Request) -> web.Response:
        outcome, response = await self._enroll(request)
        self.outcomes[outcome] += 1
        return response

    async def _enroll(self, request: web.Request) -> tuple[str, web.Response]:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return "unauthenticated", _answer(401, "unauthenticated", "a bearer token is needed")
        now = self.clock()
        try:
            claims = check_token(token, now=now)
        except TokenRejected as exc:
            outcome = "unauthenticated" if exc.status == 401 else "denied"
            self._refused(outcome, "%s", exc)
            return outcome, _answer(exc.status, outcome, str(exc))
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return "bad_request", _answer(413, "bad_request", f"the body is over {MAX_BODY} bytes")
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (ValueError, UnicodeDecodeError, RecursionError):
            return "bad_request", _answer(400, "bad_request", "the body is not JSON")
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("node", ""), str)
            or not isinstance(body.get("csr", ""), str)
            or body.get("reason", "start") not in REASONS
        ):
            return "bad_request", _answer(
                400,
                "bad_request",
                'expected {"node": "<name>", "reason": "start|renew|refused", "csr": "<PEM>"}',
            )
        asked, csr = body.get("node") or None, body.get("csr") or None
        if self.queued >= self.max_active + self.max_waiting:
            self._refused("busy", "%d enrollments queued", self.queued)
            return "busy", _answer(429, "busy", "too many enrollments at once", self._busy_for())
        self.queued += 1
        try:
            async with self._slots:
                if _gone(request):
                    return "gone", _answer(499, "gone", "the client went away")
                return await self._admitted(request, token, claims.cache_until, asked, csr)
        finally:
            self.queued -= 1
            self._answered.append(time.monotonic())

    def _busy_for(self) -> int:
        """Seconds until the queue ahead has drained at the pace of the last answers (the
        API server's reviews), 1 to 60; the agents add jitter."""
        done = self._answered
        span = done[-1] - done[0] if len(done) >= 2 else 0.0
        rate = (len(done) - 1) / span if span > 0 else ASSUMED_RATE
        return max(1, min(60, math.ceil(self.queued / rate)))

    async def _admitted(
        self, request: web.Request, token: str, cache_until: float, asked: str | None,
        csr: str | None,
    ) -> tuple[str, web.Response]:  # fmt: skip
        key = token_key(token)
        pod = self.reviews.get(key, self.clock())
        if pod is None:
            try:
                pod = await self.reviewer.review(token)
            except EnrollmentDenied as exc:
                self._refused("denied", "%s", exc)
                return "denied", _answer(403, "denied", str(exc))
            except ReviewUnavailable as exc:
                self._refused("unavailable", "%s", exc)
                return "unavailable", _answer(
                    503, "unavailable", "the API server cannot be asked", RETRY_UNAVAILABLE
                )
            self.reviews.put(key, pod, cache_until)
        if asked is not None and asked != pod.node:
            self._refused("denied", "pod %s/%s on node %s asked for node %r",
                          pod.namespace, pod.name, pod.node, asked[:253])  # fmt: skip
            return "denied", _answer(403, "denied", f"the token's pod runs on node {pod.node}")
        if _gone(request):  # nobody would receive the certificate
            return "gone", _answer(499, "gone", "the client went away")
        try:
            issued = self.issuer.issue_node(csr, pod.validation, pod.node)
        except CsrRefused as exc:
            self.csr_refusals[exc.reason] += 1
            self._refused("bad_csr", "pod %s/%s on node %s: %s (%s)",
                          pod.namespace, pod.name, pod.node, exc, exc.reason.value)  # fmt: skip
            return "bad_csr", _answer(400, "bad_csr", f"{exc} ({exc.reason.value})")
        log.info("issued the MQTT identity %s of pod %s/%s until %s", issued.identity,
                  pod.namespace, pod.name, issued.expires_at.isoformat())  # fmt: skip
        return "issued", web.json_response(
            {**issued.to_json(), "node": pod.node, "validation": pod.validation}
        )
