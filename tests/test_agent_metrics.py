"""The agent's status metrics, scraped over its real HTTP endpoint and parsed with
prometheus_client's own text parser: state sets (one series per possible status, 1 for the
current one) and no peer node name in any label, so the series set stays fixed however many
peers a cycle probes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from netval.agent.metrics import UNASSIGNED_DOMAIN, AgentMetrics, serve_agent_metrics
from netval.agent.peers.target import PeerTarget, peer_result
from netval.model import CheckId, CheckResult, Report, Status
from netval.model.results import node_status

NODE = "gpu-0000"
STATUSES = {s.value for s in Status}
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _peers(cycle: int, count: int = 300) -> list[CheckResult]:
    """`count` peers in 3 domains (different nodes every cycle), latency and loss each."""
    results = []
    for i in range(count):
        node = f"gpu-{cycle:02d}{i:04d}"
        target = PeerTarget(node=node, address=f"10.{cycle}.{i // 250}.{i % 250}", port=7480,
                            domain=f"block-{i % 3}")  # fmt: skip
        failing = i == 7 and cycle == 1  # one failing peer in block-1 in cycle 1
        status = Status.FAIL if failing else Status.PASS
        results.append(peer_result(CheckId.PEER_LATENCY, target, status, "rtt"))
        results.append(peer_result(CheckId.PEER_LOSS, target, Status.PASS, "loss"))
    return results


def _report(results: list[CheckResult]) -> Report:
    return Report(
        validation="v",
        generation=1,
        node=NODE,
        started_at=datetime.now(UTC),
        duration_ms=1.0,
        status=node_status(results),
        results=results,
    )


NODE_RESULTS = [
    CheckResult(check=CheckId.LINK_CARRIER, subject="ens1np0", status=Status.PASS, message="up"),
    CheckResult(check=CheckId.MTU_INTERFACE, subject="ens1np0", status=Status.FAIL, message="x"),
    # a peer check's not-ready result: no domain
    CheckResult(check=CheckId.PEER_THROUGHPUT, subject=NODE, status=Status.SKIP, message="x"),
]


async def _scrape(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return raw.decode().split("\r\n\r\n", 1)[1]


def _series(text: str, *names: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _scrapes_after(*reports: Report) -> list[str]:
    async def scenario() -> list[str]:
        metrics = AgentMetrics(interval_seconds=30)
        server = await serve_agent_metrics("127.0.0.1", 0, metrics)
        port = server.sockets[0].getsockname()[1]
        texts = []
        try:
            for report in reports:
                metrics.observe(report, "interval")
                texts.append(await _scrape(port))
        finally:
            server.close()
            await server.wait_closed()
        return texts

    return asyncio.run(asyncio.wait_for(scenario(), 20))


NAMES = ("netval_check_status", "netval_peer_check_status", "netval_peer_results")


def test_status_metrics_are_state_sets_without_peer_names() -> None:
    first, second = _scrapes_after(
        _report([*NODE_RESULTS, *_peers(1)]), _report([*NODE_RESULTS, *_peers(2)])
    )
    one = _series(first, *NAMES)
    labels = {v for (_name, pairs) in one for _k, v in pairs}
    assert not any(v.startswith("gpu-01") or v.startswith("gpu-02") for v in labels), labels
    assert NODE not in labels  # a peer result's own-node subject is not a label either

    checks = {k: v for k, v in one.items() if k[0] == "netval_check_status"}
    # 2 (check, subject) pairs x 5 statuses, exactly one 1 each
    assert len(checks) == 2 * len(STATUSES)
    current = {dict(p)["check"]: dict(p)["status"] for (_n, p), v in checks.items() if v == 1}
    assert current == {"link.carrier": "pass", "mtu.interface": "fail"}

    peers = {
        (dict(p)["check"], dict(p)["peer_domain"], dict(p)["status"]): v
        for (n, p), v in one.items()
        if n == "netval_peer_check_status"
    }
    worst = {(c, d): s for (c, d, s), v in peers.items() if v == 1}
    assert worst == {
        ("peer.latency", "block-0"): "pass",
        ("peer.latency", "block-1"): "fail",  # the one failing peer makes its domain's worst
        ("peer.latency", "block-2"): "pass",
        ("peer.loss", "block-0"): "pass",
        ("peer.loss", "block-1"): "pass",
        ("peer.loss", "block-2"): "pass",
        ("peer.throughput", UNASSIGNED_DOMAIN): "skip",
    }
    assert len(peers) == len(worst) * len(STATUSES)
    counts = {
        (dict(p)["check"], dict(p)["peer_domain"], dict(p)["status"]): v
        for (n, p), v in one.items()
        if n == "netval_peer_results"
    }
    assert counts[("peer.latency", "block-1", "fail")] == 1
    assert counts[("peer.latency", "block-1", "pass")] == 99
    assert counts[("peer.loss", "block-0", "pass")] == 100
    assert counts[("peer.loss", "block-0", "fail")] == 0
    assert len(counts) == len(peers)

    # the next cycle probes 300 other peers: no series ends, none starts, only values move
    two = _series(second, *NAMES)
    assert set(two) == set(one)
    latency_block_1 = [
        v
        for (n, p), v in two.items()
        if n == "netval_peer_check_status"
        and dict(p) == {"check": "peer.latency", "peer_domain": "block-1", "status": "fail"}
    ]
    assert latency_block_1 == [0.0]


def test_a_subject_that_disappears_leaves_no_series() -> None:
    only_carrier = [NODE_RESULTS[0]]
    first, second = _scrapes_after(_report(NODE_RESULTS), _report(only_carrier))
    assert any("mtu.interface" in str(k) for k in _series(first, *NAMES))
    assert not any("mtu.interface" in str(k) for k in _series(second, *NAMES))
    assert not _series(second, "netval_peer_check_status", "netval_peer_results")
