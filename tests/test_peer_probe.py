"""Peer responder, probes and the agent glue over real loopback sockets (no root needed).

127.0.0.0/8 is all loopback, so two "nodes" bind 127.0.0.1 and 127.0.0.2 on the same port,
as two agents bind the same `peers.port` on their own fabric addresses.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

import pytest

import mosquitto
from netval.agent.peers.echo import jitter, percentile, probe_peer
from netval.agent.peers.responder import PeerResponder, ResponderLimits
from netval.agent.peers.service import PeerService
from netval.agent.peers.target import PeerTarget, ProbeSettings
from netval.agent.peers.throughput import measure_throughput
from netval.agent.peers.wire import TCP_HEADER, TCP_HELLO, TCP_MAGIC, UDP_HEADER, UDP_MAGIC
from netval.model.ids import CheckId, Status
from netval.model.spec import NetworkValidationSpec, PeerChecks
from netval.model.topics import DropReason

pytestmark = pytest.mark.timeout(30)

FAST = ProbeSettings(count=20, spacing=0.001, reply_timeout=0.3, throughput_seconds=0.2)
CHECKS = PeerChecks(enabled=True, max_latency_ms=50.0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def by_check(results: list[Any]) -> dict[CheckId, Any]:
    return {r.check: r for r in results}


def test_echo_latency_loss_and_path_mtu_on_loopback() -> None:
    async def scenario() -> list[Any]:
        async with PeerResponder("127.0.0.1", 0) as responder:
            target = PeerTarget("peer-1", "127.0.0.1", responder.udp_port, "rack-a")
            results = await probe_peer(target, checks=CHECKS, mtu=9000, settings=FAST)
            assert responder.stats.udp_replies >= FAST.count + 1
            return results

    results = run(scenario())
    assert [r.check for r in results] == [
        CheckId.PEER_LATENCY,
        CheckId.PEER_LOSS,
        CheckId.PEER_PATH_MTU,
    ]
    got = by_check(results)
    lat = got[CheckId.PEER_LATENCY]
    assert lat.status is Status.PASS and lat.subject == "peer-1"
    assert lat.observed["domain"] == "rack-a"
    assert 0 < lat.observed["p50Ms"] <= lat.observed["p99Ms"] < 50
    assert lat.observed["samples"] == FAST.count
    assert got[CheckId.PEER_LOSS].observed["lossPercent"] == 0.0
    mtu = got[CheckId.PEER_PATH_MTU]
    assert (mtu.status, mtu.observed["pathMTU"], mtu.observed["method"]) == (
        Status.PASS,
        9000,
        "echo",
    )


def test_a_path_mtu_above_the_interface_mtu_is_reported_by_the_kernel() -> None:
    # lo's MTU is 65536 but no IPv4 datagram exceeds 65535: the kernel says so at send time
    async def scenario() -> list[Any]:
        async with PeerResponder("127.0.0.1", 0) as responder:
            target = PeerTarget("peer-1", "127.0.0.1", responder.udp_port)
            return await probe_peer(target, checks=CHECKS, mtu=70000, settings=FAST)

    mtu = by_check(run(scenario()))[CheckId.PEER_PATH_MTU]
    assert mtu.status is Status.FAIL
    assert (mtu.observed["pathMTU"], mtu.observed["method"]) == (65535, "kernel")
    assert mtu.expected == {"pathMTU": 70000}


def test_no_responder_is_an_error_and_a_silent_address_is_a_failure() -> None:
    port = mosquitto.free_port()

    async def scenario() -> tuple[list[Any], list[Any]]:
        refused = await probe_peer(
            PeerTarget("peer-1", "127.0.0.1", port), checks=CHECKS, mtu=9000, settings=FAST
        )
        # a port that swallows datagrams: a bound UDP socket that never answers
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hole:
            hole.bind(("127.0.0.1", 0))
            target = PeerTarget("peer-2", "127.0.0.1", hole.getsockname()[1])
            silent = await probe_peer(target, checks=CHECKS, mtu=9000, settings=FAST)
        return refused, silent

    refused, silent = run(scenario())
    got = by_check(refused)
    assert got[CheckId.PEER_LATENCY].status is Status.ERROR
    assert "responder is not running" in got[CheckId.PEER_LATENCY].message
    assert got[CheckId.PEER_LOSS].observed["lossPercent"] == 100.0
    assert got[CheckId.PEER_PATH_MTU].status is Status.SKIP
    got = by_check(silent)
    assert got[CheckId.PEER_LATENCY].status is Status.FAIL
    assert got[CheckId.PEER_LATENCY].message.startswith("unreachable: none of 20 echoes")
    assert got[CheckId.PEER_LOSS].status is Status.FAIL


def test_throughput_sample_is_measured_at_the_sink_and_bounded() -> None:
    settings = ProbeSettings(throughput_seconds=0.2, throughput_max_bytes=8 << 20)

    async def scenario() -> Any:
        async with PeerResponder("127.0.0.1", 0) as responder:
            target = PeerTarget("peer-1", "127.0.0.1", responder.udp_port, "rack-a")
            result = await measure_throughput(target, checks=CHECKS, settings=settings)
            assert responder.stats.tcp_streams == 1
            assert responder.stats.tcp_bytes == result.observed["bytes"]
            return result

    result = run(scenario())
    assert result.status is Status.PASS
    assert result.observed["bytes"] <= 8 << 20
    assert result.observed["mbps"] > 10
    assert result.expected == {"minThroughputRatio": 0.5}
    failed = run(
        measure_throughput(PeerTarget("peer-1", "127.0.0.1", mosquitto.free_port()), checks=CHECKS)
    )
    assert failed.status is Status.FAIL
    assert "could not measure" in failed.message


def test_throughput_is_never_streamed_to_a_port_that_is_not_a_netval_sink() -> None:
    got: list[int] = []

    async def scenario() -> Any:
        async def other_service(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(b"SSH-2.0-OpenSSH_9.2\r\n")
            try:
                got.append(len(await r.read()))
            except ConnectionResetError:  # the prober closed with our banner unread
                got.append(0)
            w.close()

        server = await asyncio.start_server(other_service, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            result = await measure_throughput(
                PeerTarget("peer-1", "127.0.0.1", port), checks=CHECKS, settings=FAST
            )
            await asyncio.sleep(0.1)
            return result

    result = run(scenario())
    assert result.status is Status.FAIL
    assert "does not answer as a netval peer sink" in result.message
    assert got == [0]  # not a byte was sent


def test_the_responder_is_bounded() -> None:
    limits = ResponderLimits(
        per_source_pps=10, per_source_burst=5, max_connections=2, max_connections_per_source=2
    )

    async def scenario() -> Any:
        async with PeerResponder("127.0.0.1", 0, limits=limits) as responder:
            port = responder.udp_port
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("127.0.0.1", port))
                s.settimeout(0.5)
                s.send(b"garbage that is long enough to be a header......")
                s.send(b"NVP1")  # short
                for seq in range(50):  # a flood: only the burst is answered
                    s.send(UDP_HEADER.pack(UDP_MAGIC, 1, 0, 0, seq, 7, 0, 0) + bytes(500))
                await asyncio.sleep(0.2)
                replies = []
                s.setblocking(False)
                while True:
                    try:
                        replies.append(s.recv(2048))
                    except BlockingIOError:
                        break
            # replies are never larger than the request header: no amplification
            assert replies and all(len(r) == UDP_HEADER.size for r in replies)
            size = UDP_HEADER.unpack(replies[0])[6]
            assert size == UDP_HEADER.size + 500
            # TCP: a third concurrent stream is refused; streams without a header time out
            conns = []
            for _ in range(3):
                r, w = await asyncio.open_connection("127.0.0.1", port)
                conns.append((r, w))
            await asyncio.sleep(0.1)
            assert responder.stats.tcp_refused == 1
            w = conns[0][1]
            hello = await asyncio.wait_for(conns[0][0].readexactly(len(TCP_HELLO)), 2)
            assert hello == TCP_HELLO  # the sink greets first
            w.write(TCP_HEADER.pack(TCP_MAGIC, 1, 0) + b"x" * 1000)
            w.write_eof()
            answer = await asyncio.wait_for(conns[0][0].read(), 2)
            for _, writer in conns:
                writer.close()
            return responder.stats, len(replies), answer

    stats, replied, answer = run(scenario())
    assert replied == 5  # the burst
    assert stats.udp_rate_limited == 45
    assert stats.udp_malformed == 2
    assert len(answer) == 28 and answer[:4] == TCP_MAGIC
    assert struct.unpack("!4sQQQ", answer)[2] == 1000


def test_the_responder_refuses_a_wildcard_address() -> None:
    with pytest.raises(ValueError, match="wildcard"):
        PeerResponder("0.0.0.0", 7471)


# -- the glue -----------------------------------------------------------------------------


def spec(port: int, **peers: Any) -> NetworkValidationSpec:
    return NetworkValidationSpec.model_validate(
        {
            "interval": "5s",
            "checks": {
                "mtu": {"interfaceMTU": 9000},
                "peers": {"enabled": True, "port": port, "maxLatencyMs": 50, **peers},
            },
        }
    )


def service(node: str, address: str, port: int, **kw: Any) -> PeerService:
    return PeerService(
        validation="v",
        node=node,
        spec=spec(port, interface="lo"),
        settings=FAST,
        resolve=lambda _ifname: address,
        **kw,
    )


def assignment(
    domain: str | None,
    peers: dict[str, list[tuple[str, str, int]]] | None = None,
    throughput: list[tuple[int, str]] | None = None,
    epoch: int = 0,
) -> bytes:
    """What the operator publishes (netval.operator.ingest.peer_sets)."""
    doc = {"domain": domain, "epoch": epoch, "peers": peers or {}, "throughput": throughput or []}
    return json.dumps(doc).encode()


def test_the_assignment_is_validated_dropped_and_counted_and_the_only_subscription() -> None:
    published: list[tuple[str, bytes]] = []
    svc = service("a", "127.0.0.1", 7471)
    h = svc.handle
    assert svc.subscriptions == ("netval/v1/v/a/assignment",)  # no other node's endpoint
    h("netval/v1/v/b/endpoint", b'{"address": "10.0.0.2", "port": 7471, "domain": "r1"}')
    assert svc.endpoints == {} and svc.dropped[DropReason.BAD_TOPIC] == 1
    good = {
        "r1": [("b", "10.0.0.2", 7471), ("a", "127.0.0.1", 7471)],  # ourselves: skipped
        "": [("c", "fd00::3", 7471)],  # a node without a known domain
    }

    async def assign() -> None:
        await svc.start(lambda suffix, payload: published.append((suffix, payload)))
        h("netval/v1/v/a/assignment", assignment("rack-7", good, [(5, "b")]))
        h("netval/v1/v/a/assignment", b'{"domain": 7}')  # invalid: kept rack-7
        h("netval/v1/v/a/assignment", b'{"peers": {"r1": [["d", "not-an-ip", 1]]}}')
        h("netval/v1/v/a/assignment", b'{"peers": {"r1": [["d", "10.0.0.4", 0]]}}')
        h("netval/v1/v/a/assignment", b"\xff\xfe")
        h("netval/v1/v/a/assignment", b"{" + b" " * (1 << 20) + b"}")
        h("netval/v1/v/b/assignment", b'{"domain": "not-for-us"}')
        await svc.close()

    run(assign())
    assert svc.domain == "rack-7"
    assert svc.endpoints.keys() == {"b", "c"}
    assert svc.endpoints["b"].domain == "r1" and svc.endpoints["c"].domain is None
    assert svc.endpoints["c"].address == "fd00::3"
    assert svc.dropped[DropReason.INVALID_ASSIGNMENT] == 4
    assert svc.dropped[DropReason.TOO_LARGE] == 1
    assert svc.dropped[DropReason.BAD_TOPIC] == 2
    announced = [json.loads(p) for s, p in published if s == "endpoint" and p]
    assert announced == [{"address": "127.0.0.1", "port": 7471, "domain": "rack-7"}]
    assert published[-1] == ("endpoint", b"")  # cleared on close
    # the next epoch's set replaces the table; an empty assignment empties it
    h("netval/v1/v/a/assignment", assignment("rack-7", {"r1": [("e", "10.0.0.5", 7)]}, epoch=1))
    assert svc.endpoints.keys() == {"e"} and svc.epoch == 1
    h("netval/v1/v/a/assignment", b"")
    assert svc.endpoints == {} and svc.domain is None


def test_the_endpoint_is_announced_only_once_the_assignment_is_known() -> None:
    """Issue 24's flake: a responder ready before the operator's retained assignment arrived
    announced `domain: null`, and a peer probing in that gap reported the pair with the
    wrong domain. The announcement now waits for the assignment, whatever the order."""
    port = mosquitto.free_port()
    a = service("node-a", "127.0.0.1", port)
    sent: list[bytes] = []

    async def scenario() -> None:
        await a.start(lambda _suffix, payload: sent.append(payload))
        assert a.responder is not None and sent == []  # responder up, nothing announced
        a.handle("netval/v1/v/node-a/assignment", assignment("rack-1"))
        a.handle("netval/v1/v/node-a/assignment", assignment("rack-1", epoch=1))
        await a.close()

    run(scenario())
    assert [json.loads(p)["domain"] for p in sent if p] == ["rack-1"]
    assert sent[-1] == b""
    # an assignment without a domain (no label on the node) is an assignment too
    c = service("node-c", "127.0.0.3", port)
    announced: list[bytes] = []

    async def unassigned() -> None:
        await c.start(lambda _suffix, payload: announced.append(payload))
        assert announced == []
        c.handle("netval/v1/v/node-c/assignment", b"{}")
        await c.close()

    run(unassigned())
    assert json.loads(announced[0])["domain"] is None and announced[-1] == b""


def pair_assignments(a: PeerService, b: PeerService, domain: str, slot: int | None = None) -> None:
    """The operator's assignments for two services that announced themselves (the peers'
    domain is the operator's view, never the announcement's)."""
    for me, peer in ((a, b), (b, a)):
        assert peer.address is not None and peer.responder is not None, peer.not_ready
        entry = (peer.node, peer.address, peer.responder.udp_port)
        slots = [(slot, peer.node)] if slot is not None and me is a else []
        me.handle(f"netval/v1/v/{me.node}/assignment", assignment(domain, {domain: [entry]}, slots))


def test_two_services_announce_probe_each_other_and_sample_throughput() -> None:
    port = mosquitto.free_port()
    clock = [1_000_000.0]
    a = service("node-a", "127.0.0.1", port, clock=lambda: clock[0])
    b = service("node-b", "127.0.0.2", port, clock=lambda: clock[0])

    async def scenario() -> tuple[list[Any], list[Any], Any, Any, list[Any]]:
        await a.start(lambda suffix, payload: None)
        await b.start(lambda suffix, payload: None)
        pair_assignments(a, b, "rack-1", slot=7)
        try:
            first = await a.probe_cycle(0)
            second = await b.probe_cycle(0)
            # throughput: only in the slot the assignment names
            none = await a.sample_throughput(6)
            sample = await a.sample_throughput(7)
            clock[0] += 12  # two slots later it is still reported, with its age
            later = await a.probe_cycle(1)
            return first, second, none, sample, later
        finally:
            await a.close()
            await b.close()

    first, second, none, sample, later = run(scenario())
    for results, peer, address in ((first, "node-b", "127.0.0.2"), (second, "node-a", "127.0.0.1")):
        assert {r.subject for r in results} == {peer}
        got = by_check(results)
        assert set(got) == {CheckId.PEER_LATENCY, CheckId.PEER_LOSS, CheckId.PEER_PATH_MTU}
        assert all(r.status is Status.PASS for r in results), [r.message for r in results]
        assert got[CheckId.PEER_LATENCY].observed["domain"] == "rack-1"
        assert got[CheckId.PEER_LATENCY].observed["address"] == address
    assert none is None and sample is not None and sample.subject == "node-b"
    tput = by_check(later)[CheckId.PEER_THROUGHPUT]
    assert tput.status is Status.PASS and tput.subject == "node-b"
    assert tput.observed["ageSeconds"] == 12.0
    assert "measured 12 s ago" in tput.message


def test_no_fabric_address_is_a_skip_and_a_busy_port_an_error() -> None:
    async def scenario() -> tuple[list[Any], list[Any]]:
        none = PeerService(validation="v", node="n", spec=spec(7471), resolve=lambda _: None)
        none.spec = spec(7471, interface="fab0")
        skipped = await none.probe_cycle(0)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
            busy.bind(("127.0.0.1", 0))
            port = busy.getsockname()[1]
            clash = service("n", "127.0.0.1", port)
            errored = await clash.probe_cycle(0)
        return skipped, errored

    skipped, errored = run(scenario())
    assert [(r.check, r.subject, r.status) for r in skipped] == [
        (CheckId.PEER_LATENCY, "n", Status.SKIP)
    ]
    assert "fab0 has no IP address" in skipped[0].message
    assert errored[0].status is Status.ERROR
    assert "cannot listen on 127.0.0.1" in errored[0].message


def test_statistics_helpers() -> None:
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert jitter([1.0, 3.0, 2.0]) == 1.5
    assert jitter([1.0]) == 0.0


def test_the_runner_adds_peer_results_in_their_own_span_and_reuses_them_for_events() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from netval.agent.collect.live import LiveCollector
    from netval.agent.config import AgentConfig
    from netval.agent.runner import REASON_LINK_EVENT, ProbeRunner
    from netval.infra.telemetry import make_tracer_provider
    from netval.model.results import Report

    port = mosquitto.free_port()
    a = service("node-a", "127.0.0.1", port)
    b = service("node-b", "127.0.0.2", port)
    config = AgentConfig.model_validate(
        {"validation": "v", "generation": 1, "spec": a.spec.model_dump(by_alias=True)}
    )
    exporter = InMemorySpanExporter()
    provider = make_tracer_provider({}, default_service="netval-agent", exporter=exporter)

    class Sink:
        reports: list[Report] = []

        async def publish(self, report: Report) -> None:
            self.reports.append(report)

    async def scenario() -> tuple[Report, Report]:
        await a.start(lambda s, p: None)
        await b.start(lambda s, p: None)
        pair_assignments(a, b, "rack-1")
        try:
            with LiveCollector(interfaces=["lo"]) as collector:
                runner = ProbeRunner(
                    config=config,
                    node="node-a",
                    collector=collector,
                    sink=Sink(),
                    tracer_provider=provider,
                    peers=a,
                )
                interval = await runner.probe_once()
                served = b.responder.stats.udp_replies if b.responder else 0
                event = await runner.probe_once(REASON_LINK_EVENT)
                # the event probe reused the cycle's peer results: nothing new was sent
                assert b.responder is not None and b.responder.stats.udp_replies == served
                return interval, event
        finally:
            await a.close()
            await b.close()
            provider.shutdown()

    interval, event = run(scenario())
    peer = [r for r in interval.results if r.check.group.value == "peer"]
    assert {(r.check.value, r.subject) for r in peer} == {
        ("peer.latency", "node-b"),
        ("peer.loss", "node-b"),
        ("peer.path_mtu", "node-b"),
    }
    assert [r for r in event.results if r.check.group.value == "peer"] == peer
    spans = [s for s in exporter.get_finished_spans() if s.name == "netval.checks.peer"]
    assert len(spans) == 2
    assert spans[0].attributes is not None
    assert spans[0].attributes["netval.check_group"] == "peer"
    assert spans[0].attributes["netval.results.pass"] == 3
