"""Real links: a namespace host with veth pairs, probed live, recorded and replayed.

The host (one network namespace, both ends of every veth inside it):
  v9000 <-> p9000   MTU 9000, peer up       link.carrier pass, mtu.interface pass
  v1500 <-> p1500   MTU 1500, peer up       mtu.interface fail "MTU 1500, expected 9000"
  vdown <-> pdown   MTU 9000, peer down     link.carrier fail (no carrier)
  vadm  <-> padm    MTU 9000, itself down   link.carrier fail (carrier unreadable: EINVAL)
  vflap <-> pflap   MTU 9000, peer toggled during a probe's sampling window: link.flaps fail

Everything that reads sysfs runs under `ip netns exec` (which remounts /sys for the namespace).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netns import Flapper, Namespace, namespace, netval_script, unprivileged_argv
from netval.agent.collect.sysfs import NETDEV_FILES

pytestmark = [pytest.mark.netns, pytest.mark.timeout(60)]

STATIC = ["v9000", "v1500", "vdown", "vadm"]
# Node-level checks that have nothing to judge on a host without RDMA.
NODE_SKIPS = {
    "link.phy_errors",
    "pfc.global_pause",
    "mtu.roce",
    "rdma.devices",
    "rdma.port_state",
    "rdma.link_layer",
    "rdma.rate",
    "rdma.gid_roce_v2",
    "rdma.errors",
    "pfc.priorities",
    "pfc.trust",
    "pfc.pause_storm",
    "pfc.discards",
    "ecn.np_enabled",
    "ecn.rp_enabled",
    "ecn.cnp_flow",
    "mtu.ipoib",
    "rdma.gid_index",
    "ib.port_errors",
}

Report = dict[str, Any]


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host() -> Iterator[Namespace]:
    with namespace() as ns:
        ns.add_veth("v9000", "p9000", mtu=9000, peer_mtu=9000)
        ns.add_veth("v1500", "p1500", mtu=1500)
        ns.add_veth("vdown", "pdown", mtu=9000, peer_mtu=9000, peer_up=False)
        ns.add_veth("vadm", "padm", mtu=9000, peer_mtu=9000, up=False)
        ns.add_veth("vflap", "pflap", mtu=9000, peer_mtu=9000)
        for name in ("v9000", "v1500", "vflap"):
            ns.wait_operstate(name, "up")
        ns.wait_operstate("vdown", "lowerlayerdown")
        yield ns


@pytest.fixture(scope="module")
def configs() -> Iterator[dict[str, str]]:
    """Config files any user can read (pytest's tmp_path is private to root)."""
    directory = tempfile.mkdtemp(prefix="nvt-config-")
    os.chmod(directory, 0o755)
    documents = {
        "static": {
            "link": {"interfaces": STATIC},
            "mtu": {"interfaces": STATIC, "interfaceMTU": 9000},
        },
        "good": {"link": {"interfaces": ["v9000"]}, "mtu": {"interfaces": ["v9000"]}},
        "flap": {"link": {"interfaces": ["vflap"]}},
        "missing": {"link": {"interfaces": ["gone0"]}},
    }
    paths = {}
    try:
        for key, doc in documents.items():
            path = Path(directory) / f"{key}.json"
            path.write_text(json.dumps(doc), encoding="utf-8")
            path.chmod(0o644)
            paths[key] = str(path)
        yield paths
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _report(proc: subprocess.CompletedProcess[str]) -> Report:
    assert proc.returncode in (0, 1), f"exit {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    report: Report = json.loads(proc.stdout)
    assert report["schema"] == "netval.io/report/v1"
    return report


def probe_argv(config: str, *, samples: int = 2, interval: float = 0.3) -> list[str]:
    return [
        netval_script(),
        "probe",
        "--config",
        config,
        "--output",
        "json",
        "--samples",
        str(samples),
        "--interval",
        str(interval),
    ]


def live_probe(ns: Namespace, config: str, **kwargs: Any) -> tuple[int, Report]:
    proc = ns.run(probe_argv(config, **kwargs), timeout=30)
    return proc.returncode, _report(proc)


@pytest.fixture(scope="module")
def live_static(host: Namespace, configs: dict[str, str]) -> tuple[int, Report]:
    return live_probe(host, configs["static"])


def by_key(report: Report) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in report["results"]:
        key = (r["check"], r["subject"])
        assert key not in out, f"duplicate result {key}"
        out[key] = r
    return out


def verdicts(report: Report) -> dict[tuple[str, str], tuple[str, Any]]:
    """What must agree between two evaluations of an unchanged host: status and observed."""
    return {k: (r["status"], r["observed"]) for k, r in by_key(report).items()}


def failing(report: Report) -> set[tuple[str, str]]:
    return {k for k, r in by_key(report).items() if r["status"] in ("fail", "error")}


def read_live_files(ns: Namespace, paths: list[str]) -> dict[str, bytes | None]:
    """Files as a process inside the namespace reads them (None when the read fails)."""
    code = (
        "import json, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        out[p] = open(p, 'rb').read().hex()\n"
        "    except OSError:\n"
        "        out[p] = None\n"
        "print(json.dumps(out))\n"
    )
    proc = ns.run([sys.executable, "-c", code, *paths], check=True)
    raw = json.loads(proc.stdout)
    return {p: None if v is None else bytes.fromhex(v) for p, v in raw.items()}


# -- live probe -------------------------------------------------------------------------------


def test_live_probe_judges_mtu_and_carrier(live_static: tuple[int, Report]) -> None:
    code, report = live_static
    results = by_key(report)
    assert code == 1
    assert report["status"] == "fail"

    ok = results[("link.carrier", "v9000")]
    assert ok["status"] == "pass"
    assert ok["observed"] == {"carrier": 1, "operstate": "up"}
    assert results[("mtu.interface", "v9000")]["status"] == "pass"
    assert results[("mtu.interface", "v9000")]["observed"] == {"mtu": 9000}

    small = results[("mtu.interface", "v1500")]
    assert small["status"] == "fail"
    assert small["message"] == "MTU 1500, expected 9000"
    assert small["observed"] == {"mtu": 1500}
    assert small["expected"] == {"mtu": 9000}
    assert results[("link.carrier", "v1500")]["status"] == "pass"

    down = results[("link.carrier", "vdown")]
    assert down["status"] == "fail"
    assert "no carrier" in down["message"]
    assert down["observed"] == {"carrier": 0, "operstate": "lowerlayerdown"}
    # sysfs refuses to read carrier (EINVAL) while the interface is administratively down.
    admin = results[("link.carrier", "vadm")]
    assert admin["status"] == "fail"
    assert "administratively down" in admin["message"]
    assert admin["observed"] == {"carrier": None, "operstate": "down"}
    # The MTU of a link without carrier is still right.
    assert results[("mtu.interface", "vdown")]["status"] == "pass"
    assert results[("mtu.interface", "vadm")]["status"] == "pass"

    for name in STATIC:
        flaps = results[("link.flaps", name)]
        assert flaps["status"] == "pass", flaps
        assert flaps["observed"] == {"carrierChanges": 0, "flaps": 0}

    assert failing(report) == {
        ("link.carrier", "vdown"),
        ("link.carrier", "vadm"),
        ("mtu.interface", "v1500"),
    }
    # Only the named interfaces are judged: not the peers, not vflap, not lo.
    judged = {
        s
        for (c, s) in results
        if c.startswith(("link.", "mtu.interface")) and c != "link.phy_errors"
    }
    assert judged == set(STATIC)
    node = report["node"]
    for check in NODE_SKIPS:
        assert results[(check, node)]["status"] == "skip", check


def test_exit_zero_when_everything_judged_passes(host: Namespace, configs: dict[str, str]) -> None:
    code, report = live_probe(host, configs["good"], interval=0.0)
    assert code == 0
    assert report["status"] == "pass"
    statuses = {k: r["status"] for k, r in by_key(report).items()}
    assert statuses[("link.carrier", "v9000")] == "pass"
    assert statuses[("link.flaps", "v9000")] == "pass"
    assert statuses[("mtu.interface", "v9000")] == "pass"
    assert set(statuses.values()) == {"pass", "skip"}


def test_probe_of_missing_interface_fails(host: Namespace, configs: dict[str, str]) -> None:
    code, report = live_probe(host, configs["missing"], interval=0.0)
    assert code == 1
    missing = by_key(report)[("link.carrier", "gone0")]
    assert missing["status"] == "fail"
    assert "not found" in missing["message"]
    assert failing(report) == {("link.carrier", "gone0")}


def test_carrier_flaps_during_sampling_window(host: Namespace, configs: dict[str, str]) -> None:
    before = host.link_state("vflap").carrier_changes
    assert before is not None
    # The flapper runs from before the first sample until the probe has exited, so the whole
    # window between the two samples sees the peer going down and up.
    with Flapper(host, "pflap") as flapper:
        proc = subprocess.Popen(
            host.argv(probe_argv(configs["flap"], samples=2, interval=1.0)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert flapper.error is None, flapper.error
    host.wait_operstate("vflap", "up")
    report = _report(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    assert proc.returncode == 1

    flaps = by_key(report)[("link.flaps", "vflap")]
    assert flaps["status"] == "fail", flaps
    changes = flaps["observed"]["carrierChanges"]
    assert changes > 0
    assert flaps["observed"]["flaps"] == (changes + 1) // 2
    assert flaps["expected"] == {"maxCarrierChanges": 0}
    assert f"carrier changed {changes} times" in flaps["message"]
    assert "expected at most 0" in flaps["message"]
    # Each toggle is one down and one up of the peer: two carrier changes on vflap.
    after = host.link_state("vflap").carrier_changes
    assert after is not None
    assert changes <= after - before == 2 * flapper.toggles
    # The only other possible failure is carrier itself, caught down at the last sample.
    assert failing(report) <= {("link.flaps", "vflap"), ("link.carrier", "vflap")}


# -- snapshot, replayed elsewhere -----------------------------------------------------------


def test_snapshot_replays_like_the_live_probe(
    host: Namespace, configs: dict[str, str], live_static: tuple[int, Report], tmp_path: Path
) -> None:
    out = tmp_path / "snap"
    recorded = host.run(
        [
            netval_script(),
            "snapshot",
            "--out",
            str(out),
            "--config",
            configs["static"],
            "--samples",
            "2",
            "--interval",
            "0.3",
        ],
        timeout=30,
    )
    assert recorded.returncode == 0, recorded.stderr
    assert "recorded 2 samples" in recorded.stderr

    # Evaluated outside the namespace, where none of these interfaces exist.
    replay = subprocess.run(
        [
            netval_script(),
            "probe",
            "--from",
            str(out),
            "--config",
            configs["static"],
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    replayed = _report(replay)
    live_code, live = live_static
    assert replay.returncode == live_code == 1
    assert verdicts(replayed) == verdicts(live)
    assert replayed["node"] == live["node"]

    # Layout of netval-snapshot/1.1.
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert set(meta) == {"format", "node", "captured_at", "interval_seconds"}
    assert meta["format"] == "netval-snapshot/1.1"
    assert meta["node"] == live["node"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["captured_at"])
    assert 0.25 <= meta["interval_seconds"] <= 1.0
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["0", "1"]
    last = out / "samples" / "1"
    for sample in ("0", "1"):
        net = out / "samples" / sample / "sys" / "class" / "net"
        # Only judged interfaces are recorded (veths have no device: not hardware netdevs).
        assert sorted(p.name for p in net.iterdir()) == sorted(STATIC)
        assert not (out / "samples" / sample / "sys" / "class" / "infiniband").exists()

    # Files are sysfs byte for byte; a read that fails on the host is absent in the copy.
    live_paths = [f"/sys/class/net/{n}/{rel}" for n in STATIC for rel in NETDEV_FILES]
    live_files = read_live_files(host, live_paths)
    assert live_files["/sys/class/net/v9000/mtu"] == b"9000\n"
    assert live_files["/sys/class/net/vadm/carrier"] is None  # EINVAL while admin down
    for path, content in live_files.items():
        copy = last / path.lstrip("/")
        assert (copy.read_bytes() if copy.exists() else None) == content, path
    assert not (last / "sys/class/net/v9000/device").exists()  # veth: no device, no driver

    # veth has ethtool statistics (peer_ifindex, per-queue XDP counters) but no DCB.
    for name in STATIC:
        stats = json.loads((last / "ethtool" / f"{name}.json").read_text(encoding="utf-8"))
        assert isinstance(stats, dict)
        assert "peer_ifindex" in stats
        assert all(isinstance(v, int) for v in stats.values())
    peer = host.index("p9000")
    assert json.loads((last / "ethtool" / "v9000.json").read_text())["peer_ifindex"] == peer
    # No DCB state, and the reason as DCB netlink gave it (veth has no dcbnl ops).
    assert sorted(p.name for p in (last / "dcb").iterdir()) == sorted(f"{n}.error" for n in STATIC)
    assert (last / "dcb" / "v9000.error").read_text() == "EOPNOTSUPP\n"


# -- the collector itself -----------------------------------------------------------------------

_COLLECT = """
import json, sys
from netval.agent.collect.live import LiveCollector
with LiveCollector(interfaces=sys.argv[1:]) as collector:
    collector.sample()
    sample = collector.sample()
out = {}
for name, d in sample.netdevs.items():
    out[name] = {
        "mtu": d.mtu, "carrier": d.carrier, "operstate": d.operstate,
        "carrier_changes": d.carrier_changes, "speed_mbps": d.speed_mbps,
        "driver": d.driver, "ethtool": d.ethtool, "dcb": d.dcb is not None,
        "ecn": bool(d.ecn_np or d.ecn_rp), "bond_slaves": list(d.bond_slaves),
        "address": d.address,
    }
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff:")][0]
print(json.dumps({"uid": __import__("os").geteuid(), "cap_eff": int(caps, 16),
                  "netdevs": out, "rdma": sorted(sample.rdma)}))
"""


def _collect(ns: Namespace, *, unprivileged: bool = False) -> dict[str, Any]:
    argv = [sys.executable, "-c", _COLLECT, *STATIC, "gone0"]
    proc = ns.run(unprivileged_argv(argv) if unprivileged else argv, timeout=30)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_live_collector_inside_namespace(host: Namespace) -> None:
    seen = _collect(host)
    assert seen["rdma"] == []
    netdevs = seen["netdevs"]
    # The named interfaces that exist; never the peers or lo, and no entry for gone0.
    assert set(netdevs) == set(STATIC)
    expected = {
        "v9000": (9000, 1, "up"),
        "v1500": (1500, 1, "up"),
        "vdown": (9000, 0, "lowerlayerdown"),
        "vadm": (9000, None, "down"),
    }
    for name, (mtu, carrier, operstate) in expected.items():
        d = netdevs[name]
        netlink = host.link_state(name)
        assert (d["mtu"], d["carrier"], d["operstate"]) == (mtu, carrier, operstate), name
        # The same counter netlink reports (IFLA_CARRIER_CHANGES), read through sysfs.
        assert d["carrier_changes"] == netlink.carrier_changes, name
        assert isinstance(d["carrier_changes"], int)
        assert d["driver"] is None  # no device/uevent for a virtual interface
        assert d["dcb"] is False  # DCB netlink: EOPNOTSUPP on veth
        assert d["ecn"] is False
        assert d["bond_slaves"] == []
        assert re.fullmatch(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", d["address"])
        assert isinstance(d["ethtool"], dict)
        assert d["ethtool"]["peer_ifindex"] == host.index("p" + name[1:])
    assert netdevs["v9000"]["speed_mbps"] == 10000  # veth reports 10 Gb/s


# -- without privileges -----------------------------------------------------------------------


def test_probe_without_root_gives_the_same_verdict(
    host: Namespace, configs: dict[str, str], live_static: tuple[int, Report]
) -> None:
    # The collector as nobody: sysfs, ETHTOOL_GSTATS and DCB reads need no capability.
    seen = _collect(host, unprivileged=True)
    assert (seen["uid"], seen["cap_eff"]) == (65534, 0)
    assert set(seen["netdevs"]) == set(STATIC)
    assert seen["netdevs"]["v9000"]["ethtool"]["peer_ifindex"] == host.index("p9000")

    proc = host.run(unprivileged_argv(probe_argv(configs["static"])), timeout=30)
    report = _report(proc)
    live_code, live = live_static
    assert proc.returncode == live_code == 1
    assert verdicts(report) == verdicts(live)


# -- selection on real links (issue 11) -------------------------------------------------------

# The kernel cannot make an RDMA device in a namespace, so the RDMA part of the tree is a
# recorded-style directory whose GIDs name real links; class/net/<if> are the kernel's own
# /sys/class/net entries of the namespace (flags, type, carrier read live).
_SELECT = """
import json, os, sys, tempfile
from pathlib import Path
from netval.agent.checks import run_node_checks
from netval.agent.collect.live import LiveCollector
from netval.model.snapshot import NodeSnapshot
from netval.model.spec import Checks

root = Path(tempfile.mkdtemp())
for name in ("r0", "r0.100", "spare0"):
    (root / "class/net").mkdir(parents=True, exist_ok=True)
    os.symlink(f"/sys/class/net/{name}", root / "class/net" / name)

def port(dev, state, phys, gids):
    base = root / "class/infiniband" / dev
    (base / "ports/1/gids").mkdir(parents=True)
    (base / "ports/1/gid_attrs/types").mkdir(parents=True)
    (base / "ports/1/gid_attrs/ndevs").mkdir(parents=True)
    (base / "node_type").write_text("1: CA\\n")
    for f, v in (("state", state), ("phys_state", phys), ("rate", "100 Gb/sec (4X EDR)"),
                 ("link_layer", "Ethernet")):
        (base / "ports/1" / f).write_text(v + "\\n")
    for i, (gid, typ, ndev) in enumerate(gids):
        (base / f"ports/1/gids/{i}").write_text(gid + "\\n")
        (base / f"ports/1/gid_attrs/types/{i}").write_text(typ + "\\n")
        (base / f"ports/1/gid_attrs/ndevs/{i}").write_text(ndev + "\\n")

v4 = "0000:0000:0000:0000:0000:ffff:0a0a:01{:02x}"
port("rxe_a", "4: ACTIVE", "5: LinkUp",
     [(v4.format(11), "RoCE v2", "r0"), (v4.format(12), "RoCE v2", "r0.100")])
port("rxe_b", "1: DOWN", "3: Disabled",
     [("fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2", "spare0")])
with LiveCollector(sys_root=root, rdma_cm_root=None) as collector:
    samples = (collector.sample(), collector.sample())
snap = NodeSnapshot("ns", "2025-01-01T00:00:00Z", 0.1, samples)
out = {"netdevs": {n: [d.flags, d.type, d.admin_up] for n, d in samples[-1].netdevs.items()}}
for key, spec in (("default", {}), ("skip", {"select": {"adminDown": "skip"}})):
    results = run_node_checks(snap, Checks.model_validate(spec))
    out[key] = {f"{r.check.value} {r.subject}": [r.status.value, r.message] for r in results}
print(json.dumps(out))
"""


# -- devices stacked on ports (lower_* links) -------------------------------------------------

_STACKED = """
import json, sys
from pathlib import Path
from netval.agent.collect.dcb_netlink import DcbReader
from netval.agent.collect.sysfs import SysfsReader
reader, dcb = SysfsReader(Path("/sys")), DcbReader()
out = {}
for name in sys.argv[1:]:
    state = dcb.read(name)
    d = reader.read_netdev(name, dcb=state, dcb_error=dcb.last_error)
    out[name] = {"lower": list(d.lower), "ports_below": list(d.ports_below),
                 "driver": d.driver, "dcb_error": d.dcb_error}
print(json.dumps(out))
"""


def test_admin_down_is_read_from_real_flags_and_upper_netdevs_are_judged() -> None:
    with namespace() as ns:
        ns.add_veth("r0", "rp0", mtu=9000, peer_mtu=9000)
        ns.add_veth("spare0", "sp0", mtu=9000, peer_mtu=9000, up=False)
        # An upper netdev with its own GIDs, as a VLAN has; this kernel has no 8021q (nor
        # bonding), macvlan stands in for it.
        ns.ipr.link("add", ifname="r0.100", kind="macvlan", link=ns.index("r0"))
        ns.set_up("r0.100")
        ns.wait_operstate("r0", "up")
        ns.wait_operstate("r0.100", "up")
        proc = ns.run([sys.executable, "-c", _SELECT], timeout=30)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    # IFF_UP from the kernel's flags file; ARPHRD_ETHER (1) for the veth and its VLAN
    flags, arp_type, admin_up = seen["netdevs"]["spare0"]
    assert flags & 0x1 == 0 and arp_type == 1 and admin_up is False
    assert seen["netdevs"]["r0.100"][2] is True and seen["netdevs"]["r0"][2] is True

    def bad(key: str) -> set[str]:
        return {k for k, (status, _) in seen[key].items() if status in ("fail", "error")}

    # by default the admin-down spare fails; its link-local-only GID fails too
    assert bad("default") == {
        "link.carrier spare0",
        "rdma.port_state rxe_b/1",
        "rdma.gid_roce_v2 rxe_b/1",
    }
    # adminDown: skip leaves the spare out, reported once per kind of subject
    assert bad("skip") == set()
    assert seen["skip"]["link.carrier spare0"][0] == "skip"
    assert "administratively down" in seen["skip"]["rdma.port_state rxe_b/1"][1]
    # the upper netdev that carries the port's second GID is judged like its parent
    for check in ("link.carrier", "mtu.interface"):
        assert seen["skip"][f"{check} r0.100"][0] == "pass"
    assert seen["skip"]["mtu.roce rxe_a/1"][0] == "pass"


def test_live_sysfs_reads_lower_links_of_stacked_devices() -> None:
    """A macvlan and a bridge name their ports in lower_* links, as a bond or team does (this
    kernel has no bonding module): the live sysfs reader finds the ports below them, which the
    collector then reads for a RoCE LAG's counters."""
    with namespace() as ns:
        ns.add_veth("pa", "pa-peer")
        ns.add_veth("pb", "pb-peer")
        ns.ipr.link("add", ifname="mv0", kind="macvlan", link=ns.index("pa"))
        ns.ipr.link("add", ifname="br0", kind="bridge")
        for port in ("pb", "pb-peer"):
            ns.ipr.link("set", index=ns.index(port), master=ns.index("br0"))
        proc = ns.run([sys.executable, "-c", _STACKED, "mv0", "br0", "pa"], timeout=30)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout)
    assert seen["mv0"]["lower"] == seen["mv0"]["ports_below"] == ["pa"]
    assert sorted(seen["br0"]["lower"]) == ["pb", "pb-peer"]
    assert seen["pa"]["lower"] == []  # a netdev with nothing below lists no lower_*
    assert seen["mv0"]["driver"] is None
    assert seen["mv0"]["dcb_error"] == "EOPNOTSUPP"
