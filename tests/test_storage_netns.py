"""Storage probes across a real link: htb-shaped throughput and addresses that never answer.

Two namespaces, "storage" and "node", joined by one veth pair (10.77.0.1 on the storage end,
10.77.0.2 on the node end; the addresses exist inside these namespaces only). The storage end
shapes its egress with htb, so everything the node downloads crosses the shaper. A plain HTTP
server (http.server, started with `ip netns exec`) serves a 16 MiB object in the storage
namespace; the probe runs in the node namespace in its own process (`ip netns exec NODE python
-c ...`) and prints its results as JSON.

What the shaper lets through is on-wire bytes, so the expected goodput is computed from the
frame layout, not assumed to be the rate (see `expected_goodput_mbps`).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from netns import Namespace, namespace
from netval.model.ids import CheckId, Status
from netval.model.results import CheckResult

pytestmark = [pytest.mark.netns, pytest.mark.timeout(60)]

STORAGE_ADDR = "10.77.0.1"
NODE_ADDR = "10.77.0.2"
UNOWNED_ADDR = "10.77.0.3"  # on the veth subnet, owned by nobody: ARP never resolves
PREFIXLEN = 24
STORAGE_IF = "st0"
NODE_IF = "nd0"
MTU = 1500

# 80 Mbit/s = 10 MB/s on the wire: the 16 MiB object takes ~1.75 s, long enough that TCP slow
# start (a sub-millisecond RTT here) is noise, short enough for two transfers in a few seconds.
RATE_MBIT = 80
# 10 full frames: htb may send this much back to back after an idle period (~1.2 ms at 80
# Mbit/s), nothing next to the ~1.75 s measured. htb itself would pick rate/HZ + MTU.
BURST = "15k"
# One class, so the DRR quantum never decides anything; set explicitly because the default
# (rate / r2q = 1 MB) is over htb's 200000-byte sanity bound and makes tc warn.
QUANTUM = 1514
OBJECT_SIZE = 16 * 1024 * 1024
OBJECT_NAME = "object.bin"
TOLERANCE = 0.20

PROBE_TIMEOUT = 0.5  # the per-phase bound for the endpoints that never answer
ELAPSED_BOUND = 3.0
LENIENT_MS = 1000.0


def expected_goodput_mbps(rate_mbit: float = RATE_MBIT, mtu: int = MTU) -> float:
    """HTTP body MB/s (10^6 bytes/s) that an htb rate of `rate_mbit` leaves for one TCP flow.

    htb charges every packet its length at the qdisc, which on an Ethernet device (veth) is
    the frame without preamble/FCS: MTU + 14 bytes of Ethernet header (GSO super-packets are
    charged per segment, headers included: qdisc_pkt_len_init). Each full frame carries
    MTU - 20 (IPv4) - 20 (TCP) - 12 (the timestamps option, on by default) = 1448 bytes of
    body: 1448 / 1514 = 95.6 % of the rate. HTTP response headers and ACKs (which flow the
    other way, unshaped) are noise.
    """
    frame = mtu + 14
    payload = mtu - 20 - 20 - 12
    return rate_mbit * 1e6 / 8 / 1e6 * payload / frame


# Runs in the storage namespace: binds, prints the port, serves the directory quietly.
SERVER = r"""
import functools, sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

server = ThreadingHTTPServer((sys.argv[1], 0), functools.partial(Quiet, directory=sys.argv[2]))
print(server.server_address[1], flush=True)
server.serve_forever()
"""

# Runs in the node namespace: probes each endpoint in turn (never concurrently: they would
# share the shaped link) and prints the results with the time each probe_endpoint call took.
PROBE = r"""
import asyncio, json, sys, time
from netval.agent.storage.probe import probe_endpoint
from netval.model.spec import StorageEndpoint

out = []
for item in json.loads(sys.argv[1]):
    endpoint = StorageEndpoint.model_validate(item["endpoint"])
    started = time.perf_counter()
    results = asyncio.run(
        probe_endpoint(endpoint, measure_throughput=item["measure"], timeout=item["timeout"])
    )
    elapsed = time.perf_counter() - started
    out.append({"elapsed": elapsed, "results": [r.model_dump(mode="json") for r in results]})
print(json.dumps(out))
"""


@dataclass(frozen=True, slots=True)
class ShapedLink:
    storage: Namespace
    node: Namespace
    http_port: int


@dataclass(frozen=True, slots=True)
class Probed:
    elapsed: float
    results: dict[CheckId, CheckResult]


def ip(ns: Namespace, *args: str) -> str:
    done = subprocess.run(
        ["ip", "-n", ns.name, *args], capture_output=True, text=True, timeout=10, check=False
    )
    assert done.returncode == 0, f"ip -n {ns.name} {' '.join(args)}: {done.stderr}"
    return done.stdout


def run_in(ns: Namespace, *argv: str, stdin: str | None = None) -> str:
    done = ns.run(list(argv), timeout=20, input=stdin)
    assert done.returncode == 0, f"{' '.join(argv)} in {ns.name}: {done.stderr}"
    return done.stdout


def read_port(server: subprocess.Popen[str], timeout: float = 10.0) -> int:
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    line = server.stdout.readline() if ready else ""
    if not line.strip().isdigit():
        server.kill()
        _, err = server.communicate(timeout=5)
        raise RuntimeError(f"the HTTP server in the storage namespace did not start: {err}")
    return int(line)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShapedLink]:
    docroot = tmp_path_factory.mktemp("storage")
    # Incompressible and not a repeating pattern, so nothing on the way can shortcut it.
    (docroot / OBJECT_NAME).write_bytes(os.urandom(OBJECT_SIZE))
    with namespace() as storage, namespace() as node:
        veth = f"link add {STORAGE_IF} mtu {MTU} type veth peer name {NODE_IF} mtu {MTU}"
        ip(storage, *veth.split(), "netns", node.name)
        ip(storage, "addr", "add", f"{STORAGE_ADDR}/{PREFIXLEN}", "dev", STORAGE_IF)
        ip(node, "addr", "add", f"{NODE_ADDR}/{PREFIXLEN}", "dev", NODE_IF)
        for ns, ifname in ((storage, STORAGE_IF), (node, NODE_IF)):
            ip(ns, "link", "set", "lo", "up")
            ip(ns, "link", "set", ifname, "up")
        storage.wait_operstate(STORAGE_IF, "up")
        node.wait_operstate(NODE_IF, "up")
        rate = f"{RATE_MBIT}mbit"
        for tc in (
            f"qdisc add dev {STORAGE_IF} root handle 1: htb default 10",
            f"class add dev {STORAGE_IF} parent 1: classid 1:10 htb rate {rate} ceil {rate} "
            f"burst {BURST} cburst {BURST} quantum {QUANTUM}",
        ):
            run_in(storage, "tc", *tc.split())
        server = subprocess.Popen(
            storage.argv([sys.executable, "-c", SERVER, STORAGE_ADDR, str(docroot)]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            yield ShapedLink(storage, node, read_port(server))
        finally:
            stop(server)


def probe_from_node(link: ShapedLink, *items: dict[str, Any]) -> list[Probed]:
    done = link.node.run(
        [sys.executable, "-c", PROBE, json.dumps(list(items))], timeout=40, check=False
    )
    assert done.returncode == 0, done.stderr
    probed = []
    for item in json.loads(done.stdout):
        results = [CheckResult.model_validate(r) for r in item["results"]]
        assert [r.check for r in results] == [
            CheckId.STORAGE_REACHABLE,
            CheckId.STORAGE_LATENCY,
            CheckId.STORAGE_THROUGHPUT,
        ]
        probed.append(Probed(item["elapsed"], {r.check: r for r in results}))
    return probed


def endpoint(name: str, protocol: str, host: str, port: int, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "protocol": protocol,
        "host": host,
        "port": port,
        "maxLatencyMs": LENIENT_MS,
        **fields,
    }


def htb_sent_bytes(link: ShapedLink) -> int:
    # iproute2 6.1 prints htb class statistics as text even with -j.
    listing = run_in(link.storage, "tc", "-s", "class", "show", "dev", STORAGE_IF)
    found = re.search(r"^class htb 1:10 .*\n\s*Sent (\d+) bytes", listing, re.MULTILINE)
    assert found is not None, listing
    return int(found[1])


def assert_timed_out(probed: Probed, address: str, throughput_reason: str) -> None:
    reach = probed.results[CheckId.STORAGE_REACHABLE]
    assert reach.status is Status.FAIL, reach.message
    assert reach.observed["reachable"] is False
    assert reach.message == f"timed out after {PROBE_TIMEOUT:g} s connecting to {address}"
    latency = probed.results[CheckId.STORAGE_LATENCY]
    assert latency.status is Status.SKIP
    assert latency.message == "not measured: endpoint unreachable"
    assert "latencyMs" not in latency.observed
    throughput = probed.results[CheckId.STORAGE_THROUGHPUT]
    assert throughput.status is Status.SKIP
    assert throughput_reason in throughput.message
    # It waited for the timeout (no early error) and not for anything longer.
    assert PROBE_TIMEOUT * 0.9 <= probed.elapsed < ELAPSED_BOUND, probed.elapsed


# -- throughput -------------------------------------------------------------------------------


def test_throughput_through_an_htb_shaped_veth_is_the_shaped_rate(link: ShapedLink) -> None:
    goodput = expected_goodput_mbps()  # 9.564 MB/s at 80 Mbit/s
    below = 5.0  # MB/s, half the shaped rate
    above = 12.5  # MB/s, over the 10 MB/s line rate: no flow through the shaper reaches it
    path = f"/{OBJECT_NAME}"

    def shaped(name: str, minimum: float) -> dict[str, Any]:
        ep = endpoint(name, "http", STORAGE_ADDR, link.http_port, path=path)
        return {"endpoint": {**ep, "minThroughputMBps": minimum}, "measure": True, "timeout": 5.0}

    sent_before = htb_sent_bytes(link)
    ok, too_slow = probe_from_node(link, shaped("shaped", below), shaped("shaped-fast", above))

    for probed in (ok, too_slow):
        assert probed.results[CheckId.STORAGE_REACHABLE].status is Status.PASS
        assert probed.results[CheckId.STORAGE_LATENCY].status is Status.PASS
        observed = probed.results[CheckId.STORAGE_THROUGHPUT].observed
        assert observed["bytes"] == OBJECT_SIZE, observed
        mbps = observed["MBps"]
        assert isinstance(mbps, float)
        assert abs(mbps - goodput) <= TOLERANCE * goodput, (
            f"measured {mbps} MB/s through an htb rate of {RATE_MBIT} Mbit/s; expected "
            f"{goodput:.3f} MB/s +-{TOLERANCE:.0%}"
        )

    passed = ok.results[CheckId.STORAGE_THROUGHPUT]
    assert passed.status is Status.PASS, passed.message
    assert passed.expected == {"minThroughputMBps": below}

    failed = too_slow.results[CheckId.STORAGE_THROUGHPUT]
    assert failed.status is Status.FAIL, failed.message
    assert failed.expected == {"minThroughputMBps": above}
    match = re.fullmatch(
        rf"(\d+\.\d) MB/s reading {OBJECT_SIZE} bytes of {path}, "
        rf"below the minimum of {above:g} MB/s",
        failed.message,
    )
    assert match is not None, failed.message
    observed_mbps = failed.observed["MBps"]
    assert isinstance(observed_mbps, float)
    assert abs(float(match[1]) - observed_mbps) <= 0.051, failed.message  # the same number

    # Both bodies really crossed the shaper (not some other path between the namespaces).
    assert htb_sent_bytes(link) - sent_before >= 2 * OBJECT_SIZE


# -- addresses that never answer ---------------------------------------------------------------


def neighbour_state(ns: Namespace, address: str) -> list[str]:
    entries = json.loads(ip(ns, "-j", "neigh", "show", address) or "[]")
    return [state for entry in entries for state in entry.get("state", [])]


def test_an_address_nobody_owns_times_out(link: ShapedLink) -> None:
    port = 9000
    (probed,) = probe_from_node(
        link,
        {
            "endpoint": endpoint("nobody", "tcp", UNOWNED_ADDR, port),
            "measure": True,
            "timeout": PROBE_TIMEOUT,
        },
    )
    assert_timed_out(probed, f"{UNOWNED_ADDR}:{port}", "not measured: ")
    # The SYN never left: the node is still (or gave up) asking who has the address.
    assert set(neighbour_state(link.node, UNOWNED_ADDR)) & {"INCOMPLETE", "FAILED"}


DropCounter = Callable[[], int]


def drop_syns(ns: Namespace, port: int) -> DropCounter:
    """A firewall in `ns` silently dropping TCP to `port`; returns a dropped-packet counter.

    nft if installed (Debian `nftables`), else iptables; the rules live and die with the
    namespace.
    """
    if shutil.which("nft"):
        ruleset = (
            "table inet nvt_storage {\n"
            "  chain input {\n"
            "    type filter hook input priority filter; policy accept;\n"
            f"    tcp dport {port} counter drop\n"
            "  }\n"
            "}\n"
        )
        run_in(ns, "nft", "-f", "-", stdin=ruleset)

        def nft_count() -> int:
            listing = run_in(ns, "nft", "list", "chain", "inet", "nvt_storage", "input")
            found = re.search(r"counter packets (\d+)", listing)
            assert found is not None, listing
            return int(found[1])

        return nft_count
    if shutil.which("iptables"):
        run_in(ns, "iptables", "-I", "INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP")

        def iptables_count() -> int:
            listing = run_in(ns, "iptables", "-L", "INPUT", "-v", "-n", "-x")
            for line in listing.splitlines():
                fields = line.split()
                if "DROP" in fields and f"dpt:{port}" in fields:
                    return int(fields[0])
            raise AssertionError(listing)

        return iptables_count
    pytest.skip("neither nft nor iptables is installed (Debian: apt-get install nftables)")


def test_a_firewalled_port_that_drops_syns_times_out(link: ShapedLink) -> None:
    port = 9001
    dropped = drop_syns(link.storage, port)
    # An s3 endpoint due for throughput: the throughput phase must not run (and wait) again.
    firewalled = endpoint("firewalled", "s3", STORAGE_ADDR, port, path="/bucket/object")
    firewalled["minThroughputMBps"] = 1.0
    (probed,) = probe_from_node(
        link, {"endpoint": firewalled, "measure": True, "timeout": PROBE_TIMEOUT}
    )
    assert_timed_out(probed, f"{STORAGE_ADDR}:{port}", "not measured: endpoint unreachable")
    assert probed.elapsed < 2 * PROBE_TIMEOUT, probed.elapsed
    # The SYN reached the storage namespace and the rule ate it.
    assert dropped() >= 1
