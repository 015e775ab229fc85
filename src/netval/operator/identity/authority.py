"""The identity CA: client certificates for the agents (from their CSRs) and for the
operator's own MQTT sessions.

Every broker that trusts this CA (`require_certificate`, the certificate's common name as the
user name) knows each client by its certificate alone: it keeps no per-client state, so a
new, empty broker pod takes every agent back on its first reconnect (docs/architecture.md
"Broker identity"). Signing is local and cheap (an ECDSA signature, well under a
millisecond), so enrollment no longer waits on the broker at all.

The CA's key is read once at start from files (the chart's Secret, mounted into the operator
pods only). Certificates live `lifetime` (capped at the CA's own expiry) and start 5 minutes
in the past (clock skew between this replica, the broker and the agents).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from netval.model.identity import amqp_identity, node_identity
from netval.operator.identity.csr import PublicKey, checked_public_key

BACKDATE: Final = timedelta(minutes=5)
DEFAULT_LIFETIME: Final = timedelta(hours=24)
RENEW_AT: Final = 2 / 3  # of a certificate's lifetime: when the agents and the operator renew
CaKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class AuthorityError(ValueError):
    """The CA's files are missing, unreadable or not a CA certificate with its key."""


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    identity: str
    cert_pem: bytes
    ca_pem: bytes
    expires_at: datetime
    serial: int

    def to_json(self) -> dict[str, str]:
        return {
            "username": self.identity,
            "certificate": self.cert_pem.decode(),
            "ca": self.ca_pem.decode(),
            "expiresAt": self.expires_at.isoformat().replace("+00:00", "Z"),
        }


def _key_usage(rsa_key: bool) -> x509.KeyUsage:
    """Signing (ECDHE handshakes); an RSA key may also encipher (RSA key exchange)."""
    return x509.KeyUsage(
        digital_signature=True, key_encipherment=rsa_key, content_commitment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class IdentityAuthority:
    def __init__(
        self,
        ca_cert: x509.Certificate,
        ca_key: CaKey,
        *,
        lifetime: timedelta = DEFAULT_LIFETIME,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise AuthorityError("the identity CA's key must be EC or RSA")
        if ca_key.public_key().public_numbers() != ca_cert.public_key().public_numbers():  # type: ignore[union-attr]
            raise AuthorityError("the identity CA's key does not match its certificate")
        try:
            basic = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            basic = None
        if basic is None or not basic.ca:
            raise AuthorityError("the identity CA's certificate is not a CA (basicConstraints)")
        self.ca_cert = ca_cert
        self.ca_key = ca_key
        self.ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
        # the CA's own key identifier when it has one (OpenSSL finds the issuer by it, and
        # Go's, Helm's genCA, is not the RFC 5280 hash cryptography would compute)
        try:
            ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            self._authority_key_id = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ski
            )
        except x509.ExtensionNotFound:
            self._authority_key_id = x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()
            )
        self.lifetime = lifetime
        self.clock = clock
        self.issued = 0
        self._lock = threading.Lock()  # the counter: issue runs in any thread

    @classmethod
    def from_files(cls, cert_file: Path, key_file: Path, **kwargs: object) -> IdentityAuthority:
        try:
            cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
            key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        except OSError as exc:
            raise AuthorityError(f"cannot read the identity CA: {exc.strerror or exc}") from None
        except (ValueError, TypeError) as exc:
            raise AuthorityError(f"the identity CA does not load: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise AuthorityError("the identity CA's key must be EC or RSA")
        return cls(cert, key, **kwargs)  # type: ignore[arg-type]

    @property
    def expires_at(self) -> datetime:
        return self.ca_cert.not_valid_after_utc

    def issue_node(
        self, csr_pem: bytes | str | None, validation: str, node: str
    ) -> IssuedCertificate:
        """A certificate for `validation`'s agent on `node`, for the key of `csr_pem` (which
        must ask for exactly that identity: `csr.checked_public_key`, CsrRefused)."""
        identity = node_identity(validation, node)
        key = checked_public_key(csr_pem, identity)
        return self.issue(key, identity, amqp_identity(validation, node))

    def issue(
        self,
        key: PublicKey,
        identity: str,
        dns_name: str | None = None,
        lifetime: timedelta | None = None,
    ) -> IssuedCertificate:
        now = self.clock()
        not_after = min(now + (lifetime or self.lifetime), self.expires_at)
        serial = x509.random_serial_number()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
            .issuer_name(self.ca_cert.subject)
            .public_key(key)
            .serial_number(serial)
            .not_valid_before(now - BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(isinstance(key, rsa.RSAPublicKey)), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(self._authority_key_id, critical=False)
        )
        if dns_name is not None and len(dns_name) <= 253:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False
            )
        cert = builder.sign(self.ca_key, hashes.SHA256())
        with self._lock:
            self.issued += 1
        return IssuedCertificate(
            identity,
            cert.public_bytes(serialization.Encoding.PEM),
            self.ca_pem,
            not_after.replace(microsecond=0),
            serial,
        )

    def mint(
        self, identity: str, dns_name: str | None = None, lifetime: timedelta | None = None
    ) -> tuple[IssuedCertificate, bytes]:
        """A key of the operator's own (never leaves this process) and its certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        return self.issue(key.public_key(), identity, dns_name, lifetime), _pem_key(key)


@dataclass
class MintedIdentity:
    """The operator's own MQTT client certificate (`netval.infra.mqtt_settings.ClientIdentity`):
    minted by the identity CA in memory and minted again, with a new key, once 2/3 of its
    lifetime have passed, at the next TLS context built (a reconnect). A session open when it
    expires goes on: brokers check a certificate at the handshake."""

    authority: IdentityAuthority
    identity: str
    _current: tuple[IssuedCertificate, bytes, datetime] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def pem(self) -> tuple[bytes, bytes]:
        with self._lock:
            now = self.authority.clock()
            current = self._current
            if current is None or now >= current[2]:
                issued, key = self.authority.mint(self.identity, self.identity)
                renew = now + (issued.expires_at - now) * RENEW_AT
                current = self._current = (issued, key, renew)
            return current[0].cert_pem, current[1]
