"""Two real `netval operator` replicas against one test API and one broker: one leads on the
Lease, the other stands by and writes nothing; SIGKILL of the leader hands over within the
documented bound (lease duration + retry period + a term's start); the restarted replica
stays standby; a clean stop hands over at once; a frozen leader (SIGSTOP) that resumes after
the takeover sends nothing more and exits; a leader cut off from the Lease exits before its
Lease could be taken. Writes are counted per replica at the test API (each replica has its
own bearer token)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import kmock
import pytest

from kube import KubeCluster, wait_for
from mosquitto import MosquittoBroker, free_port
from netval.model import Status
from netval.model.keys import LabelKey
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
FABRIC = LabelKey.FABRIC.value
INTERVAL = 5  # seconds, the shortest allowed: reports go stale after 15 s
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


class Agents:
    """Reports of passing nodes every second, as their agents would send them, on a thread
    of its own: they keep coming while the leader is frozen."""

    def __init__(self, broker: MosquittoBroker, nodes: tuple[str, ...]) -> None:
        self.broker = broker
        self.nodes = nodes
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):  # the broker gone at teardown
                publish(self.broker, [report_msg(report(n)) for n in self.nodes])
            self.stop.wait(1.0)

    def __enter__(self) -> Agents:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_a_frozen_leader_resuming_after_the_takeover_sends_nothing_and_exits(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, replicas: dict[str, OperatorProc]
) -> None:
    """SIGSTOP of the leader (a VM pause, a GC or swap storm) for longer than 3 intervals,
    while the agents keep reporting: the standby takes the Lease and writes; SIGCONT: the old
    leader, whose clock says every report is stale (it missed them), would label the nodes
    `unknown` and write that status. It finds by its own monotonic clock that its renew
    deadline passed while it was frozen, sends not one request more, not even to the Lease,
    and exits 1. Before the write fence it overwrote the new leader's status 15 ms after
    logging the loss, and labelled healthy nodes `unknown` for seconds after resuming."""
    a, b = replicas["op-a"], replicas["op-b"]
    nodes = ("gpu-a", "gpu-b", "gpu-c")
    cluster.create(validation(interval=f"{INTERVAL}s"))
    a.start()
    wait_status_write(cluster, "op-a")
    b.start()
    wait_for(lambda: _standing_by(b), timeout=60, what=f"op-b standing by\n{b.log()[-2000:]}")
    with Agents(mosquitto_broker, nodes):
        wait_for(lambda: status_of(cluster).get("nodes", {}).get("passing") == 3, timeout=30,
                 what="the leader folded the reports")  # fmt: skip
        wait_for(lambda: _labels(cluster, nodes) == dict.fromkeys(nodes, "healthy"),
                 timeout=30, what="op-a labelled the nodes")  # fmt: skip

        a.freeze()
        frozen_at, frozen = _last_request(cluster), time.monotonic()
        first = wait_status_write(cluster, "op-b", after=frozen_at, timeout=TAKEOVER_BOUND)
        # frozen past 3 intervals: every report op-a holds is stale by its clock
        wait_for(lambda: time.monotonic() - frozen > 3 * INTERVAL + 1
                 and status_of(cluster).get("nodes", {}).get("passing") == 3,
                 timeout=60, what="op-b leading, op-a's reports stale")  # fmt: skip
        assert not [w for w in writes(cluster, leases=True, since=frozen_at + 1)
                    if w[1] == "op-a"]  # fmt: skip

        a.thaw()
        code = wait_for(lambda: (a.exited(),) if a.exited() is not None else None, timeout=30,
                        what=f"op-a exiting after it resumed\n{a.log()[-3000:]}")[0]  # fmt: skip
        assert code == 1, a.log()[-3000:]
        assert "leadership lost: exiting" in a.log()
        late = [w for w in writes(cluster, leases=True, since=first) if w[1] == "op-a"]
        assert late == [], f"op-a wrote after op-b's first write: {late}"
        assert status_of(cluster)["nodes"]["passing"] == 3  # op-b's status stands
        assert _labels(cluster, nodes) == dict.fromkeys(nodes, "healthy")
    assert writer_runs(cluster, TOKENS) == ["op-a", "op-b"]


def _labels(kube: KubeCluster, nodes: tuple[str, ...]) -> dict[str, str | None]:
    return {n: kube.get("v1", "nodes", n)["metadata"].get("labels", {}).get(FABRIC) for n in nodes}


def test_a_leader_cut_off_from_the_lease_exits_before_it_could_be_taken(
    cluster: KubeCluster, mosquitto_broker: MosquittoBroker, replicas: dict[str, OperatorProc]
) -> None:
    """Lease writes answer 503 (the API partitioned from this replica): at the renew deadline
    it stops writing and exits 1 (controller-runtime's model), before its Lease could be
    taken; restarted (by its Deployment) once the API heals, it leads again from fresh state."""
    a = replicas["op-a"]
    cluster.create(validation())
    a.start()
    wait_status_write(cluster, "op-a")
    lease_puts = kmock.method.PUT, kmock.resource("coordination.k8s.io", "v1", "leases")
    failing = 24  # 12 s of attempts at a 0.5 s retry period: 6 s to lose, the rest after

    async def cut_off() -> None:
        done = len(list(cluster.api[lease_puts]))
        cluster.api[lease_puts][done : done + failing] << 503

    cluster.call(cut_off)
    code = wait_for(lambda: (a.exited(),) if a.exited() is not None else None, timeout=30,
                    what=f"op-a exiting\n{a.log()[-2000:]}")[0]  # fmt: skip
    assert code == 1
    log = a.log()
    assert log.index("lost leadership: no renewal") < log.index("leadership lost: exiting")
    stopped_at = _last_request(cluster)
    publish(mosquitto_broker, [report_msg(report("gpu-a", Status.FAIL))])  # a change to write
    # restarted, as its Deployment would: the same replica leads again and writes the change
    a.start()
    wait_status_write(cluster, "op-a", after=stopped_at, timeout=60)
    assert "leading: acquired Lease" in a.log()
    wait_for(lambda: status_of(cluster).get("nodes", {}).get("failing") == 1, timeout=30,
             what="the restarted leader folded the report")  # fmt: skip
