"""The load-test engines: argument building and output parsing on real output
(tests/data/engines, sources in its README), hostile output never crashing the agent, and
the bounded child process (killed at its deadline or abort, a bare environment).

perftest cannot run here (no RDMA kernel): its arguments are checked against the
validation's settings and its parser against captures from real hosts; the missing-device
path runs end to end in tests/test_loadtest_agent.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netval.agent.loadtest import iperf3, perftest
from netval.agent.loadtest.engine_process import MAX_OUTPUT_BYTES, run_engine
from netval.agent.loadtest.engines import EngineUnavailable, find_binary, rdma_device_ready
from netval.agent.loadtest.rails import Rail, service_level
from netval.model.loadplan import bucket_ms, latency_bucket
from netval.model.snapshot import RdmaPort, Transport
from netval.model.spec import PfcChecks, Trust

DATA = Path(__file__).parent / "data" / "engines"
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


# -- iperf3 -----------------------------------------------------------------------------------


def test_iperf3_client_and_server_arguments() -> None:
    argv = iperf3.client_argv(
        "/usr/bin/iperf3", peer="10.1.0.2", source="10.1.0.1", port=7491, streams=4,
        warmup_seconds=2.0, seconds=20.0, cap_mbps=10_000, dscp=26,
    )  # fmt: skip
    assert argv == [
        "/usr/bin/iperf3", "-c", "10.1.0.2", "-B", "10.1.0.1", "-p", "7491", "-P", "4",
        "-O", "2", "-t", "20", "-J", "-b", "2500000000", "--dscp", "26",
    ]  # fmt: skip
    # whole seconds, rounded up: iperf3 takes integers
    fractional = iperf3.client_argv("i", peer="a", source="b", port=1, streams=1,
                                    warmup_seconds=0.4, seconds=5.5)  # fmt: skip
    assert fractional[fractional.index("-O") + 1] == "1"
    assert fractional[fractional.index("-t") + 1] == "6"
    assert "-b" not in fractional and "--dscp" not in fractional
    assert iperf3.server_argv("iperf3", address="10.1.0.2", port=7491) == [
        "iperf3", "-s", "-1", "-B", "10.1.0.2", "-p", "7491", "--forceflush",
    ]  # fmt: skip


def test_iperf3_json_gives_the_receiver_s_bytes_the_cpu_and_the_retransmits() -> None:
    out = iperf3.parse_client(fixture("iperf3-3.12-client-4streams.json"))
    doc = json.loads(fixture("iperf3-3.12-client-4streams.json"))
    assert out.bytes == doc["end"]["sum_received"]["bytes"]
    assert out.seconds == pytest.approx(2.0, abs=0.01)
    assert out.bytes * 8 / out.seconds / 1e9 == pytest.approx(2.0, rel=0.05)  # 4 x 500 Mbit/s
    assert out.version == "3.12"
    assert out.cpu_percent is not None and out.remote_cpu_percent is not None
    assert out.retransmits is not None and out.retransmits >= 0
    with pytest.raises(iperf3.Iperf3Error, match="unable to connect to server"):
        iperf3.parse_client(fixture("iperf3-3.12-refused.json"))
    assert iperf3.refused_connection(fixture("iperf3-3.12-refused.json"), b"")


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (b"", "printed nothing"),
        (b"iperf3: error - the server is busy running a test", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"end": {"sum_received": {"bytes": -5, "seconds": 1}}}', "no end.sum_received"),
        (b'{"end": {"sum_received": {"bytes": 1e400, "seconds": 1}}}', "no end.sum_received"),
        (b'{"end": {"sum_received": {"bytes": 10, "seconds": 0}}}', "no end.sum_received"),
        (b'{"end": {"sum_received": {"bytes": 1e30, "seconds": 1}}}', "impossible"),
        (b"[" * 10_000 + b"]" * 10_000, "nests too deep"),
    ],
)
def test_iperf3_output_that_is_not_iperf3_s_is_an_error_naming_why(output: bytes, why: str) -> None:
    with pytest.raises(iperf3.Iperf3Error, match=why):
        iperf3.parse_client(output)


JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
    st.sampled_from([10**400, -(10**400), 2**64, "NaN", "Infinity"]),
)  # fmt: skip


@FUZZ
@given(st.data())
def test_hostile_iperf3_json_is_parsed_or_refused_never_raising_anything_else(
    data: st.DataObject,
) -> None:
    doc = json.loads(fixture("iperf3-3.12-client-4streams.json"))
    for _ in range(data.draw(st.integers(1, 4))):
        section = data.draw(st.sampled_from(["start", "end", "intervals"]))
        if section == "end":
            part = data.draw(st.sampled_from(["sum_received", "sum_sent",
                                              "cpu_utilization_percent"]))  # fmt: skip
            key = data.draw(st.sampled_from(["bytes", "seconds", "retransmits", "host_total",
                                             "remote_total"]))  # fmt: skip
            doc["end"].setdefault(part, {})[key] = data.draw(JSON_LEAF)
        else:
            doc[section] = data.draw(JSON_LEAF)
    try:
        payload = json.dumps(doc).encode()
    except (ValueError, OverflowError):
        payload = repr(doc).encode()
    try:
        out = iperf3.parse_client(payload)
    except iperf3.Iperf3Error:
        return
    assert 0 <= out.bytes <= 2**62 and out.seconds > 0
    for figure in (out.cpu_percent, out.remote_cpu_percent):
        assert figure is None or 0 <= figure <= 100_000


@FUZZ
@given(st.binary(max_size=2000))
def test_garbage_engine_output_never_raises_anything_but_the_engine_s_errors(
    garbage: bytes,
) -> None:
    for parse in (
        iperf3.parse_client,
        perftest.parse_bw,
        perftest.parse_lat_summary,
        lambda b: perftest.parse_lat_histogram(b, 500),
    ):
        with contextlib.suppress(iperf3.Iperf3Error, perftest.PerftestError, EngineUnavailable):
            parse(garbage)


# -- perftest ---------------------------------------------------------------------------------

ROCE = perftest.RdmaRail(device="mlx5_3", port=1, infiniband=False, gid_index=3, tos=106,
                         sl=None)  # fmt: skip


def test_perftest_arguments_follow_the_validation_and_the_rail() -> None:
    server = perftest.bw_argv("ib_write_bw", ROCE, tcp_port=7490, streams=4,
                              warmup_seconds=2, seconds=20)  # fmt: skip
    assert server == [
        "ib_write_bw", "-d", "mlx5_3", "-i", "1", "-p", "7490", "-F", "-x", "3",
        "--tclass=106", "-q", "4", "-D", "24", "-f", "2", "--report_gbits",
    ]  # fmt: skip
    # a DSCP asked for overrides the port's default_roce_tos: tclass = DSCP << 2
    client = perftest.bw_argv("ib_write_bw", ROCE, tcp_port=7490, streams=4, warmup_seconds=2,
                              seconds=20, cap_mbps=50_000, dscp=26, server="10.1.0.2",
                              source="10.1.0.1")  # fmt: skip
    assert "--tclass=104" in client and client[-1] == "10.1.0.2"
    assert "--rate_limit=50.000" in client and "--rate_limit_type=SW" in client
    assert not any(a.startswith("--source_ip") for a in client)  # only with RDMA CM
    # no GID index in the validation: RDMA CM resolves it from the rail's address
    cm = perftest.RdmaRail("mlx5_3", 1, infiniband=False, gid_index=None, tos=106, sl=None)
    argv = perftest.bw_argv("ib_write_bw", cm, tcp_port=7490, streams=1, warmup_seconds=2,
                            seconds=5, server="10.1.0.2", source="10.1.0.1")  # fmt: skip
    assert "-R" in argv and argv[argv.index("-T") : argv.index("-T") + 2] == ["-T", "106"]
    assert "--source_ip=10.1.0.1" in argv and "-x" not in argv
    # InfiniBand: no GID, the service level from the lossless priority
    ib = perftest.RdmaRail("mlx5_0", 1, infiniband=True, gid_index=3, tos=None, sl=3)
    argv = perftest.bw_argv("ib_write_bw", ib, tcp_port=7490, streams=2, warmup_seconds=2,
                            seconds=5)  # fmt: skip
    assert "-x" not in argv and "-R" not in argv and argv[-9:-7] == ["-S", "3"]
    lat = perftest.lat_argv("ib_write_lat", ROCE, tcp_port=7506, seconds=20, server="10.1.0.2")
    iterations, gap = perftest.lat_iterations(20)
    assert ["-n", str(iterations), f"--latency_gap={gap}", "-H"] == lat[-5:-1]
    assert iterations * 2 * gap / 1e6 <= 0.8 * 20  # they fit in the window


def test_the_service_level_is_the_lossless_priority_on_infiniband_or_pcp_trust() -> None:
    port = RdmaPort(device="mlx5_0", port=1)
    pfc = PfcChecks(priorities=[3])
    roce = Rail("ens1", "10.0.0.1", port, Transport.ROCE, 200_000)
    ib = Rail("ib0", "10.0.0.1", port, Transport.INFINIBAND, 400_000)
    assert service_level(roce, pfc) is None  # DSCP trust: the class comes from the DSCP
    assert service_level(ib, pfc) == 3
    assert service_level(roce, PfcChecks(priorities=[5], trust=Trust.PCP)) == 5


@pytest.mark.parametrize(
    ("name", "mbps"),
    [
        ("ib_write_bw-mlx4-ib-mbsec.txt", 4508.79 * 1.048576 * 8),
        ("ib_write_bw-roce-gbits-duration.txt", 480.0),
    ],
)
def test_perftest_bandwidth_from_real_output(name: str, mbps: float) -> None:
    out = perftest.parse_bw(fixture(name))
    assert out.mbps == pytest.approx(mbps, rel=1e-6)


@pytest.mark.parametrize(
    ("name", "typical", "p99"),
    [("ib_write_lat-mlx4-ib.txt", 0.98, 1.00), ("ib_read_lat-roce-sriov.txt", 6.74, 7.15)],
)
def test_perftest_latency_summary_from_real_output(name: str, typical: float, p99: float) -> None:
    out = perftest.parse_lat_summary(fixture(name))
    assert (out.bytes, out.iterations, out.t_typical, out.p99) == (2, 1000, typical, p99)


def test_perftest_without_a_device_is_engine_unavailable() -> None:
    for name in ("ib_write_bw-no-device.txt", "ib_write_lat-no-device.txt"):
        with pytest.raises(EngineUnavailable, match="no RDMA device"):
            perftest.parse_bw(fixture(name))
        with pytest.raises(EngineUnavailable, match="no RDMA device"):
            perftest.parse_lat_histogram(fixture(name), 500)


def test_every_round_trip_of_ib_write_lat_h_goes_into_the_histogram() -> None:
    """perftest prints each sorted sample as `<i>, <half round trip + gap>` (usec) after a
    `#, usec` line, then its summary; the gap is subtracted and the half doubled."""
    summary = fixture("ib_write_lat-mlx4-ib.txt").decode()
    gap = 500
    halves = [0.96 + 0.0001 * i for i in range(998)]  # usec, what the summary says: 0.96..1.06
    # %g keeps 6 significant digits: 1 ns resolution next to a 500 us gap
    printed = [f"{gap + h:g}" for h in halves]
    lines = ["#, usec", *(f"{i + 1}, {v}" for i, v in enumerate(printed))]
    head, table = summary.split(" #bytes", 1)
    output = f"{head}" + "\n".join(lines) + "\n #bytes" + table
    buckets = perftest.parse_lat_histogram(output.encode(), gap)
    assert sum(buckets.values()) == 998
    expected = Counter(latency_bucket(2 * (float(v) - gap) / 1000) for v in printed)
    assert buckets == expected
    assert min(bucket_ms(b) for b in buckets) == pytest.approx(2 * 0.96 / 1000, rel=0.01)
    with pytest.raises(perftest.PerftestError, match="no samples"):
        perftest.parse_lat_histogram(summary.encode(), gap)  # no -H block


def test_a_missing_engine_or_device_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match=r"iperf3 is not installed \(Debian package"):
        find_binary("iperf3", lambda _name: None)
    with pytest.raises(EngineUnavailable, match="perftest"):
        find_binary("ib_write_bw", lambda _name: None)
    sys_root, dev_root = tmp_path / "sys", tmp_path / "dev"
    with pytest.raises(EngineUnavailable, match="no RDMA device mlx5_0"):
        rdma_device_ready("mlx5_0", sys_root, dev_root)
    verbs = sys_root / "class/infiniband/mlx5_0/device/infiniband_verbs/uverbs0"
    verbs.mkdir(parents=True)
    with pytest.raises(EngineUnavailable, match=r"infiniband/uverbs0 is missing in this container"):
        rdma_device_ready("mlx5_0", sys_root, dev_root)
    (dev_root / "infiniband").mkdir(parents=True)
    (dev_root / "infiniband" / "uverbs0").write_bytes(b"")
    rdma_device_ready("mlx5_0", sys_root, dev_root)  # present and accessible (root here)


# -- the bounded child process ----------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_an_engine_is_killed_at_its_deadline_or_at_once_when_halted() -> None:
    start = time.time()
    run = await run_engine(["sleep", "60"], start_at=start, deadline=start + 0.5,
                           halt=asyncio.Event())  # fmt: skip
    assert run.killed == "deadline" and run.ended - start < 0.5 + 2.0
    halt = asyncio.Event()
    start = time.time()
    asyncio.get_running_loop().call_later(0.3, halt.set)
    run = await run_engine(["sleep", "60"], start_at=start, deadline=start + 60, halt=halt)
    assert run.killed == "stopped" and run.ended - start < 0.3 + 2.0
    # a shell and its child, the child holding the pipe: the whole group goes
    run = await run_engine(["sh", "-c", "sleep 60 & sleep 60"], start_at=time.time(),
                           deadline=time.time() + 0.3, halt=asyncio.Event())  # fmt: skip
    assert run.killed == "deadline"
    # halted before its start: it never runs
    halted = asyncio.Event()
    halted.set()
    run = await run_engine(["true"], start_at=time.time() + 5, deadline=time.time() + 10,
                           halt=halted)  # fmt: skip
    assert run.returncode is None and run.error == "stopped before it started"


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_an_engine_gets_a_bare_environment_and_bounded_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NETVAL_MQTT_PASSWORD", "secret")
    run = await run_engine(["env"], start_at=time.time(), deadline=time.time() + 10,
                           halt=asyncio.Event())  # fmt: skip
    assert sorted(line.split("=")[0] for line in run.stdout.decode().splitlines()) == [
        "LC_ALL", "PATH",
    ]  # fmt: skip
    run = await run_engine(["head", "-c", str(MAX_OUTPUT_BYTES + 4096), "/dev/zero"],
                           start_at=time.time(), deadline=time.time() + 20,
                           halt=asyncio.Event())  # fmt: skip
    assert len(run.stdout) == MAX_OUTPUT_BYTES and run.truncated
    run = await run_engine(["/nonexistent/engine"], start_at=time.time(),
                           deadline=time.time() + 5, halt=asyncio.Event())  # fmt: skip
    assert run.returncode is None and run.error is not None and "cannot start" in run.error


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_cpu_demand_is_near_a_core_for_a_busy_engine_and_low_for_a_sleeping_one() -> None:
    start = time.time()
    busy = await run_engine(["sh", "-c", "while :; do :; done"], start_at=start,
                            deadline=start + 2.0, halt=asyncio.Event(),
                            measure_from=start + 0.3)  # fmt: skip
    idle = await run_engine(["sleep", "2"], start_at=time.time(), deadline=time.time() + 5,
                            halt=asyncio.Event(), measure_from=time.time() + 0.3)  # fmt: skip
    assert busy.cpu_demand_percent is not None and busy.cpu_demand_percent >= 80
    assert idle.cpu_demand_percent is not None and idle.cpu_demand_percent <= 10
