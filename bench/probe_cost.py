"""What one probe cycle costs: netval's warm cycle vs the shell way, with 0/64/200 pod veths.

Run as root from the repository root:

    python bench/probe_cost.py

It builds a namespace host with 8 judged veth interfaces (MTU 9000, carrier up; peers in a
second "pods" namespace) and adds background veths (0, then 64, then 200 of them, peers in
the pods namespace too, as a Kubernetes node's pod veths are). For each count a worker runs
inside the host namespace (`ip netns exec`, so /sys/class/net is the namespace's) and times,
interleaved round by round:

  (a) netval warm cycle: LiveCollector.sample() for the 8 interfaces + the node checks on a
      snapshot of the previous and the new sample (what the agent does every interval);
  (b) the shell way (NHC style): one bash run that, per interface, runs
      `ip -j -d link show dev X`, `ethtool -S X` and one `cat` of mtu, carrier, operstate,
      carrier_changes and speed (output captured, not even parsed);
  (c) a pyroute2 full link dump, IPRoute().get_links() on an open socket (what netval avoids);

and the cold start of `netval probe --config CFG --samples 1` (process start to exit) with its
peak RSS (wait4 rusage of that child). Namespaces are deleted however the run ends.

Veths have no RDMA device, so the driver counter maps are measured separately: (d) the warm
cycle (LiveCollector.sample() + node checks) over a sysfs tree holding the bundled snapshots'
six RDMA devices (2 mlx5, 2 bnxt_re, 2 irdma; examples/snapshots) with their netdevs, GID
tables and hw_counters, i.e. the per-driver counter reads. The host namespace gets veths of
those netdevs' names, so the ethtool and DCB reads behave as on a node (veth: statistics, no
DCB). With `--baseline-src DIR` (another checkout's src, e.g. the previous release) every
measurement runs alternately with that code and with this one (the veth cycles in three
chunks per count, the RDMA cycles round by round), and both are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

JUDGED = [f"j{i}" for i in range(8)]
REPO = Path(__file__).resolve().parent.parent
RDMA_SNAPSHOTS = ("healthy-roce", "healthy-bnxt-thor2", "healthy-intel-e810")
RDMA_NETDEVS = ["ens1np0", "ens2np0", "ens1f0np0", "ens2f0np0", "ens801f0", "ens801f1"]
BACKGROUND_COUNTS = (0, 64, 200)
TARGET_RATIO = 10.0
TARGET_SLOWDOWN_PERCENT = 10.0
TARGET_WARM_MS = 3.0

SHELL_SCRIPT = r"""#!/bin/bash
# One health-check pass over the given interfaces, the way node health check scripts do it.
rc=0
for dev in "$@"; do
    link=$(ip -j -d link show dev "$dev") || rc=1
    if [ -n "$NV_ETHTOOL" ]; then
        stats=$(ethtool -S "$dev") || rc=1
    fi
    d=/sys/class/net/$dev
    sysfs=$(cat "$d/mtu" "$d/carrier" "$d/operstate" "$d/carrier_changes" "$d/speed") || rc=1
done
exit $rc
"""


def netval_script() -> str:
    candidate = Path(sysconfig.get_path("scripts")) / "netval"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("netval")
    if found is None:
        sys.exit("the netval console script is not installed (pip install -e .)")
    return found


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- worker: runs inside the host namespace ---------------------------------------------------


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from pyroute2 import IPRoute

    from netval.agent.checks import run_node_checks
    from netval.agent.collect.live import LiveCollector
    from netval.cli import load_probe_config
    from netval.model.ids import Status
    from netval.model.snapshot import NodeSnapshot

    judged = args.judged.split(",")
    interfaces = sorted(os.listdir("/sys/class/net"))
    checks = load_probe_config(Path(args.config)).checks
    ethtool = shutil.which("ethtool")
    env = {**os.environ, "NV_ETHTOOL": "1" if ethtool else ""}
    fd, script = tempfile.mkstemp(prefix="nvt-nhc-", suffix=".sh")
    os.write(fd, SHELL_SCRIPT.encode())
    os.close(fd)

    warm: list[float] = []
    collect: list[float] = []
    shell: list[float] = []
    dump: list[float] = []
    cold: list[float] = []
    rss_kib: list[int] = []
    try:
        with LiveCollector(interfaces=judged) as collector, IPRoute() as ipr:
            prev = collector.sample()

            def cycle() -> tuple[int, int]:
                """One agent interval's work; (collect, total) in ns."""
                nonlocal prev
                t0 = time.perf_counter_ns()
                new = collector.sample()
                t1 = time.perf_counter_ns()
                snapshot = NodeSnapshot(
                    node="bench", captured_at="", interval_seconds=10.0, samples=(prev, new)
                )
                run_node_checks(snapshot, checks)
                prev = new
                return t1 - t0, time.perf_counter_ns() - t0

            for _ in range(20):  # warm-up: ethtool names cached, sockets open
                cycle()
            first = run_node_checks(
                NodeSnapshot("bench", "", 10.0, (prev, collector.sample())), checks
            )
            bad = [(r.check, r.subject, r.message) for r in first if r.status.is_bad]
            judged_pass = sum(1 for r in first if r.status == Status.PASS)
            assert not bad, f"the judged interfaces should pass: {bad}"
            links = len(ipr.get_links())
            assert links == len(interfaces), (links, len(interfaces))

            def shell_run() -> float:
                t0 = time.perf_counter_ns()
                proc = subprocess.run(
                    ["bash", script, *judged], env=env, stdout=subprocess.DEVNULL, check=False
                )
                elapsed = (time.perf_counter_ns() - t0) / 1e6
                assert proc.returncode == 0, "the shell check failed"
                return elapsed

            def dump_run() -> float:
                t0 = time.perf_counter_ns()
                ipr.get_links()
                return (time.perf_counter_ns() - t0) / 1e6

            for _ in range(3):  # warm-up: binaries and libraries in the page cache
                shell_run()
                dump_run()
            for _ in range(args.rounds):
                for _ in range(args.cycles_per_round):
                    collect_ns, total_ns = cycle()
                    collect.append(collect_ns / 1e6)
                    warm.append(total_ns / 1e6)
                shell.append(shell_run())
                dump.append(dump_run())

        argv = [netval_script(), "probe", "--config", args.config, "--samples", "1"]
        for _ in range(args.cold_runs):
            t0 = time.perf_counter_ns()
            child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(child.pid, 0)
            cold.append((time.perf_counter_ns() - t0) / 1e6)
            child.returncode = os.waitstatus_to_exitcode(status)
            assert child.returncode == 0, f"netval probe exited {child.returncode}"
            rss_kib.append(usage.ru_maxrss)
    finally:
        os.unlink(script)
    return {
        "interfaces": len(interfaces),
        "judged_pass": judged_pass,
        "ethtool": ethtool is not None,
        "warm": warm,
        "collect": collect,
        "shell": shell,
        "dump": dump,
        "cold": cold,
        "rss_kib": rss_kib,
    }


def build_rdma_tree(workdir: str) -> Path:
    root = Path(workdir) / "rdma-tree"
    for name in RDMA_SNAPSHOTS:
        src = REPO / "examples" / "snapshots" / name / "samples" / "0"
        if not src.is_dir():
            sys.exit(f"{src} missing: run from a checkout with the bundled snapshots")
        shutil.copytree(src / "sys", root / "sys", dirs_exist_ok=True)
        shutil.copytree(src / "rdma_cm", root / "rdma_cm", dirs_exist_ok=True)
    os.chmod(workdir, 0o755)
    return root


def rdma_cycle(root: Path, cycles: int) -> dict[str, Any]:
    """(d): the collector and checks over a sysfs copy of six RDMA devices of three drivers."""
    from netval.agent.checks import run_node_checks
    from netval.agent.collect.live import LiveCollector
    from netval.model.snapshot import NodeSnapshot
    from netval.model.spec import Checks

    checks = Checks()
    collect: list[float] = []
    warm: list[float] = []
    with LiveCollector(sys_root=root / "sys", rdma_cm_root=root / "rdma_cm") as collector:
        prev = collector.sample()
        devices = sorted(prev.rdma)
        for i in range(cycles + 20):  # the first 20 warm up
            t0 = time.perf_counter_ns()
            new = collector.sample()
            t1 = time.perf_counter_ns()
            run_node_checks(NodeSnapshot("bench", "", 10.0, (prev, new)), checks)
            t2 = time.perf_counter_ns()
            prev = new
            if i >= 20:
                collect.append((t1 - t0) / 1e6)
                warm.append((t2 - t0) / 1e6)
        hw = sum(len(p.hw_counters) for d in prev.rdma.values() for p in d.ports.values())
    return {"devices": devices, "collect": collect, "warm": warm, "hw_counters": hw}


# -- driver: builds namespaces, runs workers, prints figures ---------------------------------


def ip_batch(netns: str, lines: list[str]) -> None:
    if lines:
        subprocess.run(
            ["ip", "-n", netns, "-batch", "-"],
            input="\n".join(lines) + "\n",
            text=True,
            check=True,
        )


def add_veths(host: str, pods: str, names: list[str], mtu: int | None = None) -> None:
    """Veths in `host` whose peers (<name>p) live in `pods`; all up. Two netlink batches."""
    with_mtu = f" mtu {mtu}" if mtu else ""
    ip_batch(
        host,
        [f"link add {n}{with_mtu} type veth peer name {n}p{with_mtu} netns {pods}" for n in names],
    )
    ip_batch(pods, [f"link set {n}p up" for n in names])
    ip_batch(host, [f"link set {n} up" for n in names])


def wait_carrier(host: str, names: list[str], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["ip", "-n", host, "-j", "link", "show"], capture_output=True, text=True, check=True
        )
        states = {link["ifname"]: link.get("operstate") for link in json.loads(out.stdout)}
        if all(states.get(n) == "UP" for n in names):
            return
        if time.monotonic() > deadline:
            sys.exit(f"judged interfaces did not come up: {states}")
        time.sleep(0.01)


def run_rdma_rounds(host: str, tree: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """(d) in the host namespace, round by round: this code, then the baseline (if any)."""
    sources: dict[str, str | None] = {"this checkout": None}
    if args.baseline_src:
        sources = {"baseline": os.path.abspath(args.baseline_src), **sources}
    out: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for label, src in sources.items():
            env = dict(os.environ)
            if src is not None:
                env["PYTHONPATH"] = src
            argv = ["ip", "netns", "exec", host, sys.executable, os.path.abspath(__file__),
                    "--rdma-tree", str(tree), "--cycles-per-round", str(args.cycles_per_round)]  # fmt: skip
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=120, check=False, env=env
            )
            if proc.returncode != 0:
                sys.exit(f"RDMA worker ({label}) failed:\n{proc.stderr}")
            got = json.loads(proc.stdout)
            row = out.setdefault(label, {"collect": [], "warm": []})
            row["collect"].extend(got["collect"])
            row["warm"].extend(got["warm"])
            row["devices"], row["hw_counters"] = got["devices"], got["hw_counters"]
    return out


CHUNKS = 3  # with --baseline-src, each count alternates the two codes in this many chunks


def run_worker(
    host: str,
    count: int,
    config: str,
    args: argparse.Namespace,
    *,
    src: str | None = None,
    rounds: int | None = None,
    cold_runs: int | None = None,
) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    argv = [
        "ip",
        "netns",
        "exec",
        host,
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--judged",
        ",".join(JUDGED),
        "--config",
        config,
        "--rounds",
        str(args.rounds if rounds is None else rounds),
        "--cycles-per-round",
        str(args.cycles_per_round),
        "--cold-runs",
        str(args.cold_runs if cold_runs is None else cold_runs),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env)
    if proc.returncode != 0:
        sys.exit(f"worker for {count} background interfaces failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def baseline_and_this(
    host: str, count: int, config: str, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The baseline code and this code alternately, chunk by chunk, so both see the same
    machine load; their samples are pooled per code."""
    pooled: dict[str, dict[str, Any]] = {}
    chunk = max(1, args.rounds // CHUNKS)
    for i in range(CHUNKS):
        for label, src in (("baseline", os.path.abspath(args.baseline_src)), ("this", None)):
            got = run_worker(
                host, count, config, args, src=src, rounds=chunk,
                cold_runs=args.cold_runs if i == 0 else 0,
            )  # fmt: skip
            into = pooled.setdefault(label, got)
            if into is not got:
                for key in ("warm", "collect", "shell", "dump", "cold", "rss_kib"):
                    into[key].extend(got[key])
    return pooled["baseline"], pooled["this"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--judged", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=30, help="shell/dump samples per count")
    parser.add_argument("--cycles-per-round", type=int, default=20, help="netval cycles per round")
    parser.add_argument("--cold-runs", type=int, default=5, help="cold starts per count")
    parser.add_argument(
        "--baseline-src",
        help="another checkout's src directory: its RDMA cycle is measured alongside",
    )
    parser.add_argument("--rdma-tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.rdma_tree:
        print(json.dumps(rdma_cycle(Path(args.rdma_tree), args.cycles_per_round)))
        return 0

    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark builds network namespaces")
    if shutil.which("ip") is None:
        sys.exit("needs iproute2 (ip)")
    ethtool_note = (
        "ethtool -S included"
        if shutil.which("ethtool")
        else "ethtool NOT installed (apt-get install ethtool): shell way measured without it"
    )
    import pyroute2

    import netval

    started = time.monotonic()
    suffix = secrets.token_hex(3)
    host, pods = f"nvt-bench-{suffix}", f"nvt-pods-{suffix}"
    workdir = tempfile.mkdtemp(prefix="nvt-bench-")
    config = os.path.join(workdir, "checks.json")
    with open(config, "w", encoding="utf-8") as fh:
        json.dump(
            {
                "link": {"interfaces": JUDGED},
                "mtu": {"interfaces": JUDGED, "interfaceMTU": 9000},
            },
            fh,
        )
    rows: list[dict[str, Any]] = []
    baseline_rows: list[dict[str, Any]] = []
    created: list[str] = []
    try:
        for name in (host, pods):
            subprocess.run(["ip", "netns", "add", name], check=True)
            created.append(name)
        add_veths(host, pods, JUDGED, mtu=9000)
        wait_carrier(host, JUDGED)
        have = 0
        for count in BACKGROUND_COUNTS:
            t0 = time.monotonic()
            add_veths(host, pods, [f"bg{i}" for i in range(have, count)])
            have = count
            built = time.monotonic() - t0
            if args.baseline_src:
                base_row, result = baseline_and_this(host, count, config, args)
                base_row["background"] = count
                baseline_rows.append(base_row)
            else:
                result = run_worker(host, count, config, args)
            result["background"] = count
            result["build_s"] = built
            rows.append(result)
            print(
                f"  measured {count:>3} background interfaces "
                f"({result['interfaces']} in the namespace incl. lo; built in {built:.2f} s)",
                flush=True,
            )
        tree = build_rdma_tree(workdir)
        add_veths(host, pods, RDMA_NETDEVS, mtu=9000)
        rdma = run_rdma_rounds(host, tree, args)
    finally:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], check=False)
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(
        f"netval {netval.__version__}, pyroute2 {pyroute2.__version__}, "
        f"Python {platform.python_version()}, kernel {platform.release()}, "
        f"{os.cpu_count()} CPU(s); {ethtool_note}"
    )
    print(
        f"{len(JUDGED)} judged veth interfaces; per count: {args.rounds} rounds of "
        f"{args.cycles_per_round} netval cycles + 1 shell run + 1 link dump, interleaved"
    )
    print()
    print(
        "| background interfaces | netval warm cycle median (p90) | shell way (NHC) median "
        "| shell / netval | pyroute2 get_links() median |"
    )
    print("|---:|---:|---:|---:|---:|")
    medians: dict[int, float] = {}
    ratios: list[float] = []
    for row in rows:
        warm = statistics.median(row["warm"])
        shell = statistics.median(row["shell"])
        dump = statistics.median(row["dump"])
        medians[row["background"]] = warm
        ratios.append(shell / warm)
        print(
            f"| {row['background']} | {warm:.3f} ms ({quantile(row['warm'], 0.9):.3f}) "
            f"| {shell:.1f} ms | {shell / warm:.0f}x | {dump:.2f} ms |"
        )
    print()
    for row in rows:
        share = statistics.median(row["collect"])
        print(
            f"netval cycle with {row['background']:>3} background: collector "
            f"{share:.3f} ms + checks {statistics.median(row['warm']) - share:.3f} ms (medians)"
        )
    if baseline_rows:
        print()
        print(f"Warm cycle, baseline ({args.baseline_src}) vs this checkout, alternating:")
        print()
        print("| background interfaces | baseline median (p90) | this checkout median (p90) "
              "| change | shell / this |")  # fmt: skip
        print("|---:|---:|---:|---:|---:|")
        for base, row in zip(baseline_rows, rows, strict=True):
            b, t = statistics.median(base["warm"]), statistics.median(row["warm"])
            print(
                f"| {row['background']} | {b:.3f} ms ({quantile(base['warm'], 0.9):.3f}) "
                f"| {t:.3f} ms ({quantile(row['warm'], 0.9):.3f}) | {(t / b - 1) * 100:+.1f} % "
                f"| {statistics.median(row['shell']) / t:.0f}x |"
            )
    print()
    any_row = next(iter(rdma.values()))
    print(
        f"RDMA driver counters: {len(any_row['devices'])} devices "
        f"({', '.join(any_row['devices'])}), {args.rounds} alternating rounds of "
        f"{args.cycles_per_round} cycles"
    )
    print()
    print("| code | hw_counters read | warm cycle median (p90) | collector | checks |")
    print("|---|---:|---:|---:|---:|")
    for label, row in rdma.items():
        c, w = statistics.median(row["collect"]), statistics.median(row["warm"])
        print(
            f"| {label} | {row['hw_counters']} | {w:.3f} ms ({quantile(row['warm'], 0.9):.3f}) "
            f"| {c:.3f} ms | {w - c:.3f} ms |"
        )
    slowdown = (medians[max(medians)] / medians[min(medians)] - 1) * 100
    cold = [c for row in rows for c in row["cold"]]
    rss = max(r for row in rows for r in row["rss_kib"])
    print()
    print(
        f"netval warm cycle at {max(medians)} vs {min(medians)} background interfaces: "
        f"{slowdown:+.1f} %"
    )
    print(
        f"cold start `netval probe --config CFG --samples 1`: median "
        f"{statistics.median(cold):.0f} ms (min {min(cold):.0f}, max {max(cold):.0f}, "
        f"{len(cold)} runs); peak RSS {rss / 1024:.1f} MiB"
    )
    print()
    worst_warm = max(quantile(row["warm"], 0.5) for row in rows)
    targets = [
        (f"shell / netval >= {TARGET_RATIO:.0f}x", min(ratios) >= TARGET_RATIO),
        (f"warm cycle <= {TARGET_WARM_MS:g} ms", worst_warm <= TARGET_WARM_MS),
        (
            f"<= {TARGET_SLOWDOWN_PERCENT:g} % slower at {max(medians)} background",
            slowdown <= TARGET_SLOWDOWN_PERCENT,
        ),
    ]
    for label, ok in targets:
        print(f"target {label}: {'met' if ok else 'MISSED'}")
    print(
        f"command: python bench/probe_cost.py  (as root; whole run {time.monotonic() - started:.0f} s)"
    )
    return 0 if all(ok for _, ok in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
