"""The simulated agents of bench/scale.py: one MQTT connection per node, hand-rolled.

Each node is an `asyncio.Protocol` speaking the part of MQTT 5 a netval agent speaks: CONNECT
(clean start, its own client id and login, the retained `offline` will on its state topic),
PUBLISH QoS 1 retained (`online`, the report), PUBLISH of a beat, PINGREQ, and reading
CONNACK / PUBACK / PINGRESP. No per-node task: one scheduler per process walks the nodes
whose slot in the interval has come, so 100,000 idle connections cost memory, not wake-ups.
Source addresses 127.0.0.2, 127.0.0.3, ... (NODES_PER_ADDRESS each) keep every address's
ephemeral ports (32768-60999 by default) far from exhausted.

Per-node identity (`identity` in the config, the TLS transport): each node's own client
certificate, `<validation>/<node>`, minted by the chart's identity CA as enrollment would,
one TLS context per node (made before anything is timed); no user name or password.

Broker restart (`reconnect` command): from then on a node whose connection is lost
reconnects as the agent does (`netval.infra.mqtt_client.ReconnectRule` with the agent
publisher's policy: full jitter up to 0.5 s x 2^(failures-1), at most 30 s, reset by a
session that held 10 s), through the same 100 connects in flight as the first connect; a
refusal of the credential (CONNACK 0x86, 0x87, or a TLS alert about the certificate) is what
would make the agent enroll again (counted, not done; bench/scale_reconnect.py). The first
cycle after a reconnect goes out in full, as the agent's.

Run by bench/scale.py as a child (`--role clients`): JSON lines on stdin (commands) and
stdout (answers).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from scale_reconnect import ConnackRefused, RestartStats, agent_rule, reconnect_one

NODES_PER_ADDRESS: Final = 10000
IP_BIND_ADDRESS_NO_PORT: Final = 24  # linux/in.h; not in Python's socket module
CONNECTS_IN_FLIGHT: Final = 100  # Mosquitto listens with a backlog of 100: no SYN drops
KEEPALIVE: Final = 60  # s; every node publishes each interval (< keepalive), so no PINGREQ
PLACEHOLDER_ISO: Final = b"2000-01-01T00:00:00Z"
TICK: Final = 0.05
CONNACK_TIMEOUT: Final = 20.0  # s between scheduler rounds


def node_name(i: int) -> str:
    return f"gpu-{i:05d}"


def source_address(i: int) -> str:
    k = 2 + i // NODES_PER_ADDRESS
    return f"127.0.{k // 256}.{k % 256}"


def bound_socket(address: str) -> socket.socket:
    """A TCP socket bound to `address`, its port chosen at connect time for the 4-tuple
    (IP_BIND_ADDRESS_NO_PORT): bind(port 0) alone would pick a port unused on that address
    towards any destination, so the previous run's TIME_WAIT sockets would exhaust it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
    sock.bind((address, 0))
    sock.setblocking(False)
    return sock


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s: bytes) -> bytes:
    return struct.pack("!H", len(s)) + s


def connect_packet(client_id: bytes, user: bytes, password: bytes, will_topic: bytes) -> bytes:
    """No user name (b""): a client certificate says who it is."""
    flags = 0x20 | 0x08 | 0x04 | 0x02  # will retain, QoS 1, will, clean
    payload = _str(client_id) + b"\x00" + _str(will_topic) + _str(b"offline")
    if user:
        flags |= 0x80 | 0x40  # user, password
        payload += _str(user) + _str(password)
    var = _str(b"MQTT") + bytes([5, flags]) + struct.pack("!H", KEEPALIVE) + b"\x00"
    body = var + payload
    return b"\x10" + _varint(len(body)) + body


def publish_packet(topic: bytes, payload: bytes, qos: int, retain: bool, packet_id: int) -> bytes:
    var = _str(topic) + (struct.pack("!H", packet_id) if qos else b"") + b"\x00"
    body = var + payload
    return bytes([0x30 | (qos << 1) | int(retain)]) + _varint(len(body)) + body


def subscribe_packet(topic_filter: bytes, packet_id: int) -> bytes:
    body = struct.pack("!H", packet_id) + b"\x00" + _str(topic_filter) + b"\x00"  # QoS 0
    return b"\x82" + _varint(len(body)) + body


PINGREQ: Final = b"\xc0\x00"


class Node(asyncio.Protocol):
    """One agent's connection. Counts what the broker acknowledged."""

    def __init__(self, stats: Stats, on_lost: Any = None) -> None:
        self.stats = stats
        self.on_lost = on_lost  # called once a connection that had its CONNACK is lost
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._buf = b""
        self._next_id = 0
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.stats.lost += 1
        if not self.connack.done():
            self.connack.set_exception(ConnectionError(str(exc or "closed before CONNACK")))
        elif self.on_lost is not None and not self.connack.exception():
            self.on_lost(self, exc)

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data
        while len(buf) >= 2:
            length, shift, at = 0, 0, 1
            while True:  # remaining length, a variable byte integer
                if at >= len(buf):
                    self._buf = buf
                    return
                byte = buf[at]
                length += (byte & 0x7F) << shift
                shift += 7
                at += 1
                if not byte & 0x80:
                    break
            if len(buf) < at + length:
                break
            kind, body = buf[0] >> 4, buf[at : at + length]
            buf = buf[at + length :]
            self._packet(kind, body)
        self._buf = buf

    def _packet(self, kind: int, body: bytes) -> None:
        if kind == 2 and not self.connack.done():  # CONNACK: flags, reason code, properties
            self.connack.set_result(body[1])
        elif kind == 4:  # PUBACK
            self.stats.acked += 1
            if len(body) > 2 and body[2] >= 0x80:
                self.stats.refused += 1  # e.g. 0x87 not authorized
        elif kind == 3:  # PUBLISH (the beat sink's subscription), QoS 0
            self.stats.received += 1
            self.stats.received_bytes += len(body)

    def send(self, packet: bytes) -> None:
        if self.transport is not None and not self.lost:
            self.transport.write(packet)

    def packet_id(self) -> int:
        self._next_id = self._next_id % 65535 + 1
        return self._next_id


@dataclass
class Stats:
    connected: int = 0
    lost: int = 0
    refused_connects: int = 0
    acked: int = 0
    refused: int = 0
    reports: int = 0
    beats: int = 0
    bytes_out: int = 0
    received: int = 0
    received_bytes: int = 0
    late_max: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)


class Fleet:
    """This process's share of the nodes, their connections and their schedule."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.validation: str = cfg["validation"]
        self.first, self.last = cfg["first"], cfg["last"]  # node indices [first, last)
        self.total: int = cfg["total"]
        self.interval: float = cfg["interval"]
        self.stats = Stats()
        self.nodes: dict[int, Node] = {}
        self.failing: set[int] = set()
        self.seq = 0
        self.mode = "full"
        self.templates = (cfg["template_pass"].encode(), cfg["template_fail"].encode())
        self.task: asyncio.Task[None] | None = None
        self.given_up = False
        self.connect_seconds: list[float] = []  # CONNECT to CONNACK, each node
        self.digests: dict[tuple[int, bool], str] = {}
        self.reconnect = False  # broker restart: lost nodes reconnect as the agent does
        self.rules: dict[int, Any] = {}  # node -> its ReconnectRule
        self.full_next: set[int] = set()  # reconnected: the next cycle goes out in full
        self.restart = RestartStats()
        self.gate: asyncio.Semaphore | None = None
        self.loops: set[asyncio.Task[None]] = set()
        self.contexts: dict[int, Any] = {}  # per-node identity: node -> its TLS context
        if cfg.get("identity"):
            self.make_contexts()

    def topic(self, i: int, kind: str) -> bytes:
        return f"netval/v1/{self.validation}/{node_name(i)}/{kind}".encode()

    def report(self, i: int, now: float) -> bytes:
        iso = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
        template = self.templates[i in self.failing]
        name, peer = node_name(i).encode(), node_name((i + 1) % self.total).encode()
        # the template is node 0's report with node 1 as its peer
        return (
            template.replace(b"gpu-00001", b"\0PEER\0")
            .replace(b"gpu-00000", name)
            .replace(b"\0PEER\0", peer)
            .replace(b'"' + PLACEHOLDER_ISO + b'"', b'"' + iso + b'"')
        )

    def digest(self, i: int) -> str:
        """The standing report's digest, as the agent and the operator compute it (once per
        node and verdict: the material content has no times in it)."""
        key = (i, i in self.failing)
        if key not in self.digests:
            from netval.model.beat import report_digest
            from netval.model.results import Report

            report = Report.model_validate_json(self.report(i, time.time()))
            self.digests[key] = report_digest(report)
        return self.digests[key]

    def beat(self, i: int, cycle: int, now: float) -> bytes:
        iso = datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z")
        digest = self.digest(i)
        worst = "fail" if i in self.failing else "pass"
        doc = {"schema": 1, "seq": cycle, "cycleAt": iso, "digest": digest, "worst": worst}
        return json.dumps(doc, separators=(",", ":")).encode()

    def login(self, i: int) -> tuple[bytes, bytes]:
        if self.cfg.get("shared_login"):
            return self.cfg["shared_login"][0].encode(), self.cfg["shared_login"][1].encode()
        return b"", b""  # the node's certificate

    def identity(self, i: int) -> str:
        return f"{self.validation}/{node_name(i)}"

    def make_contexts(self) -> None:
        """Each node's TLS context with its own certificate, as enrollment leaves it."""
        import ssl

        from netval.infra.mqtt_settings import PemIdentity, load_identity
        from netval.operator.identity.authority import IdentityAuthority

        ident = self.cfg["identity"]
        ca = IdentityAuthority.from_files(Path(ident["ca"]), Path(ident["key"]))
        for i in range(self.first, self.last):
            issued, key = ca.mint(self.identity(i))
            context = ssl.create_default_context(cafile=self.cfg["ca_file"])
            load_identity(context, PemIdentity(issued.cert_pem, key))
            self.contexts[i] = context

    async def attempt(self, i: int) -> Node:
        """One connect of node i up to its CONNACK (raises ConnackRefused on a refusal)."""
        loop = asyncio.get_running_loop()
        user, password = self.login(i)
        client_id = (
            node_name(i).encode() if self.cfg.get("shared_login") else self.identity(i).encode()
        )
        sock = bound_socket(source_address(i))
        try:
            await loop.sock_connect(sock, (self.cfg["host"], self.cfg["port"]))
        except OSError:
            sock.close()
            raise
        _, node = await loop.create_connection(
            lambda: Node(self.stats, lambda node, exc: self.lost(i, node, exc)),
            sock=sock,
            ssl=self.contexts.get(i) or self.cfg.get("ssl_context"),
            server_hostname=self.cfg.get("server_hostname"),
        )
        node.send(connect_packet(client_id, user, password, self.topic(i, "state")))
        try:
            code = await asyncio.wait_for(node.connack, CONNACK_TIMEOUT)
        except ConnectionError as exc:
            if node.transport is not None:
                node.transport.abort()
            text = str(exc).lower()
            if "alert" in text and "certificate" in text:  # the broker refuses the certificate
                raise ConnackRefused(0x86) from None
            raise
        except BaseException:
            if node.transport is not None:
                node.transport.abort()
            raise
        if code != 0:
            if node.transport is not None:
                node.transport.abort()
            raise ConnackRefused(code)
        return node

    def up(self, i: int, node: Node) -> None:
        self.nodes[i] = node
        if i not in self.rules:
            self.rules[i] = agent_rule()
        self.rules[i].connected()
        node.send(publish_packet(self.topic(i, "state"), b"online", 1, True, node.packet_id()))

    def lost(self, i: int, node: Node, exc: Exception | None) -> None:
        if self.reconnect and self.nodes.get(i) is node:
            task = asyncio.get_running_loop().create_task(reconnect_one(self, i, exc))
            self.loops.add(task)  # a task only the loop references may be collected
            task.add_done_callback(self.loops.discard)

    async def connect_one(self, i: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            if self.given_up:
                self.stats.errors["not tried: the broker stopped answering"] = (
                    self.stats.errors.get("not tried: the broker stopped answering", 0) + 1
                )
                return
            started = time.monotonic()
            try:
                node = await self.attempt(i)
            except ConnackRefused:
                self.stats.refused_connects += 1
                return
            except (OSError, TimeoutError, ConnectionError) as exc:
                # a broker out of file descriptors leaves connections in its listen backlog,
                # unanswered: stop trying rather than wait for every one of them
                self.given_up = self.given_up or isinstance(exc, TimeoutError)
                key = type(exc).__name__ + (
                    f" errno {exc.errno}" if isinstance(exc, OSError) else ""
                )
                self.stats.errors[key] = self.stats.errors.get(key, 0) + 1
                return
            self.stats.connected += 1
            self.connect_seconds.append(time.monotonic() - started)
            self.up(i, node)

    async def connect_all(self) -> float:
        start = time.monotonic()
        gate = self.gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
        await asyncio.gather(*(self.connect_one(i, gate) for i in range(self.first, self.last)))
        return time.monotonic() - start

    def publish(self, i: int, cycle: int, now: float, full: bool) -> None:
        node = self.nodes.get(i)
        if node is None or node.lost:
            return
        if full:
            packet = publish_packet(self.topic(i, "report"), self.report(i, now), 1, True,
                                    node.packet_id())  # fmt: skip
            self.stats.reports += 1
        else:
            # retained, as the agent publishes it (a restarted operator counts the node
            # fresh from its last beat)
            packet = publish_packet(self.topic(i, "beat"), self.beat(i, cycle, now),
                                    self.cfg["beat_qos"], True, node.packet_id())  # fmt: skip
            self.stats.beats += 1
        self.stats.bytes_out += len(packet)
        node.send(packet)

    def full_this_cycle(self, i: int, cycle: int) -> bool:
        # cycle 0: every agent's first report; then 1 % of the fleet changes per interval
        if i in self.full_next:
            self.full_next.discard(i)
            return True
        return self.mode == "full" or cycle == 0 or (i + cycle) % 100 == 0

    async def schedule(self, t0: float) -> None:
        """Node i publishes at t0 + (i / total + cycle) * interval: evenly over the interval."""
        order = list(range(self.first, self.last))
        per = self.interval / self.total
        cycle, k = 0, 0
        while True:
            now = time.time()
            while k < len(order):
                i = order[k]
                due = t0 + (cycle + i / self.total) * self.interval
                if due > now:
                    break
                self.stats.late_max = max(self.stats.late_max, now - due)
                self.publish(i, cycle, now, self.full_this_cycle(i, cycle))
                k += 1
            if k == len(order):
                cycle, k = cycle + 1, 0
                self.seq = cycle
                continue
            next_due = t0 + (cycle + order[k] / self.total) * self.interval
            await asyncio.sleep(max(TICK, min(next_due - time.time(), 1.0), per))

    def burst(self, nodes: list[int]) -> dict[str, float]:
        """These nodes fail now: each publishes its failing report at once (a change)."""
        sent = {}
        for i in nodes:
            if i in self.nodes:
                self.failing.add(i)
                now = time.time()
                self.publish(i, self.seq, now, True)
                sent[str(i)] = now
        return sent


def proc_usage() -> dict[str, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return {"cpu": usage.ru_utime + usage.ru_stime, "rss_kib": rss}


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def sink(cfg: dict[str, Any], stats: Stats) -> Node:
    """The operator's share of the beats' fan-out: one connection (the operator's login)
    subscribed to every beat, counting them (the operator of this tree does not yet)."""
    loop = asyncio.get_running_loop()
    _, node = await loop.create_connection(
        lambda: Node(stats), cfg["host"], cfg["port"], ssl=cfg.get("ssl_context"),
        server_hostname=cfg.get("server_hostname"),
    )  # fmt: skip
    user, password = cfg.get("operator_login") or ("", "")
    node.send(connect_packet(b"bench-beat-sink", user.encode(), password.encode(), b"bench/sink"))
    await asyncio.wait_for(node.connack, 30)
    node.send(subscribe_packet(f"netval/v1/{cfg['validation']}/+/beat".encode(), 1))
    return node


async def clients_main(cfg: dict[str, Any]) -> None:
    if cfg.get("ca_file"):
        import ssl

        cfg["ssl_context"] = ssl.create_default_context(cafile=cfg["ca_file"])
        cfg["server_hostname"] = cfg["tls_host"]
    fleet = Fleet(cfg)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    sink_stats = Stats()
    while line := await reader.readline():
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "connect":
            seconds = await fleet.connect_all()
            emit({"connected": fleet.stats.connected, "seconds": seconds,
                  "each": sorted(fleet.connect_seconds),
                  "errors": fleet.stats.errors, "refused": fleet.stats.refused_connects})  # fmt: skip
        elif cmd == "run":
            fleet.mode = msg["mode"]
            if cfg.get("sink"):
                await sink(cfg, sink_stats)
            fleet.task = asyncio.create_task(fleet.schedule(msg["t0"]))
            emit({"running": True})
        elif cmd == "stats":
            s = fleet.stats
            emit({"stats": {**s.__dict__, "connected_now": sum(1 for n in fleet.nodes.values()
                                                               if not n.lost),
                            "sink_received": sink_stats.received,
                            "sink_bytes": sink_stats.received_bytes, **proc_usage()}})  # fmt: skip
        elif cmd == "reconnect":
            fleet.reconnect, fleet.restart = True, RestartStats()
            emit({"reconnecting": True})
        elif cmd == "restart_stats":
            emit({"restart_stats": fleet.restart.summary()})
        elif cmd == "burst":
            emit({"burst": fleet.burst([i for i in msg["nodes"] if fleet.first <= i < fleet.last])})
        elif cmd == "stop":
            break
    os._exit(0)  # 100,000 transports: closing each one by one is minutes of nothing useful
