"""The scenarios of bench/scale.py (`--scenario broker-restart operator-rollout`), run on the
fleet of one case after its steady window (instead of the burst, so every label stays
`healthy` and any Node write is the scenario's).

broker-restart: SIGKILL of the broker, started again 5 s later with the same configuration
and data (whatever the last autosave wrote: a restarted container). broker-replace: the
same with its data directory emptied first (a new pod: no retained message; with per-node
identity no per-client state either, so nobody is refused). The nodes reconnect as the agent does (bench/scale_reconnect.py) and the
operator's ingest as it does. Measured from the kill: every node connected again (the
clients' CONNACKs) and reported (the operator read a live report or a beat matching its
standing report from each), connects tried, CONNACK refusals of the credential (would
re-enroll), the operator's API writes by kind during the outage (kill to every node back)
and after it (the next --window s), and the Nodes written (a label flipped).

operator-rollout: SIGTERM of the operator (its runtime stops as the real one's does), a new
one started (a new leader): its replay until a status counts every node, its API writes
during the replay and two status windows after, its RSS.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

SCENARIOS: Final = ("broker-restart", "broker-replace", "operator-rollout")
BROKER_DOWN_S: Final = 5.0
STATUS_WINDOWS_S: Final = 4.0  # two status windows (2 s each, the default)


@dataclass
class Ctx:
    """What a scenario needs of its case (bench/scale.py `run_case`)."""

    n: int
    args: Any
    port: int
    conf: Path
    bpid: int
    clients: list[Any]
    operator: Any
    operator_cfg: dict[str, Any]
    spawn: Any  # Child.spawn
    brokers: list[asyncio.subprocess.Process] = field(default_factory=list)  # restarted ones
    children: list[Any] = field(default_factory=list)  # operators started here


def by_kind(writes: list[list[Any]], t0: float, t1: float) -> dict[str, int]:
    return dict(sorted(Counter(k for t, k in writes if t0 <= t < t1).items()))


async def listening(port: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            await asyncio.sleep(0.05)
    return False


async def broker_restart(ctx: Ctx, fig: dict[str, Any], *, empty: bool = False) -> None:
    from scale import broker_pid, machine_busy_s, vm_mib

    for c in ctx.clients:
        await c.ask({"cmd": "reconnect"}, "reconnecting")
    busy0 = machine_busy_s()
    t_kill = time.time()
    os.kill(ctx.bpid, signal.SIGKILL)
    await asyncio.sleep(BROKER_DOWN_S)
    if empty:  # a new pod: its emptyDir starts empty
        for path in (ctx.conf.parent / "data").iterdir():
            path.unlink()
    await ctx.operator.ask({"cmd": "mark"}, "marked")  # nothing live can reach it meanwhile
    log = (ctx.conf.parent / "mosquitto.log").open("ab")
    from mosquitto import MOSQUITTO  # type: ignore[import-not-found]  # tests/mosquitto.py

    t_start = time.time()
    ctx.brokers.append(await asyncio.create_subprocess_exec(
        str(MOSQUITTO), "-c", str(ctx.conf), stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    log.close()
    if not await listening(ctx.port, 120):
        fig["restart_failed"] = "the broker did not listen again within 120 s"
        return
    fig["restart_broker_listening_s"] = time.time() - t_start
    ctx.bpid = broker_pid(ctx.conf)
    deadline = time.time() + ctx.args.restart_timeout
    connected = reported = operator_back = None
    while time.time() < deadline:
        if (
            operator_back is None
            and (await ctx.operator.ask({"cmd": "ingest"}, "ingest"))["connected"]
        ):
            operator_back = time.time()  # within the poll's 0.2 s
        rs = [await c.ask({"cmd": "restart_stats"}, "restart_stats") for c in ctx.clients]
        back = await ctx.operator.ask({"cmd": "back"}, "back")
        if connected is None and sum(r["back"] for r in rs) >= ctx.n:
            connected = max(r["last_back"] for r in rs)
        if back["count"] >= ctx.n:
            reported = back["last"]
        if connected is not None and reported is not None:
            break
        await asyncio.sleep(1.0 if operator_back else 0.2)
    rs = [await c.ask({"cmd": "restart_stats"}, "restart_stats") for c in ctx.clients]
    back = await ctx.operator.ask({"cmd": "back"}, "back")
    fig["restart_nodes_lost"] = sum(r["lost_nodes"] for r in rs)
    fig["restart_nodes_reconnected"] = sum(r["back"] for r in rs)
    fig["restart_nodes_reported"] = back["count"]
    fig["restart_all_connected_s"] = connected - t_kill if connected else None
    fig["restart_all_reported_s"] = reported - t_kill if reported else None
    fig["restart_operator_connected_s"] = operator_back - t_kill if operator_back else None
    fig["restart_connect_attempts"] = sum(r["attempts"] for r in rs)
    fig["restart_would_reenroll"] = sum(r["would_reenroll"] for r in rs)
    errors: Counter[str] = Counter()
    for r in rs:
        errors.update(r["errors"])
    fig["restart_connect_errors"] = dict(errors)
    t_back = max(connected or time.time(), reported or time.time())
    await asyncio.sleep(max(0.0, t_back + ctx.args.window - time.time()))
    t_end = time.time()
    st = await ctx.operator.ask({"cmd": "stats", "since": t_kill}, "stats")
    fig["restart_writes_outage"] = by_kind(st["writes"], t_kill, t_back)
    fig["restart_writes_after"] = by_kind(st["writes"], t_back, t_end)
    fig["restart_writes_outage_per_s"] = sum(fig["restart_writes_outage"].values()) / (
        t_back - t_kill
    )
    fig["restart_writes_after_per_s"] = sum(fig["restart_writes_after"].values()) / (t_end - t_back)
    flipped = Counter(label for _, _, label in st["node_writes"])
    fig["restart_nodes_written"] = len({node for _, node, _ in st["node_writes"]})
    fig["restart_labels_written"] = {str(k): v for k, v in flipped.items()}
    fig["restart_operator_reconnects"] = st["reconnects"]
    fig["restart_broker_rss_mib"] = vm_mib(ctx.bpid)
    fig["restart_machine_busy_pct"] = 100 * (machine_busy_s() - busy0) / (t_end - t_kill)
    fig["restart_operator_problems"] = st["problems"]


async def operator_rollout(ctx: Ctx, fig: dict[str, Any]) -> None:
    from scale import vm_mib

    old = ctx.operator
    t_term = time.time()
    old.proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(old.proc.wait(), 120)
    fig["rollout_stop_s"] = time.time() - t_term
    new = await ctx.spawn("operator", ctx.operator_cfg)
    ctx.children.append(new)
    ctx.operator = new
    await new.expect("ready")
    fig["rollout_synced_s"] = (await new.expect("synced"))["synced"]
    replayed = await new.expect("replayed")
    fig["rollout_replay_s"], fig["rollout_replay_retained"] = (
        replayed["replayed"],
        replayed["retained"],
    )
    fig["rollout_all_counted_s"] = time.time() - t_term  # from SIGTERM of the old one
    fig["rollout_rss_replayed_mib"] = vm_mib(new.proc.pid)
    await asyncio.sleep(STATUS_WINDOWS_S)
    st = await new.ask({"cmd": "stats", "since": 0.0}, "stats")
    fig["rollout_writes"] = by_kind(st["writes"], 0.0, time.time() + 1)
    fig["rollout_nodes_written"] = len({node for _, node, _ in st["node_writes"]})
    fig["rollout_rss_mib"] = vm_mib(new.proc.pid)
    fig["rollout_hwm_mib"] = vm_mib(new.proc.pid, "VmHWM")
    fig["rollout_operator_problems"] = st["problems"]


async def run(ctx: Ctx, fig: dict[str, Any]) -> None:
    import sys

    for name in ctx.args.scenario:
        print(f"  scenario {name}", file=sys.stderr, flush=True)
        if name == "operator-rollout":
            await operator_rollout(ctx, fig)
        else:
            await broker_restart(ctx, fig, empty=name == "broker-replace")
        if "restart_failed" in fig:
            return


def cell(fig: dict[str, Any], key: str, fmt: str, unit: str = "") -> str:
    value = fig.get(key)
    return "-" if value is None else format(value, fmt) + unit


def kinds(d: dict[str, int] | None) -> str:
    return ", ".join(f"{v} {k}" for k, v in (d or {}).items()) or "0"


def table(figs: list[dict[str, Any]]) -> None:
    print("| nodes | mode | transport | broker listening again | operator back | all reconnected "
          "| all reported "
          "| connects tried | would re-enroll | API writes outage (/s) | API writes after (/s) "
          "| Nodes written | operator rollout: stop / replay | rollout writes | new operator "
          "RSS (HWM) | machine busy (restart) |")  # fmt: skip
    print("|---:|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in figs:
        if "failed" in f or "restart_failed" in f:
            print(f"| {f['nodes']:,} | {f['mode']} | {f['transport']} | FAILED: "
                  f"{f.get('failed') or f.get('restart_failed')} |" + " |" * 12)  # fmt: skip
            continue
        print(
            f"| {f['nodes']:,} | {f['mode']} | {f['transport']} | "
            f"{cell(f, 'restart_broker_listening_s', '.1f', ' s')} | "
            f"{cell(f, 'restart_operator_connected_s', '.1f', ' s')} | "
            f"{cell(f, 'restart_all_connected_s', '.1f', ' s')} | "
            f"{cell(f, 'restart_all_reported_s', '.1f', ' s')} | "
            f"{cell(f, 'restart_connect_attempts', ',')} | "
            f"{cell(f, 'restart_would_reenroll', ',')} | "
            f"{kinds(f.get('restart_writes_outage'))} "
            f"({cell(f, 'restart_writes_outage_per_s', '.2f')}) | "
            f"{kinds(f.get('restart_writes_after'))} "
            f"({cell(f, 'restart_writes_after_per_s', '.2f')}) | "
            f"{cell(f, 'restart_nodes_written', ',')} | "
            f"{cell(f, 'rollout_stop_s', '.1f', ' s')} / {cell(f, 'rollout_replay_s', '.1f', ' s')} | "
            f"{kinds(f.get('rollout_writes')) if 'rollout_writes' in f else '-'} | "
            f"{cell(f, 'rollout_rss_mib', '.0f')} ({cell(f, 'rollout_hwm_mib', '.0f')}) MiB | "
            f"{cell(f, 'restart_machine_busy_pct', '.0f', ' %')} |"
        )
    print("Times from the broker's SIGKILL (back 5 s later); outage: kill to every node "
          "reconnected and reported; after: the next window; replay: the new operator's "
          "start to a status counting every node; machine busy: all processes, % of one core")  # fmt: skip
