"""A real Mosquitto broker for tests: loopback port, password auth, no persistence.

    broker = MosquittoBroker(tmp_dir)
    broker.start()              # waits (bounded) until the port accepts connections
    broker.stop(); broker.restart()   # same port, same credentials
    broker.close()

Optional TLS: ``MosquittoBroker(tmp_dir, tls=(ca_file, cert_file, key_file))`` makes the
listener speak TLS only. ``extra_config`` lines are appended to mosquitto.conf (e.g. the
chart's per-client limits, ``CHART_LIMITS``).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

MOSQUITTO = shutil.which("mosquitto") or next(
    (p for p in ("/usr/sbin/mosquitto", "/sbin/mosquitto") if os.access(p, os.X_OK)), None
)
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd")
MISSING_REASON = "mosquitto / mosquitto_passwd not installed (Debian: apt-get install -y mosquitto)"


# The chart's per-client limits (values mqtt.broker.limits; tests/test_chart_broker.py checks
# the rendering): Mosquitto's defaults would drop a burst or a big retained replay.
CHART_LIMITS = (
    "max_queued_messages 100000",
    "max_queued_bytes 0",
    "max_inflight_messages 100",
    "max_packet_size 1052672",
)


def available() -> bool:
    return MOSQUITTO is not None and MOSQUITTO_PASSWD is not None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class BrokerAddress(NamedTuple):
    host: str
    port: int
    username: str
    password: str


class MosquittoBroker:
    def __init__(
        self,
        workdir: Path,
        *,
        username: str = "netval",
        password: str = "s3cret-pw",
        tls: tuple[Path, Path, Path] | None = None,
        start_timeout: float = 5.0,
        extra_config: tuple[str, ...] = (),
    ) -> None:
        if not available():
            raise RuntimeError(MISSING_REASON)
        self.workdir = workdir
        self.host = "127.0.0.1"
        self.port = free_port()
        self.username = username
        self.password = password
        self.start_timeout = start_timeout
        self.log_file = workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

        passwd = workdir / "passwd"
        subprocess.run(
            [str(MOSQUITTO_PASSWD), "-b", "-c", str(passwd), username, password],
            check=True,
            capture_output=True,
            timeout=10,
        )
        lines = [
            f"listener {self.port} {self.host}",
            "allow_anonymous false",
            f"password_file {passwd}",
            "persistence false",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
            # Run as the current user: as root, mosquitto would switch to user "mosquitto",
            # which cannot read files in the test's private tmp dir.
            f"user {getpass.getuser()}",
        ]
        if tls is not None:
            ca, cert, key = tls
            lines += [f"cafile {ca}", f"certfile {cert}", f"keyfile {key}"]
        lines += extra_config  # e.g. the chart's per-client limits
        self.config = workdir / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress(self.host, self.port, self.username, self.password)

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("broker already running")
        log = self.log_file.open("ab")
        try:
            self.proc = subprocess.Popen(
                [str(MOSQUITTO), "-c", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mosquitto exited with {self.proc.returncode}:\n{self.log_text()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"mosquitto did not listen on {self.port} within "
                        f"{self.start_timeout}s:\n{self.log_text()}"
                    ) from None
                time.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (clean broker shutdown), SIGKILL after ``timeout``; waits for the exit."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def restart(self) -> None:
        self.stop()
        self.start()

    close = stop

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"
