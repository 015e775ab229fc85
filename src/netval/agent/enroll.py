"""The agent's per-node MQTT identity: enroll with the pod's projected ServiceAccount token
and a certificate signing request, connect with the client certificate the operator's
identity CA signs, renew it before it expires.

`NETVAL_ENROLL_URL` (https://.../v1/enroll) turns it on; the token is read from
`NETVAL_ENROLL_TOKEN_FILE` at every enrollment (the kubelet rotates the file) and the server
is verified with `NETVAL_ENROLL_CA_FILE` (hostname included). Each enrollment makes a new
P-256 key in memory (it never touches a disk: the TLS context loads it from an anonymous
memory file, `netval.infra.mqtt_settings.load_identity`) and sends only a CSR for this
pod's identity, `<validation>/<node>` (`netval.model.identity`). The agent enrolls at start,
at 2/3 of the certificate's lifetime, and when the broker refuses the certificate it holds
(a TLS alert: expired, unknown CA; or a CONNACK saying not authorized:
`netval.agent.refusal`). A broker that restarts, a new empty broker pod, DNS, TCP or
timeouts say nothing about the certificate: the brokers keep no state of it, so the agent
just reconnects. A renewal does not end the session: the new certificate is used at the
next connect. A 429 or 503 answer's `Retry-After` is honoured. The answer is a trust
boundary: validated with pydantic and checked against the key and identity asked for.
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
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from netval.agent.refusal import Login
from netval.infra.mqtt_client import backoff_delay
from netval.infra.mqtt_settings import MqttSettings, PemIdentity
from netval.model.identity import node_identity

log = logging.getLogger("netval.agent.enroll")

ENV_ENROLL_URL: Final = "NETVAL_ENROLL_URL"
ENV_ENROLL_TOKEN_FILE: Final = "NETVAL_ENROLL_TOKEN_FILE"
ENV_ENROLL_CA_FILE: Final = "NETVAL_ENROLL_CA_FILE"
DEFAULT_TOKEN_FILE: Final = "/var/run/secrets/netval.io/enroll/token"
RENEW_AT: Final = 2 / 3  # of the lifetime
MAX_ANSWER: Final = 16384  # the certificate and the CA, PEM
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
    username: Annotated[str, Field(min_length=1, max_length=520)]
    certificate: Annotated[str, Field(min_length=64, max_length=8192)]
    expiresAt: AwareDatetime
    node: Annotated[str, Field(min_length=1, max_length=253)]
    validation: Annotated[str, Field(min_length=1, max_length=253)]


@dataclass(frozen=True, slots=True)
class Credential:
    """A client certificate and the key it certifies (in memory only)."""

    identity: str  # <validation>/<node>: the certificate's common name
    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    expires_at: datetime
    issued_at: datetime

    def renew_at(self) -> datetime:
        return self.issued_at + (self.expires_at - self.issued_at) * RENEW_AT

    @property
    def login(self) -> Login:
        return None, None, self.cert_pem

    def apply(self, settings: MqttSettings) -> MqttSettings:
        """The broker knows the agent by its certificate alone (it takes the common name as
        the user name, and the client id from it); no password goes with it."""
        return dataclasses.replace(
            settings,
            username=None,
            password=None,
            cert_file=None,
            key_file=None,
            identity=PemIdentity(self.cert_pem, self.key_pem),
            client_id=self.identity,
        )


@dataclass(frozen=True, slots=True)
class EnrollSettings:
    url: str
    token_file: Path
    ca_file: Path | None
    node: str
    validation: str = ""

    @property
    def identity(self) -> str:
        return node_identity(self.validation, self.node)


def make_csr(identity: str) -> tuple[bytes, bytes]:
    """A new P-256 key (PEM, unencrypted: it lives in this process's memory only) and a CSR
    for `identity`: a common name and nothing else (the CA decides every extension)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def check_certificate(pem: str, key_pem: bytes, identity: str, now: datetime) -> datetime:
    """The certificate's expiry, if it certifies our key for `identity` and is valid now;
    else EnrollError (a confused or hostile server must not hand us another's identity)."""
    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as exc:
        raise EnrollError(200, f"the certificate does not parse: {exc}") from None
    public = cert.public_key()
    if (
        not isinstance(public, ec.EllipticCurvePublicKey)
        or not isinstance(key, ec.EllipticCurvePrivateKey)
        or public.public_numbers() != key.public_key().public_numbers()
    ):
        raise EnrollError(200, "the certificate is not for the key this agent sent")
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [a.value for a in names] != [identity]:
        raise EnrollError(200, f"the certificate names {cert.subject.rfc4514_string()!r}")
    if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        raise EnrollError(200, "the certificate is not valid now (clock skew?)")
    return cert.not_valid_after_utc


def enroll_settings_from_env(
    env: Mapping[str, str], node: str, validation: str = ""
) -> EnrollSettings | None:
    url = env.get(ENV_ENROLL_URL, "").strip()
    if not url:
        return None
    if not url.startswith("https://"):
        raise ValueError(f"{ENV_ENROLL_URL}={url!r}: must be an https:// URL")
    ca = env.get(ENV_ENROLL_CA_FILE, "").strip()
    token = env.get(ENV_ENROLL_TOKEN_FILE, "").strip() or DEFAULT_TOKEN_FILE
    return EnrollSettings(url, Path(token), Path(ca) if ca else None, node, validation)


class Publisher(Protocol):
    settings: MqttSettings

    @property
    def connected(self) -> bool: ...

    def refused(self, login: Login) -> bool: ...


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
        identity = self.settings.identity
        key_pem, csr_pem = make_csr(identity)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(
                    self.settings.url,
                    json={
                        "node": self.settings.node,
                        "reason": reason.value,
                        "csr": csr_pem.decode(),
                    },
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
        if answer.node != self.settings.node or answer.validation != self.settings.validation:
            raise EnrollError(
                status, f"issued for {answer.validation}/{answer.node}, not {identity}"
            )
        now = self.clock()
        expires = check_certificate(answer.certificate, key_pem, identity, now)
        credential = Credential(identity, answer.certificate.encode(), key_pem, expires, now)
        self.credential = credential
        self.refused = False
        self.enrollments += 1
        log.info("enrolled as %s until %s", identity, credential.expires_at.isoformat())
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
        only then: see the module docstring); hand each new credential to the publisher,
        which connects with it the next time it connects."""
        while not stop.is_set():
            credential = self.credential
            due = credential is None or self.clock() >= credential.renew_at()
            self.refused = credential is not None and publisher.refused(credential.login)
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


def enroller_from_env(env: Mapping[str, str], node: str, validation: str) -> Enroller | None:
    settings = enroll_settings_from_env(env, node, validation)
    return Enroller(settings) if settings is not None else None
