"""Storage probes against real servers on loopback: TCP, HTTP/S3, Ceph banners, NFS RPC NULL.

The servers below build their wire bytes independently of netval's encoders, so a layout
mistake in the probe cannot be mirrored by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from netval.agent.storage import reach as storage_reach
from netval.agent.storage.ceph import CEPH_MSGR2_PREFIX
from netval.agent.storage.nfs import (
    AcceptStat,
    decode_record_mark,
    decode_rpc_reply,
    encode_rpc_null_call,
)
from netval.agent.storage.probe import probe_endpoint, probe_storage
from netval.agent.storage.target import http_request_target, validate_host
from netval.agent.storage.throughput import THROUGHPUT_MAX_BYTES
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult
from netval.model.spec import StorageChecks, StorageEndpoint

LOOPBACK = "127.0.0.1"
OBJECT_PATH = "/bucket/object"
OBJECT = bytes(range(256)) * (4 * 1024 * 1024 // 256)  # 4 MiB
LENIENT_MS = 2000.0  # loopback latency on a busy CI runner stays far below this

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def endpoint(protocol: str, port: int | None, **fields: Any) -> StorageEndpoint:
    fields.setdefault("max_latency_ms", LENIENT_MS)
    return StorageEndpoint(
        name=fields.pop("name", f"{protocol}-ep"),
        protocol=protocol,
        host=fields.pop("host", LOOPBACK),
        port=port,
        **fields,
    )


def by_check(results: list[CheckResult]) -> dict[CheckId, CheckResult]:
    assert [r.check for r in results] == [
        CheckId.STORAGE_REACHABLE,
        CheckId.STORAGE_LATENCY,
        CheckId.STORAGE_THROUGHPUT,
    ]
    return {r.check: r for r in results}


def probe(
    ep: StorageEndpoint, *, measure: bool = False, timeout: float = 2.0
) -> dict[CheckId, CheckResult]:
    return by_check(asyncio.run(probe_endpoint(ep, measure_throughput=measure, timeout=timeout)))


def assert_unreachable(results: dict[CheckId, CheckResult], subject: str, *fragments: str) -> None:
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.subject == subject
    assert reach.status is Status.FAIL, reach.message
    assert reach.observed["reachable"] is False
    for fragment in fragments:
        assert fragment in reach.message, reach.message
    assert results[CheckId.STORAGE_LATENCY].status is Status.SKIP
    assert "latencyMs" not in results[CheckId.STORAGE_LATENCY].observed
    assert results[CheckId.STORAGE_THROUGHPUT].status is Status.SKIP


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, LOOPBACK, 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


def free_closed_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
    return port


async def _until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        await reader.read()
    writer.close()


# ---------------------------------------------------------------- Ceph banner servers


def msgr2_server(delay: float = 0.0) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay)
        # ProtocolV2::_banner_exchange: prefix, le16 payload length, le64 supported, le64 required
        writer.write(b"ceph v2\n" + struct.pack("<H", 16) + struct.pack("<QQ", 0x3, 0x0))
        await _until_eof(reader, writer)

    return handle


async def msgr1_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # CEPH_BANNER, then the server's entity_addr_t (contents irrelevant to the probe)
    writer.write(b"ceph v027" + bytes(136))
    await _until_eof(reader, writer)


async def silent_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _until_eof(reader, writer)


async def tcp_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


# ---------------------------------------------------------------- NFS RPC NULL responder


@dataclass
class NfsResponder:
    """Answers record-marked RPC calls; `mode` picks the answer, `calls` records what came."""

    mode: str = "ok"
    calls: list[tuple[int, ...]] = field(default_factory=list)

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (mark,) = struct.unpack(">I", await reader.readexactly(4))
                body = await reader.readexactly(mark & 0x7FFFFFFF)
                # xid, msg_type, rpcvers, prog, vers, proc, cred flavor, cred len, verf flavor,
                # verf len
                call = struct.unpack(">10I", body)
                self.calls.append(call)
                writer.write(self.reply(call))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def reply(self, call: tuple[int, ...]) -> bytes:
        xid, version = call[0], call[4]
        accepted = struct.pack(">5I", xid, 1, 0, 0, 0)  # REPLY, MSG_ACCEPTED, verf AUTH_NONE/0
        if self.mode == "ok":
            return self.record(accepted + struct.pack(">I", 0))
        if self.mode == "fragmented":
            # A verifier with a 5-byte body (padded to 8) and a reply split into two fragments.
            body = struct.pack(">5I", xid, 1, 0, 1, 5) + b"abcde\0\0\0" + struct.pack(">I", 0)
            first, second = body[:10], body[10:]
            return struct.pack(">I", len(first)) + first + self.record(second)
        if self.mode == "v4only":
            if version == 4:
                return self.record(accepted + struct.pack(">I", 0))
            return self.record(accepted + struct.pack(">3I", 2, 4, 4))  # PROG_MISMATCH 4..4
        if self.mode == "wrong_xid":
            return self.record(struct.pack(">5I", xid ^ 0xFFFF, 1, 0, 0, 0) + bytes(4))
        if self.mode == "denied":
            return self.record(struct.pack(">5I", xid, 1, 1, 1, 1))  # MSG_DENIED, AUTH_BADCRED
        if self.mode == "prog_unavail":
            return self.record(accepted + struct.pack(">I", 1))
        raise AssertionError(self.mode)

    @staticmethod
    def record(body: bytes) -> bytes:
        return struct.pack(">I", 0x80000000 | len(body)) + body


# ---------------------------------------------------------------- HTTP / S3 server


class ObjectStoreHandler(BaseHTTPRequestHandler):
    """/bucket/object: a 4 MiB object with Range support; / answers 403 like anonymous S3."""

    protocol_version = "HTTP/1.1"
    server: HttpServer

    def do_HEAD(self) -> None:
        self.respond(send_body=False)

    def do_GET(self) -> None:
        self.respond(send_body=True)

    def respond(self, *, send_body: bool) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("Range")))
        if self.path == "/error":
            self.reply(500, b"")
        elif self.path == "/":
            self.reply(403, b"<Error><Code>AccessDenied</Code></Error>", send_body=send_body)
        elif self.path == OBJECT_PATH:
            body, status = OBJECT, 200
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=0-"):
                body, status = OBJECT[: int(ranged.removeprefix("bytes=0-")) + 1], 206
            self.reply(status, body, send_body=send_body)
        else:
            self.reply(404, b"", send_body=send_body)

    def reply(self, status: int, body: bytes, *, send_body: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[tuple[str, str, str | None]]


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    server = HttpServer((LOOPBACK, 0), ObjectStoreHandler)
    server.seen = []
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def http_port(server: HttpServer) -> int:
    return int(server.server_address[1])


# ---------------------------------------------------------------- TCP


def test_tcp_listener_is_reachable_with_connect_latency() -> None:
    async def scenario() -> list[CheckResult]:
        async with serving(tcp_server) as port:
            return await probe_endpoint(endpoint("tcp", port), measure_throughput=True)

    results = by_check(asyncio.run(scenario()))
    reach, latency = results[CheckId.STORAGE_REACHABLE], results[CheckId.STORAGE_LATENCY]
    assert reach.status is Status.PASS and reach.subject == "tcp-ep"
    assert reach.observed["reachable"] is True and reach.observed["protocol"] == "tcp"
    assert latency.status is Status.PASS
    assert isinstance(latency.observed["latencyMs"], float) and latency.observed["latencyMs"] > 0
    assert latency.expected == {"maxLatencyMs": LENIENT_MS}
    throughput = results[CheckId.STORAGE_THROUGHPUT]
    assert throughput.status is Status.SKIP and "minThroughputMBps" in throughput.message


def test_refused_port_fails_reachable_with_a_clear_message() -> None:
    port = free_closed_port()
    results = probe(endpoint("tcp", port, name="closed"))
    assert_unreachable(results, "closed", "connection refused", f"{LOOPBACK}:{port}")


def test_tcp_without_port_is_an_endpoint_error() -> None:
    results = probe(endpoint("tcp", None, name="portless"))
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.ERROR and reach.subject == "portless"
    assert "needs a port" in reach.message
    assert results[CheckId.STORAGE_LATENCY].status is Status.SKIP
    assert results[CheckId.STORAGE_THROUGHPUT].status is Status.SKIP


def test_unresolvable_host_fails_with_dns_in_the_message() -> None:
    results = probe(endpoint("tcp", 9, host="netval-no-such-host.invalid", name="nodns"))
    assert_unreachable(results, "nodns", "DNS", "netval-no-such-host.invalid")


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"host": "evil\r\nX-Injected: 1"}, "invalid host"),
        ({"host": "a b"}, "invalid host"),
        ({"path": "bucket/object"}, "must start with '/'"),
    ],
)
def test_hostile_or_bad_endpoint_input_is_rejected_before_any_io(
    fields: dict[str, str], fragment: str
) -> None:
    results = probe(endpoint("http", 80, name="bad", **fields))
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.ERROR and reach.subject == "bad"
    assert fragment in reach.message


# ---------------------------------------------------------------- Ceph


def test_ceph_msgr2_banner_passes_and_reports_features() -> None:
    async def scenario() -> list[CheckResult]:
        async with serving(msgr2_server()) as port:
            return await probe_endpoint(
                endpoint("ceph", port, name="mon-a"), measure_throughput=False
            )

    results = by_check(asyncio.run(scenario()))
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.PASS and reach.subject == "mon-a", reach.message
    assert reach.observed["banner"] == "msgr2"
    assert reach.observed["msgr2Supported"] == 3 and reach.observed["msgr2Required"] == 0
    assert results[CheckId.STORAGE_LATENCY].status is Status.PASS


def test_ceph_msgr1_banner_passes() -> None:
    async def scenario() -> list[CheckResult]:
        async with serving(msgr1_server) as port:
            return await probe_endpoint(
                endpoint("ceph", port, name="mon-v1"), measure_throughput=False
            )

    results = by_check(asyncio.run(scenario()))
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.PASS and reach.observed["banner"] == "msgr1", reach.message
    assert results[CheckId.STORAGE_LATENCY].status is Status.PASS


def test_ceph_server_that_never_sends_a_banner_times_out_in_bounded_time() -> None:
    async def scenario() -> list[CheckResult]:
        async with serving(silent_server) as port:
            return await probe_endpoint(
                endpoint("ceph", port, name="mute"), measure_throughput=False, timeout=0.5
            )

    started = time.perf_counter()
    results = by_check(asyncio.run(scenario()))
    assert time.perf_counter() - started < 1.5
    assert_unreachable(results, "mute", "timed out after 0.5 s", "Ceph messenger banner")


def test_http_server_on_a_ceph_endpoint_is_an_unexpected_banner(http_server: HttpServer) -> None:
    results = probe(endpoint("ceph", http_port(http_server), name="not-ceph"))
    assert_unreachable(results, "not-ceph", "unexpected banner", "HTTP server")


def test_latency_above_the_maximum_fails_storage_latency() -> None:
    async def scenario() -> list[CheckResult]:
        async with serving(msgr2_server(delay=0.05)) as port:
            return await probe_endpoint(
                endpoint("ceph", port, name="slow", max_latency_ms=5), measure_throughput=False
            )

    results = by_check(asyncio.run(scenario()))
    assert results[CheckId.STORAGE_REACHABLE].status is Status.PASS
    latency = results[CheckId.STORAGE_LATENCY]
    assert latency.status is Status.FAIL and latency.subject == "slow"
    latency_ms = latency.observed["latencyMs"]
    assert isinstance(latency_ms, float) and latency_ms >= 50
    assert latency.expected == {"maxLatencyMs": 5.0}
    assert "exceeds" in latency.message


# ---------------------------------------------------------------- NFS


def run_nfs(mode: str) -> tuple[dict[CheckId, CheckResult], NfsResponder]:
    responder = NfsResponder(mode)

    async def scenario() -> list[CheckResult]:
        async with serving(responder) as port:
            return await probe_endpoint(endpoint("nfs", port, name="nas"), measure_throughput=False)

    return by_check(asyncio.run(scenario())), responder


def test_nfs_null_call_layout_and_accepted_reply() -> None:
    results, responder = run_nfs("ok")
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.PASS and reach.subject == "nas", reach.message
    assert reach.observed["nfsVersion"] == 3
    assert results[CheckId.STORAGE_LATENCY].status is Status.PASS
    (call,) = responder.calls
    # CALL, RPC version 2, NFS program 100003 v3, procedure NULL, AUTH_NONE cred and verifier
    assert call[1:] == (0, 2, 100003, 3, 0, 0, 0, 0, 0)


def test_nfs_reply_in_two_fragments_with_a_padded_verifier_passes() -> None:
    results, _ = run_nfs("fragmented")
    assert results[CheckId.STORAGE_REACHABLE].status is Status.PASS


def test_nfs_v4_only_server_is_retried_in_v4() -> None:
    results, responder = run_nfs("v4only")
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.PASS and reach.observed["nfsVersion"] == 4, reach.message
    assert [call[4] for call in responder.calls] == [3, 4]


@pytest.mark.parametrize(
    ("mode", "fragments"),
    [
        ("wrong_xid", ("xid", "not an answer to our call")),
        ("denied", ("MSG_DENIED", "AUTH_ERROR")),
        ("prog_unavail", ("PROG_UNAVAIL",)),
    ],
)
def test_nfs_bad_replies_fail(mode: str, fragments: tuple[str, ...]) -> None:
    results, _ = run_nfs(mode)
    assert_unreachable(results, "nas", *fragments)


# ---------------------------------------------------------------- HTTP / S3


def test_s3_anonymous_403_counts_as_reachable(http_server: HttpServer) -> None:
    results = probe(endpoint("s3", http_port(http_server), name="rgw"))
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.PASS and reach.subject == "rgw"
    assert reach.observed["httpStatus"] == 403
    assert results[CheckId.STORAGE_LATENCY].status is Status.PASS
    assert http_server.seen == [("HEAD", "/", None)]


def test_http_head_of_a_path(http_server: HttpServer) -> None:
    results = probe(endpoint("http", http_port(http_server), path=OBJECT_PATH))
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.PASS and reach.observed["httpStatus"] == 200
    assert http_server.seen == [("HEAD", OBJECT_PATH, None)]


def test_http_500_fails(http_server: HttpServer) -> None:
    results = probe(endpoint("s3", http_port(http_server), name="broken", path="/error"))
    assert_unreachable(results, "broken", "500", "server error")


def test_http_path_not_served_fails(http_server: HttpServer) -> None:
    results = probe(endpoint("http", http_port(http_server), name="gone", path="/missing"))
    assert_unreachable(results, "gone", "404", "must answer 2xx/3xx")


def test_throughput_ranged_get_measures_mbps(http_server: HttpServer) -> None:
    ep = endpoint("s3", http_port(http_server), path=OBJECT_PATH, min_throughput_m_bps=1)
    results = probe(ep, measure=True)
    throughput = results[CheckId.STORAGE_THROUGHPUT]
    assert throughput.status is Status.PASS, throughput.message
    assert throughput.subject == "s3-ep"
    assert throughput.observed["bytes"] == len(OBJECT)
    assert throughput.observed["httpStatus"] == 206
    mbps = throughput.observed["MBps"]
    assert isinstance(mbps, float) and mbps > 1
    assert throughput.expected == {"minThroughputMBps": 1.0}
    assert ("GET", OBJECT_PATH, f"bytes=0-{THROUGHPUT_MAX_BYTES - 1}") in http_server.seen


def test_throughput_below_the_minimum_fails(http_server: HttpServer) -> None:
    ep = endpoint("http", http_port(http_server), path=OBJECT_PATH, min_throughput_m_bps=1e9)
    results = probe(ep, measure=True)
    throughput = results[CheckId.STORAGE_THROUGHPUT]
    assert throughput.status is Status.FAIL
    assert "below the minimum" in throughput.message
    assert isinstance(throughput.observed["MBps"], float)
    assert throughput.observed["bytes"] == len(OBJECT)


def test_throughput_of_a_forbidden_object_fails_with_a_hint(http_server: HttpServer) -> None:
    ep = endpoint("s3", http_port(http_server), path="/", min_throughput_m_bps=1)
    results = probe(ep, measure=True)
    assert results[CheckId.STORAGE_REACHABLE].status is Status.PASS
    throughput = results[CheckId.STORAGE_THROUGHPUT]
    assert throughput.status is Status.FAIL
    assert "403" in throughput.message and "without credentials" in throughput.message


def test_throughput_skips_with_reasons(http_server: HttpServer) -> None:
    port = http_port(http_server)
    not_now = probe(endpoint("s3", port, path=OBJECT_PATH, min_throughput_m_bps=1), measure=False)
    assert not_now[CheckId.STORAGE_THROUGHPUT].status is Status.SKIP
    assert "this cycle" in not_now[CheckId.STORAGE_THROUGHPUT].message
    no_path = probe(endpoint("s3", port, min_throughput_m_bps=1), measure=True)
    assert no_path[CheckId.STORAGE_THROUGHPUT].status is Status.SKIP
    assert "no path" in no_path[CheckId.STORAGE_THROUGHPUT].message
    assert not any(method == "GET" for method, _, _ in http_server.seen)


def test_throughput_is_not_measured_for_ceph() -> None:
    async def scenario() -> list[CheckResult]:
        async with serving(msgr2_server()) as port:
            ep = endpoint("ceph", port, path="/pool", min_throughput_m_bps=1)
            return await probe_endpoint(ep, measure_throughput=True)

    throughput = by_check(asyncio.run(scenario()))[CheckId.STORAGE_THROUGHPUT]
    assert throughput.status is Status.SKIP and "s3 and http endpoints only" in throughput.message


# ---------------------------------------------------------------- probe_storage


def test_probe_storage_runs_endpoints_concurrently_and_never_reads_throughput(
    http_server: HttpServer,
) -> None:
    async def scenario() -> list[list[CheckResult]]:
        async with serving(silent_server) as mute_port:
            checks = StorageChecks(
                endpoints=[
                    endpoint(
                        "s3",
                        http_port(http_server),
                        name="objects",
                        path=OBJECT_PATH,
                        min_throughput_m_bps=1,
                    ),
                    endpoint("ceph", mute_port, name="mute"),
                    endpoint("tcp", http_port(http_server), name="plain"),
                ],
            )
            return [await probe_storage(checks, timeout=0.3) for _ in range(4)]

    started = time.perf_counter()
    cycles = asyncio.run(scenario())
    # each cycle is bounded by the 0.3 s timeout of the mute endpoint, not by the sum of probes
    assert time.perf_counter() - started < 4 * 0.3 + 1.0
    for results in cycles:
        assert [(r.subject, r.check) for r in results] == [
            (name, check)
            for name in ("objects", "mute", "plain")
            for check in (
                CheckId.STORAGE_REACHABLE,
                CheckId.STORAGE_LATENCY,
                CheckId.STORAGE_THROUGHPUT,
            )
        ]
        assert [r.status for r in results if r.check is CheckId.STORAGE_REACHABLE] == [
            Status.PASS,
            Status.FAIL,
            Status.PASS,
        ]
    # throughput is read in the node's storage slots (test_storage_slots.py), never by a cycle
    assert all(results[2].status is Status.SKIP for results in cycles)
    assert all("storage slots" in results[2].message for results in cycles)
    assert not any(method == "GET" for method, _, _ in http_server.seen)


def test_an_unexpected_exception_becomes_an_error_result(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setitem(storage_reach._EXCHANGES, storage_reach.StorageProtocol.TCP, broken)

    async def scenario() -> list[CheckResult]:
        async with serving(tcp_server) as port:
            return await probe_endpoint(endpoint("tcp", port, name="bug"), measure_throughput=True)

    results = by_check(asyncio.run(scenario()))
    reach = results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.ERROR and reach.subject == "bug"
    assert "RuntimeError: boom" in reach.message
    assert results[CheckId.STORAGE_LATENCY].status is Status.SKIP
    assert results[CheckId.STORAGE_THROUGHPUT].status is Status.SKIP


# ---------------------------------------------------------------- pure helpers


def test_rpc_codec_round_trip_and_malformed_input() -> None:
    call = encode_rpc_null_call(0xDEADBEEF, 100003, 3)
    last, length = decode_record_mark(call[:4])
    assert last and length == len(call) - 4 == 40
    reply = decode_rpc_reply(
        struct.pack(">6I", 0xDEADBEEF, 1, 0, 0, 0, 2) + struct.pack(">2I", 2, 4)
    )
    assert reply.xid == 0xDEADBEEF and reply.accepted and reply.stat == AcceptStat.PROG_MISMATCH
    assert (reply.low, reply.high) == (2, 4) and not reply.success
    with pytest.raises(ValueError, match="truncated"):
        decode_rpc_reply(b"\0\0\0\1\0\0\0\1")
    with pytest.raises(ValueError, match="expected REPLY"):
        decode_rpc_reply(call[4:])


def test_input_validation_helpers() -> None:
    assert validate_host("[::1]") == "::1"
    assert validate_host("mon-0.ceph.svc.cluster.local") == "mon-0.ceph.svc.cluster.local"
    with pytest.raises(ValueError):
        validate_host("fe80::1%eth0\r\nx")
    with pytest.raises(ValueError):
        validate_host("-bad-.example")
    assert http_request_target(None) == "/"
    assert http_request_target("/b/a key\r\nX: y") == "/b/a%20key%0D%0AX:%20y"
    assert http_request_target("/b/k?X-Amz-Signature=ab%2F") == "/b/k?X-Amz-Signature=ab%2F"
    assert CEPH_MSGR2_PREFIX == b"ceph v2\n"
