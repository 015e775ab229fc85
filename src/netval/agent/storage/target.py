"""What a storage endpoint names, checked: host, port, TLS, request target (untrusted input).

Host names and paths come from users: they are validated and never reach a shell; paths are
percent-encoded so they cannot inject header lines. A path may be presigned (its query holds a
signature): messages show `Target.shown`, never `request_target`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from netval.model.redaction import redact, redact_url
from netval.model.spec import StorageEndpoint, StorageProtocol

__all__ = [
    "DEFAULT_PORTS",
    "HTTP_PROTOCOLS",
    "TLS_PORT",
    "Target",
    "http_request_target",
    "target_of",
    "validate_host",
]

DEFAULT_PORTS: Final[Mapping[StorageProtocol, int | None]] = {
    StorageProtocol.TCP: None,
    StorageProtocol.CEPH: 3300,
    StorageProtocol.NFS: 2049,
    StorageProtocol.S3: 80,
    StorageProtocol.HTTP: 80,
}
TLS_PORT: Final = 443
HTTP_PROTOCOLS: Final = frozenset({StorageProtocol.S3, StorageProtocol.HTTP})

_HOST_CHARS: Final = re.compile(r"^[A-Za-z0-9._:%\[\]-]+$")
_HOST_NAME: Final = re.compile(
    r"^(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$"
)
# RFC 3986 pchar plus "/" and "?", and "%" so an already-encoded path (a presigned S3 URL's
# query) passes unchanged; everything else, notably CR/LF and spaces, gets percent-encoded.
_PATH_SAFE: Final = "/?%:@!$&'()*+,;=-._~"


def validate_host(host: str) -> str:
    """The host to connect to (IPv6 without brackets); ValueError says what is wrong."""
    if not _HOST_CHARS.fullmatch(host):
        raise ValueError(
            f"invalid host {redact(repr(host))}: only a DNS name or an IP address is allowed"
        )
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if bare is not host or not _HOST_NAME.fullmatch(host):
            raise ValueError(
                f"invalid host {redact(repr(host))}: only a DNS name or an IP address is allowed"
            ) from None
    return bare


def http_request_target(path: str | None) -> str:
    """The origin-form request target for `path`; ValueError unless it starts with "/"."""
    if path is None:
        return "/"
    if not path.startswith("/"):
        raise ValueError(f"path must start with '/', got {redact_url(path)!r}")
    return quote(path, safe=_PATH_SAFE)


@dataclass(frozen=True, slots=True)
class Target:
    protocol: StorageProtocol
    host: str
    port: int
    tls: bool
    request_target: str
    has_path: bool

    @property
    def shown(self) -> str:
        """The request target as messages show it: query values masked."""
        return redact_url(self.request_target)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = TLS_PORT if self.tls else 80
        return host if self.port == default else f"{host}:{self.port}"


def target_of(endpoint: StorageEndpoint) -> Target:
    host = validate_host(endpoint.host)
    port = endpoint.port if endpoint.port is not None else DEFAULT_PORTS[endpoint.protocol]
    if port is None:
        raise ValueError(f"{endpoint.protocol.value} endpoint needs a port (no default exists)")
    return Target(
        protocol=endpoint.protocol,
        host=host,
        port=port,
        tls=endpoint.protocol in HTTP_PROTOCOLS and port == TLS_PORT,
        request_target=http_request_target(endpoint.path),
        has_path=endpoint.path is not None,
    )
