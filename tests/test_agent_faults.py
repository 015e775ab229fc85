"""An agent never goes silent: a check that raises, a collector read that blocks.

- A raising check becomes one `error` result naming it (exception type and message, no
  traceback) and the rest of the report still goes out: unit level and through the real
  `netval agent` process (a wrapper replaces one check, then runs the real entry point).
- A blocked read: the real `netval agent` process in a private mount namespace where a FIFO
  is bind-mounted over /sys/class/net/lo/carrier, so the live collector's open() blocks until
  the test writes to it. The report still goes out on time with `error` results naming the
  file, the event loop keeps serving (metrics, MQTT), the blocked read costs one thread, not
  one per cycle, and the agent recovers when the read completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mosquitto
from kube import wait_for
from netns import netval_script
from netval.agent import checks as checks_module
from netval.agent.checks import NODE_CHECKS, run_node_checks
from netval.agent.checks.context import CheckContext
from netval.agent.config import AgentConfig
from netval.agent.peers.echo import probe_peer
from netval.agent.peers.target import PeerTarget, ProbeSettings
from netval.agent.runner import ProbeRunner
from netval.agent.sampling import BoundedSampler, SampleMissing, blocked_at
from netval.infra.telemetry import make_tracer_provider
from netval.model import CheckId, Report, Sample, Status
from netval.model.results import CheckResult
from netval.model.snapshot import NodeSnapshot
from netval.model.spec import Checks, PeerChecks
from test_agent import (
    LO_CHECKS,
    NODE,
    PREFIX,
    VALIDATION,
    ListSink,
    agent_config,
    next_message,
    stop_process,
    subscribed,
    tail,
    write_agent_files,
)

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parents[1] / "src"
EMPTY = Sample(netdevs={}, rdma={})
FAST_ECHO = ProbeSettings(count=20, spacing=0.001, reply_timeout=0.3)


def _boom(_ctx: CheckContext) -> list[CheckResult]:
    raise RuntimeError("injected: counters went backwards\nsecond line")


# -- a check that raises: unit level --------------------------------------------------------


def test_a_raising_check_gives_one_error_result_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    baseline = run_node_checks(NodeSnapshot("n1", "now", 10.0, (EMPTY, EMPTY)), Checks())
    raised: list[tuple[CheckId, Exception]] = []
    monkeypatch.setitem(NODE_CHECKS, CheckId.PFC_TRUST, _boom)
    results = run_node_checks(
        NodeSnapshot("n1", "now", 10.0, (EMPTY, EMPTY)),
        Checks(),
        on_raise=lambda c, e: raised.append((c, e)),
    )
    (error,) = [r for r in results if r.check is CheckId.PFC_TRUST]
    assert error.status is Status.ERROR and error.subject == "n1"
    assert error.message == (
        "check pfc.trust raised RuntimeError: injected: counters went backwards second line"
    )
    assert error.observed == {"exception": "RuntimeError"}
    assert [c for c, _ in raised] == [CheckId.PFC_TRUST]
    # every other check's results, in the same order
    others = [r for r in baseline if r.check is not CheckId.PFC_TRUST]
    assert [r for r in results if r.check is not CheckId.PFC_TRUST] == others


def test_a_long_exception_message_is_cut_short(monkeypatch: pytest.MonkeyPatch) -> None:
    def huge(_ctx: CheckContext) -> list[CheckResult]:
        raise ValueError("x" * 5000)

    monkeypatch.setitem(NODE_CHECKS, CheckId.RDMA_RATE, huge)
    results = run_node_checks(NodeSnapshot("n1", "now", 10.0, (EMPTY, EMPTY)), Checks())
    (error,) = [r for r in results if r.check is CheckId.RDMA_RATE]
    assert error.status is Status.ERROR and len(error.message) < 400
    assert error.message.endswith("...")


def test_a_context_that_cannot_be_built_fails_every_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_a: object) -> CheckContext:
        raise KeyError("netdevs")

    monkeypatch.setattr(checks_module, "make_context", broken)
    results = run_node_checks(NodeSnapshot("n1", "now", 10.0, (EMPTY, EMPTY)), Checks())
    assert [r.check for r in results] == list(NODE_CHECKS)
    assert {r.status for r in results} == {Status.ERROR}
    assert "raised KeyError" in results[0].message


# -- the sampler: deadline, one stuck thread at most, recovery -----------------------------


class GatedCollector:
    """sample() blocks until `gate` is set (as open() on a FIFO blocks until a writer)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls = 0

    def sample(self) -> Sample:
        self.calls += 1
        path = Path("/sys/class/net/eth9/carrier")  # what blocked_at reports  # noqa: F841
        self.gate.wait(30)
        return EMPTY


def _collector_threads() -> int:
    return sum(t.name == "netval-collector" for t in threading.enumerate())


def test_sampler_deadline_bounds_threads_and_recovers() -> None:
    collector = GatedCollector()
    sampler = BoundedSampler(collector, deadline=0.2)

    async def scenario() -> None:
        before = _collector_threads()
        first = await sampler.sample()
        assert isinstance(first, SampleMissing)
        assert "did not finish within 0.2 s" in first.reason
        assert "blocked at /sys/class/net/eth9/carrier" in first.reason
        assert sampler.blocked
        # while blocked: answered at once, no new read and no new thread
        t0 = time.monotonic()
        for _ in range(5):
            again = await sampler.sample()
            assert isinstance(again, SampleMissing) and "still blocked" in again.reason
        assert time.monotonic() - t0 < 0.5
        assert collector.calls == 1
        assert _collector_threads() == before + 1
        assert sampler.timeouts == 6
        # the read completes: the next sample is a fresh one, on the same thread
        collector.gate.set()
        await asyncio.to_thread(wait_for, lambda: not sampler.blocked, timeout=5)
        assert await sampler.sample() == EMPTY
        assert collector.calls == 2 and sampler.latest == EMPTY
        assert sampler.latest_source().sample() == EMPTY
        assert _collector_threads() == before + 1

    try:
        asyncio.run(asyncio.wait_for(scenario(), 20))
    finally:
        collector.gate.set()
        sampler.close()


def test_sampler_hands_back_a_raising_read() -> None:
    class Raising:
        def sample(self) -> Sample:
            raise OSError("EIO")

    sampler = BoundedSampler(Raising(), deadline=1)
    got = asyncio.run(sampler.sample())
    sampler.close()
    assert got == SampleMissing("collector read raised OSError: EIO")
    assert sampler.errors == 1 and not sampler.blocked


def test_blocked_at_without_a_path_names_the_function() -> None:
    assert blocked_at(None) is None
    where = blocked_at(sys._getframe())
    assert where is not None and where.startswith("test_blocked_at_without_a_path")


def test_runner_publishes_errors_for_a_missed_sample() -> None:
    collector = GatedCollector()
    config = AgentConfig.model_validate(agent_config(LO_CHECKS, interval="5s"))
    provider = make_tracer_provider({}, default_service="netval-agent")
    sink = ListSink()
    runner = ProbeRunner(
        config=config,
        node=NODE,
        collector=collector,
        sink=sink,
        tracer_provider=provider,
        sample_deadline=0.2,
    )
    try:
        report = asyncio.run(asyncio.wait_for(runner.probe_once(), 10))
    finally:
        collector.gate.set()
        runner.sampler.close()
        provider.shutdown()
    assert [r.check for r in report.results] == list(NODE_CHECKS)
    assert {r.status for r in report.results} == {Status.ERROR}
    assert report.status is Status.ERROR
    # the baseline read missed its deadline; the cycle's own read found it still blocked
    assert report.results[0].message.startswith("not judged: collector read still blocked")
    assert "/sys/class/net/eth9/carrier" in report.results[0].message
    assert report.duration_ms < 2000
    assert sink.reports == [report]


# -- the real `netval agent` process ---------------------------------------------------------

_RAISING_AGENT = textwrap.dedent(
    """
    import sys
    from netval.agent import checks
    from netval.model.ids import CheckId

    def boom(ctx):
        raise RuntimeError("injected: counters went backwards")

    checks.NODE_CHECKS[CheckId.PFC_TRUST] = boom
    from netval.cli import main
    sys.exit(main(["agent"]))
    """
)


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )


async def _next_report(broker: mosquitto.MosquittoBroker, within: float) -> Report:
    async with subscribed(broker, f"{PREFIX}/report") as sub:
        deadline = time.monotonic() + within
        while True:
            message = await next_message(sub, max(deadline - time.monotonic(), 0.01))
            if message.retain:
                continue  # a previous cycle's
            assert isinstance(message.payload, bytes)
            return Report.model_validate_json(message.payload)


def test_agent_process_reports_a_raising_check_as_error(
    tmp_path: Path, mosquitto_broker: mosquitto.MosquittoBroker
) -> None:
    env = write_agent_files(tmp_path, mosquitto_broker, agent_config(LO_CHECKS, interval="5s"))
    env["PYTHONPATH"] = str(SRC)
    log_path = tmp_path / "agent.log"
    proc = _spawn([sys.executable, "-c", _RAISING_AGENT], env, log_path)
    try:
        report = asyncio.run(_next_report(mosquitto_broker, 12))
    except TimeoutError:
        raise AssertionError(f"no report within 12 s\n{tail(log_path)}") from None
    finally:
        stop_process(proc)
    by_check = {(r.check, r.subject): r for r in report.results}
    error = by_check[(CheckId.PFC_TRUST, NODE)]
    assert error.status is Status.ERROR
    assert error.message == "check pfc.trust raised RuntimeError: injected: counters went backwards"
    assert "Traceback" not in report.to_json()
    # the other checks still judged lo
    assert by_check[(CheckId.LINK_CARRIER, "lo")].status is Status.PASS
    assert by_check[(CheckId.MTU_INTERFACE, "lo")].status is Status.FAIL
    assert report.status is Status.ERROR
    # the traceback goes to the log, for whoever fixes the check
    log_text = tail(log_path, 20000)
    assert "check pfc.trust raised" in log_text and "Traceback" in log_text


@pytest.fixture
def carrier_fifo(tmp_path: Path) -> Iterator[Path]:
    fifo = tmp_path / "carrier"
    os.mkfifo(fifo)
    yield fifo


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def _metrics(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    body = await asyncio.wait_for(reader.read(), 3)
    writer.close()
    return body.decode()


class FifoFeeder:
    """Answers every open() of the FIFO with "1" (lo's carrier), from a thread, until
    stopped: each read of a FIFO blocks until a writer opens it, so recovery needs one
    writer per read."""

    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        self.stop = threading.Event()
        self.fed = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FifoFeeder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                # Non-blocking: ENXIO while no reader has it open, so stop stays prompt.
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                self.stop.wait(0.01)
                continue
            try:
                os.write(fd, b"1\n")
                self.fed += 1
            finally:
                os.close(fd)
            self.stop.wait(0.01)


def test_agent_process_with_a_blocked_sysfs_read(
    tmp_path: Path, mosquitto_broker: mosquitto.MosquittoBroker, carrier_fifo: Path
) -> None:
    """interval 5 s, so the read deadline is 2.5 s: reports keep coming every interval."""
    peer_port = mosquitto.free_port()
    peers = {"enabled": True, "interface": "lo", "port": peer_port}
    config = agent_config({**LO_CHECKS, "peers": peers}, interval="5s")
    # every cycle in full: the blocked cycles are alike, and this test reads each one's report
    config["spec"]["report"] = {"fullEvery": 1}
    env = write_agent_files(tmp_path, mosquitto_broker, config)
    metrics_port = mosquitto.free_port()
    env.update(PYTHONPATH=str(SRC), NETVAL_METRICS_ADDR=f"127.0.0.1:{metrics_port}")
    carrier = "/sys/class/net/lo/carrier"
    script = f'mount --bind "$1" {carrier} && exec "$2" agent'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    log_path = tmp_path / "agent.log"
    proc = _spawn([*argv, str(carrier_fifo), netval_script()], env, log_path)

    def diagnostics() -> str:
        return f"-- agent log --\n{tail(log_path)}"

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with subscribed(mosquitto_broker, f"{PREFIX}/#") as sub:
            deadline = time.monotonic() + 20
            reports: list[Report] = []
            while len(reports) < 2:
                message = await next_message(sub, max(deadline - time.monotonic(), 0.01))
                topic = str(message.topic)
                if topic.endswith("/state"):
                    seen.setdefault("states", []).append(message.payload)
                elif topic.endswith("/report") and not message.retain:
                    assert isinstance(message.payload, bytes)
                    reports.append(Report.model_validate_json(message.payload))
                    seen.setdefault("threads", []).append(_threads(proc.pid))
                    seen.setdefault("arrived", []).append(time.monotonic())
            seen["blocked"] = reports
            # the loop still serves while the read is stuck: metrics, the peer responder
            seen["metrics"] = await _metrics(metrics_port)
            target = PeerTarget("agent", "127.0.0.1", peer_port, None)
            seen["echo"] = await probe_peer(
                target, checks=PeerChecks(enabled=True), mtu=1500, settings=FAST_ECHO
            )
            with FifoFeeder(carrier_fifo):
                while True:
                    left = max(deadline + 15 - time.monotonic(), 0.01)
                    message = await next_message(sub, left)
                    if not str(message.topic).endswith("/report") or message.retain:
                        continue
                    assert isinstance(message.payload, bytes)
                    report = Report.model_validate_json(message.payload)
                    if any(r.subject == "lo" for r in report.results):
                        seen["recovered"] = report
                        return seen

    try:
        seen = asyncio.run(scenario())
    except TimeoutError:
        raise AssertionError(f"reports stopped\n{diagnostics()}") from None
    finally:
        alive = proc.poll() is None
        if alive:
            # SIGTERM with the next read blocked again (the feeder has stopped): still a
            # clean, prompt exit (the reader is a daemon thread)
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(8)
        stopped_rc = proc.poll()
        stop_process(proc)
    assert alive, diagnostics()
    assert stopped_rc == 0, (stopped_rc, diagnostics())
    for report in seen["blocked"]:
        by_check = {(r.check, r.subject): r for r in report.results}
        error = by_check[(CheckId.LINK_CARRIER, NODE)]
        assert error.status is Status.ERROR, report
        assert carrier in error.message, error.message
        node_checks = [r for r in report.results if r.check in NODE_CHECKS]
        assert [r.check for r in node_checks] == list(NODE_CHECKS)
        assert {r.status for r in node_checks} == {Status.ERROR}
        assert (CheckId.LINK_CARRIER, "lo") not in by_check
        # the peer group still ran (alone in the fleet: nothing to probe, not an error)
        assert any(r.check.group.value == "peer" for r in report.results), report
    latency, loss = seen["echo"][:2]
    assert (latency.check, latency.status) == (CheckId.PEER_LATENCY, Status.PASS), latency
    assert (loss.check, loss.status) == (CheckId.PEER_LOSS, Status.PASS), loss
    second = seen["blocked"][1]
    assert "still blocked after" in second.results[0].message
    # no slot missed although every read blocks (2.5 s deadline, then answered at once)
    assert seen["arrived"][1] - seen["arrived"][0] < 7.5, seen["arrived"]
    # the stuck read costs one thread, not one per cycle
    assert seen["threads"][0] == seen["threads"][1], seen["threads"]
    # never offline: keepalives went on
    assert b"offline" not in seen.get("states", []), seen.get("states")
    assert "netval_collector_blocked 1.0" in seen["metrics"], seen["metrics"][-2000:]
    assert "netval_mqtt_connected 1.0" in seen["metrics"]
    # the read completed: lo is judged again
    recovered = seen["recovered"]
    carrier_result = [r for r in recovered.results if r.check is CheckId.LINK_CARRIER]
    assert [(r.subject, r.status) for r in carrier_result] == [("lo", Status.PASS)], recovered
    assert recovered.validation == VALIDATION


class RaisingPeers:
    """Stands in for PeerService in one call only: its probe cycle raises. Any other
    attribute the runner might use fails loudly (AttributeError), never answers None."""

    __slots__ = ()

    async def probe_cycle(self, cycle: int, spec: object) -> list[CheckResult]:
        raise ConnectionResetError("peer table vanished")


def test_a_raising_peer_probe_is_one_error_and_the_node_checks_still_go_out() -> None:
    config = AgentConfig.model_validate(
        agent_config({**LO_CHECKS, "peers": {"enabled": True}}, interval="5s")
    )
    provider = make_tracer_provider({}, default_service="netval-agent")
    sink = ListSink()

    class Lo:
        def sample(self) -> Sample:
            return EMPTY

    runner = ProbeRunner(
        config=config,
        node=NODE,
        collector=Lo(),
        sink=sink,
        tracer_provider=provider,
        peers=RaisingPeers(),  # type: ignore[arg-type]
    )
    try:
        report = asyncio.run(asyncio.wait_for(runner.probe_once(), 10))
    finally:
        runner.sampler.close()
        provider.shutdown()
    (peer,) = [r for r in report.results if r.check.group.value == "peer"]
    assert peer.check is CheckId.PEER_LATENCY and peer.status is Status.ERROR
    assert peer.message == "check peer.latency raised ConnectionResetError: peer table vanished"
    assert [r.check for r in report.results if r.check in NODE_CHECKS] == list(NODE_CHECKS)
    assert sink.reports == [report]
