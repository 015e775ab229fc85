"""Real `netval operator` processes against the test API (tests/kube.py) and a real broker,
for tests/test_operator_process.py, tests/test_failover.py and bench/failover.py.

Each process gets its own kubeconfig with its own bearer token, so the test API's request
log says which replica made each request (`writes_by`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

import yaml

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker, free_port

REPO = Path(__file__).resolve().parents[1]
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
FAST_LEASE = {  # short timings so tests see a failover in seconds; the renew deadline leaves
    # room for an event loop blocked a few seconds on a loaded CI machine
    "NETVAL_LEASE_DURATION_SECONDS": "8",
    "NETVAL_LEASE_RENEW_DEADLINE_SECONDS": "6",
    "NETVAL_LEASE_RETRY_PERIOD_SECONDS": "0.5",
}


class BrokerLogin(Protocol):
    """What a replica needs of a broker: a `MosquittoBroker`, or the chart's (tests that run
    `test_chart_broker.run_chart_broker`)."""

    host: str
    port: int
    username: str
    password: str


class OperatorProc:
    """One `netval operator` subprocess; `token` identifies its requests at the test API."""

    def __init__(
        self,
        kube: KubeCluster,
        broker: BrokerLogin,
        workdir: Path,
        token: str,
        *,
        standalone: bool = False,
        env: dict[str, str] | None = None,
        metrics_port: int | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.kube = kube
        self.token = token
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.metrics_port = metrics_port if metrics_port is not None else free_port()
        self.liveness_port = free_port()
        self.log_path = workdir / f"{token}.log"
        config: dict[str, Any] = yaml.safe_load(kube.kubeconfig_path.read_text())
        config["users"][0]["user"]["token"] = token
        kubeconfig = workdir / f"{token}.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        password = workdir / "mqtt-password"
        password.write_text(broker.password)
        full = {k: v for k, v in os.environ.items() if not k.startswith(("NETVAL_", "KUBE"))}
        full.update(
            PYTHONPATH=os.environ.get("NETVAL_TEST_EXTRA_PATH", "") + str(REPO / "src"),
            HOME=str(workdir),
            KUBECONFIG=str(kubeconfig),
            NETVAL_MQTT_URL=f"mqtt://{broker.host}:{broker.port}",
            NETVAL_MQTT_USERNAME=broker.username,
            NETVAL_MQTT_PASSWORD_FILE=str(password),
            NETVAL_NAMESPACE="netval-system",
            NETVAL_STATUS_WINDOW_SECONDS="0.2",
            NETVAL_LOG_LEVEL="INFO",
        )
        full.update(env or {})
        self.env = full
        self.argv = [
            sys.executable, "-m", "netval.cli", "operator",
            "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
            "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
            *(["--standalone"] if standalone else []),
            *args,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    def start(self) -> OperatorProc:
        """Start (again): `log()` shows only this run's output."""
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: the process, every thread of it, stops where it is (a VM pause, a long
        GC or swap storm seen from outside)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def exited(self) -> int | None:
        """The exit code once the process has ended by itself, else None."""
        return None if self.proc is None else self.proc.poll()

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait for the exit (SIGKILL after `timeout`); the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen process would not see SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def log(self) -> str:
        """This run's output (since the last `start`)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def _token(headers: Any) -> str:
    for key, value in dict(headers).items():
        if str(key).lower() == "authorization":
            return str(value).removeprefix("Bearer ").strip()
    return ""


def requests_by_token(kube: KubeCluster, since: int = 0) -> list[tuple[int, str, str, str]]:
    """The requests from number `since` on: (number, token, METHOD, path)."""

    async def read() -> list[tuple[int, str, str, str]]:
        # kmock's request log, sliced: copying all of it on every poll starves the test API
        # once it holds tens of thousands of requests (the benchmark's)
        log = kube.api._requests
        return [
            (since + i, _token(r.headers), str(r.method.value), str(r.url.path))
            for i, r in enumerate(log[since:])
        ]

    return kube.call(read)


def request_count(kube: KubeCluster) -> int:
    async def read() -> int:
        return len(kube.api._requests)

    return kube.call(read)


def writes(
    kube: KubeCluster, *, leases: bool = False, since: int = 0
) -> list[tuple[int, str, str, str]]:
    """Write requests (POST/PUT/PATCH/DELETE) in order; the Lease's own writes only with
    `leases`."""
    return [
        r
        for r in requests_by_token(kube, since)
        if r[2] in WRITES and (leases or "/leases" not in r[3])
    ]


def status_writes(kube: KubeCluster, token: str | None = None, since: int = 0) -> list[int]:
    return [
        i
        for i, t, method, path in writes(kube, since=since)
        if method == "PATCH"
        and "/networkvalidations/" in path
        and path.endswith("/status")
        and (token is None or t == token)
    ]


def writer_runs(kube: KubeCluster, tokens: set[str]) -> list[str]:
    """The writers in order, consecutive writes by the same replica collapsed: ["a", "b"]
    means a wrote, then b, and a never again."""
    runs: list[str] = []
    for _, token, _, _ in writes(kube):
        if token in tokens and (not runs or runs[-1] != token):
            runs.append(token)
    return runs


def mqtt_connections(broker: MosquittoBroker, prefix: str = "netval-operator-") -> int:
    """How many times an operator client connected (Mosquitto's connection log)."""
    text = broker.log_file.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if "New client connected" in line and prefix in line)


def wait_status_write(kube: KubeCluster, token: str, after: int = -1, timeout: float = 60.0) -> int:
    """The order number of `token`'s first status write after request `after`."""

    def found() -> tuple[int] | None:
        later = status_writes(kube, token, since=after + 1)
        return (later[0],) if later else None

    return wait_for(found, timeout=timeout, what=f"a status write by {token}")[0]
