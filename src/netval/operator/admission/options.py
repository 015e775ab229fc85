"""`netval operator --webhook-*`: the flags parsed into `WebhookOptions` (None: no webhook)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from netval.infra.metrics_server import parse_host_port

WEBHOOK_MEMO_KEY: Final = "webhook"  # memo: WebhookOptions, or absent for no webhook

FailurePolicy = Literal["Fail", "Ignore"]
FAILURE_POLICIES: Final[tuple[FailurePolicy, ...]] = ("Fail", "Ignore")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class ServiceRef:
    namespace: str
    name: str
    port: int = 443


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    host: str  # listening address; also the URL host without a Service
    port: int  # 0: any free port (the configurations carry the one chosen)
    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None  # caBundle for the configurations (default: cert_file)
    service: ServiceRef | None = None
    failure_policy: FailurePolicy = "Fail"
    timeout_seconds: int = 10
    cert_dir: Path | None = None  # where generated certificates go (default: a new temp dir)
    excluded_namespaces: tuple[str, ...] = ("kube-system",)  # plus the operator's namespace


def parse_addr(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:9443` for IPv6, `:9443` for every IPv4 interface) -> (host, port)."""
    addr = parse_host_port(text, variable="--webhook-addr")
    if addr is None:
        raise ValueError(f"--webhook-addr: expected HOST:PORT, e.g. 0.0.0.0:9443, got {text!r}")
    return addr


def parse_service(text: str) -> ServiceRef:
    """`NAMESPACE/NAME[:PORT]` (port of the Service, default 443)."""
    ref, _, port_text = text.strip().partition(":")
    namespace, sep, name = ref.partition("/")
    if not sep or not _DNS_LABEL.match(namespace) or not _DNS_LABEL.match(name):
        raise ValueError(f"--webhook-service: expected NAMESPACE/NAME[:PORT], got {text!r}")
    port = 443
    if port_text:
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"--webhook-service: not a port number: {port_text!r}") from None
        if not 1 <= port <= 65535:
            raise ValueError(f"--webhook-service: port must be 1..65535, got {port}")
    return ServiceRef(namespace, name, port)


def webhook_options(
    addr: str | None,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    ca: Path | None = None,
    service: str | None = None,
    failure_policy: str = "Fail",
    timeout_seconds: int = 10,
) -> WebhookOptions | None:
    """The webhook options from the command line; None without `--webhook-addr`. Raises
    ValueError (one line, naming the flag) on inconsistent flags."""
    if addr is None:
        given = [
            flag
            for flag, value in (
                ("--webhook-cert", cert),
                ("--webhook-key", key),
                ("--webhook-ca", ca),
                ("--webhook-service", service),
            )
            if value is not None
        ]
        if given:
            raise ValueError(f"{given[0]} needs --webhook-addr")
        return None
    if (cert is None) != (key is None):
        raise ValueError("--webhook-cert and --webhook-key go together")
    if ca is not None and cert is None:
        raise ValueError("--webhook-ca needs --webhook-cert and --webhook-key")
    for flag, path in (("--webhook-cert", cert), ("--webhook-key", key), ("--webhook-ca", ca)):
        if path is not None and not path.is_file():
            raise ValueError(f"{flag}: no such file: {path}")
    if failure_policy not in FAILURE_POLICIES:
        raise ValueError(f"--webhook-failure-policy: Fail or Ignore, got {failure_policy!r}")
    if not 1 <= timeout_seconds <= 30:
        raise ValueError(f"--webhook-timeout: 1..30 seconds, got {timeout_seconds}")
    host, port = parse_addr(addr)
    return WebhookOptions(
        host=host,
        port=port,
        cert_file=cert,
        key_file=key,
        ca_file=ca,
        service=parse_service(service) if service is not None else None,
        failure_policy=failure_policy,
        timeout_seconds=timeout_seconds,
    )
