"""netval.infra.mqtt_settings: parsing NETVAL_MQTT_* into one immutable settings object."""

from __future__ import annotations

import dataclasses
import os
import ssl
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from netval.infra.mqtt_settings import MqttSettings, mqtt_settings_from_env, parse_mqtt_url
from tls_certs import issue, make_ca


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mqtt://broker", ("broker", 1883, False)),
        ("mqtt://broker:1884", ("broker", 1884, False)),
        ("mqtts://broker.netval.svc", ("broker.netval.svc", 8883, True)),
        ("MQTTS://10.0.0.5:9883/", ("10.0.0.5", 9883, True)),
        ("mqtt://[fd00::1]:1883", ("fd00::1", 1883, False)),
    ],
)
def test_url_parsing(url: str, expected: tuple[str, int, bool]) -> None:
    assert parse_mqtt_url(url) == expected


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://broker:1883", "unsupported scheme 'http'"),
        ("broker:1883", "unsupported scheme 'broker'"),
        ("//broker", "no scheme"),
        ("mqtt://", "no host"),
        ("mqtt://broker:99999", "out of range"),
        ("mqtt://broker:0", "port 0"),
        ("mqtt://broker:abc", "Port could not be cast"),
        ("mqtt://user:pw@broker", "credentials do not belong in the URL"),
        ("mqtt://broker/topic", "unexpected path"),
        ("ws://broker", "unsupported scheme"),
    ],
)
def test_bad_urls_name_the_variable(url: str, why: str) -> None:
    with pytest.raises(ValueError, match="NETVAL_MQTT_URL") as err:
        mqtt_settings_from_env({"NETVAL_MQTT_URL": url})
    assert why in str(err.value)


def test_missing_url() -> None:
    with pytest.raises(ValueError, match="NETVAL_MQTT_URL is not set"):
        mqtt_settings_from_env({})
    with pytest.raises(ValueError, match="NETVAL_MQTT_URL is not set"):
        mqtt_settings_from_env({"NETVAL_MQTT_URL": "  "})


def test_full_settings_and_password_file(tmp_path: Path) -> None:
    pw = tmp_path / "password"
    pw.write_bytes(b"  s3cr et\t\n")  # one trailing newline stripped, the rest kept
    env = {
        "NETVAL_MQTT_URL": "mqtt://broker.netval.svc",
        "NETVAL_MQTT_USERNAME": "agent",
        "NETVAL_MQTT_PASSWORD_FILE": str(pw),
        "NETVAL_MQTT_CA_FILE": "",  # empty counts as unset
    }
    settings = mqtt_settings_from_env(env, client_id="netval-agent-node1")
    assert settings == MqttSettings(
        host="broker.netval.svc",
        port=1883,
        tls=False,
        username="agent",
        password="  s3cr et\t",
        client_id="netval-agent-node1",
    )
    assert "s3cr" not in repr(settings)
    assert settings.url == "mqtt://broker.netval.svc:1883"
    assert settings.ssl_context() is None
    pw.write_text("changed")  # read once: the object does not change
    assert settings.password == "  s3cr et\t"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]
    assert settings.with_client_id(None).client_id is None


def test_password_file_crlf(tmp_path: Path) -> None:
    pw = tmp_path / "password"
    pw.write_bytes(b"pw\r\n")
    env = {"NETVAL_MQTT_URL": "mqtt://b", "NETVAL_MQTT_USERNAME": "u"}
    assert mqtt_settings_from_env(env | {"NETVAL_MQTT_PASSWORD_FILE": str(pw)}).password == "pw"


def test_password_file_errors(tmp_path: Path) -> None:
    env = {"NETVAL_MQTT_URL": "mqtt://b", "NETVAL_MQTT_USERNAME": "u"}
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=r"NETVAL_MQTT_PASSWORD_FILE=.*nope.*cannot read"):
        mqtt_settings_from_env(env | {"NETVAL_MQTT_PASSWORD_FILE": str(missing)})
    with pytest.raises(ValueError, match=r"NETVAL_MQTT_PASSWORD_FILE=.*cannot read"):
        mqtt_settings_from_env(env | {"NETVAL_MQTT_PASSWORD_FILE": str(tmp_path)})  # a dir
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"NETVAL_MQTT_PASSWORD_FILE=.*empty"):
        mqtt_settings_from_env(env | {"NETVAL_MQTT_PASSWORD_FILE": str(empty)})
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=r"NETVAL_MQTT_PASSWORD_FILE=.*UTF-8"):
        mqtt_settings_from_env(env | {"NETVAL_MQTT_PASSWORD_FILE": str(binary)})
    pw = tmp_path / "pw"
    pw.write_text("x")
    with pytest.raises(ValueError, match="NETVAL_MQTT_USERNAME is not"):
        mqtt_settings_from_env(
            {"NETVAL_MQTT_URL": "mqtt://b", "NETVAL_MQTT_PASSWORD_FILE": str(pw)}
        )


def test_unreadable_password_file(tmp_path: Path) -> None:
    """A Secret mounted with modes the process cannot read. Root reads any file (it has
    CAP_DAC_OVERRIDE), so as root the read runs in a child without it (setpriv, as the
    agent's non-root uid): the test runs either way, never skips."""
    pw = tmp_path / "pw"
    pw.write_text("x")
    pw.chmod(0)
    env = {"NETVAL_MQTT_URL": "mqtt://b", "NETVAL_MQTT_USERNAME": "u"}
    if os.geteuid() != 0:
        with pytest.raises(ValueError, match=r"NETVAL_MQTT_PASSWORD_FILE=.*cannot read"):
            mqtt_settings_from_env(env | {"NETVAL_MQTT_PASSWORD_FILE": str(pw)})
        return
    import shutil
    import subprocess
    import sys

    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) drops root's file access override here"
    tmp_path.chmod(0o755)  # the directory is traversable; the file is not readable
    code = (
        "import sys; from netval.infra.mqtt_settings import mqtt_settings_from_env as f\n"
        "try: f({'NETVAL_MQTT_URL': 'mqtt://b', 'NETVAL_MQTT_USERNAME': 'u',"
        f" 'NETVAL_MQTT_PASSWORD_FILE': {str(pw)!r}}})\n"
        "except ValueError as e: print(e); sys.exit(3)\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run(
        [setpriv, "--reuid=65532", "--regid=65532", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": src},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "NETVAL_MQTT_PASSWORD_FILE=" in done.stdout and "cannot read" in done.stdout
    assert "Permission denied" in done.stdout


def test_ca_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"NETVAL_MQTT_CA_FILE=.*cannot read"):
        mqtt_settings_from_env(
            {"NETVAL_MQTT_URL": "mqtts://b", "NETVAL_MQTT_CA_FILE": str(tmp_path / "nope.pem")}
        )
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=r"NETVAL_MQTT_CA_FILE=.*not a usable PEM"):
        mqtt_settings_from_env({"NETVAL_MQTT_URL": "mqtts://b", "NETVAL_MQTT_CA_FILE": str(junk)})
    with pytest.raises(ValueError, match="NETVAL_MQTT_CA_FILE is set but NETVAL_MQTT_URL"):
        mqtt_settings_from_env({"NETVAL_MQTT_URL": "mqtt://b", "NETVAL_MQTT_CA_FILE": str(junk)})


def test_mqtts_without_ca_uses_system_trust() -> None:
    settings = mqtt_settings_from_env({"NETVAL_MQTT_URL": "mqtts://broker"})
    assert (settings.port, settings.tls, settings.ca_file) == (8883, True, None)
    context = settings.ssl_context()
    assert context is not None and context.check_hostname


def test_direct_construction_is_checked() -> None:
    with pytest.raises(ValueError, match="port"):
        MqttSettings(host="b", port=70000)
    with pytest.raises(ValueError, match="needs a username"):
        MqttSettings(host="b", port=1883, password="x")
    with pytest.raises(ValueError, match="needs TLS"):
        MqttSettings(host="b", port=1883, ca_file=Path("/x"))
    with pytest.raises(ValueError, match="needs its key"):
        MqttSettings(host="b", port=8883, tls=True, cert_file=Path("/x"))
    with pytest.raises(ValueError, match="client certificate needs TLS"):
        MqttSettings(host="b", port=1883, cert_file=Path("/x"), key_file=Path("/y"))


def test_tls_context_always_verifies(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    settings = mqtt_settings_from_env(
        {"NETVAL_MQTT_URL": "mqtts://broker", "NETVAL_MQTT_CA_FILE": str(ca.cert_file)}
    )
    context = settings.ssl_context()
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert mqtt_settings_from_env({"NETVAL_MQTT_URL": "mqtt://broker"}).ssl_context() is None


def test_client_certificate_errors(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    leaf = issue(ca, tmp_path, "gpu-a", client=True)
    other = issue(ca, tmp_path, "gpu-b", client=True)
    base = {"NETVAL_MQTT_URL": "mqtts://broker", "NETVAL_MQTT_CA_FILE": str(ca.cert_file)}
    ok = mqtt_settings_from_env(
        base
        | {"NETVAL_MQTT_CERT_FILE": str(leaf.cert_file), "NETVAL_MQTT_KEY_FILE": str(leaf.key_file)}
    )
    assert (ok.cert_file, ok.key_file) == (leaf.cert_file, leaf.key_file)
    assert ok.ssl_context() is not None
    cases = [
        ({"NETVAL_MQTT_CERT_FILE": str(leaf.cert_file)},
         "NETVAL_MQTT_CERT_FILE is set but NETVAL_MQTT_KEY_FILE is not"),
        ({"NETVAL_MQTT_KEY_FILE": str(leaf.key_file)},
         "NETVAL_MQTT_KEY_FILE is set but NETVAL_MQTT_CERT_FILE is not"),
        ({"NETVAL_MQTT_CERT_FILE": str(leaf.cert_file), "NETVAL_MQTT_KEY_FILE": str(other.key_file)},
         "not a usable PEM certificate and matching key"),
        ({"NETVAL_MQTT_CERT_FILE": str(tmp_path / "nope"), "NETVAL_MQTT_KEY_FILE": str(leaf.key_file)},
         "cannot read"),
    ]  # fmt: skip
    for extra, why in cases:
        with pytest.raises(ValueError, match=why):
            mqtt_settings_from_env(base | extra)
    plain = {"NETVAL_MQTT_URL": "mqtt://broker", "NETVAL_MQTT_CERT_FILE": str(leaf.cert_file),
             "NETVAL_MQTT_KEY_FILE": str(leaf.key_file)}  # fmt: skip
    with pytest.raises(ValueError, match="NETVAL_MQTT_CERT_FILE is set but NETVAL_MQTT_URL"):
        mqtt_settings_from_env(plain)


@hypothesis_settings(deadline=None)  # shared CI cores: no per-example timing
@given(st.text(max_size=200))
def test_any_url_parses_or_says_why(url: str) -> None:
    try:
        host, port, tls = parse_mqtt_url(url)
    except ValueError as exc:
        assert "NETVAL_MQTT_URL" in str(exc)
    else:
        assert host and 0 < port < 65536
        assert tls is url.strip().lower().startswith("mqtts://")
