"""Secrets out of anything netval shows: results, logs, Events, status.

Storage paths may be presigned (`?X-Amz-Credential=...&X-Amz-Signature=...`), URLs may carry
userinfo (`https://user:pw@host/`), and error text may quote a `password=` or a bearer token.
`redact_url` rewrites a URL or a request target and `redact` free text, keeping only what
helps a reader find the configuration at fault: the path, the host and the names of the query
parameters (`/bucket/obj?X-Amz-Credential=…&X-Amz-Signature=…`).

It is the one redaction every rendering of a URL, path or message goes through: every
`CheckResult.message` (built by an agent or parsed by the operator from a report), storage
messages and progress steps, and every log line (`netval.infra.log_redaction`). Pure, total:
any string in, a string out, never an exception.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "MASK",
    "redact",
    "redact_message",
    "redact_url",
]

MASK: Final = "…"

# A query string in free text: "?" up to whitespace, a double quote or an angle bracket (JSON
# strings, HTML). Not at a single quote or a bracket: both are legal unencoded in a query, so
# stopping there would show the rest of a value.
_QUERY: Final = re.compile(r"\?([^\s\"<>]+)")
# A parameter name worth showing: what S3, GCS and Azure SAS use; anything else is masked too.
_PARAM_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")
# Userinfo: everything before an "@" inside a URL authority or a bare "user:pw@host".
_USERINFO: Final = re.compile(r"(?P<lead>//|^|(?<=[\s'\"(=,]))[^\s'\"/@?#()]+@(?=[^\s@])")
# key=value, or "key": value (JSON, reprs), where the key names a secret; and HTTP bearer /
# basic credentials. Keys naming where a secret is (`..._FILE`, a Secret's name) stay.
_SECRET_FIELD: Final = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<key>[A-Za-z0-9_.-]+)(?P<sep>\s*=\s*|['\"]\s*:\s*)"
    r"(?P<value>\"[^\"]*\"?|'[^']*'?|[^\s&,;'\"]+)"
)
_SECRET_KEY: Final = re.compile(
    r"password|passwd|secret|token|signature|credential|api[_-]?key", re.IGNORECASE
)
_KEPT_KEY: Final = re.compile(r"(?:file|path|dir|name|secret)$", re.IGNORECASE)
_AUTH_SCHEME: Final = re.compile(r"\b(?P<scheme>Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE)


def _names_only(query: str) -> str:
    shown: list[str] = []
    for part in re.split(r"[&;]", query):
        name, sep, _value = part.partition("=")
        if sep and _PARAM_NAME.fullmatch(name):
            shown.append(f"{name}={MASK}")
        elif part:
            shown.append(MASK)
    return "?" + ("&".join(shown) if shown else MASK)


def _query_names(match: re.Match[str]) -> str:
    return _names_only(match.group(1))


def redact_url(url: str) -> str:
    """A URL or request target as shown: userinfo masked, and everything after the first "?"
    (fragment included) reduced to the query's parameter names."""
    base, sep, query = url.partition("?")
    if "#" in base and not sep:
        base = base.partition("#")[0] + "#" + MASK
    scheme, slashes, rest = base.partition("//")
    if slashes and "@" in rest.partition("/")[0]:
        base = f"{scheme}//{MASK}@{rest.partition('@')[2]}"
    return base + (_names_only(query.partition("#")[0]) if sep else "")


def _secret_field(match: re.Match[str]) -> str:
    key, sep, value = match.group("key", "sep", "value")
    if not _SECRET_KEY.search(key) or _KEPT_KEY.search(key):
        return match.group(0)
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{key}{sep}{quote}{MASK}{quote}"


def redact(text: str) -> str:
    """`text` with query values, userinfo, secret-named fields and bearer tokens masked."""
    # The cheap membership tests keep the common message (no URL, no secret) at ~1 us: every
    # result of every report passes here.
    if "?" in text:
        text = _QUERY.sub(_query_names, text)
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m.group('lead')}{MASK}@", text)
    if "=" in text or '":' in text or "':" in text or '" :' in text or "' :" in text:
        text = _SECRET_FIELD.sub(_secret_field, text)
    if "earer" in text or "asic" in text or "EARER" in text or "ASIC" in text:
        text = _AUTH_SCHEME.sub(lambda m: f"{m.group('scheme')} {MASK}", text)
    return text


def redact_message(text: str, max_length: int) -> str:
    """`redact`, then clipped to `max_length` (a mask may be longer than an empty value)."""
    text = redact(text)
    return text if len(text) <= max_length else text[: max_length - 3] + "..."
