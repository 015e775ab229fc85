"""`netval doctor`'s broker checks: reachable, TLS handshake (mqtts), MQTT login, ACL.

Each check is a function of the settings and what the checks before it left (an open TCP
socket, then maybe a TLS one); a failing check ends the chain and the later ones are skipped
with why. More checks (per-node identities, ACLs) append to `BROKER_CHECKS`.

The login is a bare MQTT 3.1.1 CONNECT/CONNACK over the socket (no client library, no
subscription, nothing published), then DISCONNECT; a client certificate
(`NETVAL_MQTT_CERT_FILE`/`_KEY_FILE`, e.g. a node's) goes with the TLS handshake. The ACL
check then tries, as the same identity, every topic kind of a node nobody owns
(`netval.infra.broker_acl`: publish report, beat, endpoint, loadresult, state; subscribe to
assignment, loadplan): a broker that lets it lets any credential speak for any node. Doctor
has no observer login, so an acknowledged publish counts as taken.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from netval.cli.doctor_result import CheckResult, fail, ok, skip
from netval.infra.broker_acl import AclVerdict, probe_broker_acl
from netval.infra.mqtt_settings import MqttSettings

CONNACK_CODES: Final = {
    1: "unacceptable protocol version",
    2: "client identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}


@dataclass
class BrokerProbe:
    settings: MqttSettings
    timeout: float
    sock: socket.socket | None = None
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


def check_reachable(p: BrokerProbe) -> CheckResult:
    s = p.settings
    where = f"{s.host}:{s.port}"
    try:
        p.sock = socket.create_connection((s.host, s.port), timeout=p.timeout)
    except socket.gaierror as exc:
        return fail(
            "broker.reachable",
            f"cannot resolve {s.host}: {exc.strerror}",
            "run doctor where the broker's name resolves (in the cluster), or pass "
            "--mqtt-url through a port-forward",
        )
    except OSError as exc:
        return fail(
            "broker.reachable",
            f"cannot connect to {where}: {exc.strerror or exc}",
            "is the broker running and its Service/port right? (NETVAL_MQTT_URL)",
        )
    return ok("broker.reachable", f"TCP connect to {where}")


def check_tls(p: BrokerProbe) -> CheckResult:
    s = p.settings
    if not s.tls:
        return skip("broker.tls", "mqtt:// (no TLS): use mqtts:// to encrypt the reports")
    assert p.sock is not None
    context = s.ssl_context()  # the agents' and operator's own: same CA, checks, client cert
    assert context is not None
    try:
        p.sock = context.wrap_socket(p.sock, server_hostname=s.host)
    except ssl.SSLCertVerificationError as exc:
        return fail(
            "broker.tls",
            f"the broker's certificate does not verify: {exc.verify_message}",
            "give the CA that signed it (--mqtt-ca-file / NETVAL_MQTT_CA_FILE) and a "
            f"certificate for {s.host}",
        )
    except (ssl.SSLError, OSError) as exc:
        return fail("broker.tls", f"TLS handshake failed: {exc}", "does the port speak TLS?")
    tls = p.sock
    version = tls.version() if isinstance(tls, ssl.SSLSocket) else "?"
    return ok("broker.tls", f"TLS handshake ({version}), certificate valid for {s.host}")


def _utf8(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("!H", len(raw)) + raw


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def connect_packet(client_id: str, username: str | None, password: str | None) -> bytes:
    flags = 0x02  # clean session
    payload = _utf8(client_id)
    if username is not None:
        flags |= 0x80
        payload += _utf8(username)
        if password is not None:
            flags |= 0x40
            payload += _utf8(password)
    variable = _utf8("MQTT") + bytes([4, flags]) + struct.pack("!H", 30)
    body = variable + payload
    return bytes([0x10]) + _remaining_length(len(body)) + body


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def check_login(p: BrokerProbe) -> CheckResult:
    s = p.settings
    assert p.sock is not None
    who = f"as {s.username!r}" if s.username else "anonymously"
    try:
        p.sock.sendall(connect_packet("netval-doctor", s.username, s.password))
        header = _read_exact(p.sock, 4)
    except (OSError, ConnectionError) as exc:
        return fail("broker.login", f"no CONNACK {who}: {exc}", "is this an MQTT broker?")
    if header[0] != 0x20 or header[1] != 2:
        return fail("broker.login", f"unexpected answer to CONNECT: {header.hex()}",
                    "is this an MQTT 3.1.1/5 broker?")  # fmt: skip
    code = header[3]
    if code:
        why = CONNACK_CODES.get(code, f"refused with code {code}")
        return fail(
            "broker.login",
            f"login {who} refused: {why}",
            "check the user and its password file (--mqtt-username, --mqtt-password-file)",
        )
    with contextlib.suppress(OSError):
        p.sock.sendall(b"\xe0\x00")  # DISCONNECT
    return ok("broker.login", f"MQTT login {who} accepted")


def check_acl(p: BrokerProbe) -> CheckResult:
    s = p.settings
    probe = probe_broker_acl(s.with_client_id("netval-doctor"), s.ssl_context(), timeout=p.timeout)
    verdict = probe.verdict
    if verdict is AclVerdict.UNCHECKED:
        return fail("broker.acl", f"cannot probe the ACL: {probe.error}", "see broker.login")
    if verdict is AclVerdict.VIOLATED:
        return fail(
            "broker.acl",
            f"{probe.identity!r} can {', '.join(probe.violations)} of a node it does not own",
            "the broker does not enforce netval's per-node ACL: any credential can speak for "
            'any node (docs/operations.md "Broker ACL")',
        )
    if verdict is AclVerdict.UNCONFIRMED:
        return fail("broker.acl", "no answer for " + ", ".join(probe.unacknowledged),
                    "is the broker overloaded?")  # fmt: skip
    return ok(
        "broker.acl",
        f"{probe.identity!r} cannot publish for another node nor read its topics "
        f"({len(probe.outcomes)} kinds refused)",
    )


BROKER_CHECKS: Final[tuple[tuple[str, Callable[[BrokerProbe], CheckResult]], ...]] = (
    ("broker.reachable", check_reachable),
    ("broker.tls", check_tls),
    ("broker.login", check_login),
    ("broker.acl", check_acl),
)


def broker_checks(settings: MqttSettings, timeout: float) -> list[CheckResult]:
    probe = BrokerProbe(settings, timeout)
    results: list[CheckResult] = []
    try:
        failed: CheckResult | None = None
        for name, check in BROKER_CHECKS:
            if failed is not None:
                results.append(skip(name, f"needs {failed.name}"))
                continue
            result = check(probe)
            results.append(result)
            failed = result if result.failed else None
    finally:
        probe.close()
    return results
