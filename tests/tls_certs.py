"""Test certificates made with `cryptography`: a CA and leaf certificates it signs (server or
client), written as PEM files for Mosquitto and netval's clients."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Ca:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_file: Path


@dataclass(frozen=True)
class Leaf:
    cert_file: Path
    key_file: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key_pem(key))
    path.chmod(0o600)


def make_ca(directory: Path, name: str = "netval-test-ca") -> Ca:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file = directory / f"{name}.crt"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Ca(cert, key, cert_file)


def issue(
    ca: Ca,
    directory: Path,
    name: str,
    *,
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    client: bool = False,
    expired: bool = False,
) -> Leaf:
    """A certificate signed by `ca`: CN `name`, the given SANs, server (or client) auth."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = (
        (now - datetime.timedelta(days=2), now - datetime.timedelta(days=1))
        if expired
        else (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    cert_file = directory / f"{name}.crt"
    key_file = directory / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_file)
    return Leaf(cert_file, key_file)
