"""The load-test messages at the MQTT trust boundary: plans (operator -> agent) and results
(agent -> operator). Garbage and hostile-but-schema-shaped payloads (NaN, Infinity, huge
numbers, far dates, long strings) are refused with a ValueError naming the field, never
another exception; what is accepted aggregates into a status the API server can parse
(`json.dumps(allow_nan=False)`). And the topics sit under the node's own level."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest_fabric import answer, leaf_spine
from netval.model.loadplan import (
    MAX_PLAN_BYTES,
    MAX_RESULT_BYTES,
    LoadAbort,
    LoadPlan,
    decode_plan,
    decode_result,
    encode,
)
from netval.model.loadtest import Expectations, NetworkLoadTestStatus
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import MAX_REPORT_PACKET_BYTES, TopicKind, parse_topic, topic
from netval.operator.loadtest.aggregate import Received, aggregate
from netval.operator.loadtest.plan import RunPlan, plan_run
from netval.operator.loadtest.rails import NodeRails
from netval.operator.loadtest.tasks import build_plans
from netval.operator.loadtest.validate import RunSettings, settle

NOW = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

VALIDATION = NetworkValidationSpec.model_validate(
    {
        "checks": {
            "peers": {"enabled": True},
            "storage": {"endpoints": [{"name": "d", "protocol": "s3", "host": "h", "path": "/o"}]},
        }
    }
)


FABRIC = leaf_spine(2, 2)
# two rails per node, the first an RDMA port: with engine auto, perftest on rail 0 (its
# latency probe too) and iperf3 on rail 1; every task kind appears in a node's plan
TWO_RAILS = NodeRails(mask=0b11, rdma=0b01)


def _plan() -> RunPlan:
    s = settle({"validation": "pool", "duration": "5s"}, VALIDATION)
    assert isinstance(s, RunSettings)
    nodes = [c.node for c in FABRIC.candidates()]
    plan = plan_run(s, FABRIC.candidates(), run_id="run-1", now=NOW, seed=2,
                    rails=dict.fromkeys(nodes, TWO_RAILS))  # fmt: skip
    assert isinstance(plan, RunPlan)
    return plan


PLAN = _plan()
RESULTS = answer(FABRIC, PLAN)
ENDPOINTS = {n: (f"10.0.0.{i + 1}", 7471) for i, n in enumerate(PLAN.domain_of)}
ANNOUNCED = {
    n: (((f"r0-{i}", f"10.1.0.{i + 1}", True), (f"r1-{i}", f"10.2.0.{i + 1}", False)), ())
    for i, n in enumerate(PLAN.domain_of)
}
PLANS = build_plans(PLAN, PLAN.stages[1], term=7, endpoints=ENDPOINTS, announced=ANNOUNCED)
PLAN_DOC: dict[str, Any] = json.loads(encode(PLANS["node-0-00"]))


def _result_doc() -> dict[str, Any]:
    """A result with every field an agent may send (evidence, servers, engines, ranges)."""
    doc: dict[str, Any] = json.loads(encode(RESULTS[3].result))
    flow = doc["flows"][0]
    flow.update(cpuPercent=55.5, remoteCpuPercent=41.2, cpuDemandPercent=96.0, retransmits=11,
                streams=4)  # fmt: skip
    doc["serves"] = [{"window": flow["window"], "peer": flow["peer"], "rail": 0,
                      "portMbps": 10000.0, "cpuDemandPercent": 85.0}]  # fmt: skip
    doc["engines"] = {"iperf3": "3.12", "perftest": "6.06"}
    doc["unavailable"] = None
    return doc


RESULT_DOC = _result_doc()

hostile = st.one_of(
    st.sampled_from(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            1e308,
            -1e308,
            10**400,
            2**63,
            -1,
            0,
            "",
            "9999-12-31T23:59:59Z",
            "0001-01-01T00:00:00Z",
            "2026-03-01T02:00:00",  # naive
            "2026-03-01T02:00:00+14:00",
            "x" * 5000,
            "a/b",
            "+",
            None,
            True,
            [],
            {},
        ]
    ),
    st.floats(),
    st.integers(),
    st.text(max_size=40),
)


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _leaves(v, (*path, i))] or [path]
    return [path]


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    if path:
        target[path[-1]] = value
    return doc


def _dumps(doc: Any) -> bytes:
    try:
        return json.dumps(doc).encode()
    except ValueError:  # 10**400 and the like: as a JSON number all the same
        return repr(doc).encode()


@FUZZ
@given(st.data())
def test_hostile_results_are_refused_clearly_or_aggregate_to_valid_json(
    data: st.DataObject,
) -> None:
    paths = _leaves(RESULT_DOC)
    doc = RESULT_DOC
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _set(doc, data.draw(st.sampled_from(paths)), data.draw(hostile))
    try:
        result = decode_result(_dumps(doc))
    except ValueError as exc:
        assert str(exc).startswith("invalid load result: "), exc
        return
    received = [*RESULTS[:3], Received(result, NOW), *RESULTS[4:]]
    run = aggregate(
        PLAN,
        received,
        expect=Expectations(max_oversubscription=1.0, max_latency_inflation=1.0),
        finished_at=NOW,
    )
    patch = NetworkLoadTestStatus(last_run=run).to_patch()
    json.dumps(patch, allow_nan=False)


@FUZZ
@given(st.data())
def test_hostile_plans_are_refused_clearly(data: st.DataObject) -> None:
    paths = _leaves(PLAN_DOC)
    doc = PLAN_DOC
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _set(doc, data.draw(st.sampled_from(paths)), data.draw(hostile))
    try:
        plan = decode_plan(_dumps(doc))
    except ValueError as exc:
        assert str(exc).startswith("invalid load plan: "), exc
        return
    assert isinstance(plan, LoadPlan)
    assert plan.deadline - plan.issued_at <= timedelta(seconds=600)
    assert all(plan.issued_at <= t.start and t.end <= plan.deadline for t in plan.tasks)


@FUZZ
@given(st.binary(max_size=300))
def test_garbage_is_refused_clearly(payload: bytes) -> None:
    for decode, what in ((decode_plan, "plan"), (decode_result, "result")):
        try:
            decode(payload)
        except ValueError as exc:
            assert f"load {what}" in str(exc)


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (("flows", 0, "bytes"), float("nan"), "flows.0.bytes: Input should be a finite number"),
        (("flows", 0, "bytes"), -1, "flows.0.bytes: Input should be greater than or equal to 0"),
        (
            ("flows", 0, "end"),
            "2000-01-01T00:00:00Z",
            "flows.0: Value error, end must be after start",
        ),
        (
            ("flows", 0, "start"),
            "2026-03-01T02:00:00",
            "flows.0.start: Input should have timezone info",
        ),
        (
            ("latency", 0, "histogram", 0, 0),
            10**6,
            "latency.0.histogram.0.0: Input should be less than or equal to 1105",
        ),
        (
            ("latency", 0, "histogram", 0, 1),
            10**6,
            "latency.0: Value error, histogram holds 1000",
        ),
        (("flows", 0, "rail"), 16, "flows.0.rail: Input should be less than 16"),
        (("serves", 0, "cpuDemandPercent"), float("inf"), "serves.0.cpuDemandPercent: Input"),
        (
            ("latency", 0, "received"),
            10**6,
            "latency.0: Value error, received 1000000 is more than sent",
        ),
        (("node",), "a/b", "node: String should match pattern"),
        (("extra",), 1, "extra: Extra inputs are not permitted"),
    ],
)
def test_result_errors_name_the_field(path: tuple[Any, ...], value: Any, error: str) -> None:
    doc = _set(RESULT_DOC, path, value) if path[0] in RESULT_DOC else {**RESULT_DOC, path[0]: value}
    with pytest.raises(ValueError, match="invalid load result") as exc:
        decode_result(_dumps(doc))
    assert error in str(exc.value)


def test_plan_errors_name_the_rule() -> None:
    late = {**PLAN_DOC, "deadline": "2026-03-01T03:00:00Z"}
    with pytest.raises(ValueError, match="deadline must be after issuedAt and at most 600s later"):
        decode_plan(_dumps(late))
    early = _set(PLAN_DOC, ("tasks", 0, "start"), "2026-03-01T01:00:00Z")
    with pytest.raises(ValueError, match=r"tasks\[0\] \(r1:idle\) runs outside issuedAt..deadline"):
        decode_plan(_dumps(early))
    far = _set(PLAN_DOC, ("tasks", 0, "start"), "9999-12-31T23:59:59Z")
    with pytest.raises(ValueError, match="runs outside"):
        decode_plan(_dumps(far))
    with pytest.raises(ValueError, match="over 262144"):
        decode_plan(b" " * (MAX_PLAN_BYTES + 1))
    with pytest.raises(
        ValueError, match=r"invalid load plan: .*Input tag 'launch' found using 'type'"
    ):
        decode_plan(b'{"type": "launch", "run": "r"}')
    assert decode_plan(b'{"type": "abort", "run": "run-1"}') == LoadAbort(run="run-1")


def test_the_largest_legal_result_passes_the_chart_broker() -> None:
    """The chart's broker disconnects a sender whose packet is over its maxPacketSize
    (`MAX_REPORT_PACKET_BYTES`, tests/test_chart_broker.py): a result the model accepts, on
    the longest topic, must fit in one packet with its MQTT 5 headers."""
    longest = topic("v" * 253, "n" * 253, TopicKind.LOAD_RESULT)
    # fixed header (at most 5), topic (2 + its length), packet id (2), properties (~70)
    packet = 5 + 2 + len(longest.encode()) + 2 + 128 + MAX_RESULT_BYTES
    assert packet <= MAX_REPORT_PACKET_BYTES
    with pytest.raises(ValueError, match=f"over {MAX_RESULT_BYTES}"):
        decode_result(b" " * (MAX_RESULT_BYTES + 1))


def test_plans_and_results_live_under_the_node_s_own_topic_level() -> None:
    for kind in (TopicKind.LOAD_PLAN, TopicKind.LOAD_RESULT):
        name = topic("pool", "node-0-00", kind)
        assert name == f"netval/v1/pool/node-0-00/{kind.value}"
        parsed = parse_topic(name)
        assert parsed is not None and (parsed.node, parsed.kind) == ("node-0-00", kind)
    # the per-node ACL (the chart's, user name <validation>/<node>): everything a node may
    # publish is under its own level of its own validation; it reads its own plan and
    # publishes its own results
    from chart_kit import one

    acl = one("default", "ConfigMap", "netval-mqtt")["data"]["acl"]
    patterns = [line.split() for line in acl.splitlines() if line.startswith("pattern ")]
    sends = [t for _, access, t in patterns if "write" in access]
    reads = [t for _, access, t in patterns if "read" in access]
    assert all(t.startswith("netval/v1/%u/") for t in sends + reads)
    assert "netval/v1/%u/loadresult" in sends and "netval/v1/%u/loadplan" in reads
    assert "netval/v1/%u/beat" in sends and not any(t.endswith("/beat") for t in reads)
    assert not any("loadplan" in t for t in sends) and not any("loadresult" in t for t in reads)
