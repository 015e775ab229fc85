"""The fault classes of the detection campaign: how each is injected on the fabric of
tests/detection_fabric.py, how it is repaired, and what naming it takes (`Expect`: the check
ids docs/checks.md gives for it). One fault at a time; `target` is chosen by the campaign's
seeded random generator.

| class | injected | named by |
| --- | --- | --- |
| port_down | the leaf's port towards the node down (the node's f0 loses carrier) | link.carrier |
| flap | that port toggled `FLAP_TOGGLES` times over `FLAP_SECONDS` | link.flaps, link.carrier |
| port_loss | nft drops `LOSS_PERCENT` % of f0's packets each way, in the node | peer.loss |
| uplink_loss | nft drops `LOSS_PERCENT` % of what the leaf bridges through its uplink | a failing cross-leaf cell |
| latency | the leaf's port towards the node at `LATENCY_MBIT`, a deep FIFO kept full by a flow | peer.latency, peer.loss |
| fail_slow | the node's port shaped to 25 % of PORT_MBIT, both ways | peer.throughput |
| mtu_blackhole | the leaf's uplink at MTU 1500 (bridges drop jumbo frames silently) | a failing cross-leaf cell |
| agent_kill | SIGKILL to the node's agent (restarted at the repair) | label unknown |
| agent_stop | SIGSTOP to the node's agent (SIGCONT at the repair): a silent node | label unknown |
| ecn_np_off | recorded ecn/roce_np/enable/3 = 0 | ecn.np_enabled |
| pfc_off | recorded DCB: no PFC priority | pfc.priorities |
| roce_v1 | recorded GID types: RoCE v2 entries become IB/RoCE v1 | rdma.gid_roce_v2 |
| mtu_1500 | f0 at MTU 1500 | mtu.interface, mtu.roce |
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from detection_env import Env
from detection_fabric import FABRIC_MTU, PORT_MBIT, replace_file, shape, write_dcb
from detection_score import Expect, Kind
from kube import wait_for
from test_peers_netns import ip, run_in, stop_process

LOSS_PERCENT: Final = 10
LATENCY_MBIT: Final = 20
LATENCY_QUEUE_PACKETS: Final = 170  # about 100 ms of 1428-byte packets at LATENCY_MBIT
LATENCY_OFFER_MBIT: Final = 21  # the competing flow: the queue stays full, ~5 % dropped
FLAP_TOGGLES: Final = 6
FLAP_SECONDS: Final = 60.0
FLAP_DOWN_SECONDS: Final = 0.3
NP_ENABLE: Final = "net/f0/ecn/roce_np/enable/3"
GID_TYPES: Final = "infiniband/mlx5_0/ports/1/gid_attrs/types"


@dataclass(frozen=True)
class FaultClass:
    name: str
    kind: Kind
    checks: frozenset[str]
    inject: Callable[[Env, str], str]  # (env, target) -> a detail for the record
    repair: Callable[[Env, str], None]
    hold: float = 0.0  # seconds the fault must hold at least (beyond the campaign's hold)

    def target(self, env: Env, rng: random.Random) -> str:
        layout = env.fabric.layout
        return rng.choice(layout.leaf_names if self.kind == "link" else layout.nodes)

    def expect(self, target: str) -> Expect:
        return Expect(self.kind, target, self.checks)


def _leaf_port(env: Env, node: str, up: bool) -> None:
    leaf = env.fabric.leaves[env.fabric.layout.leaf_of(node)]
    ip(leaf, "link", "set", node, "up" if up else "down")


class _Flapper:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, env: Env, node: str) -> str:
        self.stop.clear()
        gap = FLAP_SECONDS / FLAP_TOGGLES

        def run() -> None:
            for _ in range(FLAP_TOGGLES):
                _leaf_port(env, node, up=False)
                self.stop.wait(FLAP_DOWN_SECONDS)
                _leaf_port(env, node, up=True)
                if self.stop.wait(gap - FLAP_DOWN_SECONDS):
                    return

        self.thread = threading.Thread(target=run, name=f"flap-{node}", daemon=True)
        self.thread.start()
        return f"{FLAP_TOGGLES} toggles over {FLAP_SECONDS:g} s"

    def end(self, env: Env, node: str) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(10)
        _leaf_port(env, node, up=True)


_FLAPPER = _Flapper()


def _lossy(hook: str, *matches: str) -> str:
    """One nft chain at `hook` dropping LOSS_PERCENT % of what each match selects."""
    rules = "".join(f"  {m} numgen random mod 100 < {LOSS_PERCENT} counter drop\n" for m in matches)
    return (
        f" chain {hook}_loss {{\n  type filter hook {hook} priority 0; policy accept;\n{rules} }}\n"
    )


def _port_loss(env: Env, node: str) -> str:
    chains = _lossy("input", 'iifname "f0"') + _lossy("output", 'oifname "f0"')
    run_in(env.fabric.nodes[node], "nft", "-f", "-", stdin=f"table inet nvt_loss {{\n{chains}}}\n")
    return f"{LOSS_PERCENT} % each way"


def _uplink_loss(env: Env, leaf: str) -> str:
    chain = _lossy("forward", 'oifname "up0"', 'iifname "up0"')
    run_in(
        env.fabric.leaves[leaf], "nft", "-f", "-", stdin=f"table bridge nvt_loss {{\n{chain}}}\n"
    )
    return f"{LOSS_PERCENT} % each way"


def _drop_table(family: str) -> Callable[[Env, str], None]:
    def repair(env: Env, target: str) -> None:
        fabric = env.fabric
        ns = fabric.leaves[target] if target in fabric.leaves else fabric.nodes[target]
        ns.run(["nft", "delete", "table", family, "nvt_loss"], timeout=10)

    return repair


_FLOWS: dict[str, list[subprocess.Popen[bytes]]] = {}


def _latency(env: Env, node: str) -> str:
    """The leaf's port towards the node at LATENCY_MBIT with a deep FIFO, kept full by a UDP
    flow slightly above that rate from the leaf's traffic host to the node (iperf3 -R: the
    server sends). A TCP flow would not do: in one kernel its queue stays short."""
    fabric = env.fabric
    leaf = fabric.layout.leaf_of(node)
    sink = fabric.layout.sink_ip(leaf)
    shape(fabric.leaves[leaf], node, LATENCY_MBIT, limit=LATENCY_QUEUE_PACKETS)
    host = fabric.traffic[leaf]
    server = subprocess.Popen(host.argv(["iperf3", "-s", "-1", "-B", sink]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def listening() -> bool:
        return ":5201" in run_in(host, "ss", "-ltn")

    wait_for(listening, 10, what=f"iperf3 listening on {sink}")
    client = subprocess.Popen(
        fabric.nodes[node].argv(["iperf3", "-c", sink, "-R", "-u", "-b", f"{LATENCY_OFFER_MBIT}M",
                                 "-l", "1400", "-t", "3600", "--connect-timeout", "3000"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _FLOWS[node] = [client, server]
    return f"its port at {LATENCY_MBIT} Mbit/s, kept full by a {LATENCY_OFFER_MBIT} Mbit/s flow"


def _latency_repair(env: Env, node: str) -> None:
    for proc in _FLOWS.pop(node, []):
        stop_process(proc)
    fabric = env.fabric
    shape(fabric.leaves[fabric.layout.leaf_of(node)], node, PORT_MBIT)


def _fail_slow(env: Env, node: str, mbit: float = PORT_MBIT / 4) -> str:
    fabric = env.fabric
    shape(fabric.nodes[node], "f0", mbit)
    shape(fabric.leaves[fabric.layout.leaf_of(node)], node, mbit)
    return f"{mbit:g} of {PORT_MBIT} Mbit/s"


def _uplink_mtu(env: Env, leaf: str, mtu: int = 1500) -> str:
    ip(env.fabric.leaves[leaf], "link", "set", "up0", "mtu", str(mtu))
    ip(env.fabric.spine, "link", "set", f"up-{leaf}", "mtu", str(mtu))
    return f"uplink of {leaf} at MTU {mtu}"


def _set_file(relative: str, value: str) -> Callable[[Env, str], str]:
    def edit(env: Env, node: str) -> str:
        replace_file(env.fabric.recorded(node, relative), value + "\n")
        return f"{relative} = {value}"

    return edit


def _gid_types(v2_as: str) -> Callable[[Env, str], str]:
    def edit(env: Env, node: str) -> str:
        types = env.fabric.recorded(node, GID_TYPES)
        for entry in sorted(types.iterdir()):
            if entry.name.isdigit() and entry.name in ("1", "3"):  # the recorded RoCE v2 slots
                replace_file(entry, v2_as + "\n")
        return f"RoCE v2 GIDs typed {v2_as!r}"

    return edit


def _restart_agent(env: Env, node: str) -> None:
    env.start_agent(node)


def _signal(sig: signal.Signals) -> Callable[[Env, str], str]:
    def send(env: Env, node: str) -> str:
        env.signal_agent(node, sig)
        return sig.name

    return send


def _port_down(env: Env, node: str) -> str:
    _leaf_port(env, node, up=False)
    return "the leaf's port down"


def _port_up(env: Env, node: str) -> None:
    _leaf_port(env, node, up=True)


def _unshape(env: Env, node: str) -> None:
    _fail_slow(env, node, PORT_MBIT)


def _uplink_jumbo(env: Env, leaf: str) -> None:
    _uplink_mtu(env, leaf, FABRIC_MTU)


def _pfc_off(env: Env, node: str) -> str:
    write_dcb(env.fabric, node, pfc_enabled=[])
    return "no PFC priority"


def _pfc_on(env: Env, node: str) -> None:
    write_dcb(env.fabric, node)


def _node_mtu(mtu: int) -> Callable[[Env, str], str]:
    def edit(env: Env, node: str) -> str:
        ip(env.fabric.nodes[node], "link", "set", "f0", "mtu", str(mtu))
        return f"f0 at MTU {mtu}"

    return edit


def _undo(edit: Callable[[Env, str], str]) -> Callable[[Env, str], None]:
    def repair(env: Env, target: str) -> None:
        edit(env, target)

    return repair


CLASSES: Final = {
    c.name: c
    for c in (
        FaultClass("port_down", "node", frozenset({"link.carrier"}), _port_down, _port_up),
        FaultClass("flap", "node", frozenset({"link.flaps", "link.carrier"}), _FLAPPER.start,
                   _FLAPPER.end, hold=FLAP_SECONDS),
        FaultClass("port_loss", "node", frozenset({"peer.loss"}), _port_loss,
                   _drop_table("inet")),
        FaultClass("uplink_loss", "link", frozenset({"peer.loss"}), _uplink_loss,
                   _drop_table("bridge")),
        FaultClass("latency", "node", frozenset({"peer.latency", "peer.loss"}), _latency,
                   _latency_repair),
        FaultClass("fail_slow", "node", frozenset({"peer.throughput"}), _fail_slow, _unshape),
        FaultClass("mtu_blackhole", "link", frozenset({"peer.path_mtu"}), _uplink_mtu,
                   _uplink_jumbo),
        FaultClass("agent_kill", "silent", frozenset(), _signal(signal.SIGKILL),
                   _restart_agent),
        FaultClass("agent_stop", "silent", frozenset(), _signal(signal.SIGSTOP),
                   _undo(_signal(signal.SIGCONT))),
        FaultClass("ecn_np_off", "node", frozenset({"ecn.np_enabled"}),
                   _set_file(NP_ENABLE, "0"), _undo(_set_file(NP_ENABLE, "1"))),
        FaultClass("pfc_off", "node", frozenset({"pfc.priorities"}), _pfc_off, _pfc_on),
        FaultClass("roce_v1", "node", frozenset({"rdma.gid_roce_v2", "rdma.gid_index"}),
                   _gid_types("IB/RoCE v1"), _undo(_gid_types("RoCE v2"))),
        FaultClass("mtu_1500", "node", frozenset({"mtu.interface", "mtu.roce"}),
                   _node_mtu(1500), _undo(_node_mtu(FABRIC_MTU))),
    )
}  # fmt: skip
