"""`netval broker-reloader`: a renewed broker certificate is served without a restart.

The broker pod, for real: a Mosquitto with TLS and the `netval broker-reloader` process in one
PID namespace of their own (`unshare --pid`, what `shareProcessNamespace` gives the pod; it
also keeps the reloader from signalling other tests' brokers), the certificate directory laid
out as the kubelet mounts a Secret (files are links through `..data`, a link to a timestamped
directory) and renewed as the kubelet does (a new directory, then an atomic rename of the
`..data` link).
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

import mosquitto as broker_kit
import tls_certs
from kube import wait_for
from netval.infra.broker_reloader import Action, Observation, Reloader, decide, find_processes

REPO = Path(__file__).resolve().parent.parent
UNSHARE = shutil.which("unshare")
FILES = ("tls.crt", "tls.key", "ca.crt")

needs_pod = pytest.mark.skipif(
    not broker_kit.available() or UNSHARE is None or os.geteuid() != 0,
    reason=f"{broker_kit.MISSING_REASON}; and unshare as root (a PID namespace)",
)


# --- the pure decision ----------------------------------------------------------------------


def _seen(version: str = "..2026_01", *, loadable: bool = True) -> Observation:
    return Observation(version, "hash", loadable)


@pytest.mark.parametrize(
    ("told", "seen", "action"),
    [
        (None, None, Action.WAIT),  # no directory yet
        (None, _seen(loadable=False), Action.WAIT),  # nothing the broker could have loaded
        (None, _seen(), Action.BASELINE),  # what the broker started with
        ("..2026_01", _seen(), Action.NONE),
        ("..2026_01", None, Action.WAIT),  # the directory went away: keep what it has
        ("..2026_01", _seen("..2026_02"), Action.SIGNAL),
        ("..2026_01", _seen("..2026_02", loadable=False), Action.NOT_READY),
    ],
)
def test_what_a_poll_means_for_the_broker(
    told: str | None, seen: Observation | None, action: Action
) -> None:
    assert decide(told, seen) is action


def test_without_the_kubelets_link_the_content_is_the_version() -> None:
    assert Observation(None, "abc", True).version == "abc"
    assert Observation("..x", "abc", True).version == "..x"


def _fake_proc(root: Path, pid: int, comm: str) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "comm").write_text(comm + "\n")


def test_only_processes_of_that_name_and_user_are_found(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 12, "mosquitto")
    _fake_proc(tmp_path, 13, "mosquitto_passwd")
    _fake_proc(tmp_path, 14, "sh")
    (tmp_path / "self").mkdir()
    assert find_processes("mosquitto", os.getuid(), tmp_path) == [12]
    assert find_processes("mosquitto", os.getuid() + 1, tmp_path) == []
    assert find_processes("mosquitto", os.getuid(), tmp_path / "absent") == []


# --- the kubelet's layout -------------------------------------------------------------------


class SecretVolume:
    """A directory as the kubelet mounts a Secret: `tls.crt -> ..data/tls.crt`, `..data ->
    ..<timestamp>`; `update` writes a new timestamped directory and renames a new link over
    `..data` (atomic: a reader sees the old set or the new one, never a mix)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.generation = 0

    def update(self, files: dict[str, bytes]) -> None:
        self.path.mkdir(exist_ok=True)
        self.generation += 1
        new = f"..2026_12_04_00_00_{self.generation:02d}.{os.getpid()}"
        (self.path / new).mkdir()
        for name, data in files.items():
            (self.path / new / name).write_bytes(data)
        old = self.path / "..data"
        previous = os.readlink(old) if old.is_symlink() else None
        (self.path / "..data_tmp").symlink_to(new)
        os.rename(self.path / "..data_tmp", old)
        for name in files:
            if not (self.path / name).is_symlink():
                (self.path / name).symlink_to(f"..data/{name}")
        if previous is not None:
            shutil.rmtree(self.path / previous)


def _pair(ca: tls_certs.Ca, directory: Path, name: str) -> dict[str, bytes]:
    leaf = tls_certs.issue(ca, directory, name, ip_addresses=("127.0.0.1",))
    return {"tls.crt": leaf.cert_file.read_bytes(), "tls.key": leaf.key_file.read_bytes(),
            "ca.crt": ca.cert_file.read_bytes()}  # fmt: skip


def _serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def presented_serial(port: int, ca_file: Path) -> int:
    """The serial of the certificate a new TLS handshake gets (verified against the CA)."""
    import socket

    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:  # fmt: skip
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


# --- the pod --------------------------------------------------------------------------------


class Pod:
    """Mosquitto (optional) and `netval broker-reloader` in their own PID namespace."""

    def __init__(self, tmp: Path, reloader_args: list[str], broker_conf: Path | None) -> None:
        self.reloader_log = tmp / "reloader.log"
        self.reloader_rc = tmp / "reloader.rc"
        self.broker_log = tmp / "broker.log"
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "NETVAL_LOG_LEVEL": "INFO"}
        reloader = " ".join([sys.executable, "-m", "netval.cli", "broker-reloader", *reloader_args])
        script = f"({reloader} >{self.reloader_log} 2>&1; echo $? >{self.reloader_rc}) & "
        if broker_conf is not None:
            script += f"{broker_kit.MOSQUITTO} -c {broker_conf} >{self.broker_log} 2>&1 & "
        script += "wait"
        assert UNSHARE is not None
        self.proc = subprocess.Popen(
            [UNSHARE, "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script],
            env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def descendants(self) -> list[int]:
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            found += map(int, children)
            todo += map(int, children)
        return found

    def reloader_pid(self) -> int | None:
        for pid in self.descendants():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            # the argument itself: the subshell around it has it inside its `sh -c` script
            if b"broker-reloader" in cmdline.split(b"\0"):
                return pid
        return None

    def log(self) -> str:
        try:
            return self.reloader_log.read_text()
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # --kill-child ends the namespace with it
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class _Session:
    """An MQTT session over TLS (paho); counts disconnects and collects messages."""

    def __init__(self, port: int, broker: broker_kit.MosquittoBroker, ca_file: Path) -> None:
        import paho.mqtt.client as paho

        self.connected = threading.Event()
        self.disconnects = 0
        self.messages: list[bytes] = []
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        self.client.username_pw_set(broker.username, broker.password)
        self.client.tls_set(ca_certs=str(ca_file))
        self.client.on_connect = lambda *a: self.connected.set()
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = lambda c, u, m: self.messages.append(m.payload)
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        assert self.connected.wait(10), "no MQTT session"

    def _on_disconnect(self, *args: Any) -> None:
        self.disconnects += 1

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def ca(tmp_path: Path) -> tls_certs.Ca:
    return tls_certs.make_ca(tmp_path, "broker-ca")


@needs_pod
def test_a_renewed_certificate_is_served_and_open_sessions_stay(
    tmp_path: Path, ca: tls_certs.Ca
) -> None:
    volume = SecretVolume(tmp_path / "tls")
    first = _pair(ca, tmp_path, "broker-1")
    volume.update(first)
    tls = (volume.path / "ca.crt", volume.path / "tls.crt", volume.path / "tls.key")
    # only its configuration and passwords: the pod runs it
    broker = broker_kit.MosquittoBroker(tmp_path, tls=tls)
    pod = Pod(tmp_path, ["--dir", str(volume.path), "--interval", "0.1"], broker.config)
    sessions: list[_Session] = []
    try:
        wait_for(lambda: presented_serial(broker.port, ca.cert_file) == _serial(first["tls.crt"]),
                 20, what="the broker serving the first certificate")  # fmt: skip
        # the baseline first: a renewal before it would be taken for what the broker loaded
        wait_for(lambda: "watching" in pod.log(), 20, what=f"the reloader's baseline: {pod.log()}")
        before = _Session(broker.port, broker, ca.cert_file)
        sessions.append(before)
        before.client.subscribe("renewal/#", qos=1)

        second = _pair(ca, tmp_path, "broker-2")
        volume.update(second)
        wait_for(lambda: presented_serial(broker.port, ca.cert_file) == _serial(second["tls.crt"]),
                 20, what=f"the renewed certificate served; reloader: {pod.log()}")  # fmt: skip
        assert "sent SIGHUP to mosquitto" in pod.log()

        after = _Session(broker.port, broker, ca.cert_file)  # a handshake with the new one
        sessions.append(after)
        after.client.publish("renewal/check", b"after", qos=1).wait_for_publish(5)
        wait_for(lambda: b"after" in before.messages, 10, what="the old session still served")
        assert before.disconnects == 0 and before.client.is_connected()
        assert pod.proc.poll() is None  # the reloader keeps running
    finally:
        for session in sessions:
            session.close()
        pod.close()


@needs_pod
def test_a_missing_directory_is_waited_for_and_sigterm_ends_it_cleanly(
    tmp_path: Path, ca: tls_certs.Ca
) -> None:
    volume = SecretVolume(tmp_path / "later")
    broker = broker_kit.MosquittoBroker(tmp_path)  # plaintext: it only has to take the SIGHUP
    pod = Pod(tmp_path, ["--dir", str(volume.path), "--interval", "0.1"], broker.config)
    try:
        wait_for(lambda: "waiting" in pod.log(), 20, what=f"the reloader waiting: {pod.log()}")
        pid = wait_for(pod.reloader_pid, 10, what="the reloader running")
        volume.update(_pair(ca, tmp_path, "broker-1"))
        wait_for(lambda: "watching" in pod.log(), 20, what=f"the baseline: {pod.log()}")
        volume.update(_pair(ca, tmp_path, "broker-2"))
        wait_for(lambda: "sent SIGHUP to mosquitto" in pod.log(), 20,
                 what=f"the broker told: {pod.log()}")  # fmt: skip
        wait_for(lambda: "reload" in pod.broker_log.read_text().lower(),
                 10, what="mosquitto reloading")  # fmt: skip

        os.kill(pid, signal.SIGTERM)
        rc = wait_for(lambda: pod.reloader_rc.read_text().strip(), 20, what="the reloader's exit")
        assert rc == "0", pod.log()
        assert "Traceback" not in pod.log()
    finally:
        pod.close()


def test_a_change_with_no_broker_to_tell_is_tried_again(tmp_path: Path, ca: tls_certs.Ca) -> None:
    volume = SecretVolume(tmp_path / "tls")
    volume.update(_pair(ca, tmp_path, "broker-1"))
    proc = tmp_path / "proc"
    proc.mkdir()
    reloader = Reloader(volume.path, proc=proc)
    assert reloader.poll() is Action.BASELINE
    told = reloader.told
    volume.update(_pair(ca, tmp_path, "broker-2"))
    assert reloader.poll() is Action.SIGNAL
    assert reloader.told == told and reloader.signals == 0  # nobody got it: next poll again
    # a half-written pair (no kubelet link, the new certificate with the old key) waits
    plain = tmp_path / "plain"
    plain.mkdir()
    one, two = _pair(ca, tmp_path, "broker-3"), _pair(ca, tmp_path, "broker-4")
    for name, data in one.items():
        (plain / name).write_bytes(data)
    reloader = Reloader(plain, proc=proc)
    assert reloader.poll() is Action.BASELINE
    (plain / "tls.crt").write_bytes(two["tls.crt"])
    assert reloader.poll() is Action.NOT_READY
    (plain / "tls.key").write_bytes(two["tls.key"])
    assert reloader.poll() is Action.SIGNAL
