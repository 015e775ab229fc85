"""A real RabbitMQ cluster with the MQTT plugin for tests (Debian's rabbitmq-server): nodes of
this test's own (their own node names, ports, data and log directories, Erlang cookie);
never the system's instance.

    cluster = RabbitCluster(workdir, size=2, tls=...)
    cluster.start()                 # bounded waits for each node and the join
    cluster.ctl(0, "add_user", ...) # rabbitmqctl against node 0
    cluster.close()

Each node serves MQTT over TLS only, asking every client for a certificate of `client_ca`
and taking the user name from the certificate's first DNS name (`ssl_cert_login_from =
subject_alternative_name`): netval's identity certificates carry `<validation>.<node>` there,
the form RabbitMQ matches topic permissions against (docs/operations.md "External brokers").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
SERVER = RABBIT_BIN / "rabbitmq-server"
CTL = RABBIT_BIN / "rabbitmqctl"
MISSING_REASON = "rabbitmq-server not installed (Debian: apt-get install -y rabbitmq-server)"


def available() -> bool:
    return SERVER.is_file() and CTL.is_file() and shutil.which("erl") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RabbitNode:
    name: str  # Erlang node name, e.g. netval123a@localhost
    workdir: Path
    mqtt_port: int = field(default_factory=_free_port)
    amqp_port: int = field(default_factory=_free_port)
    dist_port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None

    def env(self, home: Path, epmd_port: int) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")},
            "HOME": str(home),  # the Erlang cookie, shared by the cluster's nodes and the CLI
            # an epmd of the test's own (a system RabbitMQ's stays untouched), ended at close
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.workdir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.workdir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(self.workdir / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(self.workdir / "pid"),
        }


class RabbitCluster:
    def __init__(
        self,
        workdir: Path,
        *,
        size: int,
        server_cert: tuple[Path, Path],
        client_ca: Path,
        start_timeout: float = 180.0,
    ) -> None:
        if not available():
            raise RuntimeError(MISSING_REASON)
        self.workdir = workdir
        self.home = workdir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.start_timeout = start_timeout
        self.epmd_port = _free_port()
        tag = f"netval{os.getpid()}x{time.monotonic_ns() % 100000}"
        self.nodes = [RabbitNode(f"{tag}{i}@localhost", workdir / f"node{i}") for i in range(size)]
        cert, key = server_cert
        for node in self.nodes:
            d = node.workdir
            for sub in ("mnesia", "log"):
                (d / sub).mkdir(parents=True, exist_ok=True)
            (d / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
            (d / "rabbitmq-env.conf").write_text("")
            (d / "advanced.config").write_text("[].\n")
            (d / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = 127.0.0.1:{node.amqp_port}\n"
                "mqtt.listeners.tcp = none\n"
                f"mqtt.listeners.ssl.default = 127.0.0.1:{node.mqtt_port}\n"
                f"ssl_options.cacertfile = {client_ca}\n"
                f"ssl_options.certfile = {cert}\n"
                f"ssl_options.keyfile = {key}\n"
                "ssl_options.verify = verify_peer\n"
                "ssl_options.fail_if_no_peer_cert = true\n"
                "mqtt.ssl_cert_login = true\n"
                "ssl_cert_login_from = subject_alternative_name\n"
                "ssl_cert_login_san_type = dns\n"
                "ssl_cert_login_san_index = 0\n"
                "mqtt.allow_anonymous = false\n"
                "mqtt.vhost = /\n"
                "mqtt.exchange = amq.topic\n"
                "loopback_users = none\n"
                "log.console = false\n"
                "log.file.level = info\n"
            )

    def ctl(self, index: int, *args: str, timeout: float = 60.0) -> str:
        node = self.nodes[index]
        done = subprocess.run(
            [str(CTL), "-n", node.name, "-q", *args], env=node.env(self.home, self.epmd_port),
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args[:2])}: {done.stderr.strip()[-800:]}")
        return done.stdout

    def _start(self, index: int) -> None:
        node = self.nodes[index]
        log = (node.workdir / "server.out").open("ab")
        node.proc = subprocess.Popen(
            [str(SERVER)], env=node.env(self.home, self.epmd_port), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self._await(index)

    def _await(self, index: int) -> None:
        """Until the node runs its applications (await_startup refuses a node that has not
        registered with epmd yet: asked again until the deadline)."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            proc = self.nodes[index].proc
            if proc is not None and proc.poll() is not None:
                out = (self.nodes[index].workdir / "server.out").read_text(errors="replace")
                raise RuntimeError(f"rabbitmq-server exited ({proc.returncode}): {out[-1500:]}")
            try:
                self.ctl(index, "await_startup", "--timeout", "30", timeout=60)
                return
            except (RuntimeError, subprocess.TimeoutExpired):
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def start(self) -> RabbitCluster:
        try:
            self._start(0)
            for i in range(1, len(self.nodes)):
                self._start(i)
                self.ctl(i, "stop_app")
                self.ctl(i, "join_cluster", self.nodes[0].name)
                self.ctl(i, "start_app")
                self._await(i)
        except BaseException:
            self.close()  # nothing of this test's left running
            raise
        return self

    def close(self) -> None:
        for node in self.nodes:
            proc = node.proc
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._stop_epmd()

    def _stop_epmd(self) -> None:
        """The epmd the first node started on this test's port (a daemon: not in the node's
        process group)."""
        epmd = shutil.which("epmd") or next(
            (str(p) for p in Path("/usr/lib/erlang").glob("erts-*/bin/epmd")), None
        )
        if epmd is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([epmd, "-port", str(self.epmd_port), "-kill"],
                               capture_output=True, timeout=10, check=False)  # fmt: skip
