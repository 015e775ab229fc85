"""TLS between netval and the broker, against a real Mosquitto with TLS listeners.

Agent and operator verify the broker's certificate and its host name: a certificate for
another name, from another CA or expired is refused with a message that says which; an
`mqtts://` URL never talks plaintext; a client certificate is presented when configured.
The agent is the real `netval agent` process; the operator's side is its ingest component.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

import mosquitto
from kube import wait_for
from netns import netval_script
from netval.infra.mqtt_client import make_client
from netval.infra.mqtt_settings import MqttSettings, mqtt_settings_from_env
from netval.operator.ingest.subscriber import ReportIngest
from test_agent import LO_CHECKS, agent_config, stop_process, tail, write_agent_files
from tls_certs import Ca, issue, make_ca

pytestmark = pytest.mark.skipif(not mosquitto.available(), reason=mosquitto.MISSING_REASON)


@pytest.fixture
def ca(tmp_path: Path) -> Ca:
    return make_ca(tmp_path)


def tls_broker(
    workdir: Path, ca: Ca, *, dns: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = (),
    expired: bool = False, extra: tuple[str, ...] = (),
) -> mosquitto.MosquittoBroker:  # fmt: skip
    workdir.mkdir(exist_ok=True)
    leaf = issue(ca, workdir, "broker", dns_names=dns, ip_addresses=ips, expired=expired)
    broker = mosquitto.MosquittoBroker(workdir, tls=(ca.cert_file, leaf.cert_file, leaf.key_file))
    if extra:
        broker.config.write_text(broker.config.read_text() + "\n".join(extra) + "\n")
    broker.start()
    return broker


@pytest.fixture
def good_broker(tmp_path: Path, ca: Ca) -> Iterator[mosquitto.MosquittoBroker]:
    broker = tls_broker(tmp_path / "good", ca, dns=("localhost",), ips=("127.0.0.1",))
    yield broker
    broker.close()


def settings(
    broker: mosquitto.MosquittoBroker, *, host: str = "localhost", tls: bool = True,
    ca_file: Path | None = None, **extra: Path,
) -> MqttSettings:  # fmt: skip
    return MqttSettings(
        host=host,
        port=broker.port,
        tls=tls,
        username=broker.username,
        password=broker.password,
        ca_file=ca_file,
        client_id="netval-tls-test",
        **extra,  # type: ignore[arg-type]
    )


async def _round_trip(s: MqttSettings) -> bytes:
    async with make_client(s, keepalive=10, timeout=5, tls_context=s.ssl_context()) as client:
        await client.subscribe("netval/v1/tls/node/report", qos=1)
        await client.publish("netval/v1/tls/node/report", b"hello", qos=1)
        async for message in client.messages:
            return bytes(message.payload)  # type: ignore[arg-type]
    raise AssertionError("no message")


def connect_error(s: MqttSettings) -> str:
    with pytest.raises(aiomqtt.MqttError) as err:
        asyncio.run(_round_trip(s))
    return str(err.value)


def test_verified_tls_round_trip(good_broker: mosquitto.MosquittoBroker, ca: Ca) -> None:
    assert asyncio.run(_round_trip(settings(good_broker, ca_file=ca.cert_file))) == b"hello"
    # by IP too, when the certificate names the IP
    s = settings(good_broker, host="127.0.0.1", ca_file=ca.cert_file)
    assert asyncio.run(_round_trip(s)) == b"hello"


def test_a_certificate_for_another_name_is_refused(tmp_path: Path, ca: Ca) -> None:
    broker = tls_broker(tmp_path / "other", ca, dns=("broker.elsewhere.example",))
    try:
        message = connect_error(settings(broker, ca_file=ca.cert_file))
    finally:
        broker.close()
    assert "TLS to mqtts://localhost:" in message
    assert "not valid for 'localhost'" in message and "host names are always verified" in message


def test_a_certificate_from_another_ca_is_refused(
    tmp_path: Path, good_broker: mosquitto.MosquittoBroker
) -> None:
    other = make_ca(tmp_path, "other-ca")
    message = connect_error(settings(good_broker, ca_file=other.cert_file))
    assert f"not signed by a CA in NETVAL_MQTT_CA_FILE={other.cert_file}" in message
    # and the system trust store does not know the test CA either
    assert "not signed by a CA in the system trust store" in connect_error(settings(good_broker))


def test_an_expired_certificate_is_refused(tmp_path: Path, ca: Ca) -> None:
    broker = tls_broker(tmp_path / "expired", ca, expired=True)
    try:
        message = connect_error(settings(broker, ca_file=ca.cert_file))
    finally:
        broker.close()
    assert "certificate has expired" in message


def test_tls_never_falls_back_to_plaintext(tmp_path: Path, ca: Ca) -> None:
    plain = mosquitto.MosquittoBroker(tmp_path)
    plain.start()
    try:
        message = connect_error(settings(plain, ca_file=ca.cert_file))
    finally:
        plain.close()
    assert "TLS to mqtts://localhost:" in message
    with pytest.raises(ValueError, match="without a TLS context"):
        make_client(settings(plain, ca_file=ca.cert_file), keepalive=10)


def test_plaintext_client_gets_nothing_from_a_tls_listener(
    good_broker: mosquitto.MosquittoBroker,
) -> None:
    with pytest.raises(aiomqtt.MqttError):
        asyncio.run(asyncio.wait_for(_round_trip(settings(good_broker, tls=False)), 10))


def test_client_certificate_is_presented(tmp_path: Path, ca: Ca) -> None:
    broker = tls_broker(tmp_path / "mtls", ca, extra=("require_certificate true",))
    client = issue(ca, tmp_path, "gpu-a", client=True)
    try:
        env = {
            "NETVAL_MQTT_URL": f"mqtts://localhost:{broker.port}",
            "NETVAL_MQTT_USERNAME": broker.username,
            "NETVAL_MQTT_PASSWORD_FILE": str(_password_file(tmp_path, broker)),
            "NETVAL_MQTT_CA_FILE": str(ca.cert_file),
            "NETVAL_MQTT_CERT_FILE": str(client.cert_file),
            "NETVAL_MQTT_KEY_FILE": str(client.key_file),
        }
        with_cert = mqtt_settings_from_env(env, client_id="netval-mtls")
        assert asyncio.run(_round_trip(with_cert)) == b"hello"
        del env["NETVAL_MQTT_CERT_FILE"], env["NETVAL_MQTT_KEY_FILE"]
        with pytest.raises(aiomqtt.MqttError):
            asyncio.run(_round_trip(mqtt_settings_from_env(env, client_id="netval-no-cert")))
    finally:
        broker.close()


def _password_file(directory: Path, broker: mosquitto.MosquittoBroker) -> Path:
    path = directory / "password"
    path.write_text(broker.password)
    return path


# ---------------------------------------------------------------- agent and operator


def test_agent_process_refuses_a_mismatching_certificate(tmp_path: Path, ca: Ca) -> None:
    broker = tls_broker(tmp_path / "agent", ca, dns=("broker.elsewhere.example",))
    env = write_agent_files(tmp_path, broker, agent_config(LO_CHECKS))
    env["NETVAL_MQTT_URL"] = f"mqtts://localhost:{broker.port}"
    env["NETVAL_MQTT_CA_FILE"] = str(ca.cert_file)
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # this tree's netval, not the venv's
    log_file = tmp_path / "agent.log"
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            [netval_script(), "agent"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: "host names are always verified" in tail(log_file, 20000),
            timeout=30,
            what=f"the agent's TLS refusal in its log:\n{tail(log_file)}",
        )
        assert proc.poll() is None, "the agent keeps retrying, it does not crash"
        assert "connected as" not in tail(log_file, 20000)
    finally:
        stop_process(proc)
        broker.close()
    assert "Connected" not in broker.log_text().replace("New connection", "")


def test_operator_ingest_refuses_a_mismatching_certificate(
    tmp_path: Path, ca: Ca, caplog: pytest.LogCaptureFixture
) -> None:
    bad = tls_broker(tmp_path / "bad", ca, dns=("broker.elsewhere.example",))
    good = tls_broker(tmp_path / "good", ca, dns=("localhost",))

    async def main() -> None:
        refused = ReportIngest(
            settings(bad, ca_file=ca.cert_file),
            on_report=lambda r, retained: None,
            on_state=lambda s: None,
            backoff_base=0.05,
            backoff_cap=0.2,
        )
        accepted = ReportIngest(
            settings(good, ca_file=ca.cert_file),
            on_report=lambda r, retained: None,
            on_state=lambda s: None,
        )
        tasks = [asyncio.create_task(refused.run()), asyncio.create_task(accepted.run())]
        try:
            async with asyncio.timeout(20):
                await accepted.synced.wait()
                while refused.stats.reconnects < 2:  # noqa: ASYNC110 - a counter, polled with a deadline
                    await asyncio.sleep(0.05)
            assert not refused.stats.connected and not refused.synced.is_set()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    caplog.set_level(logging.WARNING, logger="netval")
    try:
        asyncio.run(main())
    finally:
        bad.close()
        good.close()
    refusals = [
        r.getMessage() for r in caplog.records if "not valid for 'localhost'" in r.getMessage()
    ]
    assert refusals, [r.getMessage() for r in caplog.records]


def test_plaintext_is_used_only_as_written_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plain = mosquitto.MosquittoBroker(tmp_path)
    plain.start()
    caplog.set_level(logging.WARNING, logger="netval.infra.mqtt_client")
    try:
        s = settings(plain, host="127.0.0.1", tls=False)
        assert asyncio.run(_round_trip(s)) == b"hello"
        assert asyncio.run(_round_trip(s)) == b"hello"
    finally:
        plain.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "netval.infra.mqtt_client"]
    assert len(warnings) == 1, warnings  # once per process and broker, not per connection
    assert "plaintext MQTT" in warnings[0] and "use mqtts://" in warnings[0]
