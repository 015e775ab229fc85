"""The enrollment endpoint: `POST /v1/enroll` over HTTPS, `Authorization: Bearer <the
agent's projected ServiceAccount token>`, body `{"node": ..., "reason": "start" | "renew" |
"refused"}` (both optional).

The node the credential is for is the one the API server says the token's pod runs on
(`review.PodTokenReviewer`); a body naming another node is refused (403), so one node can
never obtain or replace another's credential. In order, cheapest first:

1. 401 without a bearer token; 401/403 for a token that can never pass a TokenReview
   (`token_check`: not a JWT, another audience, expired); 400/413 for a bad body.
2. 503 + Retry-After while the broker's admin connection is down: no TokenReview is spent
   on a request that cannot be issued.
3. A bounded queue: `max_active` requests reviewed and issued at once, `max_waiting` more
   waiting; past that 429 + Retry-After (a mass enrollment drains at the broker's pace
   instead of piling up connections and retries).
4. The TokenReview (and Pod read), or its cached positive answer (`intake.ReviewCache`).
5. Issuance, idempotent per pod: a request that arrives while the same pod's issuance is in
   flight gets that credential; a `start` enrollment within the freshness window gets the
   credential this replica issued last (`intake.FreshCredentials`: a retried request or a
   restarted container must not rotate a credential that works); `renew` and `refused`
   get a new password, at most once per `min_reissue` seconds per pod (429 + Retry-After).
   A request whose client went away is not issued.

Answers: 200 `{"username", "password", "clientId", "expiresAt", "node"}`. Neither the
token nor the password is ever logged.
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

from netval.operator.identity.credentials import IssuedCredential
from netval.operator.identity.dynsec import DynsecError
from netval.operator.identity.intake import (
    MAX_FRESH,
    MAX_REVIEWS,
    FreshCredentials,
    PodKey,
    ReviewCache,
    token_key,
)
from netval.operator.identity.review import AgentPod, EnrollmentDenied, ReviewUnavailable
from netval.operator.identity.token_check import TokenRejected, check_token

log = logging.getLogger("netval.operator.identity")

ENROLL_PATH: Final = "/v1/enroll"
MAX_BODY: Final = 4096
LOG_EVERY_SECONDS: Final = 10.0  # refusals are counted always, logged at most this often
MIN_REISSUE_SECONDS: Final = 10.0  # per pod: each issue costs the broker O(fleet) work
FRESH_SECONDS: Final = 600.0  # a `start` enrollment this soon gets the same credential back
MAX_ACTIVE: Final = 16  # reviews + issues at once (the broker plugin works one at a time)
MAX_WAITING: Final = 256  # queued behind them; more get 429
RETRY_UNAVAILABLE: Final = 5  # seconds: Retry-After while the broker cannot be asked
# enrollments/s before any was answered: the bundled broker's pace at 500-1,000 nodes
# (bench/enrollment.py, bench/enrollment_storm.py); measured from the answers after that
ASSUMED_RATE: Final = 50.0
REASONS: Final = ("start", "renew", "refused")


class Reviewer(Protocol):
    async def review(self, token: str) -> AgentPod: ...


class Issuer(Protocol):
    async def issue(self, node: str, pod: str) -> IssuedCredential: ...


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
        min_reissue: float = MIN_REISSUE_SECONDS,
        fresh: float = FRESH_SECONDS,
        max_active: int = MAX_ACTIVE,
        max_waiting: int = MAX_WAITING,
        broker_ready: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reviewer = reviewer
        self.issuer = issuer
        self.min_reissue = min_reissue
        self.fresh_seconds = fresh
        self.max_active = max_active
        self.max_waiting = max_waiting
        self.broker_ready = broker_ready
        self.clock = clock
        self.reviews = ReviewCache(MAX_REVIEWS)
        self.fresh = FreshCredentials(MAX_FRESH)
        self._issued_at: dict[PodKey, float] = {}  # monotonic, for min_reissue
        self._inflight: dict[PodKey, asyncio.Task[IssuedCredential]] = {}
        self._slots = asyncio.Semaphore(max_active)
        self.queued = 0  # requests admitted (waiting or working)
        self._answered: deque[float] = deque(maxlen=64)  # monotonic, admitted requests done
        self.outcomes: Counter[str] = Counter()  # issued, reused, denied, busy, ...
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
        """A revoked node's pods enroll again only through a new TokenReview."""
        self.reviews.forget_node(node)
        self.fresh.forget_node(node)

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
        asked, reason = None, "start"
        if raw.strip():
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError, RecursionError):
                return "bad_request", _answer(400, "bad_request", "the body is not JSON")
            if (
                not isinstance(body, dict)
                or not isinstance(body.get("node", ""), str)
                or body.get("reason", "start") not in REASONS
            ):
                return "bad_request", _answer(
                    400,
                    "bad_request",
                    'expected {"node": "<name>", "reason": "start|renew|refused"}',
                )
            asked, reason = body.get("node") or None, body.get("reason", "start")
        if not self.broker_ready():
            self._refused("unavailable", "the broker's admin connection is down")
            return "unavailable", _answer(
                503, "unavailable", "the broker cannot be asked", RETRY_UNAVAILABLE
            )
        if self.queued >= self.max_active + self.max_waiting:
            self._refused("busy", "%d enrollments queued", self.queued)
            return "busy", _answer(429, "busy", "too many enrollments at once", self._busy_for())
        self.queued += 1
        try:
            async with self._slots:
                if _gone(request):
                    return "gone", _answer(499, "gone", "the client went away")
                return await self._admitted(request, token, claims.cache_until, asked, reason)
        finally:
            self.queued -= 1
            self._answered.append(time.monotonic())

    def _busy_for(self) -> int:
        """Seconds until the queue ahead has drained at the pace of the last answers (the
        broker's: it slows as the fleet grows, bench/enrollment.py), 1 to 60; the agents
        add jitter."""
        done = self._answered
        span = done[-1] - done[0] if len(done) >= 2 else 0.0
        rate = (len(done) - 1) / span if span > 0 else ASSUMED_RATE
        return max(1, min(60, math.ceil(self.queued / rate)))

    async def _admitted(
        self, request: web.Request, token: str, cache_until: float, asked: str | None, reason: str
    ) -> tuple[str, web.Response]:
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
        return await self._issue(request, pod, reason)

    async def _issue(
        self, request: web.Request, pod: AgentPod, reason: str
    ) -> tuple[str, web.Response]:
        key: PodKey = (pod.namespace, pod.name, pod.uid)
        running = self._inflight.get(key)
        outcome = "reused"
        if running is None and reason == "start":
            fresh = self.fresh.get(key, time.monotonic())
            if fresh is not None:
                return outcome, self._issued(fresh[1], pod)
        if running is None:
            now = time.monotonic()
            wait = self.min_reissue - (now - self._issued_at.get(key, float("-inf")))
            if wait > 0:
                # A pod that enrolls in a loop would make the broker rewrite its state again
                # and again; its current credential stays valid meanwhile.
                self._refused("throttled", "pod %s/%s enrolled again within %gs",
                              pod.namespace, pod.name, self.min_reissue)  # fmt: skip
                return "throttled", _answer(
                    429, "throttled", f"enrolled less than {self.min_reissue:g}s ago", round(wait)
                )
            if _gone(request):  # after the review: nobody would receive the password
                return "gone", _answer(499, "gone", "the client went away")
            self._issued_at[key] = now
            if len(self._issued_at) > 4 * 4096:
                self._issued_at = {
                    k: t for k, t in self._issued_at.items() if now - t < self.min_reissue
                }
            running = asyncio.create_task(self._issue_once(key, pod))
            self._inflight[key] = running
            outcome = "issued"
        try:
            # Shielded: a handler cancelled mid-issue still leaves the credential in
            # `fresh`, where the retry finds it.
            credential = await asyncio.shield(running)
        except DynsecError as exc:
            self._refused("unavailable", "node %s: %s", pod.node, exc)
            return "unavailable", _answer(
                503, "unavailable", "the broker cannot be asked", RETRY_UNAVAILABLE
            )
        if outcome == "issued":
            log.info("issued the MQTT identity of pod %s/%s on node %s until %s",
                     pod.namespace, pod.name, pod.node, credential.expires_at.isoformat())  # fmt: skip
        return outcome, self._issued(credential, pod)

    async def _issue_once(self, key: PodKey, pod: AgentPod) -> IssuedCredential:
        try:
            credential = await self.issuer.issue(pod.node, pod.name)
        finally:
            self._inflight.pop(key, None)
        # Never handed back once a third of its life is gone: renewal comes at two thirds.
        lifetime = (credential.expires_at.timestamp() - self.clock()) / 3
        self.fresh.put(
            key, (pod.node, credential), time.monotonic() + min(self.fresh_seconds, lifetime)
        )
        return credential

    @staticmethod
    def _issued(credential: IssuedCredential, pod: AgentPod) -> web.Response:
        return web.json_response({**credential.to_json(), "node": pod.node})
