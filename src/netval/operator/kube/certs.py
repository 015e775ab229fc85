"""Self-signed CA and server certificate for the admission webhook, made with `cryptography`.

Kopf can generate a certificate itself, but through certbuilder/oscrypto, which fail with the
OpenSSL of our images ("Error detecting the version of libcrypto"). Here a throwaway CA signs a
server certificate whose SANs cover every name the API server may use: the listening host,
the Service's DNS names (`NAME.NAMESPACE.svc` and `.svc.cluster.local`) and the loopback
names. The CA's private key is never written: nothing but this run can sign with it, and a
restart makes a new CA (the webhook configurations are rewritten with its bundle).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE: Final = "ca.crt"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
LOOPBACK_SANS: Final = ("localhost", "127.0.0.1", "::1")
DEFAULT_DAYS: Final = 365


@dataclass(frozen=True, slots=True)
class CertFiles:
    ca: Path  # the CA bundle clients (the API server) verify the server with
    cert: Path
    key: Path


def service_dns_names(namespace: str, name: str) -> list[str]:
    """The names the API server uses for a webhook Service (and short forms)."""
    return [
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.cluster.local",
        f"{name}.{namespace}",
        name,
    ]


def server_sans(host: str | None, extra: Iterable[str] = ()) -> list[str]:
    """SANs for the webhook's certificate: the host it is reached at (unless it is a
    catch-all listening address), `extra` names, then the loopback names; no duplicates."""
    names: list[str] = []
    if host and not _is_unspecified(host):
        names.append(host)
    names += [*extra, *LOOPBACK_SANS]
    return list(dict.fromkeys(n for n in names if n))


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signatures only; a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def generate_self_signed(
    directory: Path,
    sans: Sequence[str],
    *,
    days: int = DEFAULT_DAYS,
    now: dt.datetime | None = None,
) -> CertFiles:
    """Write `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `directory` (made 0700 if
    absent) and return their paths. The server certificate is valid for every name in
    `sans` (IP addresses as IP SANs, everything else as DNS SANs)."""
    if not sans:
        raise ValueError("a certificate needs at least one subject alternative name")
    now = now or dt.datetime.now(dt.UTC)
    not_before = now - dt.timedelta(minutes=5)  # tolerate small clock skew
    not_after = now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "netval webhook CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sans[0][:64])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in sans]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = CertFiles(ca=directory / CA_FILE, cert=directory / CERT_FILE, key=directory / KEY_FILE)
    _write(files.key, key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ), mode=0o600)  # fmt: skip
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    _write(files.ca, ca_cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return files


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _write(path: Path, data: bytes, *, mode: int) -> None:
    """Replace `path` atomically, created with `mode` (a key is never world-readable, not even
    for a moment). Kopf's server notices the new files and reloads them."""
    tmp = path.with_name(f".{path.name}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
