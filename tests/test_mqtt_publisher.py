"""ReportPublisher against a real Mosquitto broker (tests/mosquitto.py), MQTT v5.

Each test runs its own broker on a free loopback port and its own event loop
(``asyncio.run``); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from aiomqtt import ProtocolVersion
from paho.mqtt.subscribeoptions import SubscribeOptions

import mosquitto
from netval.agent.publish import ReportPublisher
from netval.infra.mqtt_settings import MqttSettings, mqtt_settings_from_env
from netval.model import Report, Status
from netval.model.topics import check_topic_level

pytestmark = pytest.mark.timeout(30)

VALIDATION = "fabric-a"
NODE = "gpu-node-1"
PREFIX = f"netval/v1/{VALIDATION}/{NODE}"
WAIT = 5.0


def make_report(generation: int = 1, node: str = NODE) -> Report:
    return Report(
        validation=VALIDATION,
        generation=generation,
        node=node,
        started_at=dt.datetime.now(dt.UTC),
        duration_ms=1.0,
        status=Status.PASS,
        results=[],
    )


def settings_for(broker: mosquitto.MosquittoBroker, **overrides: Any) -> MqttSettings:
    values: dict[str, Any] = {
        "host": broker.host,
        "port": broker.port,
        "username": broker.username,
        "password": broker.password,
    }
    values.update(overrides)
    return MqttSettings(**values)


def fast_publisher(settings: MqttSettings, **kwargs: Any) -> ReportPublisher:
    kwargs = {"backoff_base": 0.05, "backoff_cap": 0.3, "timeout": 3.0, "keepalive": 5} | kwargs
    return ReportPublisher(settings, VALIDATION, NODE, **kwargs)


@asynccontextmanager
async def subscriber(
    broker: mosquitto.MosquittoBroker, *topics: str, **client_kwargs: Any
) -> AsyncIterator[aiomqtt.Client]:
    """A separate client; retainAsPublished keeps the publisher's retain flag on live
    messages, so tests can assert that the publisher set it."""
    kwargs: dict[str, Any] = {
        "username": broker.username,
        "password": broker.password,
        "protocol": ProtocolVersion.V5,
        "timeout": WAIT,
    } | client_kwargs
    client = aiomqtt.Client(broker.host, broker.port, **kwargs)
    async with client:
        for topic in topics:
            # paho: passing qos= together with options= is a ValueError; qos goes in options
            await client.subscribe(topic, options=SubscribeOptions(qos=1, retainAsPublished=True))
        yield client


async def next_message(client: aiomqtt.Client, within: float = WAIT) -> aiomqtt.Message:
    return await asyncio.wait_for(anext(aiter(client.messages)), within)


async def no_message(client: aiomqtt.Client, within: float) -> None:
    """Assert that nothing arrives within ``within`` seconds."""
    try:
        message = await asyncio.wait_for(anext(aiter(client.messages)), within)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected message on {message.topic}: {message.payload!r}")


async def wait_until(pred: Callable[[], bool], what: str, within: float = WAIT) -> None:
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.02)


def parse_report(message: aiomqtt.Message) -> Report:
    assert isinstance(message.payload, bytes)
    return Report.model_validate_json(message.payload)


# ------------------------------------------------------------------------------------


def test_report_and_online_arrive_qos1_retained(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    async def main() -> None:
        async with subscriber(mosquitto_broker, f"{PREFIX}/#") as sub:
            publisher = fast_publisher(settings_for(mosquitto_broker))
            await publisher.start()
            try:
                state = await next_message(sub)
                assert str(state.topic) == f"{PREFIX}/state"
                assert (state.payload, state.qos, state.retain) == (b"online", 1, True)
                assert publisher.connected

                first, second = make_report(1), make_report(2)
                await publisher.publish(first)
                got = await next_message(sub)
                assert str(got.topic) == f"{PREFIX}/report"
                assert (got.qos, got.retain) == (1, True)
                assert parse_report(got) == first
                assert b'"schema":"netval.io/report/v1"' in got.payload

                await publisher.publish(second)
                assert parse_report(await next_message(sub)) == second
                await wait_until(lambda: publisher.published == 2, "published == 2")
                stats = publisher.stats()
                assert (stats.replaced, stats.publish_failures, stats.reconnects) == (0, 0, 0)
            finally:
                await publisher.stop()

    asyncio.run(main())


def test_late_subscriber_gets_retained_report_and_state(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    async def main() -> None:
        report = make_report(7)
        async with fast_publisher(settings_for(mosquitto_broker)) as publisher:
            await publisher.publish(report)
            await wait_until(lambda: publisher.published == 1, "report acknowledged")
            # Subscribe only now: the broker delivers the retained messages on subscribe.
            async with subscriber(mosquitto_broker, f"{PREFIX}/#") as sub:
                got = {str(m.topic): m for m in [await next_message(sub), await next_message(sub)]}
        assert set(got) == {f"{PREFIX}/state", f"{PREFIX}/report"}
        assert all(m.retain for m in got.values())
        assert got[f"{PREFIX}/state"].payload == b"online"
        assert parse_report(got[f"{PREFIX}/report"]) == report

    asyncio.run(main())


def test_wrong_password_keeps_retrying_without_crashing(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    async def main() -> None:
        publisher = fast_publisher(settings_for(mosquitto_broker, password="wrong"))
        await publisher.start()
        try:
            await publisher.publish(make_report(1))
            await publisher.publish(make_report(2))
            await wait_until(lambda: publisher.reconnects >= 3, "3 reconnect attempts")
            assert publisher.running
            assert not publisher.connected
            assert publisher.connect_failures >= 3
            assert publisher.published == 0
            assert publisher.has_pending  # the newest report still waits in the slot
            assert publisher.replaced == 1
        finally:
            started = time.monotonic()
            await publisher.stop()
            assert time.monotonic() - started < 2.0
        assert not publisher.running

    asyncio.run(main())


_KILLED_AGENT = textwrap.dedent(
    """
    import asyncio, datetime as dt, os, sys
    from netval.agent.publish import ReportPublisher
    from netval.model import Report, Status
    from netval.infra.mqtt_settings import mqtt_settings_from_env

    async def main():
        settings = mqtt_settings_from_env(os.environ, client_id="netval-test-killed")
        publisher = ReportPublisher(settings, sys.argv[1], sys.argv[2], keepalive=2)
        await publisher.start()
        await publisher.publish(Report(validation=sys.argv[1], generation=1, node=sys.argv[2],
            started_at=dt.datetime.now(dt.UTC), duration_ms=1.0, status=Status.PASS, results=[]))
        while publisher.published < 1:
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def test_last_will_offline_when_publisher_is_sigkilled(
    mosquitto_broker: mosquitto.MosquittoBroker, tmp_path: Path
) -> None:
    password_file = tmp_path / "mqtt-password"
    password_file.write_text(mosquitto_broker.password + "\n")
    env = os.environ | {
        "NETVAL_MQTT_URL": f"mqtt://{mosquitto_broker.host}:{mosquitto_broker.port}",
        "NETVAL_MQTT_USERNAME": mosquitto_broker.username,
        "NETVAL_MQTT_PASSWORD_FILE": str(password_file),
    }

    async def main() -> None:
        async with subscriber(mosquitto_broker, f"{PREFIX}/state") as sub:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _KILLED_AGENT,
                VALIDATION,
                NODE,
                env=env,
                stdout=asyncio.subprocess.PIPE,
            )
            try:
                assert proc.stdout is not None
                line = await asyncio.wait_for(proc.stdout.readline(), 15)
                assert line == b"ready\n", line
                online = await next_message(sub)
                assert (online.payload, online.retain) == (b"online", True)
            finally:
                proc.send_signal(signal.SIGKILL)
                await asyncio.wait_for(proc.wait(), WAIT)
            # The socket closes with the process: the broker publishes the will at once
            # (keepalive 2 s would bound it to ~3 s otherwise).
            started = time.monotonic()
            offline = await next_message(sub, within=WAIT)
            assert str(offline.topic) == f"{PREFIX}/state"
            assert (offline.payload, offline.qos, offline.retain) == (b"offline", 1, True)
            assert time.monotonic() - started < WAIT
        # The will is retained: a late subscriber sees the node offline, and its last report.
        async with subscriber(mosquitto_broker, f"{PREFIX}/#") as late:
            got = {str(m.topic): m for m in [await next_message(late), await next_message(late)]}
        assert got[f"{PREFIX}/state"].payload == b"offline"
        assert parse_report(got[f"{PREFIX}/report"]).generation == 1

    asyncio.run(main())


def test_clean_stop_publishes_offline(mosquitto_broker: mosquitto.MosquittoBroker) -> None:
    async def main() -> None:
        async with subscriber(mosquitto_broker, f"{PREFIX}/state") as sub:
            publisher = fast_publisher(settings_for(mosquitto_broker))
            await publisher.start()
            assert (await next_message(sub)).payload == b"online"
            await publisher.publish(make_report(3))
            started = time.monotonic()
            await publisher.stop()
            assert time.monotonic() - started < 2.0
            assert not publisher.connected and not publisher.running
            # the pending report went out before offline
            assert publisher.published == 1
            offline = await next_message(sub)
            assert (offline.payload, offline.retain) == (b"offline", True)
            # a clean DISCONNECT discards the will: nothing else follows
            await no_message(sub, within=0.3)
        async with subscriber(mosquitto_broker, f"{PREFIX}/state") as late:
            assert (await next_message(late)).payload == b"offline"

    asyncio.run(main())


def test_broker_restart_sends_only_the_newest_report(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    async def main() -> None:
        publisher = fast_publisher(settings_for(mosquitto_broker), backoff_cap=0.5)
        publisher.publish_retained("endpoint", b'{"address": "10.0.0.1", "port": 7000}')
        await publisher.start()
        try:
            await publisher.publish(make_report(1))
            await wait_until(lambda: publisher.published == 1, "first report")

            mosquitto_broker.stop()
            await wait_until(lambda: not publisher.connected, "disconnect noticed")
            for generation in range(2, 7):
                await publisher.publish(make_report(generation))
            assert publisher.replaced == 4  # 2..5 replaced, only 6 waits: one slot
            assert publisher.published == 1

            # Persistence is off: the restarted broker has no retained messages, so
            # whatever the subscriber sees was sent after the restart.
            mosquitto_broker.start()
            async with subscriber(mosquitto_broker, f"{PREFIX}/report") as sub:
                got = await next_message(sub, within=WAIT)
                assert parse_report(got).generation == 6
                await wait_until(lambda: publisher.published == 2, "newest report acknowledged")
                await no_message(sub, within=0.3)
            assert publisher.connected
            assert publisher.reconnects >= 1
            assert publisher.replaced == 4
            assert not publisher.has_pending

            # state and the endpoint announcement are re-published on reconnect
            async with subscriber(
                mosquitto_broker, f"{PREFIX}/state", f"{PREFIX}/endpoint"
            ) as late:
                got_retained = {
                    str(m.topic): m.payload for m in [await next_message(late) for _ in range(2)]
                }
            assert got_retained == {
                f"{PREFIX}/state": b"online",
                f"{PREFIX}/endpoint": b'{"address": "10.0.0.1", "port": 7000}',
            }
        finally:
            await publisher.stop()

    asyncio.run(main())


def test_subscriptions_deliver_retained_assignment(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    async def main() -> None:
        async with subscriber(mosquitto_broker) as operator:
            await operator.publish(
                f"{PREFIX}/assignment", b'{"domain": "rack-1"}', qos=1, retain=True
            )
        received: list[tuple[str, bytes]] = []

        def on_message(message: aiomqtt.Message) -> None:
            assert isinstance(message.payload, bytes)
            received.append((str(message.topic), message.payload))

        publisher = fast_publisher(
            settings_for(mosquitto_broker),
            subscriptions=[f"{PREFIX}/assignment"],
            on_message=on_message,
        )
        async with publisher:
            await wait_until(lambda: bool(received), "assignment delivered")
        assert received == [(f"{PREFIX}/assignment", b'{"domain": "rack-1"}')]

    asyncio.run(main())


# ---- TLS -------------------------------------------------------------------------------


def _make_tls_files(directory: Path) -> tuple[Path, Path, Path, Path]:
    """A CA, a server certificate for localhost/127.0.0.1 signed by it, and a second,
    unrelated CA. Returns (ca, cert, key, other_ca)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> Any:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def ca_cert(cn: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cert, key

    ca, ca_key = ca_cert("netval test CA")
    other_ca, _ = ca_cert("unrelated CA")
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = (
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "other-ca.pem",
    )
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    paths[2].write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths[3].write_bytes(other_ca.public_bytes(pem))
    return paths


def test_tls_with_ca_file(tmp_path: Path) -> None:
    if not mosquitto.available():
        pytest.skip(mosquitto.MISSING_REASON)
    ca, cert, key, other_ca = _make_tls_files(tmp_path)
    password_file = tmp_path / "password"
    broker = mosquitto.MosquittoBroker(tmp_path, tls=(ca, cert, key))
    password_file.write_text(broker.password + "\n")
    broker.start()

    def env(ca_file: Path) -> dict[str, str]:
        return {
            "NETVAL_MQTT_URL": f"mqtts://localhost:{broker.port}",
            "NETVAL_MQTT_USERNAME": broker.username,
            "NETVAL_MQTT_PASSWORD_FILE": str(password_file),
            "NETVAL_MQTT_CA_FILE": str(ca_file),
        }

    async def main() -> None:
        settings = mqtt_settings_from_env(env(ca))
        assert settings.tls and settings.port == broker.port
        async with (
            subscriber(broker, f"{PREFIX}/report", tls_context=settings.ssl_context()) as sub,
            fast_publisher(settings) as publisher,
        ):
            await publisher.publish(make_report(1))
            assert parse_report(await next_message(sub)).generation == 1

        # a CA that did not sign the broker's certificate: verification fails, retried
        untrusted = fast_publisher(mqtt_settings_from_env(env(other_ca)))
        async with untrusted:
            await wait_until(lambda: untrusted.connect_failures >= 2, "2 TLS failures")
            assert not untrusted.connected and untrusted.running

    try:
        asyncio.run(main())
    finally:
        broker.close()


# ---- names -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "a/b", "a+b", "#", "rack#1", "a\0b", "$SYS", "x" * 254])
def test_bad_topic_names_are_rejected(bad: str) -> None:
    settings = MqttSettings(host="127.0.0.1", port=1883)
    with pytest.raises(ValueError, match="validation name"):
        ReportPublisher(settings, bad, NODE)
    with pytest.raises(ValueError, match="node name"):
        ReportPublisher(settings, VALIDATION, bad)
    publisher = ReportPublisher(settings, VALIDATION, NODE)
    with pytest.raises(ValueError, match="topic suffix"):
        publisher.publish_retained(bad, b"x")


def test_reserved_suffixes_and_foreign_reports_are_rejected() -> None:
    publisher = ReportPublisher(MqttSettings(host="127.0.0.1", port=1883), VALIDATION, NODE)
    for suffix in ("report", "state"):
        with pytest.raises(ValueError, match="reserved"):
            publisher.publish_retained(suffix, b"x")
    with pytest.raises(ValueError, match="other-node"):
        publisher.publish_nowait(make_report(node="other-node"))
    assert check_topic_level("gpu-node-1.example") == "gpu-node-1.example"


def test_a_report_above_the_limit_is_not_sent_and_the_session_stays(
    mosquitto_broker: mosquitto.MosquittoBroker,
) -> None:
    """A report the operator would drop, in a packet the chart's broker refuses (ending the
    session, then again after each reconnect): not sent, counted as a failure; the next
    report that fits goes out on the same session."""
    from netval.model import CheckId
    from netval.model.results import CheckResult
    from netval.model.topics import MAX_REPORT_BYTES

    big = make_report(1).model_copy(update={"results": [
        CheckResult(check=CheckId.LINK_CARRIER, subject=f"eth{i}", status=Status.PASS,
                    message="m" * 1024, observed={}, expected={})
        for i in range(1100)
    ]})  # fmt: skip
    assert len(big.to_json().encode()) > MAX_REPORT_BYTES

    async def main() -> None:
        async with subscriber(mosquitto_broker, f"{PREFIX}/report") as sub:
            publisher = fast_publisher(settings_for(mosquitto_broker))
            await publisher.start()
            try:
                await publisher.publish(big)
                await wait_until(lambda: publisher.stats().publish_failures == 1, "dropped")
                small = make_report(2)
                await publisher.publish(small)
                assert parse_report(await next_message(sub)) == small
                stats = publisher.stats()
                assert (stats.published, stats.reconnects) == (1, 0)
            finally:
                await publisher.stop()

    asyncio.run(main())
