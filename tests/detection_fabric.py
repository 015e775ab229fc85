"""The detection campaign's fabric (bench/detection.py, tests/test_detection_campaign.py):
network namespaces wired as leaves and a spine, each node with a recorded RDMA /sys tree.

    spine (namespace, bridge br0)
      |  up-<leaf>: one uplink per leaf (veth, htb each direction at UPLINK_MBIT)
    leaf-a (bridge br0)            leaf-b (bridge br0) ...      one namespace per leaf
      |    |    |    |               |    |    |    |          node ports: htb at PORT_MBIT
     a1   a2   a3   a4              b1   b2   b3   b4          one namespace per node
      \\____\\____\\____\\___ m0: management, bridge brm (namespace "mgmt") ___/
                                |
                     root namespace: <MGMT>.1 (the TLS broker, the operator, the test API)

Fabric addresses share one /16 (an L2 fabric through the spine), MTU 9000 everywhere. Each
leaf has a traffic host (`traffic`, a namespace on the leaf's bridge, address `sink_ip`)
that sends a competing flow to a node: from another namespace, so that the flow's packets
queue in the leaf's port towards the node, not in the sender's own qdisc (where TCP Small
Queues would keep the queue short).

The kernel cannot make an RDMA device in a namespace, so each node gets a recorded /sys/class
tree (from examples/snapshots/healthy-roce: a ConnectX-7 on mlx5_core, sources in
examples/snapshots/make_snapshots.py) that the agent sees through a bind mount over
/sys/class in its own mount namespace (`agent_argv`): class/infiniband/mlx5_0 with its GIDs
bound to f0 and naming the node's address, class/net/f0 whose live files (carrier, mtu,
operstate, ...) are symlinks to the kernel's own f0, plus the recorded device/uevent and ecn/
directories; class/net/m0 and lo are the kernel's. DCB netlink has nothing to say about a
veth, so the agent reads f0's DCB state from the recorded JSON (tests/detection_agent.py).
Configuration faults edit these files in place; link faults act on the real links.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kube import wait_for
from netns import Namespace, namespace
from test_peers_netns import ip, run_in

REPO: Final = Path(__file__).resolve().parents[1]
RECORDED: Final = REPO / "examples" / "snapshots" / "healthy-roce" / "samples" / "0"
RECORDED_NETDEV: Final = "ens1np0"  # bound to mlx5_0 in the recording
DEVICE: Final = "mlx5_0"
FABRIC_MTU: Final = 9000
PORT_MBIT: Final = 200  # every node port, each direction
UPLINK_MBIT: Final = 400  # every leaf uplink, each direction
# A shallow queue on every shaped port (about 7 ms at PORT_MBIT): a throughput sample must
# not hold the echoes of the same port for the length of a deep FIFO.
QUEUE_PACKETS: Final = 20
LETTERS: Final = "abcdefgh"
LEAF_KEY: Final = "netval.test/leaf"  # the Node label the operator reads the leaf from


@dataclass(frozen=True)
class Layout:
    leaves: int = 2
    per_leaf: int = 4
    net: int = field(default_factory=lambda: secrets.randbelow(200) + 20)  # 10.<net>.0.0/16

    def __post_init__(self) -> None:
        if not 1 <= self.leaves <= len(LETTERS) or not 1 <= self.per_leaf <= 200:
            raise ValueError(f"1..{len(LETTERS)} leaves of 1..200 nodes")

    @property
    def leaf_names(self) -> list[str]:
        return [f"leaf-{LETTERS[i]}" for i in range(self.leaves)]

    @property
    def members(self) -> dict[str, list[str]]:
        return {
            f"leaf-{LETTERS[i]}": [f"{LETTERS[i]}{j + 1}" for j in range(self.per_leaf)]
            for i in range(self.leaves)
        }

    @property
    def nodes(self) -> list[str]:
        return [n for members in self.members.values() for n in members]

    def leaf_of(self, node: str) -> str:
        return f"leaf-{node[0]}"

    def fabric_ip(self, node: str) -> str:
        return f"10.{self.net}.{LETTERS.index(node[0]) + 1}.{int(node[1:]) + 10}"

    def sink_ip(self, leaf: str) -> str:
        return f"10.{self.net}.{LETTERS.index(leaf[-1]) + 1}.250"

    def mgmt_ip(self, node: str | None = None) -> str:
        """The management address of `node`; None: the root namespace's (the broker's)."""
        if node is None:
            return f"198.18.{self.net}.1"
        return f"198.18.{self.net}.{10 + self.nodes.index(node)}"


@dataclass
class Fabric:
    layout: Layout
    workdir: Path
    nodes: dict[str, Namespace]
    leaves: dict[str, Namespace]
    spine: Namespace
    mgmt: Namespace
    root_link: str
    traffic: dict[str, Namespace]  # leaf -> its traffic host

    def sys_root(self, node: str) -> Path:
        """The node's recorded /sys/class tree (bind-mounted over /sys/class)."""
        return self.workdir / "sys" / node / "class"

    def dcb_dir(self, node: str) -> Path:
        return self.workdir / "dcb" / node

    def recorded(self, node: str, relative: str) -> Path:
        """A file of the node's recorded tree, e.g. `net/f0/ecn/roce_np/enable/3`."""
        return self.sys_root(node) / relative

    def agent_argv(self, node: str, argv: list[str]) -> list[str]:
        """`argv` in the node's namespace, /sys/class replaced by its recorded tree (the
        mount namespace of `ip netns exec` is private: nothing outside sees the mount)."""
        script = 'mount --bind "$1" /sys/class && shift && exec "$@"'
        return self.nodes[node].argv(["sh", "-c", script, "sh", str(self.sys_root(node)), *argv])


def shape(ns: Namespace, ifname: str, mbit: float, *, limit: int = QUEUE_PACKETS) -> None:
    """htb at `mbit` with a pfifo of `limit` packets (replaces what was there)."""
    ns.run(["tc", "qdisc", "del", "dev", ifname, "root"], timeout=10)
    run_in(ns, *f"tc qdisc add dev {ifname} root handle 1: htb default 10 r2q 100".split())
    run_in(ns, *f"tc class add dev {ifname} parent 1: classid 1:10 htb rate {mbit}mbit "
                f"ceil {mbit}mbit burst 64k cburst 64k".split())  # fmt: skip
    run_in(ns, *f"tc qdisc add dev {ifname} parent 1:10 pfifo limit {limit}".split())


def _sysfs_tree(fabric: Fabric, node: str) -> None:
    root = fabric.sys_root(node)
    net = root / "net"
    f0 = net / "f0"
    (f0).mkdir(parents=True)
    # every attribute of a netdev, live: the kernel's f0 in the agent's namespace
    for entry in sorted(os.listdir("/sys/devices/virtual/net/lo")):
        if entry not in ("device", "ecn"):
            os.symlink(f"/sys/devices/virtual/net/f0/{entry}", f0 / entry)
    recorded_netdev = RECORDED / "sys" / "class" / "net" / RECORDED_NETDEV
    shutil.copytree(recorded_netdev / "device", f0 / "device")
    shutil.copytree(recorded_netdev / "ecn", f0 / "ecn")
    for ifname in ("lo", "m0"):
        os.symlink(f"/sys/devices/virtual/net/{ifname}", net / ifname)
    device = root / "infiniband" / DEVICE
    shutil.copytree(RECORDED / "sys" / "class" / "infiniband" / DEVICE, device)
    port = device / "ports" / "1"
    for ndev in (port / "gid_attrs" / "ndevs").iterdir():
        ndev.write_text("f0\n")
    a, b, c, d = (int(x) for x in fabric.layout.fabric_ip(node).split("."))
    mapped = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}\n"
    for gid in (port / "gids").iterdir():
        if "ffff" in gid.read_text():
            gid.write_text(mapped)
    dcb = fabric.dcb_dir(node)
    dcb.mkdir(parents=True)
    shutil.copy(RECORDED / "dcb" / f"{RECORDED_NETDEV}.json", dcb / "f0.json")


def write_dcb(fabric: Fabric, node: str, **changes: object) -> None:
    """Rewrite the node's recorded DCB state of f0 in place (the agent reads it per sample)."""
    doc = json.loads((RECORDED / "dcb" / f"{RECORDED_NETDEV}.json").read_text())
    doc.update(changes)
    replace_file(fabric.dcb_dir(node) / "f0.json", json.dumps(doc))


def replace_file(path: Path, text: str) -> None:
    """Atomically (a rename): the agent reads by path, never a half-written file."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    os.replace(part, path)


def build(stack: contextlib.ExitStack, layout: Layout, workdir: Path) -> Fabric:
    """The namespaces and links above, torn down with `stack` (namespaces take their veths)."""
    nodes = {n: stack.enter_context(namespace()) for n in layout.nodes}
    leaves = {leaf: stack.enter_context(namespace()) for leaf in layout.leaf_names}
    traffic = {leaf: stack.enter_context(namespace()) for leaf in layout.leaf_names}
    spine = stack.enter_context(namespace())
    mgmt = stack.enter_context(namespace())
    mtu = str(FABRIC_MTU)
    for ns in [*leaves.values(), spine]:
        ip(ns, "link", "add", "br0", "mtu", mtu, "type", "bridge")
        ip(ns, "link", "set", "br0", "up")
    for leaf, leaf_ns in leaves.items():
        ip(leaf_ns, *f"link add up0 mtu {mtu} type veth peer name up-{leaf} mtu {mtu}".split(),
           "netns", spine.name)  # fmt: skip
        ip(leaf_ns, "link", "set", "up0", "master", "br0", "up")
        ip(spine, "link", "set", f"up-{leaf}", "master", "br0", "up")
        host = traffic[leaf]
        ip(host, *f"link add tg0 mtu {mtu} type veth peer name tg mtu {mtu}".split(),
           "netns", leaf_ns.name)  # fmt: skip
        ip(leaf_ns, "link", "set", "tg", "master", "br0", "up")
        ip(host, "addr", "add", f"{layout.sink_ip(leaf)}/16", "dev", "tg0")
        for ifname in ("lo", "tg0"):
            ip(host, "link", "set", ifname, "up")
        shape(leaf_ns, "up0", UPLINK_MBIT)  # leaf -> spine
        shape(spine, f"up-{leaf}", UPLINK_MBIT)  # spine -> leaf
    ip(mgmt, "link", "add", "brm", "type", "bridge")
    ip(mgmt, "link", "set", "brm", "up")
    root_link = f"nvtm{secrets.token_hex(3)}"
    ip_root = ["ip", "link", "add", root_link, "type", "veth", "peer", "name", "root0", "netns"]
    run_root([*ip_root, mgmt.name])
    stack.callback(run_root, ["ip", "link", "del", root_link], check=False)
    run_root(["ip", "addr", "add", f"{layout.mgmt_ip()}/24", "dev", root_link])
    run_root(["ip", "link", "set", root_link, "up"])
    ip(mgmt, "link", "set", "root0", "master", "brm", "up")
    for node, ns in nodes.items():
        leaf_ns = leaves[layout.leaf_of(node)]
        ip(ns, *f"link add f0 mtu {mtu} type veth peer name {node} mtu {mtu}".split(),
           "netns", leaf_ns.name)  # fmt: skip
        ip(leaf_ns, "link", "set", node, "master", "br0", "up")
        ip(ns, "link", "add", "m0", "type", "veth", "peer", "name", f"m-{node}", "netns", mgmt.name)
        ip(mgmt, "link", "set", f"m-{node}", "master", "brm", "up")
        ip(ns, "addr", "add", f"{layout.fabric_ip(node)}/16", "dev", "f0")
        ip(ns, "addr", "add", f"{layout.mgmt_ip(node)}/24", "dev", "m0")
        for ifname in ("lo", "f0", "m0"):
            ip(ns, "link", "set", ifname, "up")
        shape(ns, "f0", PORT_MBIT)  # node -> leaf
        shape(leaf_ns, node, PORT_MBIT)  # leaf -> node
    fabric = Fabric(layout, workdir, nodes, leaves, spine, mgmt, root_link, traffic)
    for node in layout.nodes:
        _sysfs_tree(fabric, node)
    for ns in nodes.values():
        wait_for(lambda ns=ns: '"operstate":"UP"' in ip(ns, "-j", "link", "show", "f0"),
                 10, what=f"f0 up in {ns.name}")  # fmt: skip
    return fabric


def run_root(argv: list[str], *, check: bool = True) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
