"""Cheap checks of an enrollment token before the API server is asked. Pure: no I/O.

The payload of the JWT is decoded WITHOUT verifying its signature, only to turn away what
can never pass (not a JWT, another audience, expired, not valid yet) before a TokenReview
costs the API server anything; a token that passes still needs the TokenReview, which stays
the authority. The expiry read here also bounds how long a positive review is reused
(`cache_until`): never past `exp`, nor past `kubernetes.io.warnafter` (an API server that
extends token lifetimes for old clients puts a year in `exp` and the real expiry there),
nor past `MAX_CACHE_SECONDS`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Final

from netval.operator.identity.review import AUDIENCE

MAX_TOKEN: Final = 16384  # characters; projected tokens are about 1 KiB
LEEWAY_SECONDS: Final = 30.0  # clock skew between this replica and the API server
MAX_CACHE_SECONDS: Final = 3600.0  # the DaemonSet's projected tokens live 1 h
_SEGMENT: Final = re.compile(r"[A-Za-z0-9_-]+")


class TokenRejected(Exception):
    """The token cannot pass a TokenReview: 401 (not a usable token) or 403 (a token, but
    not for this, or not now). The message names the check, never the token."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class TokenClaims:
    expires_at: float  # epoch seconds
    cache_until: float  # epoch seconds: a positive review of this token may be reused until


def _segment(text: str, what: str) -> Any:
    if not _SEGMENT.fullmatch(text):
        raise TokenRejected(401, f"the bearer token is not a JWT (its {what} is not base64url)")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return json.loads(raw, parse_constant=_no_constant)
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        raise TokenRejected(
            401, f"the bearer token is not a JWT (its {what} is not JSON)"
        ) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _number(value: Any) -> float | None:
    """A finite JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value) if isinstance(value, float) or abs(value) < 2**63 else math.inf
    return number if math.isfinite(number) else None


def check_token(
    token: str, *, now: float, audience: str = AUDIENCE, max_cache: float = MAX_CACHE_SECONDS
) -> TokenClaims:
    """What the token claims, if it can pass a TokenReview at `now` (epoch seconds);
    raises TokenRejected."""
    if len(token) > MAX_TOKEN:
        raise TokenRejected(401, f"the bearer token is over {MAX_TOKEN} characters")
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        raise TokenRejected(401, "the bearer token is not a JWT (three parts)")
    header, payload = _segment(parts[0], "header"), _segment(parts[1], "payload")
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise TokenRejected(401, "the bearer token is not a JWT (header and payload objects)")
    alg = header.get("alg")
    if not isinstance(alg, str) or not alg or alg.lower() == "none":
        raise TokenRejected(401, "the bearer token is not a signed JWT")
    aud = payload.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if audience not in audiences:
        raise TokenRejected(403, f"the token is not for audience {audience}")
    exp = _number(payload.get("exp"))
    if exp is None:
        raise TokenRejected(403, "the token has no usable expiry (use a projected token)")
    if exp <= now - LEEWAY_SECONDS:
        raise TokenRejected(403, "the token has expired")
    if "nbf" in payload:
        nbf = _number(payload["nbf"])
        if nbf is None or nbf > now + LEEWAY_SECONDS:
            raise TokenRejected(403, "the token is not valid yet")
    until = min(exp, now + max_cache)
    kube = payload.get("kubernetes.io")
    warn = _number(kube.get("warnafter")) if isinstance(kube, dict) else None
    if warn is not None:
        until = min(until, warn)
    return TokenClaims(expires_at=exp, cache_until=until)
