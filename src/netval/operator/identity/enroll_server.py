"""The enrollment endpoint: `POST /v1/enroll` over HTTPS, `Authorization: Bearer <the
agent's projected ServiceAccount token>`.

The node the credential is for is the one the API server says the token's pod runs on
(`review.PodTokenReviewer`); a body `{"node": ...}` naming another node is refused (403), so
one node can never obtain or replace another's credential. Answers: 200 `{"username",
"password", "expiresAt", "node"}`; 401 without a bearer token; 403 with the check that
failed; 413 for a body over 4 KiB; 503 when the API server or the broker cannot be asked
(the agent retries). Neither the token nor the password is ever logged.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections import Counter
from typing import Final, Protocol

from aiohttp import web

from netval.operator.identity.credentials import IssuedCredential
from netval.operator.identity.dynsec import DynsecError
from netval.operator.identity.review import AgentPod, EnrollmentDenied, ReviewUnavailable

log = logging.getLogger("netval.operator.identity")

ENROLL_PATH: Final = "/v1/enroll"
MAX_BODY: Final = 4096
MAX_TOKEN: Final = 16384
LOG_EVERY_SECONDS: Final = 10.0  # refusals are counted always, logged at most this often
MIN_REISSUE_SECONDS: Final = 10.0  # per pod: each issue costs the broker O(fleet) work


class Reviewer(Protocol):
    async def review(self, token: str) -> AgentPod: ...


class Issuer(Protocol):
    async def issue(self, node: str, pod: str) -> IssuedCredential: ...


def _answer(status: int, outcome: str, message: str) -> web.Response:
    return web.json_response({"error": outcome, "message": message}, status=status)


class EnrollmentServer:
    def __init__(
        self, reviewer: Reviewer, issuer: Issuer, *, min_reissue: float = MIN_REISSUE_SECONDS
    ) -> None:
        self.reviewer = reviewer
        self.issuer = issuer
        self.min_reissue = min_reissue
        self._issued_at: dict[tuple[str, str], float] = {}  # (namespace, pod) -> monotonic
        self.outcomes: Counter[str] = Counter()  # issued, denied, unauthenticated, ...
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
        if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN:
            return "unauthenticated", _answer(401, "unauthenticated", "a bearer token is needed")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return "bad_request", _answer(413, "bad_request", f"the body is over {MAX_BODY} bytes")
        asked = None
        if raw.strip():
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                return "bad_request", _answer(400, "bad_request", "the body is not JSON")
            if not isinstance(body, dict) or not isinstance(body.get("node", ""), str):
                return "bad_request", _answer(400, "bad_request", 'expected {"node": "<name>"}')
            asked = body.get("node") or None
        try:
            pod = await self.reviewer.review(token)
        except EnrollmentDenied as exc:
            self._refused("denied", "%s", exc)
            return "denied", _answer(403, "denied", str(exc))
        except ReviewUnavailable as exc:
            self._refused("unavailable", "%s", exc)
            return "unavailable", _answer(503, "unavailable", "the API server cannot be asked")
        if asked is not None and asked != pod.node:
            self._refused("denied", "pod %s/%s on node %s asked for node %r",
                          pod.namespace, pod.name, pod.node, asked[:253])  # fmt: skip
            return "denied", _answer(403, "denied", f"the token's pod runs on node {pod.node}")
        key, now = (pod.namespace, pod.name), time.monotonic()
        wait = self.min_reissue - (now - self._issued_at.get(key, float("-inf")))
        if wait > 0:
            # A pod that enrolls in a loop would make the broker rewrite its state again and
            # again; its current credential stays valid meanwhile.
            self._refused("throttled", "pod %s/%s enrolled again within %gs",
                          pod.namespace, pod.name, self.min_reissue)  # fmt: skip
            answer = _answer(429, "throttled", f"enrolled less than {self.min_reissue:g}s ago")
            answer.headers["Retry-After"] = str(max(1, round(wait)))
            return "throttled", answer
        self._issued_at[key] = now
        if len(self._issued_at) > 4 * 4096:
            self._issued_at = {
                k: t for k, t in self._issued_at.items() if now - t < self.min_reissue
            }
        try:
            credential = await self.issuer.issue(pod.node, pod.name)
        except DynsecError as exc:
            self._refused("unavailable", "node %s: %s", pod.node, exc)
            return "unavailable", _answer(503, "unavailable", "the broker cannot be asked")
        log.info("issued the MQTT identity of pod %s/%s on node %s until %s",
                 pod.namespace, pod.name, pod.node, credential.expires_at.isoformat())  # fmt: skip
        return "issued", web.json_response({**credential.to_json(), "node": pod.node})
