"""The enrollment server picks up a renewed certificate (cert-manager swaps the mounted files)
without a restart: real TLS handshakes against the running server before and after."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mosquitto as broker_kit
import tls_certs
from kube import wait_for
from netval.infra.mqtt_settings import MqttSettings
from netval.operator.identity.authority import IdentityAuthority
from netval.operator.identity.service import IdentityService, IdentitySettings


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _issuer_of_presented_cert(port: int, ca: Path) -> str | None:
    """The presented certificate's issuer CN if it verifies against `ca`, else None."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            cert = tls.getpeercert()
    except ssl.SSLCertVerificationError:
        return None
    issuer = dict(pair[0] for pair in cert["issuer"]) if cert else {}
    return str(issuer.get("commonName"))


@pytest.fixture
def loop() -> Iterator[_Loop]:
    running = _Loop()
    yield running
    running.close()


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path, loop: _Loop) -> None:
    old_ca = tls_certs.make_ca(tmp_path, "old-ca")
    new_ca = tls_certs.make_ca(tmp_path, "new-ca")
    old = tls_certs.issue(old_ca, tmp_path, "enroll-old", ip_addresses=("127.0.0.1",))
    new = tls_certs.issue(new_ca, tmp_path, "enroll-new", ip_addresses=("127.0.0.1",))
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    cert, key = mounted / "tls.crt", mounted / "tls.key"
    shutil.copy(old.cert_file, cert)
    shutil.copy(old.key_file, key)
    settings = IdentitySettings("127.0.0.1", 0, cert, key, cert_reload_every=0.05)
    # no broker: enrollment does not need one
    mqtt = MqttSettings(host="127.0.0.1", port=broker_kit.free_port(), client_id="op")
    authority = IdentityAuthority(old_ca.cert, old_ca.key)
    service = IdentityService(settings, mqtt, reviewer=None, authority=authority)  # type: ignore[arg-type]
    port = loop.run(service.start())
    try:
        assert _issuer_of_presented_cert(port, old_ca.cert_file) == "old-ca"
        assert _issuer_of_presented_cert(port, new_ca.cert_file) is None
        # a half-written pair (the new certificate, the old key) is not taken
        shutil.copy(new.cert_file, cert)
        wait_for(lambda: service.cert_reloader and service.cert_reloader.failures, 10,
                 what="the mismatched pair tried")  # fmt: skip
        assert _issuer_of_presented_cert(port, old_ca.cert_file) == "old-ca"
        shutil.copy(new.key_file, key)
        wait_for(lambda: _issuer_of_presented_cert(port, new_ca.cert_file) == "new-ca", 10,
                 what="the renewed certificate served")  # fmt: skip
        assert _issuer_of_presented_cert(port, old_ca.cert_file) is None
    finally:
        loop.run(service.stop())
