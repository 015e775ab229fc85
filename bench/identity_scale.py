"""Broker identity at fleet scale, before and after side by side: per-node logins in
Mosquitto's dynamic security plugin (the code of another tree, --before, e.g. main's) vs
client certificates from the identity CA (this tree). N simulated agents, one TLS connection
each, enroll at the operator's real identity service (a real HTTPS server, TokenReview and
Pod reads at a Kubernetes stand-in over HTTP), connect and publish; then the broker pod is
replaced under them.

Run from the repository root as root (file descriptors; mosquitto must be installed):

    mkdir -p /tmp/netval-main && git archive main src | tar -x -C /tmp/netval-main
    python bench/identity_scale.py --nodes 10000 --before /tmp/netval-main/src
    python bench/identity_scale.py --nodes 1000 --repeat 3 --before /tmp/netval-main/src

Phases, each timed from its start, per side:

- enroll: no agent holds a credential; all N start at once (enroll, connect, publish a
  retained report). Until every node's report is acknowledged.
- new pod: the broker SIGKILLed, started again after 5 s with an empty data directory (a
  new pod's emptyDir: the plugin's state as the chart's init container writes it, no
  retained messages). The agents reconnect by the agent's rule (0.5 s doubling to 30 s,
  full jitter); a refusal of the credential (CONNACK 0x86/0x87, or a TLS alert about the
  certificate) makes an agent enroll again (reason `refused`), as `netval agent` does.
  Until every node's report is acknowledged again.
- restart: the same, the data directory kept (a restarted container).

Counted per phase: enrollment requests (by answer), credentials the broker refused,
TokenReviews and Pod/DaemonSet reads at the stand-in (the API calls), connects tried; and
when the operator's own session (the tree's ingest, `ReportIngest`, with its own reconnect
policy) was back; the CPU seconds the operator process used (TokenReview and Pod read, the
CSR checked and signed: its cost per enrollment) and the broker process (TLS handshakes,
credential and ACL checks, the plugin's state; in the broker phases the new broker's whole
CPU). Wall times depend on the machine: the 1-minute load average at each phase's start is
printed with it.

What runs, each in its own process: the broker (TLS listener with a certificate for
127.0.0.1, the chart's limits; the dynsec side: its password file, ACL and plugin as the
chart of that design rendered them; the certificate side: require_certificate,
use_identity_as_username, use_username_as_clientid and the pattern ACL, as this chart
renders them), the Kubernetes stand-in, the operator (the tree's IdentityService and
ReportIngest), and the fleet (hand-rolled MQTT 5 over asyncio TLS, one connection per node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shlex
import shutil
import signal
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NS: Final = "netval-system"
VALIDATION: Final = "pool"
BROKER_DOWN_S: Final = 5.0
AGENT_POLICY: Final = (0.5, 30.0, 10.0)  # the agent publisher's reconnect policy
ENROLL_BACKOFF: Final = (1.0, 60.0)  # netval.agent.enroll.Enroller's
CONNECTS_IN_FLIGHT: Final = 200
HTTP_IN_FLIGHT: Final = 64
PLACEHOLDER: Final = "gpu-00000"
LIMITS: Final = (
    "max_queued_messages 100000\nmax_queued_bytes 0\nmax_inflight_messages 100\n"
    "max_packet_size 1052672\nset_tcp_nodelay true\n"
)


def _tree(src: str) -> None:
    """netval from `src` (the tree under test); the test kits from this checkout."""
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, src)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# --- the broker --------------------------------------------------------------------------

DYNSEC_INITIAL = json.dumps({
    "defaultACLAccess": {"publishClientSend": False, "publishClientReceive": False,
                         "subscribe": False, "unsubscribe": True},
    "clients": [], "groups": [], "roles": [],
})  # fmt: skip


def broker_config(work: Path, side: str, port: int, user: str) -> Path:
    """mosquitto.conf of one side, its files written next to it."""
    import tls_certs

    tls = work / "tls"
    tls.mkdir(parents=True, exist_ok=True)
    ca = tls_certs.make_ca(tls, "broker-ca")
    leaf = tls_certs.issue(ca, tls, "broker", ip_addresses=("127.0.0.1",))
    data = work / "data"
    data.mkdir(exist_ok=True)
    lines = [f"listener {port} 127.0.0.1", "protocol mqtt", f"certfile {leaf.cert_file}",
             f"keyfile {leaf.key_file}", "tls_version tlsv1.2", "allow_anonymous false",
             "persistence true", f"persistence_location {data}/", "autosave_interval 60",
             "max_connections -1", f"user {user}", "log_dest stderr", "log_type error",
             "log_type warning"]  # fmt: skip
    if side == "before":
        passwd = work / "passwd"
        (work / "operator-password").write_text("op-pw")
        subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwd), "netval-operator", "op-pw"],
                       check=True, capture_output=True)  # fmt: skip
        (work / "acl").write_text("user netval-operator\ntopic readwrite netval/#\n"
                                  "topic readwrite $CONTROL/dynamic-security/#\n")  # fmt: skip
        (data / "dynamic-security.json").write_text(DYNSEC_INITIAL)
        plugin = next(Path("/usr/lib").glob("*/mosquitto_dynamic_security.so"))
        lines += [f"cafile {ca.cert_file}", f"password_file {passwd}", f"acl_file {work / 'acl'}",
                  f"plugin {plugin}",
                  f"plugin_opt_config_file {data / 'dynamic-security.json'}"]  # fmt: skip
    else:
        identity = tls_certs.make_ca(tls, "identity-ca")
        (tls / "identity-ca.key").write_bytes(tls_certs.key_pem(identity.key))
        (work / "acl").write_text(
            "user netval-operator\ntopic readwrite netval/#\n\n"
            + "".join(f"pattern {a} netval/v1/%u/{k}\n" for a, k in (
                ("write", "report"), ("write", "beat"), ("readwrite", "state"),
                ("write", "endpoint"), ("write", "loadresult"), ("read", "assignment"),
                ("read", "loadplan")))
        )  # fmt: skip
        lines += [f"cafile {identity.cert_file}", "require_certificate true",
                  "use_identity_as_username true", "use_username_as_clientid true",
                  f"acl_file {work / 'acl'}"]  # fmt: skip
    conf = work / "mosquitto.conf"
    conf.write_text("\n".join(lines) + "\n" + LIMITS)
    return conf


def empty_data(work: Path, side: str) -> None:
    """A new pod: its emptyDir as the init container leaves it."""
    data = work / "data"
    for path in data.iterdir():
        path.unlink()
    if side == "before":
        (data / "dynamic-security.json").write_text(DYNSEC_INITIAL)


async def start_broker(conf: Path, port: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf),
        stdout=asyncio.subprocess.DEVNULL, stderr=(conf.parent / "mosquitto.log").open("ab"),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return proc
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError("the broker did not listen")


# --- a child process speaking JSON lines -------------------------------------------------


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def spawn(cls, role: str, cfg: dict[str, Any]) -> Child:
        # in a file: 10,000 tokens are more than a command line holds
        fd, path = tempfile.mkstemp(prefix=f"netval-bench-{role}-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--role", role, "--child-config", path,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=64 << 20,
        )  # fmt: skip
        return cls(proc)

    async def ask(self, msg: dict[str, Any], key: str, within: float = 7200) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), within)
            if not line:
                raise RuntimeError(f"{key}: child exited ({await self.proc.wait()})")
            answer = json.loads(line)
            if "error" in answer:
                raise RuntimeError(answer["error"])
            if key in answer:
                return answer[key]

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def commands() -> Any:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield json.loads(line)


# --- role: the Kubernetes stand-in ------------------------------------------------------


async def kube_main(cfg: dict[str, Any]) -> None:
    """TokenReview, Pod and DaemonSet reads (as tests/kube.py answers them), counted."""
    from aiohttp import web

    from test_enrollment import AGENT_LABELS, Claims, TokenAuthority

    authority = TokenAuthority()
    calls = {"tokenreviews": 0, "pods": 0, "daemonsets": 0, "other": 0}
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": f"netval-agent-{VALIDATION}",
             "uid": "ds-uid", "controller": True}  # fmt: skip
    daemonset = {"apiVersion": "apps/v1", "kind": "DaemonSet",
                 "metadata": {"name": owner["name"], "namespace": NS, "uid": "ds-uid",
                              "labels": AGENT_LABELS,
                              "ownerReferences": [{"apiVersion": "netval.io/v1alpha1",
                                                   "kind": "NetworkValidation", "name": VALIDATION,
                                                   "uid": "nv-uid", "controller": True}]},
                 "spec": {"selector": {"matchLabels": AGENT_LABELS},
                          "template": {"metadata": {"labels": AGENT_LABELS},
                                       "spec": {"containers": [{"name": "agent",
                                                                "image": "netval"}]}}}}  # fmt: skip
    pods, tokens = {}, {}
    for i in range(cfg["nodes"]):
        node, pod, uid = f"gpu-{i:05d}", f"agent-{i:05d}", f"uid-{i:05d}"
        pods[pod] = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": pod, "namespace": NS, "uid": uid, "labels": AGENT_LABELS,
                                  "ownerReferences": [owner]},
                     "spec": {"nodeName": node, "serviceAccountName": "netval-agent",
                              "containers": [{"name": "agent", "image": "netval"}]}}  # fmt: skip
        # (a day: the tokens outlive the bench, as the kubelet keeps them fresh)
        tokens[node] = authority.mint(Claims(pod, uid, node), lifetime=86400)

    async def token_review(request: web.Request) -> web.Response:
        calls["tokenreviews"] += 1
        body = await request.json()
        return web.json_response({**body, "status": authority.review(body.get("spec") or {})},
                                 status=201)  # fmt: skip

    async def read_pod(request: web.Request) -> web.Response:
        calls["pods"] += 1
        pod = pods.get(request.match_info["name"])
        return web.json_response(pod) if pod else web.json_response({"code": 404}, status=404)

    async def read_daemonset(request: web.Request) -> web.Response:
        calls["daemonsets"] += 1
        return web.json_response(daemonset)

    async def other(request: web.Request) -> web.Response:
        calls["other"] += 1
        return web.json_response({"code": 501}, status=501)

    app = web.Application()
    app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", token_review)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", read_pod)
    app.router.add_get("/apis/apps/v1/namespaces/{ns}/daemonsets/{name}", read_daemonset)
    app.router.add_route("*", "/{tail:.*}", other)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = Path(cfg["workdir"]) / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
    }))  # fmt: skip
    emit({"ready": {"kubeconfig": str(kubeconfig), "tokens": tokens}})
    async for msg in commands():
        if msg["cmd"] == "calls":
            emit({"calls": dict(calls)})


# --- role: the operator (the tree's identity service and ingest) --------------------------


async def operator_main(cfg: dict[str, Any]) -> None:
    _tree(cfg["src"])
    from datetime import timedelta

    from kubernetes import config as kube_config

    from netval.infra.mqtt_settings import MqttSettings
    from netval.operator.identity.review import PodTokenReviewer
    from netval.operator.identity.service import IdentityService, IdentitySettings
    from netval.operator.ingest.subscriber import ReportIngest
    from netval.operator.kube import certs

    work = Path(cfg["workdir"])
    api = kube_config.new_client_from_config(config_file=cfg["kubeconfig"])
    reviewer = PodTokenReviewer(api, namespace=NS)
    tls = certs.generate_self_signed(work / "enroll-tls", ["127.0.0.1"])
    base = MqttSettings("127.0.0.1", cfg["port"], tls=True, ca_file=Path(cfg["broker_ca"]),
                        client_id="bench-operator")  # fmt: skip
    if cfg["side"] == "before":
        mqtt = MqttSettings("127.0.0.1", cfg["port"], tls=True, ca_file=Path(cfg["broker_ca"]),
                            username="netval-operator", password="op-pw",
                            client_id="bench-operator")  # fmt: skip
        settings = IdentitySettings("127.0.0.1", 0, tls.cert, tls.key, timedelta(hours=24), tls.ca)
        service: Any = IdentityService(settings, mqtt, reviewer)
        service.issuer.validations_of = lambda node: {VALIDATION}  # no runtime: it targets all
        ingest_settings = mqtt
    else:
        import dataclasses

        from netval.model.identity import OPERATOR_IDENTITY
        from netval.operator.identity.authority import IdentityAuthority, MintedIdentity

        ca = IdentityAuthority.from_files(Path(cfg["identity_ca"]), Path(cfg["identity_key"]),
                                          lifetime=timedelta(hours=24))  # fmt: skip
        mqtt = dataclasses.replace(base, identity=MintedIdentity(ca, OPERATOR_IDENTITY))
        settings = IdentitySettings("127.0.0.1", 0, tls.cert, tls.key, tls.ca)
        service = IdentityService(settings, mqtt, reviewer, ca)
        ingest_settings = mqtt
    port = await service.start()
    sessions: list[float] = []  # wall times the ingest (re)subscribed
    reports = [0]

    def on_report(report: Any, retained: bool) -> None:
        reports[0] += 1

    ingest = ReportIngest(
        ingest_settings, on_report=on_report, on_state=lambda change: None,
        on_reconnected=lambda shard: sessions.append(time.time()),  # a session after the first
    )  # fmt: skip
    ingest_task = asyncio.create_task(ingest.run())
    emit({"ready": {"port": port, "ca": str(tls.ca)}})
    async for msg in commands():
        if msg["cmd"] == "stats":
            emit({"stats": {"outcomes": dict(service.server.outcomes), "sessions": sessions,
                            "reports": reports[0], "cpu": time.process_time()}})  # fmt: skip
        elif msg["cmd"] == "stop":
            break
    ingest_task.cancel()
    os._exit(0)


# --- role: the fleet -----------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s: bytes) -> bytes:
    return struct.pack("!H", len(s)) + s


def connect_packet(client_id: bytes, user: bytes | None, password: bytes | None,
                   will: bytes) -> bytes:  # fmt: skip
    flags = 0x20 | 0x08 | 0x04 | 0x02  # will retain, will QoS 1, will, clean start
    payload = _str(client_id) + b"\x00" + _str(will) + _str(b"offline")
    if user is not None:
        flags |= 0x80 | 0x40
        payload += _str(user) + _str(password or b"")
    body = _str(b"MQTT") + bytes([5, flags]) + struct.pack("!H", 60) + b"\x00" + payload
    return b"\x10" + _varint(len(body)) + body


def publish_packet(topic: bytes, payload: bytes, packet_id: int) -> bytes:
    body = _str(topic) + struct.pack("!H", packet_id) + b"\x00" + payload
    return bytes([0x30 | 0x02 | 0x01]) + _varint(len(body)) + body


class Conn(asyncio.Protocol):
    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[int] = loop.create_future()
        self.puback: asyncio.Future[int] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.connack, self.puback):
            if not future.done():
                future.set_exception(ConnectionError(str(exc or "closed")))
                future.add_done_callback(lambda f: f.exception())  # read, or not: not lost
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data
        while len(buf) >= 2:
            length, shift, at = 0, 0, 1
            while True:
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
            if kind == 2 and not self.connack.done():
                self.connack.set_result(body[1])
            elif kind == 4 and not self.puback.done():
                self.puback.set_result(body[2] if len(body) > 2 else 0)
        self._buf = buf


class Refused(Exception):
    """The broker refuses the credential: the agent enrolls again."""


class Fleet:
    def __init__(self, cfg: dict[str, Any]) -> None:
        _tree(str(ROOT / "src"))  # the agent's reconnect rule, this tree's (both sides')
        self.cfg = cfg
        self.side = cfg["side"]
        self.n = cfg["nodes"]
        self.tokens: dict[str, str] = cfg["tokens"]
        self.enroll_ctx = ssl.create_default_context(cafile=cfg["enroll_ca"])
        self.creds: dict[int, Any] = {}
        self.reported: dict[int, float] = {}  # node -> wall time its report was acknowledged
        self.counts = {"enroll_requests": 0, "enroll_issued": 0, "enroll_refused": 0,
                       "refused_credentials": 0, "connects": 0, "connect_errors": 0}  # fmt: skip
        self.gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)
        self.rng = random.Random()
        self.session: Any = None
        self.tasks: list[asyncio.Task[None]] = []

    def node(self, i: int) -> str:
        return f"gpu-{i:05d}"

    def report(self, i: int) -> bytes:
        """A real RoCE node's report (bench/ingest.py), this node's, started now."""
        if not hasattr(self, "_template"):
            import ingest

            self._template = ingest.build_report(0, 2, 0.0).to_json()
        now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".000000Z"
        text = self._template.replace(PLACEHOLDER, self.node(i)).replace(
            "2000-01-01T00:00:00Z", now
        )
        return text.replace('"validation":"fabric"', f'"validation":"{VALIDATION}"').encode()

    async def enroll(self, i: int, reason: str) -> Any:
        """Enroll until a credential (the agent's Enroller: Retry-After honoured, plus up
        to half as much again; else backoff 1 s doubling to 60 s, full jitter)."""
        from netval.infra.mqtt_client import backoff_delay

        node = self.node(i)
        failures = 0
        while True:
            key_pem, body = None, {"node": node, "reason": reason}
            if self.side == "after":
                from netval.agent.enroll import make_csr

                key_pem, csr = make_csr(f"{VALIDATION}/{node}")
                body["csr"] = csr.decode()
            self.counts["enroll_requests"] += 1
            floor = 0.0
            try:
                async with self.session.post(
                    self.cfg["enroll_url"], json=body, ssl=self.enroll_ctx,
                    headers={"Authorization": f"Bearer {self.tokens[node]}"},
                ) as response:  # fmt: skip
                    answer = await response.json(content_type=None)
                    if response.status == 200:
                        self.counts["enroll_issued"] += 1
                        return (answer, key_pem)
                    self.counts["enroll_refused"] += 1
                    header = response.headers.get("Retry-After", "")
                    floor = float(header) if header.isdigit() else 0.0
            except Exception:
                self.counts["enroll_refused"] += 1
            failures += 1
            delay = max(floor, backoff_delay(failures, base=ENROLL_BACKOFF[0],
                                             cap=ENROLL_BACKOFF[1], rng=self.rng))  # fmt: skip
            if floor:
                delay += self.rng.uniform(0, floor / 2)
            await asyncio.sleep(delay)

    def context(self, i: int) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.cfg["broker_ca"])
        ctx.check_hostname = False  # the broker's certificate names 127.0.0.1 (an IP SAN)
        cred = self.creds[i]
        if self.side == "after":
            from netval.infra.mqtt_settings import PemIdentity, load_identity

            answer, key = cred
            load_identity(ctx, PemIdentity(answer["certificate"].encode(), key))
        return ctx

    async def connect(self, i: int) -> Conn:
        loop = asyncio.get_running_loop()
        answer, _ = self.creds[i]
        async with self.gate:
            self.counts["connects"] += 1
            _, conn = await asyncio.wait_for(loop.create_connection(
                Conn, "127.0.0.1", self.cfg["port"], ssl=self.context(i),
                server_hostname="127.0.0.1"), 30)  # fmt: skip
            will = f"netval/v1/{VALIDATION}/{self.node(i)}/state".encode()
            if self.side == "before":
                packet = connect_packet(answer["clientId"].encode(), answer["username"].encode(),
                                        answer["password"].encode(), will)  # fmt: skip
            else:
                packet = connect_packet(answer["username"].encode(), None, None, will)
            assert conn.transport is not None
            conn.transport.write(packet)
            try:
                code = await asyncio.wait_for(conn.connack, 30)
            except ConnectionError as exc:  # a TLS alert about the certificate: refused
                if "certificate" in str(exc).lower() and "alert" in str(exc).lower():
                    raise Refused(str(exc)) from None
                raise
            if code in (0x86, 0x87, 4, 5):
                conn.transport.abort()
                raise Refused(f"CONNACK {code:#x}")
            if code != 0:
                conn.transport.abort()
                raise ConnectionError(f"CONNACK {code:#x}")
        return conn

    async def agent(self, i: int) -> None:
        """One agent: enroll, connect, publish; reconnect by the agent's rule; enroll
        again only when the broker refuses the credential."""
        from netval.infra.mqtt_client import ReconnectPolicy, ReconnectRule

        rule = ReconnectRule(ReconnectPolicy(*AGENT_POLICY), rng=self.rng)
        reason = "start"
        while True:
            if i not in self.creds or reason == "refused":
                self.creds[i] = await self.enroll(i, reason)
                reason = "renew"
            error: BaseException | None = None
            try:
                conn = await self.connect(i)
                rule.connected()
                assert conn.transport is not None
                conn.transport.write(publish_packet(
                    f"netval/v1/{VALIDATION}/{self.node(i)}/report".encode(), self.report(i), 1))  # fmt: skip
                if await asyncio.wait_for(conn.puback, 30) < 0x80:
                    self.reported[i] = time.time()
                await conn.lost
            except Refused as exc:
                self.counts["refused_credentials"] += 1
                reason, error = "refused", exc
            except (OSError, TimeoutError, ConnectionError) as exc:
                self.counts["connect_errors"] += 1
                error = exc
            end = rule.ended(error)
            await asyncio.sleep(end.delay)

    async def main(self) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=HTTP_IN_FLIGHT),
            timeout=aiohttp.ClientTimeout(total=10),  # the Enroller's
        )
        async for msg in commands():
            if msg["cmd"] == "go":
                self.tasks = [asyncio.create_task(self.agent(i)) for i in range(self.n)]
                emit({"going": True})
            elif msg["cmd"] == "stats":
                since = msg.get("since", 0.0)
                back = [t for t in self.reported.values() if t >= since]
                emit({"stats": {**self.counts, "reported": len(back),
                                "last": max(back) if back else None}})  # fmt: skip
            elif msg["cmd"] == "stop":
                break
        os._exit(0)


# --- the orchestration ---------------------------------------------------------------------


async def wait_reported(fleet: Child, n: int, since: float, limit: float) -> dict[str, Any]:
    deadline = time.time() + limit
    while True:
        stats = await fleet.ask({"cmd": "stats", "since": since}, "stats")
        if stats["reported"] >= n or time.time() > deadline:
            return dict(stats)
        await asyncio.sleep(1.0 if time.time() - since > 10 else 0.2)


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int | float)}


async def one_side(side: str, src: str, args: argparse.Namespace) -> dict[str, Any]:
    n = args.nodes
    fig: dict[str, Any] = {"side": side, "nodes": n, "tree": src}
    work = Path(tempfile.mkdtemp(prefix=f"netval-identity-{side}-"))
    port = _free_port()
    user = os.environ.get("USER") or "root"
    conf = broker_config(work, side, port, user)
    broker = await start_broker(conf, port)
    children: list[Child] = []
    try:
        kube = await Child.spawn("kube", {"nodes": n, "workdir": str(work)})
        children.append(kube)
        ready = await kube.ask({"cmd": "noop"}, "ready")
        op_cfg = {"src": src, "side": side, "workdir": str(work), "kubeconfig": ready["kubeconfig"],
                  "port": port, "broker_ca": str(work / "tls" / "broker-ca.crt"),
                  "identity_ca": str(work / "tls" / "identity-ca.crt"),
                  "identity_key": str(work / "tls" / "identity-ca.key")}  # fmt: skip
        operator = await Child.spawn("operator", op_cfg)
        children.append(operator)
        op = await operator.ask({"cmd": "noop"}, "ready")
        fleet = await Child.spawn("fleet", {
            "side": side, "nodes": n, "tokens": ready["tokens"], "port": port,
            "broker_ca": op_cfg["broker_ca"], "enroll_ca": op["ca"],
            "enroll_url": f"https://127.0.0.1:{op['port']}/v1/enroll",
        })  # fmt: skip
        children.append(fleet)
        # -- enroll from empty
        calls0 = await kube.ask({"cmd": "calls"}, "calls")
        op_cpu0 = (await operator.ask({"cmd": "stats"}, "stats"))["cpu"]
        broker_cpu0 = cpu_s(broker.pid)
        fig["enroll_load1"] = load1()
        t0 = time.time()
        await fleet.ask({"cmd": "go"}, "going")
        stats = await wait_reported(fleet, n, t0, args.timeout)
        fig["enroll_all_s"] = (stats["last"] - t0) if stats["reported"] >= n else None
        fig["enroll_reported"] = stats["reported"]
        fig["enroll_counts"] = {k: stats[k] for k in ("enroll_requests", "enroll_issued",
                                                       "refused_credentials", "connects")}  # fmt: skip
        fig["enroll_api"] = delta(await kube.ask({"cmd": "calls"}, "calls"), calls0)
        op_stats = await operator.ask({"cmd": "stats"}, "stats")
        fig["enroll_outcomes"] = op_stats["outcomes"]
        # the operator's CPU: TokenReview and Pod read, the CSR checked and signed, per node
        fig["enroll_operator_cpu_s"] = op_stats["cpu"] - op_cpu0
        fig["enroll_broker_cpu_s"] = cpu_s(broker.pid) - broker_cpu0
        print(f"  {side}: {n:,} enrolled and reported in {fig['enroll_all_s']} s "
              f"({fig['enroll_counts']}, API {fig['enroll_api']})", file=sys.stderr, flush=True)  # fmt: skip
        await asyncio.sleep(12)  # every session held past the agents' stable 10 s
        for phase, empty in (("newpod", True), ("restart", False)):
            before_stats = await fleet.ask({"cmd": "stats"}, "stats")
            calls0 = await kube.ask({"cmd": "calls"}, "calls")
            op0 = await operator.ask({"cmd": "stats"}, "stats")
            fig[f"{phase}_load1"] = load1()
            t_kill = time.time()
            broker.send_signal(signal.SIGKILL)
            await broker.wait()
            await asyncio.sleep(BROKER_DOWN_S)
            if empty:
                empty_data(work, side)
            broker = await start_broker(conf, port)
            t_up = time.time()
            stats = await wait_reported(fleet, n, t_kill, args.timeout)
            # a new broker process: all its CPU is this phase's (TLS handshakes, the
            # credential checks, the ACL checks of the reports, the retained store)
            fig[f"{phase}_broker_cpu_s"] = cpu_s(broker.pid)
            op1 = await operator.ask({"cmd": "stats"}, "stats")
            fig[f"{phase}_operator_cpu_s"] = op1["cpu"] - op0["cpu"]
            back = [t for t in op1["sessions"] if t > t_kill]
            fig[f"{phase}_all_s"] = (stats["last"] - t_kill) if stats["reported"] >= n else None
            fig[f"{phase}_all_after_up_s"] = (
                (stats["last"] - t_up) if stats["reported"] >= n else None
            )
            fig[f"{phase}_reported"] = stats["reported"]
            fig[f"{phase}_operator_back_s"] = (back[0] - t_up) if back else None
            d = delta(stats, before_stats)
            fig[f"{phase}_counts"] = {k: d.get(k, 0) for k in ("enroll_requests", "enroll_issued",
                                                               "refused_credentials", "connects")}  # fmt: skip
            fig[f"{phase}_api"] = delta(await kube.ask({"cmd": "calls"}, "calls"), calls0)
            fig[f"{phase}_outcomes"] = {k: v - op0["outcomes"].get(k, 0)
                                        for k, v in op1["outcomes"].items()}  # fmt: skip
            print(f"  {side} {phase}: every node back {fig[f'{phase}_all_s']} s after the kill, "
                  f"operator back {fig[f'{phase}_operator_back_s']} s after the broker, "
                  f"{fig[f'{phase}_counts']}, API {fig[f'{phase}_api']}",
                  file=sys.stderr, flush=True)  # fmt: skip
            await asyncio.sleep(12)
        return fig
    finally:
        for child in children:
            child.kill()
        if broker.returncode is None:
            broker.kill()
        shutil.rmtree(work, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(figs: list[dict[str, Any]]) -> None:
    def cell(value: Any, fmt: str = ".1f") -> str:
        return "-" if value is None else format(value, fmt)

    print(
        "| side | nodes | phase | every node reported (from start / kill) | after the broker "
        "listened | operator session back | enrollment requests | credentials issued | "
        "refused credentials | TokenReviews | Pod reads | operator CPU | broker CPU | "
        "load (1 min) |"
    )
    print("|:---|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in figs:
        for phase, label in (("enroll", "enroll from empty"), ("newpod", "new empty broker pod"),
                             ("restart", "broker container restarted")):  # fmt: skip
            counts = f.get(f"{phase}_counts") or {}
            api = f.get(f"{phase}_api") or {}
            print(f"| {f['side']} | {f['nodes']:,} | {label} | {cell(f.get(f'{phase}_all_s'))} s | "
                  f"{cell(f.get(f'{phase}_all_after_up_s'))} s | "
                  f"{cell(f.get(f'{phase}_operator_back_s'), '.2f')} s | "
                  f"{counts.get('enroll_requests', 0):,} | {counts.get('enroll_issued', 0):,} | "
                  f"{counts.get('refused_credentials', 0):,} | {api.get('tokenreviews', 0):,} | "
                  f"{api.get('pods', 0):,} | {cell(f.get(f'{phase}_operator_cpu_s'), '.2f')} s | "
                  f"{cell(f.get(f'{phase}_broker_cpu_s'), '.2f')} s | "
                  f"{f.get(f'{phase}_load1', 0):.2f} |")  # fmt: skip


def median_fig(figs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each numeric figure over repetitions (counts: of each)."""
    out = dict(figs[0])
    for key, value in figs[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values = [f[key] for f in figs if f.get(key) is not None]
            out[key] = statistics.median(values) if values else None
    return out


async def main_async(args: argparse.Namespace) -> None:
    limit = int(Path("/proc/sys/fs/nr_open").read_text())  # noqa: ASYNC240 - before anything
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    except (ValueError, OSError):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sides = []
    if args.before:
        sides.append(("before", args.before))
    sides.append(("after", str(ROOT / "src")))
    figs = []
    for side, src in sides:
        runs = []
        for r in range(args.repeat if side == "after" else args.repeat_before):
            print(f"{side} run {r + 1}", file=sys.stderr, flush=True)
            runs.append(await one_side(side, src, args))
            print("RUN " + json.dumps(runs[-1]), file=sys.stderr, flush=True)
        figs.append(median_fig(runs) if len(runs) > 1 else runs[0])
    print(f"\ncommand: {shlex.join(['python', 'bench/identity_scale.py', *sys.argv[1:]])}")
    print(
        f"{os.cpu_count()} CPUs; medians of {args.repeat} runs (after), "
        f"{args.repeat_before} (before)\n"
    )
    table(figs)
    print("\nFIGURES " + json.dumps(figs))
    if args.json:
        Path(args.json).write_text(json.dumps(figs, indent=1))  # noqa: ASYNC240 - at the end


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--before", help="src of the dynamic-security tree (e.g. main's)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the after side")
    parser.add_argument("--repeat-before", type=int, default=1, help="runs of the before side")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per phase, s")
    parser.add_argument("--json")
    parser.add_argument("--role", choices=["main", "kube", "operator", "fleet"], default="main")
    parser.add_argument("--child-config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "main":
        _tree(str(ROOT / "src"))
        asyncio.run(main_async(args))
        return
    cfg = json.loads(Path(args.child_config).read_text())
    Path(args.child_config).unlink()
    _tree(cfg.get("src", str(ROOT / "src")))
    if args.role == "kube":
        asyncio.run(kube_main(cfg))
    elif args.role == "operator":
        asyncio.run(operator_main(cfg))
    else:
        asyncio.run(Fleet(cfg).main())


if __name__ == "__main__":
    main()
