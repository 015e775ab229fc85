"""Agent enrollment at scale: N simulated agents enroll with the operator's real identity
service against the chart's real Mosquitto (dynamic security plugin) and a real HTTP
Kubernetes API.

Run from the repository root (mosquitto must be installed; root is not needed):

    python bench/enrollment.py                   # 1,000 nodes, 3 repetitions, ~1-2 min
    python bench/enrollment.py --nodes 200 --repeat 5 --concurrency 64

What runs, each in its own process, so that CPU is measured per part:

- Broker: Mosquitto configured exactly as the chart renders it (tests/test_chart_broker.py
  `run_chart_broker`: password_file, acl_file, the dynamic security plugin with the chart's
  deny-by-default initial state, persistence).
- Kubernetes API: a stand-in over real HTTP for the two calls enrollment makes (TokenReview,
  Pod GET), answering as a real apiserver does from a token -> pod table (tests/
  test_enrollment.py's `TokenAuthority`, the one the tests give tests/kube.py); any other
  call is a 501 and fails the bench. Its CPU is reported apart (a real apiserver's latency
  is not in these figures: it adds to wall time, not to operator CPU).
- Operator (this process, measured alone): `IdentityService` as `netval operator` starts it:
  the HTTPS enrollment server, the TokenReview + Pod read per request (the official client
  in worker threads), and the dynamic security admin connection.
- Agents: one process with aiohttp, --concurrency enrollments in flight (default 32), each a
  POST with its pod's token over TLS verified with the server's CA.

Per repetition: "create" (no client exists: createRole + createClient per node), then
"rotate" (every node enrolls again: setClientPassword, which also disconnects the old
session). Side by side, "dynsec only": the same N issues from inside the operator without
HTTP or TokenReview (what the broker and plugin cost). Figures are medians over
--repeat repetitions; between repetitions every node's identity is revoked (not timed).
At the end a sample of credentials is checked against the broker (connect accepted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

NS: Final = "netval-system"
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _mosquitto_pid(config_dir: Path) -> int:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"mosquitto") and str(config_dir).encode() in b" ".join(cmd):
                return int(proc.name)
    raise RuntimeError("the broker's process was not found")


# --- role: the Kubernetes API stand-in -----------------------------------------------------


def run_kube(workdir: Path, nodes: int, out: Path) -> None:
    """The three calls enrollment makes (the DaemonSet read once), answered as a real apiserver would (the same answers
    as tests/kube.py's TokenReview table and Pod reads); any other call is a 501 and is
    counted, and the bench fails if there was one."""
    from aiohttp import web

    from test_enrollment import AGENT_LABELS, Claims, TokenAuthority

    authority = TokenAuthority()
    pods: dict[str, dict[str, Any]] = {}
    tokens = {}
    daemonset = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "netval-agent-pool", "namespace": NS, "uid": "ds-uid",
                     "labels": AGENT_LABELS,
                     "ownerReferences": [{"apiVersion": "netval.io/v1alpha1",
                                          "kind": "NetworkValidation", "name": "pool",
                                          "uid": "nv-uid", "controller": True}]},
    }  # fmt: skip
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "netval-agent-pool",
             "uid": "ds-uid", "controller": True}  # fmt: skip
    for i in range(nodes):
        node, pod = f"node-{i:05d}", f"agent-{i:05d}"
        uid = f"uid-{i:05d}"
        pods[pod] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": NS, "uid": uid, "labels": AGENT_LABELS,
                         "ownerReferences": [owner]},
            "spec": {"nodeName": node, "serviceAccountName": "netval-agent",
                     "containers": [{"name": "agent", "image": "netval"}]},
        }  # fmt: skip
        tokens[node] = authority.mint(Claims(pod, uid, node))
    unknown: list[str] = []

    async def token_review(request: web.Request) -> web.Response:
        body = await request.json()
        status = authority.review(body.get("spec") or {})
        return web.json_response({**body, "status": status}, status=201)

    async def read_pod(request: web.Request) -> web.Response:
        pod = pods.get(request.match_info["name"]) if request.match_info["ns"] == NS else None
        if pod is None:
            return web.json_response(
                {"kind": "Status", "code": 404, "reason": "NotFound"}, status=404
            )
        return web.json_response(pod)

    async def read_daemonset(request: web.Request) -> web.Response:
        if request.match_info["ns"] != NS or request.match_info["name"] != "netval-agent-pool":
            return web.json_response(
                {"kind": "Status", "code": 404, "reason": "NotFound"}, status=404
            )
        return web.json_response(daemonset)

    async def anything_else(request: web.Request) -> web.Response:
        unknown.append(f"{request.method} {request.path}")
        print(
            f"bench Kubernetes stand-in: unexpected call {request.method} {request.path}",
            file=sys.stderr,
        )
        return web.json_response(
            {"kind": "Status", "code": 501, "message": "not in the bench"}, status=501
        )

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", token_review)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", read_pod)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/daemonsets/{name}", read_daemonset)
        app.router.add_route("*", "/{tail:.*}", anything_else)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        # (set-up before anything is measured: blocking file I/O is fine here)
        workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}],
        }))  # fmt: skip
        out.write_text(json.dumps({"kubeconfig": str(kubeconfig), "tokens": tokens}))  # noqa: ASYNC240
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        if unknown:
            sys.exit(f"the Kubernetes stand-in got {len(unknown)} unexpected calls: {unknown[:3]}")

    asyncio.run(serve())


# --- role: the agents --------------------------------------------------------------------


async def run_agents(url: str, ca: str, tokens_file: Path, concurrency: int) -> None:
    import ssl

    import aiohttp

    tokens: dict[str, str] = json.loads(tokens_file.read_text())["tokens"]  # noqa: ASYNC240
    context = ssl.create_default_context(cafile=ca)
    latencies: list[float] = []
    failures: dict[str, int] = {}
    passwords: dict[str, list[str]] = {}
    queue = list(tokens.items())

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            node, token = queue.pop()
            start = time.perf_counter()
            async with session.post(url, json={"node": node}, ssl=context,
                                    headers={"Authorization": f"Bearer {token}"}) as response:  # fmt: skip
                body = await response.json()
            latencies.append(time.perf_counter() - start)
            if response.status != 200:
                failures[str(response.status)] = failures.get(str(response.status), 0) + 1
            elif len(passwords) < 20:
                passwords[node] = [body["username"], body["password"], body["clientId"]]

    start = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    wall = time.perf_counter() - start
    print(json.dumps({"wall": wall, "latencies": latencies, "failures": failures,
                      "sample": passwords}))  # fmt: skip


# --- the bench ---------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from identity_kit import Mqtt
    from netval.infra.mqtt_settings import MqttSettings
    from netval.operator.identity.review import PodTokenReviewer
    from netval.operator.identity.service import IdentityService, IdentitySettings
    from netval.operator.kube import certs
    from test_chart_broker import run_chart_broker

    work = Path(tempfile.mkdtemp(prefix="netval-bench-enroll-"))
    (work / "broker").mkdir()
    tls = certs.generate_self_signed(work / "tls", ["127.0.0.1"])
    tokens_file = work / "tokens.json"
    kube_proc = subprocess.Popen(  # noqa: ASYNC220 - started before anything is measured
        [sys.executable, __file__, "--role", "kube", "--nodes", str(args.nodes),
         "--workdir", str(work / "kube"), "--out", str(tokens_file)],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not tokens_file.exists():
            if kube_proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the Kubernetes API process did not come up")
            await asyncio.sleep(0.2)
        kubeconfig = json.loads(tokens_file.read_text())["kubeconfig"]
        from kubernetes import config as kube_config

        api_client = kube_config.new_client_from_config(config_file=kubeconfig)
        with run_chart_broker(work / "broker") as (port, secrets):
            broker_pid = _mosquitto_pid(work / "broker")
            mqtt = MqttSettings("127.0.0.1", port, username="netval-operator",
                                password=secrets["operator"], client_id="bench-operator")  # fmt: skip
            # No per-pod throttle: each round re-enrolls every pod right after the last one.
            settings = IdentitySettings(
                "127.0.0.1",
                0,
                tls.cert,
                tls.key,
                timedelta(hours=24),
                tls.ca,
                min_reissue_seconds=0,
            )
            service = IdentityService(settings, mqtt, PodTokenReviewer(api_client, namespace=NS))
            service.issuer.validations_of = lambda node: {"pool"}  # one validation targets all
            await service.start()
            service.admin.timeout = 300  # the bench measures how long the broker takes
            assert await service.admin.wait_connected(10)
            url = f"https://127.0.0.1:{service.server.port}/v1/enroll"
            rows: dict[str, list[dict[str, float]]] = {
                "create": [],
                "rotate": [],
                "dynsec only": [],
            }
            sample: dict[str, list[str]] = {}
            for _ in range(args.repeat):
                for phase in ("create", "rotate"):
                    rows[phase].append(
                        await _round(
                            url,
                            tls.ca,
                            tokens_file,
                            args.concurrency,
                            broker_pid,
                            kube_proc.pid,
                            sample,
                        )
                    )
                await _revoke_all(service, args.nodes)
                rows["dynsec only"].append(await _dynsec_round(service, args, broker_pid))
                await _revoke_all(service, args.nodes)
            # The last rotate round's credentials were revoked: enroll once more and check some.
            await _round(
                url, tls.ca, tokens_file, args.concurrency, broker_pid, kube_proc.pid, sample
            )
            accepted = 0
            for username, password, client_id in list(sample.values())[:10]:
                client = Mqtt(port, username, password, client_id=client_id)
                accepted += not client.connect().is_failure
                client.close()
            await service.stop()
        _print(args, rows, accepted)
    finally:
        if kube_proc.stdin is not None:
            kube_proc.stdin.close()
        if kube_proc.wait(30) != 0:
            raise SystemExit("the Kubernetes stand-in saw unexpected calls (see above)")


async def _round(url: str, ca: Path, tokens_file: Path, concurrency: int, broker_pid: int,
                 kube_pid: int, sample: dict[str, list[str]]) -> dict[str, float]:  # fmt: skip
    cpu0, broker0, kube0, t0 = (
        _self_cpu(),
        _cpu_of(broker_pid),
        _cpu_of(kube_pid),
        time.perf_counter(),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "agents", "--url", url, "--ca", str(ca),
        "--out", str(tokens_file), "--concurrency", str(concurrency),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    wall = time.perf_counter() - t0
    result = json.loads(out)
    if result["failures"]:
        raise RuntimeError(f"enrollments failed: {result['failures']}")
    sample.clear()
    sample.update(result["sample"])
    lat = sorted(result["latencies"])
    return {
        "wall": result["wall"], "process_wall": wall,
        "operator_cpu": _self_cpu() - cpu0, "broker_cpu": _cpu_of(broker_pid) - broker0,
        "kube_cpu": _cpu_of(kube_pid) - kube0,
        "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99) - 1],
    }  # fmt: skip


async def _dynsec_round(
    service: Any, args: argparse.Namespace, broker_pid: int
) -> dict[str, float]:
    nodes = [f"node-{i:05d}" for i in range(args.nodes)]
    latencies: list[float] = []

    async def worker() -> None:
        while nodes:
            node = nodes.pop()
            start = time.perf_counter()
            await service.issuer.issue(node, f"agent-{node[5:]}")
            latencies.append(time.perf_counter() - start)

    cpu0, broker0, t0 = _self_cpu(), _cpu_of(broker_pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    lat = sorted(latencies)
    return {
        "wall": time.perf_counter() - t0, "operator_cpu": _self_cpu() - cpu0,
        "broker_cpu": _cpu_of(broker_pid) - broker0, "kube_cpu": 0.0,
        "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99) - 1],
    }  # fmt: skip


async def _revoke_all(service: Any, nodes: int) -> None:
    (response,) = await service.admin.execute([{"command": "listClients"}])
    names = [n for n in response["data"]["clients"] if n.startswith("netval-node:")]
    for i in range(0, len(names), 50):
        await service.admin.execute(
            [{"command": "deleteClient", "username": n} for n in names[i : i + 50]]
        )


def _print(
    args: argparse.Namespace, rows: dict[str, list[dict[str, float]]], accepted: int
) -> None:
    print(f"enrollment of {args.nodes} nodes, {args.concurrency} in flight, "
          f"medians of {args.repeat} repetitions (chart's Mosquitto + dynamic security plugin)")  # fmt: skip
    header = ("phase", "wall s", "enroll/s", "operator CPU s", "CPU ms/enroll",
              "broker CPU s", "test API CPU s", "p50 ms", "p99 ms")  # fmt: skip
    print("  ".join(f"{h:>14}" for h in header))
    create_cpu = None
    for phase, samples in rows.items():
        med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        create_cpu = create_cpu or med["operator_cpu"]
        cells = (phase, f"{med['wall']:.2f}", f"{args.nodes / med['wall']:.0f}",
                 f"{med['operator_cpu']:.2f}", f"{1000 * med['operator_cpu'] / args.nodes:.2f}",
                 f"{med['broker_cpu']:.2f}", f"{med['kube_cpu']:.2f}",
                 f"{med['p50_ms']:.1f}", f"{med['p99_ms']:.1f}")  # fmt: skip
        print("  ".join(f"{c:>14}" for c in cells))
    print(f"credentials checked against the broker: {accepted}/10 accepted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--role", choices=("bench", "kube", "agents"), default="bench")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--url")
    parser.add_argument("--ca")
    args = parser.parse_args()
    if args.role == "kube":
        run_kube(args.workdir, args.nodes, args.out)
    elif args.role == "agents":
        asyncio.run(run_agents(args.url, args.ca, args.out, args.concurrency))
    else:
        import mosquitto

        if not mosquitto.available():
            sys.exit(mosquitto.MISSING_REASON)
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
