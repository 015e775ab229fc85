"""Operator failover: how long status stays frozen when the leader dies, and when it stops.

Run from the repository root (mosquitto must be installed):

    python bench/failover.py              # 5 SIGKILLs and 5 clean stops per timing profile
    python bench/failover.py --runs 5 --profiles default previous   # the defaults, before/after

What runs: two real `netval operator` processes (tests/operator_processes.py: their flags and
env, each with its own bearer token) against the tests' stateful Kubernetes API (tests/kube.py)
and a real Mosquitto, 4 GPU nodes and one NetworkValidation. Per run:

- SIGKILL: the leader is killed and a report that changes the status is published at once;
  measured is the time from the kill to the first status PATCH by the other replica (and, on
  the way, to its Lease acquisition). The killed replica is restarted as standby for the next
  run, so the roles alternate.
- clean stop: SIGTERM to the leader (it stops its writers, then releases the Lease); the
  change is published once it has exited (before, it could write the change itself); the
  clock starts at the SIGTERM.

Profiles: `default` (10 s lease, 7 s renew deadline, 2 s retry: the shipped defaults since
issue 24), `previous` (15 s / 10 s / 2 s: the defaults before) and `fast` (6 s / 4 s / 0.5 s).
Figures are medians with min and max. Before the Lease, a SIGKILL froze status for 25-48 s
(Kopf peering, 60 s lifetime; issue 15).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker
from netval.model import Status
from netval.operator.leadership.settings import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD,
)
from operator_env import GPU, NODES, publish, report, report_msg, validation
from operator_processes import OperatorProc, request_count, status_writes

PROFILES: Final = {
    "default": {
        "NETVAL_LEASE_DURATION_SECONDS": str(DEFAULT_LEASE_DURATION),
        "NETVAL_LEASE_RENEW_DEADLINE_SECONDS": str(DEFAULT_RENEW_DEADLINE),
        "NETVAL_LEASE_RETRY_PERIOD_SECONDS": str(DEFAULT_RETRY_PERIOD),
    },
    "previous": {
        "NETVAL_LEASE_DURATION_SECONDS": "15",
        "NETVAL_LEASE_RENEW_DEADLINE_SECONDS": "10",
        "NETVAL_LEASE_RETRY_PERIOD_SECONDS": "2",
    },
    "fast": {
        "NETVAL_LEASE_DURATION_SECONDS": "6",
        "NETVAL_LEASE_RENEW_DEADLINE_SECONDS": "4",
        "NETVAL_LEASE_RETRY_PERIOD_SECONDS": "0.5",
    },
}
LEASE: Final = ("coordination.k8s.io/v1", "leases", "netval-operator", "netval-system")
POLL: Final = 0.05


def _holder(kube: KubeCluster) -> str:
    return str(kube.get(*LEASE)["spec"].get("holderIdentity") or "")


def _first_status_write(kube: KubeCluster, token: str, after: int, timeout: float) -> None:
    def found() -> bool:
        return bool(status_writes(kube, token, since=after + 1))

    wait_for(found, timeout=timeout, interval=POLL, what=f"a status write by {token}")


class Pair:
    def __init__(
        self, kube: KubeCluster, broker: MosquittoBroker, workdir: Path, env: dict[str, str]
    ) -> None:
        self.kube = kube
        self.broker = broker
        self.procs = {
            token: OperatorProc(kube, broker, workdir, token, env=env) for token in ("op-a", "op-b")
        }
        self.leader = "op-a"
        self.flip = 0

    @property
    def standby(self) -> str:
        return "op-b" if self.leader == "op-a" else "op-a"

    def start(self) -> None:
        self.procs[self.leader].start()
        _first_status_write(self.kube, self.leader, -1, 120)
        self.start_standby()

    def start_standby(self) -> None:
        proc = self.procs[self.standby]
        proc.start()
        wait_for(lambda: "standing by: the Lease is held by" in proc.log()[-20000:],
                 timeout=120, what=f"{self.standby} standing by")  # fmt: skip

    def change(self) -> None:
        # a different failing node each time: the status changes, so it must be written
        self.flip += 1
        node = NODES[self.flip % len(NODES)]
        status = Status.FAIL if self.flip % 2 else Status.PASS
        publish(self.broker, [report_msg(report(node, status))])

    def handover(self, *, kill: bool, timeout: float) -> tuple[float, float]:
        """(seconds to the Lease acquisition, seconds to the first status write)."""
        old, new = self.leader, self.standby
        old_holder = _holder(self.kube)
        last = request_count(self.kube) - 1
        started = time.monotonic()
        if kill:
            self.procs[old].kill()
        else:
            # the change only once the old leader is gone: it could still write it itself
            self.procs[old].terminate()
        self.change()
        wait_for(lambda: _holder(self.kube) not in ("", old_holder), timeout=timeout,
                 interval=POLL, what="the Lease taken over")  # fmt: skip
        acquired = time.monotonic() - started
        _first_status_write(self.kube, new, last, timeout)
        written = time.monotonic() - started
        self.leader = new
        self.start_standby()
        return acquired, written

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()


def _fmt(values: list[float]) -> str:
    return (f"median {statistics.median(values):5.2f} s  (min {min(values):5.2f}, "
            f"max {max(values):5.2f}, n={len(values)})")  # fmt: skip


def run_profile(name: str, runs: int, logs: Path | None) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="netval-failover-") as tmp:
        workdir = Path(tmp)
        (workdir / "mqtt").mkdir()
        broker = MosquittoBroker(workdir / "mqtt")
        broker.start()
        kube = KubeCluster(workdir / "kube").start()
        pair = Pair(kube, broker, workdir / "ops", PROFILES[name])
        try:
            kube.ensure_namespace("netval-system")
            for node in NODES:
                kube.create({"apiVersion": "v1", "kind": "Node",
                             "metadata": {"name": node, "labels": dict(GPU)}})  # fmt: skip
            kube.create(validation())
            pair.start()
            result: dict[str, list[float]] = {k: [] for k in
                                              ("kill_lease", "kill_status", "stop_lease", "stop_status")}  # fmt: skip
            for kill in (True, False):
                for _ in range(runs):
                    acquired, written = pair.handover(kill=kill, timeout=120)
                    prefix = "kill" if kill else "stop"
                    result[f"{prefix}_lease"].append(acquired)
                    result[f"{prefix}_status"].append(written)
                    print(f"  {name:7s} {'SIGKILL' if kill else 'SIGTERM'}: Lease {acquired:5.2f} s, "
                          f"first status write {written:5.2f} s", flush=True)  # fmt: skip
            return result
        finally:
            pair.stop()
            kube.stop()
            broker.stop()
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                for log in (workdir / "ops").glob("*.log"):
                    shutil.copy(log, logs / f"{name}-{log.name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--profiles", nargs="+", choices=sorted(PROFILES), default=["default", "previous", "fast"]
    )
    parser.add_argument("--logs", type=Path, help="copy the operators' logs into this directory")
    args = parser.parse_args()
    results = {name: run_profile(name, args.runs, args.logs) for name in args.profiles}
    print()
    for name, r in results.items():
        timings = PROFILES[name]
        print(f"profile {name}: lease {timings['NETVAL_LEASE_DURATION_SECONDS']} s, renew deadline "
              f"{timings['NETVAL_LEASE_RENEW_DEADLINE_SECONDS']} s, retry "
              f"{timings['NETVAL_LEASE_RETRY_PERIOD_SECONDS']} s")  # fmt: skip
        print(f"  SIGKILL of the leader -> Lease taken over:        {_fmt(r['kill_lease'])}")
        print(f"  SIGKILL of the leader -> first status write:      {_fmt(r['kill_status'])}")
        print(f"  clean stop (SIGTERM)  -> Lease taken over:        {_fmt(r['stop_lease'])}")
        print(f"  clean stop (SIGTERM)  -> first status write:      {_fmt(r['stop_status'])}")
    if "default" in results:
        kill = statistics.median(results["default"]["kill_status"])
        print(f"\nfrozen status after SIGKILL, default timings: {kill:.1f} s vs 25-48 s with Kopf "
              f"peering ({25 / kill:.1f}-{48 / kill:.1f}x shorter)")  # fmt: skip


if __name__ == "__main__":
    main()
