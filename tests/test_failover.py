"""Two real `netval operator` replicas against one test API and one broker: one leads on the
Lease, the other stands by and writes nothing; SIGKILL of the leader hands over within the
documented bound (lease duration + retry period + a term's start); the restarted replica
stays standby; a clean stop hands over at once. Writes are counted per replica at the test
API (each replica has its own bearer token)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import kmock
import pytest

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker, free_port
from netval.model import Status
from operator_env import publish, report, report_msg, status_of, validation
from operator_processes import (
    FAST_LEASE,
    OperatorProc,
    request_count,
    status_writes,
    wait_status_write,
    writer_runs,
    writes,
)

LEASE = ("coordination.k8s.io/v1", "leases", "netval-operator", "netval-system")
# FAST_LEASE: 8 s lease, 0.5 s retry; a term starts Kopf and reads back retained reports
# (up to 5 s): 25 s is the bound with room for a loaded CI machine.
TAKEOVER_BOUND = 25.0
TOKENS = {"op-a", "op-b"}


@pytest.fixture
def replicas(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, tmp_path: Path
) -> Iterator[dict[str, OperatorProc]]:
    made: dict[str, OperatorProc] = {}

    def make(token: str) -> OperatorProc:
        webhook = ("--webhook-addr", f"127.0.0.1:{free_port()}")
        made[token] = OperatorProc(cluster, mosquitto_broker, tmp_path, token, env=FAST_LEASE,
                                   args=webhook)  # fmt: skip
        return made[token]

    procs = {token: make(token) for token in sorted(TOKENS)}
    yield procs
    for proc in made.values():
        proc.terminate()


def _holder(kube: KubeCluster) -> str:
    return str(kube.get(*LEASE)["spec"]["holderIdentity"])


def _standing_by(proc: OperatorProc) -> bool:
    return "standing by: the Lease is held by" in proc.log()


def _listening(argv: list[str]) -> bool:
    port = int(argv[argv.index("--webhook-addr") + 1].rpartition(":")[2])
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _last_request(kube: KubeCluster) -> int:
    return request_count(kube) - 1


def test_sigkill_of_the_leader_hands_over_and_the_restarted_one_stays_standby(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, replicas: dict[str, OperatorProc]
) -> None:
    a, b = replicas["op-a"], replicas["op-b"]
    cluster.create(validation())
    a.start()
    wait_status_write(cluster, "op-a")
    b.start()
    wait_for(lambda: _standing_by(b), timeout=60, what=f"op-b standing by\n{b.log()[-2000:]}")
    publish(mosquitto_broker, [report_msg(report("gpu-a"))])
    wait_for(lambda: status_of(cluster).get("nodes", {}).get("passing") == 1, timeout=30,
             what="the leader folded the report")  # fmt: skip
    # the standby answers admission reviews (the Service routes to it too) and writes nothing:
    # no status, no taints, no agent objects, no webhook configurations, not even the Lease
    wait_for(lambda: _listening(b.argv), timeout=30, what="op-b serving the webhook")
    assert [w for w in writes(cluster, leases=True) if w[1] == "op-b"] == []

    a.kill()
    killed_at = _last_request(cluster)
    publish(mosquitto_broker, [report_msg(report("gpu-b", Status.FAIL))])  # a change to write
    wait_status_write(cluster, "op-b", after=killed_at, timeout=TAKEOVER_BOUND)
    wait_for(lambda: status_of(cluster).get("nodes", {}).get("failing") == 1, timeout=30,
             what=f"the new leader folded the report\n{b.log()[-2000:]}")  # fmt: skip
    lease = cluster.get(*LEASE)["spec"]
    assert lease["leaseTransitions"] == 1 and lease["holderIdentity"] != ""
    wait_for(lambda: [w for w in writes(cluster) if w[1] == "op-b" and "webhookconfigurations"
                      in w[3]], timeout=30, what="the new leader writes the webhook configurations")  # fmt: skip

    # the killed replica comes back: it stands by and writes nothing
    restarted_at = _last_request(cluster)
    a.start()
    wait_for(lambda: _standing_by(a), timeout=60, what=f"op-a standing by\n{a.log()[-2000:]}")
    publish(mosquitto_broker, [report_msg(report("gpu-c", Status.FAIL))])
    wait_for(lambda: status_of(cluster).get("nodes", {}).get("failing") == 2, timeout=30,
             what="op-b still leading")  # fmt: skip
    after_restart = [w for w in writes(cluster, leases=True) if w[0] > restarted_at]
    assert after_restart and {w[1] for w in after_restart} == {"op-b"}
    # at no time did both write: one run of op-a's writes, then op-b's
    assert writer_runs(cluster, TOKENS) == ["op-a", "op-b"]


def test_clean_stop_hands_over_at_once(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, replicas: dict[str, OperatorProc]
) -> None:
    a, b = replicas["op-a"], replicas["op-b"]
    cluster.create(validation())
    a.start()
    wait_status_write(cluster, "op-a")
    b.start()
    wait_for(lambda: _standing_by(b), timeout=60, what="op-b standing by")
    assert a.terminate() == 0
    assert "released Lease" in a.log()  # op-b need not wait for the Lease to expire
    stopped_at = _last_request(cluster)
    publish(mosquitto_broker, [report_msg(report("gpu-d", Status.FAIL))])
    wait_status_write(cluster, "op-b", after=stopped_at, timeout=TAKEOVER_BOUND)
    assert writer_runs(cluster, TOKENS) == ["op-a", "op-b"]
    assert not [i for i in status_writes(cluster, "op-a") if i > stopped_at]


def test_a_leader_cut_off_from_the_lease_stops_writing_before_it_could_be_taken(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, replicas: dict[str, OperatorProc]
) -> None:
    """Lease writes answer 503 (the API partitioned from this replica): after the renew
    deadline it ends its term and writes nothing more; when the API heals it leads again."""
    a = replicas["op-a"]
    cluster.create(validation())
    a.start()
    wait_status_write(cluster, "op-a")
    lease_puts = kmock.method.PUT, kmock.resource("coordination.k8s.io", "v1", "leases")
    failing = 24  # 12 s of attempts at a 0.5 s retry period: 6 s to lose, 6 s standing by

    async def cut_off() -> None:
        done = len(list(cluster.api[lease_puts]))
        cluster.api[lease_puts][done : done + failing] << 503

    cluster.call(cut_off)
    wait_for(lambda: "standing by again after losing leadership" in a.log(), timeout=30,
             what=f"op-a ends its term\n{a.log()[-2000:]}")  # fmt: skip
    stopped_at = _last_request(cluster)
    publish(mosquitto_broker, [report_msg(report("gpu-a", Status.FAIL))])  # a change to write

    def lease_attempts_since() -> bool:  # standing by, it keeps trying: time enough to see
        return len([w for w in writes(cluster, leases=True) if w[0] > stopped_at]) >= 4

    wait_for(lease_attempts_since, timeout=30, what="op-a trying to take the Lease back")
    assert [w for w in writes(cluster) if w[0] > stopped_at] == []  # no status, no taints
    # the API heals: the same replica leads again, from fresh state, and writes the change
    wait_status_write(cluster, "op-a", after=stopped_at, timeout=60)
    assert "leading: acquired Lease" in a.log().split("standing by again")[-1]
