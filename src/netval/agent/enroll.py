"""The agent's per-node MQTT identity: enroll with the pod's projected ServiceAccount token,
use the credential the operator issues, renew it before it expires.

`NETVAL_ENROLL_URL` (https://.../v1/enroll) turns it on; the token is read from
`NETVAL_ENROLL_TOKEN_FILE` at every enrollment (the kubelet rotates the file) and the server
is verified with `NETVAL_ENROLL_CA_FILE` (hostname included). The agent enrolls at start, at
2/3 of the credential's lifetime, and when the broker refuses the credential it holds (a
CONNACK saying bad user name or password, or not authorized: `netval.agent.refusal`), e.g. a
new broker pod without its dynamic security state. Nothing else makes it enroll again: a
broker that is restarting, DNS, TCP, TLS or timeouts say nothing about the credential, and
a new one would end the session the publisher just restored. Each request says why
(`reason`: start, renew, refused): the server hands a fresh credential back unchanged unless
the broker refused it. A 429 or 503 answer's `Retry-After` is honoured. The answer is a
trust boundary: validated with pydantic; the password never appears in logs or reprs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Final, Protocol

import aiohttp
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from netval.infra.mqtt_client import backoff_delay
from netval.infra.mqtt_settings import MqttSettings

log = logging.getLogger("netval.agent.enroll")

ENV_ENROLL_URL: Final = "NETVAL_ENROLL_URL"
ENV_ENROLL_TOKEN_FILE: Final = "NETVAL_ENROLL_TOKEN_FILE"
ENV_ENROLL_CA_FILE: Final = "NETVAL_ENROLL_CA_FILE"
DEFAULT_TOKEN_FILE: Final = "/var/run/secrets/netval.io/enroll/token"
RENEW_AT: Final = 2 / 3  # of the lifetime
MAX_ANSWER: Final = 8192
MAX_RETRY_AFTER: Final = 300.0  # seconds: a server's Retry-After is honoured up to this


class Reason(StrEnum):
    """Why the agent enrolls (sent as `reason`)."""

    START = "start"  # no credential yet (this process)
    RENEW = "renew"  # 2/3 of the lifetime passed
    REFUSED = "refused"  # the broker refused the credential this agent holds


class EnrollError(Exception):
    """An enrollment that did not give a credential (status 0: no answer)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"enrollment failed: {message}" + (f" (HTTP {status})" if status else ""))
        self.status = status
        self.retry_after = retry_after  # the server's Retry-After (429, 503), seconds


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    username: Annotated[str, Field(min_length=1, max_length=1024)]
    password: Annotated[str, Field(min_length=16, max_length=1024)]
    expiresAt: AwareDatetime
    clientId: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    node: Annotated[str, Field(min_length=1, max_length=253)]


@dataclass(frozen=True, slots=True)
class Credential:
    username: str
    password: str = field(repr=False)
    expires_at: datetime
    issued_at: datetime
    client_id: str | None = None  # the one the broker binds the credential to

    def renew_at(self) -> datetime:
        return self.issued_at + (self.expires_at - self.issued_at) * RENEW_AT

    def apply(self, settings: MqttSettings) -> MqttSettings:
        return dataclasses.replace(
            settings,
            username=self.username,
            password=self.password,
            client_id=self.client_id or settings.client_id,
        )


@dataclass(frozen=True, slots=True)
class EnrollSettings:
    url: str
    token_file: Path
    ca_file: Path | None
    node: str


def enroll_settings_from_env(env: Mapping[str, str], node: str) -> EnrollSettings | None:
    url = env.get(ENV_ENROLL_URL, "").strip()
    if not url:
        return None
    if not url.startswith("https://"):
        raise ValueError(f"{ENV_ENROLL_URL}={url!r}: must be an https:// URL")
    ca = env.get(ENV_ENROLL_CA_FILE, "").strip()
    token = env.get(ENV_ENROLL_TOKEN_FILE, "").strip() or DEFAULT_TOKEN_FILE
    return EnrollSettings(url, Path(token), Path(ca) if ca else None, node)


class Publisher(Protocol):
    settings: MqttSettings

    @property
    def connected(self) -> bool: ...

    def refused(self, username: str | None, password: str | None) -> bool: ...


class Enroller:
    def __init__(
        self,
        settings: EnrollSettings,
        *,
        timeout: float = 10.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.timeout = timeout
        self.backoff = (backoff_base, backoff_cap)
        self.clock = clock
        self._tls = ssl.create_default_context(
            cafile=str(settings.ca_file) if settings.ca_file else None
        )
        self._rng = random.Random()  # noqa: S311 - jitter
        self.credential: Credential | None = None
        self.enrollments = 0
        self.failures = 0
        self.enrolling = False  # a request (or its retries) is under way
        self.refused = False  # the broker refuses the credential held (until a new one)

    def enrolled(self) -> bool:
        """Holds a credential that has not expired and that the broker did not refuse."""
        credential = self.credential
        return credential is not None and not self.refused and self.clock() < credential.expires_at

    async def enroll(self, reason: Reason = Reason.START) -> Credential:
        """One enrollment; raises EnrollError."""
        try:
            token = self.settings.token_file.read_text().strip()
        except OSError as exc:
            raise EnrollError(
                0, f"cannot read {self.settings.token_file}: {exc.strerror}"
            ) from None
        headers = {"Authorization": f"Bearer {token}"}
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(
                    self.settings.url,
                    json={"node": self.settings.node, "reason": reason.value},
                    headers=headers,
                    ssl=self._tls,
                ) as response,  # fmt: skip
            ):
                raw = await response.content.read(MAX_ANSWER + 1)
                status = response.status
                retry_after = retry_after_seconds(response.headers.get("Retry-After"))
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as exc:
            raise EnrollError(0, f"{self.settings.url}: {type(exc).__name__}: {exc}") from None
        if status != 200:
            raise EnrollError(status, _error_message(raw), retry_after)
        if len(raw) > MAX_ANSWER:
            raise EnrollError(status, "the answer is too large")
        try:
            answer = _Answer.model_validate_json(raw)
        except ValidationError as exc:
            raise EnrollError(status, f"unexpected answer ({exc.error_count()} errors)") from None
        if answer.node != self.settings.node:
            raise EnrollError(status, f"issued for node {answer.node!r}, not this one")
        credential = Credential(
            answer.username, answer.password, answer.expiresAt, self.clock(), answer.clientId
        )
        self.credential = credential
        self.refused = False
        self.enrollments += 1
        log.info("enrolled as %s until %s", credential.username, credential.expires_at.isoformat())
        return credential

    async def enroll_until(
        self, stop: asyncio.Event, reason: Reason = Reason.START
    ) -> Credential | None:
        """Enroll, retrying with backoff (the operator may not be up yet, or busy: its
        Retry-After is a floor); None if stopped."""
        failures = 0
        self.enrolling = True
        try:
            while not stop.is_set():
                try:
                    return await self.enroll(reason)
                except EnrollError as exc:
                    failures += 1
                    self.failures += 1
                    level = logging.WARNING if failures == 1 or exc.status == 403 else logging.DEBUG
                    log.log(level, "%s", exc)
                    floor = exc.retry_after or 0.0
                base, cap = self.backoff
                delay = max(floor, backoff_delay(failures, base=base, cap=cap, rng=self._rng))
                if floor:  # spread a fleet told the same Retry-After over another half of it
                    delay += self._rng.uniform(0, floor / 2)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            return None
        finally:
            self.enrolling = False

    async def keep(self, publisher: Publisher, stop: asyncio.Event, *, poll: float = 1.0) -> None:
        """Renew at 2/3 of the lifetime, or when the broker refuses the credential held (and
        only then: see the module docstring); hand each new credential to the publisher
        (the broker disconnects the old session)."""
        while not stop.is_set():
            credential = self.credential
            due = credential is None or self.clock() >= credential.renew_at()
            self.refused = credential is not None and publisher.refused(
                credential.username, credential.password
            )
            if due or self.refused:
                if self.refused:
                    log.warning("the broker refuses the MQTT credential: enrolling again")
                reason = Reason.REFUSED if self.refused else Reason.RENEW
                new = await self.enroll_until(stop, reason)
                if new is None:
                    return
                publisher.settings = new.apply(publisher.settings)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds (delta-seconds only; an HTTP date or garbage: None),
    at most MAX_RETRY_AFTER."""
    text = (value or "").strip()
    if not text.isascii() or not text.isdigit():  # "²".isdigit(), yet int("²") fails
        return None
    return min(float(int(text[:6])), MAX_RETRY_AFTER)


def _error_message(raw: bytes) -> str:
    try:
        doc = json.loads(raw[:MAX_ANSWER])
        message = doc.get("message") if isinstance(doc, dict) else None
    except (ValueError, UnicodeDecodeError):
        message = None
    return str(message)[:300] if message else "refused"


def enroller_from_env(env: Mapping[str, str], node: str) -> Enroller | None:
    settings = enroll_settings_from_env(env, node)
    return Enroller(settings) if settings is not None else None
