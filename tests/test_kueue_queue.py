"""The Kueue controller's per-Workload reconciliation: the keyed work queue (dedup, per-item
backoff), what is cached, and which Workloads a node's verdict change requeues.

The controller runs on a real `OperatorRuntime` (its store filled as the Kopf and MQTT
handlers fill it) against the API stand-in of bench/kueue_scale.py, which keeps the objects
in memory, refuses stale resourceVersions and fails loudly on a call it does not know."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from netval.operator.kube.work_queue import WorkQueue
from netval.operator.kueue.controller import KueueController
from test_bench_standins import bench

scale = bench("kueue_scale")
NODES = 4 * scale.PER_RACK  # four racks


async def until(pred: Callable[[], Any], what: str, limit: float = 30.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not (value := pred()):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
    return value


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())  # type: ignore[arg-type]


# -- the queue ------------------------------------------------------------------------------


def test_a_key_added_twice_is_processed_once_and_again_if_added_while_processed() -> None:
    async def main() -> None:
        queue: WorkQueue[str] = WorkQueue()
        queue.add("a")
        queue.add("b")
        queue.add("a")  # waiting already: deduplicated
        assert len(queue) == 2 and queue.adds == 2
        assert await queue.get() == "a"
        queue.add("a")  # while a worker has it: queued again once it is done, not before
        assert await queue.get() == "b"
        assert len(queue) == 0
        queue.done("b")
        queue.done("a")
        assert await queue.get() == "a"
        queue.done("a")
        assert queue.idle

    run(main)


def test_backoff_doubles_per_failure_up_to_the_cap_and_forget_resets_it() -> None:
    async def main() -> None:
        queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.04)
        delays = [queue.add_rate_limited("k") for _ in range(4)]
        assert delays == [0.01, 0.02, 0.04, 0.04]
        assert queue.failures("k") == 4
        assert await asyncio.wait_for(queue.get(), 30) == "k"  # one delayed add, not four
        queue.done("k")
        assert len(queue) == 0
        queue.forget("k")
        assert queue.add_rate_limited("k") == 0.01
        queue.close()

    run(main)


# -- the controller ---------------------------------------------------------------------------


class Cluster:
    """An operator runtime with NODES nodes (four racks) and the API stand-in."""

    def __init__(self) -> None:
        self.custom = scale.StandInCustomObjects()
        self.kube = scale.StandInKube(self.custom)
        self.runtime = scale.operator_runtime(NODES, self.kube)
        self.ours = scale.admission_check(
            scale.CHECK, "netval.io/fabric",
            {"apiGroup": "netval.io", "kind": "NetworkValidation", "name": scale.VALIDATION},
        )  # fmt: skip
        self.custom.add("admissionchecks", self.ours)

    def add(self, index: int, rack: int | None, checks: list[tuple[str, str]],
            admitted: bool) -> dict[str, Any]:  # fmt: skip
        body = scale.workload(index, rack, checks, admitted)
        self.custom.add("workloads", body)
        return copy.deepcopy(body)

    def state(self, index: int) -> str:
        body = self.custom.objects[("workloads", "team-a", f"wl-{index:05d}")]
        return str(next(c["state"] for c in body["status"]["admissionChecks"]
                        if c["name"] == scale.CHECK))  # fmt: skip

    def controller(self) -> KueueController:
        controller = KueueController({"runtime": self.runtime}, interval=0.05)
        self.custom.loop = asyncio.get_running_loop()
        self.custom.on_event = controller.on_event
        return controller


def key(index: int) -> tuple[str, str]:
    return ("team-a", f"wl-{index:05d}")


def test_a_verdict_change_on_a_node_requeues_only_the_workloads_placed_on_it() -> None:
    async def main() -> None:
        cluster = Cluster()
        controller = cluster.controller()
        controller.on_event("admissionchecks", "ADDED", copy.deepcopy(cluster.ours))
        for i in range(4):  # one admitted Workload per rack
            controller.on_event("workloads", "ADDED",
                                cluster.add(i, i, [(scale.CHECK, "Ready")], admitted=True))  # fmt: skip
        controller.start()
        try:
            await until(lambda: len(controller.assignments.placed) == 4, "all placed")
            await until(lambda: controller.queue.idle, "the queue idle")
            requeued: list[tuple[str, str]] = []
            add = controller.queue.add
            controller.queue.add = lambda k: (requeued.append(k), add(k))[1]  # type: ignore[method-assign]
            ticks = controller.reconciles
            scale.fail_node(cluster.runtime, 2 * scale.PER_RACK + 5)  # a node of rack 2
            await until(lambda: requeued, "a requeue")
            await until(lambda: controller.queue.idle, "the queue idle")
            assert set(requeued) == {key(2)}
            assert controller.reconciles > ticks
            assert all(cluster.state(i) == "Ready" for i in range(4))  # admitted: runs on
            assert controller.patches == 1  # the AdmissionCheck's Active, no Workload write
        finally:
            await controller.stop()
            cluster.kube.close()

    run(main)


def test_a_workload_without_our_check_is_not_cached_until_its_check_turns_out_ours() -> None:
    async def main() -> None:
        cluster = Cluster()
        controller = cluster.controller()
        controller.start()
        try:
            # the Workloads' events before the AdmissionCheck's (a start-up's order)
            controller.on_event(
                "workloads", "ADDED", cluster.add(0, 0, [(scale.CHECK, "Pending")], admitted=False)
            )
            controller.on_event(
                "workloads", "ADDED", cluster.add(1, 1, [("prov", "Pending")], admitted=False)
            )
            controller.on_event("workloads", "ADDED",
                                cluster.add(2, None, [], admitted=False))  # fmt: skip
            await until(lambda: controller.queue.idle, "the queue idle")
            assert controller.workloads == {}
            assert controller.workload_cache.others == {key(0): {scale.CHECK},
                                                        key(1): {"prov"}}  # fmt: skip
            controller.on_event("admissionchecks", "ADDED", copy.deepcopy(cluster.ours))
            await until(lambda: cluster.state(0) == "Ready", "wl-0 Ready (read from the API)")
            assert set(controller.workloads) == {key(0)}
            assert cluster.custom.calls["get_namespaced_custom_object"] >= 1
            # a Workload that stops naming our check leaves the cache
            body = copy.deepcopy(cluster.custom.objects[("workloads", "team-a", "wl-00000")])
            body["status"]["admissionChecks"] = [{"name": "prov", "state": "Pending"}]
            body["metadata"]["resourceVersion"] = "999"
            controller.on_event("workloads", "MODIFIED", body)
            assert controller.workloads == {}
        finally:
            await controller.stop()
            cluster.kube.close()

    run(main)


def test_a_failing_patch_is_retried_with_backoff() -> None:
    async def main() -> None:
        cluster = Cluster()
        patch = cluster.custom.patch_namespaced_custom_object_status
        attempts: list[int] = []

        def failing(*args: Any, **kwargs: Any) -> Any:
            attempts.append(1)
            if len(attempts) <= 3:
                raise ApiException(status=500, reason="Internal Server Error")
            return patch(*args, **kwargs)

        cluster.custom.patch_namespaced_custom_object_status = failing  # type: ignore[method-assign]
        controller = cluster.controller()
        controller.queue.base_delay = 0.01
        delays: list[float] = []
        backoff = controller.queue.add_rate_limited
        controller.queue.add_rate_limited = (  # type: ignore[method-assign]
            lambda k: (d := backoff(k), delays.append(d))[0]
        )
        controller.on_event("admissionchecks", "ADDED", copy.deepcopy(cluster.ours))
        controller.on_event("workloads", "ADDED",
                            cluster.add(0, 0, [(scale.CHECK, "Pending")], admitted=False))  # fmt: skip
        controller.start()
        try:
            await until(lambda: cluster.state(0) == "Ready", "wl-0 Ready after the failures")
            assert len(attempts) == 4
            assert delays == [0.01, 0.02, 0.04]  # doubling per failure of this key
            await until(lambda: controller.queue.failures(key(0)) == 0, "forgotten")
        finally:
            await controller.stop()
            cluster.kube.close()

    run(main)


def test_the_bench_stand_in_fails_loudly() -> None:
    custom = scale.StandInCustomObjects()
    with pytest.raises(AttributeError, match="stand-in"):
        custom.delete_namespaced_custom_object  # noqa: B018
    kube = scale.StandInKube(custom)
    try:
        with pytest.raises(AttributeError, match="stand-in"):
            kube.patch_status  # noqa: B018
    finally:
        kube.close()
