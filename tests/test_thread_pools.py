"""The operator's worker threads (`netval.operator.thread_pools`): no call site under
`netval.operator` uses asyncio's default executor; each concern's pool is bounded and named;
and a concern that hangs does not starve another: with every TokenReview of an enrollment
storm hanging in the test API, the operator's loop still resolves a broker address in the
default executor (as aiomqtt's connect does for every MQTT session the operator opens), and
the hung requests end once the API answers.
"""

from __future__ import annotations

import ast
import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube import KubeCluster, wait_for
from netval.operator import thread_pools
from netval.operator.thread_pools import SIZES, Concern, PoolsClosed, ThreadPools
from test_enrollment import Enrollment, csr_for, running_enrollment

OPERATOR_SRC = Path(thread_pools.__file__).parent
POOLS_MODULE = Path(thread_pools.__file__)


def _calls(path: Path) -> Iterator[tuple[str, ast.Call]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            yield name, node


def _bypasses_the_pools(name: str, call: ast.Call, path: Path) -> bool:
    """`to_thread`; `run_in_executor` or a `ThreadPoolExecutor` outside thread_pools.py;
    `run_in_executor(None, ...)` anywhere."""
    if name == "to_thread":
        return True
    if name not in ("run_in_executor", "ThreadPoolExecutor"):
        return False
    default = name == "run_in_executor" and (
        not call.args or (isinstance(call.args[0], ast.Constant) and call.args[0].value is None)
    )
    return default or path != POOLS_MODULE


def test_no_operator_call_site_uses_the_default_executor_or_a_pool_of_its_own() -> None:
    found = [
        f"{path.relative_to(OPERATOR_SRC)}:{call.lineno} {name}"
        for path in sorted(OPERATOR_SRC.rglob("*.py"))
        for name, call in _calls(path)
        if _bypasses_the_pools(name, call, path)
    ]
    assert found == [], "use netval.operator.thread_pools (a bounded pool per concern)"


def test_a_concerns_pool_is_bounded_named_and_closed_with_its_owner() -> None:
    async def scenario() -> tuple[int, set[str]]:
        pools = ThreadPools({Concern.STATUS})
        loop = asyncio.get_running_loop()
        full = asyncio.Event()  # every thread of the pool busy
        release = threading.Event()
        lock = threading.Lock()
        running = peak = 0
        names: set[str] = set()

        def blocked() -> None:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
                names.add(threading.current_thread().name.rsplit("_", 1)[0])
                if running == SIZES[Concern.STATUS]:
                    loop.call_soon_threadsafe(full.set)
            release.wait(10)
            with lock:
                running -= 1

        calls = [
            asyncio.ensure_future(pools.run(Concern.STATUS, blocked))
            for _ in range(SIZES[Concern.STATUS] + 3)
        ]
        await asyncio.wait_for(full.wait(), 10)
        release.set()
        await asyncio.wait_for(asyncio.gather(*calls), 10)
        pools.close()
        with pytest.raises(PoolsClosed):
            await pools.run(Concern.STATUS, lambda: None)
        with pytest.raises(ValueError, match="not one of"):
            pools.executor(Concern.NODES)
        reopening = ThreadPools({Concern.ENROLL}, reopen=True)
        reopening.close()
        assert await reopening.run(Concern.ENROLL, lambda: 7) == 7
        reopening.close()
        return peak, names

    peak, names = asyncio.run(scenario())
    assert peak == SIZES[Concern.STATUS]
    assert names == {"netval-kube-status"}


@pytest.fixture
def enrollment(tmp_path: Path, kube: KubeCluster) -> Iterator[Enrollment]:
    with running_enrollment(tmp_path, kube) as env:
        yield env


def test_hung_token_reviews_do_not_keep_an_mqtt_connect_from_the_default_executor(
    enrollment: Enrollment,
) -> None:
    e = enrollment
    # More hung reviews than asyncio's default executor has threads (cpu + 4, capped at 32):
    # sharing it, they would hold every thread aiomqtt's connect needs.
    default_threads = min(32, (os.cpu_count() or 1) + 4)
    storm = min(SIZES[Concern.ENROLL], e.service.server.max_active)
    assert storm > default_threads or default_threads >= 32, "a storm too small to starve"
    tokens = [e.agent_token(f"agent-{i}", f"node-{i}") for i in range(storm)]
    fault = e.kube.inject("POST", r"/tokenreviews", hang=60)
    answers: list[int] = []

    def enroll(token: str, node: str) -> None:
        status, _ = e.post(token, {"node": node, "csr": csr_for(f"pool/{node}")})
        answers.append(status)

    posts = [
        threading.Thread(target=enroll, args=(token, f"node-{i}"), daemon=True)
        for i, token in enumerate(tokens)
    ]
    for post in posts:
        post.start()
    try:
        # every review of the storm in flight at once, more than the default executor's
        # threads (sharing it, the rest would queue until the first ones time out)
        wait_for(lambda: fault.hits >= storm, timeout=30, what="every review hanging")

        # An MQTT session reconnects while they hang (a broker restart, say): aiomqtt's
        # connect resolves the broker's address in the loop's default executor.
        async def resolve() -> list[object]:
            loop = asyncio.get_running_loop()
            return list(await loop.getaddrinfo("127.0.0.1", e.mqtt_port))

        assert e.loop.run(resolve(), timeout=15), "the default executor starved"
        assert not answers, "the hung reviews were still hanging while the connect resolved"
    finally:
        e.kube.clear_faults()
        for post in posts:
            post.join(30)
    # The API answers again: the storm's requests end (enrolled, or a retryable 503 when
    # the client's read timeout had already ended a review).
    assert len(answers) == storm and set(answers) <= {200, 503}, answers
