"""MQTT connection settings shared by the agent and the operator.

One immutable object per process, built once at start from the environment (docs/architecture.md,
"Processes and configuration"):

- ``NETVAL_MQTT_URL``: ``mqtt://host[:port]`` (default port 1883) or ``mqtts://host[:port]``
  (TLS, default port 8883). Required.
- ``NETVAL_MQTT_USERNAME``: optional user name.
- ``NETVAL_MQTT_PASSWORD_FILE``: optional file holding the password (a mounted Secret); read
  once here, one trailing newline stripped. Needs ``NETVAL_MQTT_USERNAME``.
- ``NETVAL_MQTT_CA_FILE``: optional PEM CA bundle that verifies the broker (``mqtts`` only);
  without it the system trust store is used.
- ``NETVAL_MQTT_CERT_FILE`` / ``NETVAL_MQTT_KEY_FILE``: optional client certificate and key
  (PEM, ``mqtts`` only, both or neither) for brokers that authenticate clients by certificate.

- ``NETVAL_MQTT_PROTOCOL``: ``5`` (MQTT 5, the default) or ``3.1.1``, for brokers without
  MQTT 5 (RabbitMQ before 3.13). With 3.1.1 a refused publish has no reason code: the broker
  drops it silently or closes the connection.

A client certificate can also be held in memory (`ClientIdentity`: the agent's enrolled one,
the operator's own, minted by its identity CA), read each time a TLS context is built, so a
renewed one is used at the next connect; it never touches a file system.

Sharded brokers (``mqtt.shards`` > 1, docs/operations.md "Brokers beyond one process"):

- ``NETVAL_MQTT_SHARDS``: how many (1..64; unset or 1: one broker, the URL above).
- ``NETVAL_MQTT_URL_PATTERN``: every shard's URL, ``{shard}`` standing for its index (e.g.
  ``mqtts://netval-mqtt-{shard}.netval-system.svc:8883``). An agent connects to the shard
  of its node (`netval.model.shards.shard_of`, `mqtt_env_for_node`), the operator to all
  (`shard_urls`); credentials and CA are the same for every shard.

TLS is chosen by the scheme, explicitly: ``mqtts://`` verifies the broker's certificate
against the CA and its host name against the URL's host (always: there is no switch to turn
verification off), TLS 1.2 at least, and never falls back to plaintext. ``mqtt://`` is
plaintext and is only ever used when written so (the chart renders it only with
``mqtt.tls.enabled=false``).

An empty variable counts as unset (Kubernetes renders unset optional values as ""). Every
error is a ``ValueError`` that names the variable at fault. Credentials never appear in the
URL and the password never appears in ``repr``.

This module imports neither the agent nor the operator, nor aiomqtt: both sides use it.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import urlsplit

from netval.model.shards import MAX_SHARDS, MIN_SHARDS, shard_of, shard_url

ENV_URL: Final = "NETVAL_MQTT_URL"
ENV_USERNAME: Final = "NETVAL_MQTT_USERNAME"
ENV_PASSWORD_FILE: Final = "NETVAL_MQTT_PASSWORD_FILE"
ENV_CA_FILE: Final = "NETVAL_MQTT_CA_FILE"
ENV_CERT_FILE: Final = "NETVAL_MQTT_CERT_FILE"
ENV_KEY_FILE: Final = "NETVAL_MQTT_KEY_FILE"
ENV_SHARDS: Final = "NETVAL_MQTT_SHARDS"
ENV_URL_PATTERN: Final = "NETVAL_MQTT_URL_PATTERN"
ENV_PROTOCOL: Final = "NETVAL_MQTT_PROTOCOL"
PROTOCOLS: Final = ("5", "3.1.1")

DEFAULT_PORTS: Final[Mapping[str, int]] = {"mqtt": 1883, "mqtts": 8883}

# MQTT client identifiers: the spec guarantees 1..23 chars of [0-9a-zA-Z]; brokers
# (Mosquitto included) accept up to 65535 UTF-8 bytes. Keep a sane bound.
_MAX_CLIENT_ID: Final = 256


class ClientIdentity(Protocol):
    """A client certificate held in memory: its PEM chain and its key's PEM."""

    def pem(self) -> tuple[bytes, bytes]: ...


@dataclass(frozen=True, slots=True)
class PemIdentity:
    """A fixed certificate and key (the agent's, as enrollment issued them)."""

    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)

    def pem(self) -> tuple[bytes, bytes]:
        return self.cert_pem, self.key_pem


def load_identity(context: ssl.SSLContext, identity: ClientIdentity) -> None:
    """Load an in-memory certificate and key into `context` through an anonymous memory
    file (`memfd_create`): Python's ssl module loads key material from paths only, and the
    key must never land on a disk (the agent's root file system is read-only anyway)."""
    cert, key = identity.pem()
    fd = os.memfd_create("netval-mqtt-identity", os.MFD_CLOEXEC)
    try:
        os.write(fd, cert + b"\n" + key)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """Where and how to reach the broker. Immutable; build with `mqtt_settings_from_env`."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None  # client certificate (PEM), with key_file
    key_file: Path | None = None
    # None lets the broker assign one (MQTT v5). Two live connections with the same id
    # kick each other off (session takeover), so a fixed id must be unique per process.
    client_id: str | None = None
    # a client certificate in memory (instead of cert_file/key_file), read at each
    # ssl_context(): per-node identity (netval.model.identity)
    identity: ClientIdentity | None = field(default=None, repr=False, compare=False)
    protocol: str = "5"  # MQTT 5, or "3.1.1" for a broker without it

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("MQTT host must not be empty")
        if not 0 < self.port < 65536:
            raise ValueError(f"MQTT port {self.port} out of range 1..65535")
        if self.password is not None and self.username is None:
            raise ValueError("an MQTT password needs a username")
        if self.ca_file is not None and not self.tls:
            raise ValueError("an MQTT CA file needs TLS (mqtts://)")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("an MQTT client certificate needs its key, and a key its certificate")
        if (self.cert_file is not None or self.identity is not None) and not self.tls:
            raise ValueError("an MQTT client certificate needs TLS (mqtts://)")
        if self.cert_file is not None and self.identity is not None:
            raise ValueError("an MQTT client certificate from files or from memory, not both")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"MQTT protocol {self.protocol!r}: one of {', '.join(PROTOCOLS)}")
        if self.client_id is not None and not 0 < len(self.client_id) <= _MAX_CLIENT_ID:
            raise ValueError(f"MQTT client id must be 1..{_MAX_CLIENT_ID} characters")

    @property
    def url(self) -> str:
        """The broker URL without credentials (safe to log)."""
        scheme = "mqtts" if self.tls else "mqtt"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context verifying the broker (hostname included), or None for mqtt://."""
        if not self.tls:
            return None
        context = _client_context(self.ca_file, self.cert_file, self.key_file)
        if self.identity is not None:
            load_identity(context, self.identity)
        return context

    def with_client_id(self, client_id: str | None) -> MqttSettings:
        """A copy with another client id (e.g. one derived from the node name)."""
        return dataclasses.replace(self, client_id=client_id)


def _client_context(
    ca_file: Path | None, cert_file: Path | None, key_file: Path | None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    # create_default_context already requires a certificate and checks the host name; said
    # here so that no later edit can quietly drop either.
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None and key_file is not None:
        context.load_cert_chain(str(cert_file), str(key_file))
    return context


def parse_mqtt_url(url: str, *, variable: str = ENV_URL) -> tuple[str, int, bool]:
    """``mqtt://host[:port]`` / ``mqtts://host[:port]`` -> (host, port, tls). Pure."""

    def bad(why: str) -> ValueError:
        return ValueError(
            f"{variable}={url!r}: {why}; expected mqtt://host[:port] or mqtts://host[:port]"
        )

    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:  # bad port, unbalanced [ ]
        raise bad(str(exc)) from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise bad(f"unsupported scheme {parts.scheme!r}" if scheme else "no scheme")
    if parts.username is not None or parts.password is not None:
        raise bad(
            f"credentials do not belong in the URL; use {ENV_USERNAME} and {ENV_PASSWORD_FILE}"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise bad("unexpected path, query or fragment")
    host = parts.hostname
    if not host:
        raise bad("no host")
    if port == 0:
        raise bad("port 0")
    return host, port if port is not None else DEFAULT_PORTS[scheme], scheme == "mqtts"


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def read_password_file(path: str, variable: str = ENV_PASSWORD_FILE) -> str:
    """A mounted Secret's password; errors name `variable`, the setting that gave `path`."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{variable}={path!r}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{variable}={path!r}: not UTF-8 text") from None
    # Strip exactly one trailing line ending (echo / editors add one); keep other whitespace,
    # which may be part of the password.
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise ValueError(f"{variable}={path!r}: the file is empty")
    return text


def _check_ca_file(path: str) -> Path:
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:  # (a subclass of OSError: catch it first)
        raise ValueError(f"{ENV_CA_FILE}={path!r}: not a usable PEM CA bundle: {exc}") from None
    except OSError as exc:  # missing or unreadable (FileNotFoundError, PermissionError)
        raise ValueError(f"{ENV_CA_FILE}={path!r}: cannot read: {exc.strerror or exc}") from None
    return Path(path)


def _check_client_cert(cert: str, key: str) -> tuple[Path, Path]:
    try:
        ssl.create_default_context().load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ValueError(
            f"{ENV_CERT_FILE}={cert!r} / {ENV_KEY_FILE}={key!r}: not a usable PEM certificate "
            f"and matching key: {exc.reason or exc}"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"{ENV_CERT_FILE}={cert!r} / {ENV_KEY_FILE}={key!r}: cannot read: {exc.strerror or exc}"
        ) from None
    return Path(cert), Path(key)


def mqtt_settings_from_env(env: Mapping[str, str], *, client_id: str | None = None) -> MqttSettings:
    """Build the settings from ``env`` (pass ``os.environ`` at process start).

    Reads the password file and loads the CA file once, so that a bad mount fails at start
    with a clear message instead of at every reconnect. Raises ValueError naming the variable.
    """
    url = _get(env, ENV_URL)
    if url is None:
        raise ValueError(
            f"{ENV_URL} is not set; expected mqtt://host[:port] or mqtts://host[:port]"
        )
    host, port, tls = parse_mqtt_url(url)

    username = _get(env, ENV_USERNAME)
    password_file = _get(env, ENV_PASSWORD_FILE)
    password = None
    if password_file is not None:
        if username is None:
            raise ValueError(f"{ENV_PASSWORD_FILE} is set but {ENV_USERNAME} is not")
        password = read_password_file(password_file)

    ca_path = _get(env, ENV_CA_FILE)
    ca_file = None
    if ca_path is not None:
        if not tls:
            raise ValueError(f"{ENV_CA_FILE} is set but {ENV_URL}={url!r} is not mqtts://")
        ca_file = _check_ca_file(ca_path)

    cert_path, key_path = _get(env, ENV_CERT_FILE), _get(env, ENV_KEY_FILE)
    cert_file = key_file = None
    if cert_path is not None or key_path is not None:
        if cert_path is None or key_path is None:
            given, missing = (
                (ENV_CERT_FILE, ENV_KEY_FILE) if cert_path else (ENV_KEY_FILE, ENV_CERT_FILE)
            )
            raise ValueError(
                f"{given} is set but {missing} is not (a client certificate needs both)"
            )
        if not tls:
            raise ValueError(f"{ENV_CERT_FILE} is set but {ENV_URL}={url!r} is not mqtts://")
        cert_file, key_file = _check_client_cert(cert_path, key_path)

    protocol = _get(env, ENV_PROTOCOL) or "5"
    if protocol not in PROTOCOLS:
        raise ValueError(f"{ENV_PROTOCOL}={protocol!r}: one of {', '.join(PROTOCOLS)}")
    return MqttSettings(
        host=host,
        port=port,
        tls=tls,
        username=username,
        password=password,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        client_id=client_id,
        protocol=protocol,
    )


def shard_count(env: Mapping[str, str]) -> int:
    """``NETVAL_MQTT_SHARDS`` (1 when unset). Raises ValueError naming the variable."""
    text = _get(env, ENV_SHARDS) or "1"
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"{ENV_SHARDS}={text!r}: not a whole number") from None
    if not MIN_SHARDS <= count <= MAX_SHARDS:
        raise ValueError(f"{ENV_SHARDS}={count}: must be {MIN_SHARDS}..{MAX_SHARDS}")
    return count


def shard_urls(env: Mapping[str, str]) -> list[str]:
    """Every shard's URL, by index; one shard: [``NETVAL_MQTT_URL``]. Each is checked."""
    count = shard_count(env)
    if count == 1:
        url = _get(env, ENV_URL)
        return [url] if url is not None else []
    pattern = _get(env, ENV_URL_PATTERN)
    if pattern is None:
        raise ValueError(f"{ENV_SHARDS}={count} needs {ENV_URL_PATTERN} (with {{shard}})")
    try:
        urls = [shard_url(pattern, i) for i in range(count)]
    except ValueError as exc:
        raise ValueError(f"{ENV_URL_PATTERN}: {exc}") from None
    for url in urls:
        parse_mqtt_url(url, variable=ENV_URL_PATTERN)
    return urls


def mqtt_env_for_node(env: Mapping[str, str], node: str) -> Mapping[str, str]:
    """`env` with ``NETVAL_MQTT_URL`` set to the URL of `node`'s shard (as is with one)."""
    urls = shard_urls(env)
    if len(urls) < 2:
        return env
    return {**env, ENV_URL: urls[shard_of(node, len(urls))]}
