"""What an agent's certificate signing request must be before the identity CA signs its key.
Pure: no I/O.

The CSR is untrusted input from the network (only its sender's token was checked): the
operator takes nothing from it but the public key, and refuses, cheapest check first, what
is not exactly the request netval's agent makes (`netval.agent.enroll.make_csr`): one PEM
block of at most `MAX_CSR_BYTES`, an EC key on P-256 or P-384 or an RSA key of 2048 to 4096
bits (public exponent 65537), a valid self-signature (proof that the sender holds the
private key), a subject of exactly one common name, the identity the token's pod is entitled
to (`<validation>/<node>`), and no requested extensions (the CA decides every extension of
the certificate). Each refusal has a reason, counted in
`netval_operator_csr_refusals_total{reason}`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

MAX_CSR_BYTES: Final = 8192  # an RSA-4096 CSR is ~1.7 KiB of PEM, a P-256 one ~0.5 KiB
CURVES: Final = (ec.SECP256R1, ec.SECP384R1)
RSA_BITS: Final = (2048, 4096)  # inclusive bounds: bigger keys only cost the broker handshakes
RSA_EXPONENT: Final = 65537
PEM_BEGIN: Final = b"-----BEGIN CERTIFICATE REQUEST-----"

PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


class CsrReason(StrEnum):
    MISSING = "missing"  # no CSR in the request
    TOO_LARGE = "too_large"
    NOT_PEM = "not_pem"  # not one PEM certificate request that parses
    KEY_TYPE = "key_type"  # neither EC (P-256, P-384) nor RSA
    KEY_SIZE = "key_size"  # RSA outside 2048..4096 bits or another exponent
    BAD_SIGNATURE = "bad_signature"  # the sender does not hold the key it asks for
    WRONG_SUBJECT = "wrong_subject"  # another name than the identity the token proves
    EXTENSIONS = "extensions"  # asks for extensions (SANs, CA, key usages...)


class CsrRefused(ValueError):
    def __init__(self, reason: CsrReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def checked_public_key(pem: bytes | str | None, identity: str) -> PublicKey:
    """The public key of `pem` if it is an acceptable request for `identity`; else
    CsrRefused saying why (the message never quotes more than a bounded part of the input)."""
    if pem is None or pem == "" or pem == b"":
        raise CsrRefused(CsrReason.MISSING, "no certificate signing request (csr)")
    raw = pem.encode() if isinstance(pem, str) else pem
    if len(raw) > MAX_CSR_BYTES:
        raise CsrRefused(CsrReason.TOO_LARGE, f"the CSR is over {MAX_CSR_BYTES} bytes")
    if raw.count(PEM_BEGIN) != 1:
        raise CsrRefused(CsrReason.NOT_PEM, "expected one PEM CERTIFICATE REQUEST block")
    try:
        csr = x509.load_pem_x509_csr(raw)
        key = csr.public_key()
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise CsrRefused(CsrReason.NOT_PEM, f"the CSR does not parse: {str(exc)[:120]}") from None
    _check_key(key)
    try:
        valid = csr.is_signature_valid
    except (ValueError, TypeError, UnsupportedAlgorithm):
        valid = False
    if not valid:
        raise CsrRefused(CsrReason.BAD_SIGNATURE, "the CSR's signature does not verify")
    _check_subject(csr.subject, identity)
    try:
        extensions = list(csr.extensions)
    except (ValueError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType) as exc:
        raise CsrRefused(CsrReason.EXTENSIONS, f"unreadable extensions: {str(exc)[:120]}") from None
    if extensions or list(csr.attributes):
        raise CsrRefused(
            CsrReason.EXTENSIONS, "the CSR asks for extensions or attributes: send none"
        )
    assert isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey)
    return key


def _check_key(key: object) -> None:
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, CURVES):
            raise CsrRefused(CsrReason.KEY_TYPE, f"EC curve {key.curve.name}: use P-256 or P-384")
        return
    if isinstance(key, rsa.RSAPublicKey):
        low, high = RSA_BITS
        if not low <= key.key_size <= high or key.public_numbers().e != RSA_EXPONENT:
            raise CsrRefused(
                CsrReason.KEY_SIZE,
                f"RSA key of {key.key_size} bits: {low} to {high} bits, exponent {RSA_EXPONENT}",
            )
        return
    raise CsrRefused(CsrReason.KEY_TYPE, f"{type(key).__name__}: use an EC (P-256) or RSA key")


def _check_subject(subject: x509.Name, identity: str) -> None:
    attributes = list(subject)
    if (
        len(attributes) != 1
        or attributes[0].oid != NameOID.COMMON_NAME
        or attributes[0].value != identity
    ):
        asked = subject.rfc4514_string()[:200]
        raise CsrRefused(
            CsrReason.WRONG_SUBJECT,
            f"the CSR names {asked!r}; this token may ask for CN={identity}",
        )
