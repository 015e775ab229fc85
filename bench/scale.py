"""One MQTT connection per simulated node: the chart's Mosquitto and the operator's ingest at
10,000 / 30,000 (/ 100,000) nodes, full reports every interval side by side with beats.

Run from the repository root (mosquitto must be installed; run as root for the file
descriptor limits):

    python bench/scale.py                       # 10,000 and 30,000 nodes, full and beats
    python bench/scale.py --nodes 100000        # the attempt: says what failed, if anything
    python bench/scale.py --nodes 10000 --transport tls   # the chart's TLS listener
    python bench/scale.py --quick               # 500 nodes, seconds (tests/test_bench_scale.py)
    python bench/scale.py --nodes 10000 --transport tls --scenario broker-restart operator-rollout

--scenario (bench/scale_scenarios.py): after the steady window, instead of the burst, a
broker restart (SIGKILL, back after 5 s with its data; the nodes reconnect as the agent
does), a broker replaced by a new empty pod (the same, its data directory emptied) and/or
an operator rollout (SIGTERM, a new operator replays), with their own table.

Per size and mode (`full`, `beats`), each on a fresh broker, operator and fleet:
- Broker: the chart's rendered mosquitto.conf and ACL (tests/test_chart_broker.py
  `run_chart_broker`: persistence, the chart's per-client limits), plus `max_connections -1`;
  it inherits this process's RLIMIT_NOFILE, raised to the kernel's nr_open (or, without
  CAP_SYS_RESOURCE, to the hard limit: 20,000 on the machine of docs/performance.md, which
  caps a broker process at 19,993 connections).
- Identity: with --transport tls, per-node identity as the chart has it by default: every
  node shows its own client certificate of the chart's identity CA (`<validation>/<node>`,
  as enrollment signs it; minted in the client processes before anything is timed), the
  broker keeps no per-client state. With --transport plaintext (client certificates need
  TLS) the chart's shared agent login (`mqtt.identity.enabled=false`).
- Nodes (bench/scale_client.py): hand-rolled MQTT 5 clients, one connection per node, a
  retained `offline` will, `online` on connect, reports retained QoS 1 (a real RoCE
  node's, 40 results, bench/ingest.py's `build_report`), spread evenly over --interval.
  `full`: every node publishes its full report every interval. `beats`: 1 % of the nodes
  publish a (changed) full report per interval, the others a beat on
  `netval/v1/<validation>/<node>/beat` (QoS --beat-qos, retained as the agent sends it,
  with the digest of the node's standing report, which the operator checks).
- Operator (bench/scale_operator.py): the real `OperatorRuntime` in its own process,
  started once every node's first report is retained (the replay at start is measured),
  API writes counted by a stand-in (no API-server latency).

Timeline: connect all -> publishing starts -> one interval later the operator starts (replay
of N retained reports until a status says N reporting) -> one interval of warm-up -> the
steady window (--window): CPU (/proc/<pid>/stat) and RSS (VmRSS each second, VmHWM) of the
broker, operator and clients, messages/s, API writes/s -> the burst: --burst nodes fail at
once, each publishing its failing report; detect-to-status is, per failing node in publish
order (rank r), the time from its publish to the first status patch counting >= r failing
nodes (the operator reads in order on one connection). Burst writes/s: writes from the
burst until two status windows after the last failing node is counted, over that time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import secrets
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import scale_scenarios  # noqa: E402
from scale_client import clients_main  # noqa: E402

CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
MIB: Final = 1024 * 1024
NODES_PER_CLIENT_PROCESS: Final = 15000  # under the 20,000 fds a process may hold here
TIMEOUT: Final = 600.0


# -- the broker ---------------------------------------------------------------------------


def broker_pid(conf: Path) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(conf).encode() in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    raise RuntimeError(f"no mosquitto process with {conf}")


# -- process metrics ----------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_s() -> float:
    """CPU-seconds the whole machine spent busy (/proc/stat, all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def vm_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


# -- children -----------------------------------------------------------------------------


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def spawn(cls, role: str, cfg: dict[str, Any]) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--role", role, "--child-config", json.dumps(cfg),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=256 * MIB,
        )  # fmt: skip
        return cls(proc)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())

    async def expect(self, key: str, within: float = TIMEOUT) -> Any:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), within)
            if not line:
                raise RuntimeError(f"{key!r}: child exited ({await self.proc.wait()})")
            msg = json.loads(line)
            if "error" in msg:
                raise RuntimeError(msg["error"])
            if key in msg:
                return msg[key] if len(msg) == 1 else msg

    async def ask(self, msg: dict[str, Any], key: str) -> Any:
        self.send(msg)
        return await self.expect(key)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


class Sampler:
    """RSS of some processes each second, and their CPU between `mark`s."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.rss_max: dict[str, float] = dict.fromkeys(pids, 0.0)
        self._task: asyncio.Task[None] | None = None

    def cpu(self) -> dict[str, float]:
        return {who: sum(cpu_s(p) for p in ps) for who, ps in self.pids.items()}

    def rss(self) -> dict[str, float]:
        return {who: sum(vm_mib(p) for p in ps) for who, ps in self.pids.items()}

    async def _run(self) -> None:
        while True:
            for who, mib in self.rss().items():
                self.rss_max[who] = max(self.rss_max[who], mib)
            await asyncio.sleep(1.0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


# -- one case -----------------------------------------------------------------------------


def templates() -> tuple[str, str]:
    import ingest  # bench/ingest.py: a real RoCE node's report

    return (ingest.build_report(0, 2, 0.0).to_json(), ingest.build_report(0, 2, 100.0).to_json())


async def run_case(n: int, mode: str, tls: bool, args: argparse.Namespace,
                   port: int, pw: dict[str, str], conf: Path, secret: str,
                   work: Path) -> dict[str, Any]:  # fmt: skip
    from test_chart_broker import BROKER_HOST, rendered_ca

    fig: dict[str, Any] = {"nodes": n, "mode": mode, "transport": "tls" if tls else "plaintext"}
    bpid = broker_pid(conf)
    fig["broker_rss_idle_mib"] = vm_mib(bpid)
    ca_file = None
    if tls:
        ca_file = str(work / "ca.crt")
        await asyncio.to_thread(Path(ca_file).write_text, rendered_ca())
    pass_t, fail_t = templates()
    procs = max(1, math.ceil(n / args.nodes_per_process))
    common = {"validation": "fabric", "total": n, "interval": args.interval, "host": "127.0.0.1",
              "port": port, "beat_qos": args.beat_qos, "secret": secret, "ca_file": ca_file,
              "tls_host": BROKER_HOST, "template_pass": pass_t, "template_fail": fail_t}  # fmt: skip
    if tls:  # per-node identity: each node's certificate, the operator's own
        common["identity"] = {"ca": pw["identity_ca"], "key": pw["identity_key"]}
    else:  # the chart's shared agent login
        common["shared_login"] = ["netval-agent", pw["agent"]]
        common["operator_login"] = ["netval-operator", pw["operator"]]
    clients: list[Child] = []
    operator: Child | None = None
    scenario: scale_scenarios.Ctx | None = None
    try:
        for p in range(procs):
            first, last = n * p // procs, n * (p + 1) // procs
            sink = False  # the operator reads the beats itself
            clients.append(await Child.spawn("clients", {**common, "first": first, "last": last,
                                                         "sink": sink}))  # fmt: skip
        t = time.monotonic()
        for c in clients:
            c.send({"cmd": "connect"})
        answers = [await c.expect("connected") for c in clients]
        fig["connect_all_s"] = time.monotonic() - t
        each = sorted(x for a in answers for x in a["each"])
        fig["connect_each_p50_s"], fig["connect_each_p99_s"] = pct(each, 0.5), pct(each, 0.99)
        fig["connected"] = sum(a["connected"] for a in answers)
        errors: dict[str, int] = {}
        for a in answers:
            for k, v in a["errors"].items():
                errors[k] = errors.get(k, 0) + v
        fig["connect_errors"] = errors
        fig["connect_refused"] = sum(a["refused"] for a in answers)
        fig["broker_rss_connected_mib"] = vm_mib(bpid)
        print(f"  {n:,} {mode} {fig['transport']}: {fig['connected']:,} connected in "
              f"{fig['connect_all_s']:.1f} s {fig['connect_errors'] or ''}",
              file=sys.stderr, flush=True)  # fmt: skip
        if fig["connected"] < n:
            fig["failed"] = f"only {fig['connected']:,} of {n:,} connected"
            return fig
        t0 = time.time() + 0.5
        for c in clients:
            await c.ask({"cmd": "run", "mode": mode, "t0": t0}, "running")
        await asyncio.sleep(t0 + args.interval + 1.0 - time.time())  # every first report out

        operator_cfg = {
            "nodes": n, "interval": args.interval, "workdir": str(work),
            "password": None if tls else pw["operator"],
            "identity": common.get("identity"),
            "url": f"mqtts://{BROKER_HOST}:{port}" if tls else f"mqtt://127.0.0.1:{port}",
            "ca_file": ca_file, "tls_host": BROKER_HOST if tls else None,
            "replay_timeout": TIMEOUT,
        }  # fmt: skip
        operator = await Child.spawn("operator", operator_cfg)
        await operator.expect("ready")
        fig["replay_synced_s"] = (await operator.expect("synced"))["synced"]
        replayed = await operator.expect("replayed")
        fig["replay_s"], fig["replay_retained"] = replayed["replayed"], replayed["retained"]
        print(f"  operator replayed {fig['replay_retained']:,} in {fig['replay_s']:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip

        pids = {"broker": [bpid], "operator": [operator.proc.pid],
                "clients": [c.proc.pid for c in clients]}  # fmt: skip
        sampler = Sampler(pids)
        sampler.start()
        # warm-up: at least --warmup, then until the operator reads live reports less than
        # 5 s old (it also read the reports published during its replay), 3 intervals at most
        warm_end, cap = time.time() + args.warmup, time.time() + 3 * args.interval
        await asyncio.sleep(args.warmup)
        while time.time() < cap and mode == "full":
            if (await operator.ask({"cmd": "stats", "since": time.time()}, "stats"))["lag"] < 5:
                break
            await asyncio.sleep(1.0)
        fig["warmup_s"] = time.time() - warm_end + args.warmup
        w0, cpu0, busy0 = time.time(), sampler.cpu(), machine_busy_s()
        cs0 = [await c.ask({"cmd": "stats"}, "stats") for c in clients]
        op0 = await operator.ask({"cmd": "stats", "since": w0}, "stats")
        await asyncio.sleep(args.window)
        w1, cpu1, busy1 = time.time(), sampler.cpu(), machine_busy_s()
        cs1 = [await c.ask({"cmd": "stats"}, "stats") for c in clients]
        op1 = await operator.ask({"cmd": "stats", "since": w0}, "stats")
        wall = w1 - w0
        for who in pids:
            fig[f"{who}_cpu_pct"] = 100 * (cpu1[who] - cpu0[who]) / wall
            fig[f"{who}_rss_mib"] = sampler.rss_max[who]
        fig["other_load_pct"] = 100 * (busy1 - busy0) / wall - sum(
            fig[f"{who}_cpu_pct"] for who in pids
        )
        fig["operator_lag_start_s"], fig["operator_lag_end_s"] = op0["lag"], op1["lag"]
        fig["operator_hwm_mib"] = vm_mib(operator.proc.pid, "VmHWM")
        fig["broker_hwm_mib"] = vm_mib(bpid, "VmHWM")
        reports = sum(b["reports"] - a["reports"] for a, b in zip(cs0, cs1, strict=True))
        beats = sum(b["beats"] - a["beats"] for a, b in zip(cs0, cs1, strict=True))
        fig["reports_per_s"], fig["beats_per_s"] = reports / wall, beats / wall
        fig["msgs_per_s"] = (reports + beats) / wall
        fig["mbytes_per_s_in"] = sum(b["bytes_out"] - a["bytes_out"]
                                     for a, b in zip(cs0, cs1, strict=True)) / wall / 1e6  # fmt: skip
        fig["operator_reports_per_s"] = (op1["live"] - op0["live"]) / wall
        fig["operator_beats_per_s"] = (op1["beats"] - op0["beats"]) / wall
        fig["sink_beats_per_s"] = (cs1[0]["sink_received"] - cs0[0]["sink_received"]) / wall
        steady = [w for w in op1["writes"] if w[0] < w1]
        fig["api_writes_steady_per_s"] = len(steady) / wall
        fig["api_writes_steady_kinds"] = sorted({k for _, k in steady})
        fig["connected_end"] = sum(s["connected_now"] for s in cs1)
        fig["clients_late_max_s"] = max(s["late_max"] for s in cs1)
        print(f"  steady: {fig['msgs_per_s']:,.0f} msg/s, broker {fig['broker_cpu_pct']:.0f} %, "
              f"operator {fig['operator_cpu_pct']:.0f} % {fig['operator_rss_mib']:.0f} MiB",
              file=sys.stderr, flush=True)  # fmt: skip

        if args.scenario:
            sampler.stop()
            scenario = scale_scenarios.Ctx(n, args, port, conf, bpid, clients, operator,
                                           operator_cfg, Child.spawn)  # fmt: skip
            await scale_scenarios.run(scenario, fig)
            return fig
        burst = [k * (n // args.burst) for k in range(args.burst)]
        sent: dict[str, float] = {}
        for c in clients:
            sent.update(await c.ask({"cmd": "burst", "nodes": burst}, "burst"))
        times = sorted(sent.values())
        b0 = times[0]
        deadline = time.time() + args.burst_timeout
        counted_at = None
        while time.time() < deadline:
            st = await operator.ask({"cmd": "stats", "since": b0}, "stats")
            if any(f >= len(times) for _, _, f in st["patches"]):
                counted_at = time.time()
                break
            await asyncio.sleep(0.25)
        if counted_at is not None:
            await asyncio.sleep(4.0)  # two status windows: the writes the burst caused
        st = await operator.ask({"cmd": "stats", "since": b0}, "stats")
        lat = []
        for rank, published in enumerate(times, 1):
            at = next((t for t, _, f in st["patches"] if f >= rank), None)
            if at is not None:
                lat.append(at - published)
        fig["burst_nodes"] = len(times)
        fig["burst_counted"] = len(lat)
        fig["detect_p50_s"], fig["detect_p99_s"] = pct(lat, 0.5), pct(lat, 0.99)
        fig["burst_all_counted_s"] = (counted_at - b0) if counted_at else None
        span = time.time() - b0
        fig["api_writes_burst_per_s"] = len(st["writes"]) / span
        fig["api_writes_burst"] = {k: sum(1 for _, x in st["writes"] if x == k)
                                   for k in sorted({x for _, x in st["writes"]})}  # fmt: skip
        fig["operator_dropped"], fig["operator_problems"] = st["dropped"], st["problems"]
        sampler.stop()
        print(f"  burst: p50 {fig['detect_p50_s']:.2f} s p99 {fig['detect_p99_s']:.2f} s, "
              f"{fig['api_writes_burst']}", file=sys.stderr, flush=True)  # fmt: skip
        return fig
    finally:
        extra = scenario.children if scenario else []
        for child in [*clients, *([operator] if operator else []), *extra]:
            child.kill()
            await child.proc.wait()
        for broker in scenario.brokers if scenario else []:
            if broker.returncode is None:
                broker.terminate()
                await broker.wait()


def case(n: int, mode: str, tls: bool, args: argparse.Namespace) -> dict[str, Any]:
    from test_chart_broker import plaintext_listener, run_chart_broker

    secret = secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="netval-scale-") as tmp:
        work = Path(tmp)
        (work / "broker").mkdir()

        def edit(conf: str) -> str:
            return (conf if tls else plaintext_listener(conf)) + "\nmax_connections -1\n"

        # TLS: per-node identity (the chart's default); plaintext: the shared agent login
        variant = "default" if tls else "broker-shared-login"
        t = time.monotonic()
        with run_chart_broker(work / "broker", edit, variant) as (port, pw):
            started = time.monotonic() - t
            fig = asyncio.run(run_case(n, mode, tls, args, port, pw,
                                       work / "broker" / "mosquitto.conf", secret, work))  # fmt: skip
        fig["broker_start_s"] = started
        return fig


# -- output -------------------------------------------------------------------------------


def cell(fig: dict[str, Any], key: str, fmt: str) -> str:
    value = fig.get(key)
    return "-" if value is None or value == "" else format(value, fmt)


def table(figs: list[dict[str, Any]]) -> None:
    print("| nodes | mode | transport | all connected | broker RSS (connected / steady) | "
          "broker CPU | operator RSS (HWM) | operator CPU | operator lag | clients CPU | "
          "msgs/s (reports + beats) | operator reports + beats/s | detect-to-status p50 / p99 | "
          "API writes/s steady / burst | replay at start | other load |")  # fmt: skip
    print("|---:|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in figs:
        if "failed" in f:
            print(f"| {f['nodes']:,} | {f['mode']} | {f['transport']} | FAILED: {f['failed']} "
                  f"{f.get('connect_errors') or ''} |" + " |" * 12)  # fmt: skip
            continue
        dagger = ""
        print(
            f"| {f['nodes']:,} | {f['mode']} | {f['transport']} | {f['connect_all_s']:.1f} s | "
            f"{f['broker_rss_connected_mib']:.0f} / {f['broker_rss_mib']:.0f} MiB | "
            f"{f['broker_cpu_pct']:.0f} % | {f['operator_rss_mib']:.0f} "
            f"({f['operator_hwm_mib']:.0f}) MiB{dagger} | {f['operator_cpu_pct']:.0f} %{dagger} | "
            f"{f['operator_lag_end_s']:.1f} s | {f['clients_cpu_pct']:.0f} % | "
            f"{f['msgs_per_s']:,.0f} ({f['reports_per_s']:,.0f} + {f['beats_per_s']:,.0f}) | "
            f"{f['operator_reports_per_s']:,.0f} + {f['operator_beats_per_s']:,.0f} | "
            f"{cell(f, 'detect_p50_s', '.2f')} / {cell(f, 'detect_p99_s', '.2f')} s | "
            f"{f['api_writes_steady_per_s']:.2f}{dagger} / {cell(f, 'api_writes_burst_per_s', '.1f')} | "
            f"{f['replay_s']:.1f} s | {f['other_load_pct']:.0f} % |"
        )
    print("CPU in % of one core; operator lag: age of the newest live report it had read at "
          "the end of the window (behind when it exceeds the interval); other load: CPU of "
          "processes outside the bench during the window")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+")
    parser.add_argument("--modes", nargs="+", choices=["full", "beats"], default=["full", "beats"])
    parser.add_argument("--interval", type=float, default=10.0, help="report interval, s")
    parser.add_argument("--window", type=float, default=30.0, help="steady window, s")
    parser.add_argument("--warmup", type=float, help="s before the window (default: interval)")
    parser.add_argument("--burst", type=int, default=1000, help="nodes failing at once")
    parser.add_argument("--burst-timeout", type=float, default=120.0)
    parser.add_argument("--beat-qos", type=int, choices=[0, 1], default=0)
    parser.add_argument("--transport", nargs="+", choices=["plaintext", "tls"],
                        default=["plaintext"], help="tls: the chart's TLS listener, verified")  # fmt: skip
    parser.add_argument("--nodes-per-process", type=int, default=NODES_PER_CLIENT_PROCESS)
    parser.add_argument("--scenario", nargs="+", choices=scale_scenarios.SCENARIOS, default=[],
                        help="after the steady window, instead of the burst")  # fmt: skip
    parser.add_argument("--restart-timeout", type=float, default=300.0,
                        help="s from the broker's kill for every node to be back")  # fmt: skip
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--quick", action="store_true", help="500 nodes, a few seconds")
    parser.add_argument("--role", choices=["main", "clients", "operator"], default="main")
    parser.add_argument("--child-config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes = args.nodes or [500]
        args.interval, args.window, args.burst = 5.0, 5.0, 50
        args.warmup = 1.0
    args.nodes = args.nodes or [10000, 30000]
    if args.warmup is None:
        args.warmup = args.interval
    return args


def main() -> None:
    args = parse_args()
    if args.role != "main":
        cfg = json.loads(args.child_config)
        if args.role == "clients":
            asyncio.run(clients_main(cfg))
        else:
            from scale_operator import operator_main

            asyncio.run(operator_main(cfg))
        return
    import mosquitto  # type: ignore[import-not-found]  # tests/mosquitto.py

    if not mosquitto.available():
        sys.exit(mosquitto.MISSING_REASON)
    limit = int(Path("/proc/sys/fs/nr_open").read_text())
    try:  # children (broker, clients) inherit it
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    except (ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    figs = []
    for n in args.nodes:
        for tls in [t == "tls" for t in args.transport]:
            for mode in args.modes:
                if figs and figs[-1]["nodes"] == n and "connected" in figs[-1].get("failed", ""):
                    # the machine's limit, not the mode's: no need to hit it twice
                    figs.append(
                        {**figs[-1], "mode": mode, "failed": "not run: " + figs[-1]["failed"]}
                    )
                    continue
                try:
                    figs.append(case(n, mode, tls, args))
                except Exception as exc:  # a size the machine cannot hold: say what failed
                    figs.append({"nodes": n, "mode": mode, "transport": "tls" if tls else
                                 "plaintext", "failed": f"{type(exc).__name__}: {exc}"})  # fmt: skip
                print(json.dumps(figs[-1]), file=sys.stderr, flush=True)
    print(f"\ncommand: {shlex.join(['python', 'bench/scale.py', *sys.argv[1:]])}")
    print(f"{os.cpu_count()} CPUs, RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)[0]:,}; "
          f"interval {args.interval:g} s, window {args.window:g} s, burst {args.burst:,} nodes, "
          f"beats QoS {args.beat_qos}")  # fmt: skip
    print()
    table(figs)
    if args.scenario:
        print()
        scale_scenarios.table(figs)
    print()
    print("FIGURES " + json.dumps(figs))
    if args.json:
        Path(args.json).write_text(json.dumps(figs, indent=1))
    if any("failed" in f or "restart_failed" in f for f in figs) and args.quick:
        sys.exit(1)


if __name__ == "__main__":
    main()
