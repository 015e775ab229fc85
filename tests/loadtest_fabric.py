"""A synthetic leaf-spine fabric that answers a load-test plan with the results its agents
would send: what `netval.operator.loadtest.aggregate` gets from real agents, without traffic.

Rates follow the fabric's bottlenecks for the flows of each window: a flow gets the smallest
of its sender's port share, its receiver's port share and, across leaves, its share of the
sender leaf's uplink and of the receiver leaf's downlink (each direction carries its own
flows: links are full duplex). Storage sits behind one link of `storage_mbps` shared by the
readers of a window. Latency grows with how loaded the busiest link of the pair is.
Used by tests/test_loadtest_*.py and bench/loadtest_plan.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from netval.model.loadplan import (
    FlowResult,
    LatencyResult,
    LoadResult,
    ServeResult,
    StorageResult,
    latency_bucket,
)
from netval.model.spec import NetworkValidationSpec
from netval.operator.loadtest.aggregate import Received
from netval.operator.loadtest.plan import Candidate, RunPlan, Window, WindowKind, plan_run
from netval.operator.loadtest.rails import common_rails
from netval.operator.loadtest.validate import RunSettings, settle

IDLE_MS = 0.05
NOW = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
# peers and one readable store: every phase can run
VALIDATION = NetworkValidationSpec.model_validate(
    {
        "checks": {
            "peers": {"enabled": True},
            "storage": {
                "endpoints": [
                    {"name": "datasets", "protocol": "http", "host": "s.local", "path": "/d"}
                ]
            },
        }
    }
)


@dataclass(frozen=True)
class Fabric:
    leaves: dict[str, list[str]]  # leaf (domain) -> nodes
    port_mbps: float = 200_000.0
    uplink_mbps: float = 200_000.0  # per leaf, each direction
    storage_mbps: float = 400_000.0  # the storage link, in Mbit/s

    @property
    def leaf_of(self) -> dict[str, str]:
        return {n: leaf for leaf, nodes in self.leaves.items() for n in nodes}

    def candidates(self, **overrides: dict[str, bool]) -> list[Candidate]:
        """Every node fresh, idle and not gated, except as `overrides` says per node."""
        return [
            Candidate(
                node=n,
                domain=leaf,
                fresh=overrides.get(n, {}).get("fresh", True),
                busy=overrides.get(n, {}).get("busy", False),
                gated=overrides.get(n, {}).get("gated", False),
            )
            for leaf, nodes in self.leaves.items()
            for n in nodes
        ]

    def flow_rates(self, w: Window) -> dict[tuple[str, str], float]:
        leaf = self.leaf_of
        out_port = Counter(a for a, _ in w.flows)
        in_port = Counter(b for _, b in w.flows)
        up = Counter(leaf[a] for a, b in w.flows if leaf[a] != leaf[b])
        down = Counter(leaf[b] for a, b in w.flows if leaf[a] != leaf[b])
        rates = {}
        for a, b in w.flows:
            shares = [self.port_mbps / out_port[a], self.port_mbps / in_port[b]]
            if leaf[a] != leaf[b]:
                shares += [self.uplink_mbps / up[leaf[a]], self.uplink_mbps / down[leaf[b]]]
            rates[(a, b)] = min(shares)
        return rates


def leaf_spine(leaves: int, per_leaf: int, **kwargs: float) -> Fabric:
    return Fabric(
        leaves={f"leaf-{i}": [f"node-{i}-{j:02d}" for j in range(per_leaf)] for i in range(leaves)},
        **kwargs,  # type: ignore[arg-type]
    )


def _samples(ms: float, n: int = 20) -> list[tuple[int, int]]:
    """`n` round trips around `ms` as a latency histogram (what agents send)."""
    buckets = Counter(latency_bucket(ms * (1 + i / (10 * n))) for i in range(n))
    return sorted(buckets.items())


def answer(
    fabric: Fabric,
    plan: RunPlan,
    *,
    clock_offset: dict[str, float] | None = None,
    transit_seconds: float = 0.05,
    cpu_demand: float | None = None,
    dropped: Callable[[Window, str, str], bool] = lambda _w, _a, _b: False,
    failed_readers: Callable[[Window, str], bool] = lambda _w, _n: False,
    silent: frozenset[str] = frozenset(),
    port_report: float | None = None,
) -> list[Received]:
    """Every participant's result for every stage, as the fabric would make them.
    `cpu_demand`: each engine's CPU demand on both ends (None: no evidence); `dropped`:
    flows (window, sender, receiver) the fabric does not carry (they fail); `failed_readers`:
    reads that fail (503); `silent`: nodes that send nothing; `port_report`: the port rate
    the rails report (default the fabric's: a veth reports 10000 it never reaches)."""
    offset = clock_offset or {}
    port = port_report if port_report is not None else fabric.port_mbps
    received: list[Received] = []
    for stage in plan.stages:
        windows = plan.windows_of(stage)
        flows: dict[str, list[FlowResult]] = {}
        serves: dict[str, list[ServeResult]] = {}
        latency: dict[str, list[LatencyResult]] = {}
        storage: dict[str, list[StorageResult]] = {}
        load = {
            w.id: fabric.flow_rates(w)
            for w in windows
            if w.kind in (WindowKind.INTRA, WindowKind.CROSS)
        }
        for w in windows:
            skew = timedelta(0)
            if w.kind is WindowKind.IDLE:
                for a, b in w.flows:
                    latency.setdefault(a, []).append(
                        LatencyResult(window=w.id, peer=b, loaded=False, sent=30, received=30,
                                      histogram=_samples(IDLE_MS, 30))
                    )  # fmt: skip
            elif w.kind in (WindowKind.INTRA, WindowKind.CROSS):
                rates = load[w.id]
                for a, b in w.flows:
                    skew = timedelta(seconds=offset.get(a, 0.0))
                    mbps = rates[(a, b)]
                    # every rail plane is a copy of the fabric: the same rate on each
                    for rail in common_rails(plan.rails_of(a), plan.rails_of(b)):
                        lost = dropped(w, a, b)
                        flows.setdefault(a, []).append(
                            FlowResult(
                                window=w.id, peer=b, rail=rail,
                                bytes=0 if lost else int(mbps * 1e6 / 8 * w.measured_seconds),
                                start=w.measure_start + skew, end=w.end + skew,
                                port_mbps=port, cpu_demand_percent=cpu_demand,
                                error="iperf3: unable to connect to server" if lost else None,
                            )
                        )  # fmt: skip
                        serves.setdefault(b, []).append(
                            ServeResult(window=w.id, peer=a, rail=rail, port_mbps=port,
                                        cpu_demand_percent=cpu_demand)
                        )  # fmt: skip
                    # queueing: the fuller the pair's bottleneck, the longer the echo waits
                    ms = IDLE_MS * (1 + 10 * mbps / fabric.port_mbps)
                    latency.setdefault(a, []).append(
                        LatencyResult(window=w.id, peer=b, loaded=True, sent=100, received=99,
                                      histogram=_samples(ms, 99))
                    )  # fmt: skip
            else:
                readers = len(w.flows)
                mbps = min(fabric.port_mbps, fabric.storage_mbps / readers)
                for node, endpoint in w.flows:
                    skew = timedelta(seconds=offset.get(node, 0.0))
                    fails = failed_readers(w, node)
                    storage.setdefault(node, []).append(
                        StorageResult(
                            window=w.id, endpoint=endpoint,
                            bytes=0 if fails else int(mbps * 1e6 / 8 * w.measured_seconds),
                            start=w.measure_start + skew, end=w.end + skew,
                            error="GET /d answered 503 Service Unavailable" if fails else None,
                        )
                    )  # fmt: skip
        for node in sorted(flows.keys() | latency.keys() | storage.keys()):
            if node in silent:
                continue
            sent_at: datetime = stage.deadline + timedelta(seconds=offset.get(node, 0.0))
            received.append(
                Received(
                    LoadResult(
                        run=plan.run_id, stage=stage.index, validation=plan.settings.validation,
                        node=node, sent_at=sent_at, flows=flows.get(node, []),
                        serves=serves.get(node, []), latency=latency.get(node, []),
                        storage=storage.get(node, []),
                    ),
                    received_at=stage.deadline + timedelta(seconds=transit_seconds),
                )
            )  # fmt: skip
    return received


def make_plan(fabric: Fabric, spec: dict[str, Any] | None = None, **kw: Any) -> RunPlan:
    """The run a test `spec` (over a 10 s default duration) plans on `fabric` at `NOW`."""
    s = settle({"validation": "pool", "duration": "10s", **(spec or {})}, VALIDATION)
    assert isinstance(s, RunSettings)
    plan = plan_run(s, fabric.candidates(), run_id="run-1", now=NOW, **{"seed": 1, **kw})
    assert isinstance(plan, RunPlan)
    return plan
