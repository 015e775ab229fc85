"""Property-based fuzzing of what crosses the MQTT trust boundary: `decode_message` with any
topic and bytes, and the whole ingest path (decode, fold, status with the east-west matrix)
with hostile but schema-valid reports: huge integers, far dates, NaN/Infinity, deep nesting
in `observed`, long strings, unicode. Whatever comes in: nothing raises out, each rejected
message is one drop with a known reason (never `internal_error`: that would be a bug the
guard hid), other nodes' records are untouched and the status patch is valid JSON
(`json.dumps(allow_nan=False)`), which is what the Kubernetes API server parses.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netval.infra.mqtt_settings import MqttSettings
from netval.model.ids import CheckId, Status
from netval.model.results import Report
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import DropReason
from netval.operator.ingest.decode import (
    INGEST_DROP_REASONS,
    Dropped,
    StateChange,
    decode_message,
)
from netval.operator.ingest.subscriber import ReportIngest
from netval.operator.state.store import Store
from netval.operator.status.compute import validation_status

POOL = "pool-a"
ZONE = "topology.kubernetes.io/zone"
GPU = {"nvidia.com/gpu.present": "true"}
NODES = {"gpu-a": "rack-1", "gpu-b": "rack-1", "gpu-c": "rack-2", "gpu-d": "rack-2"}
NOW = datetime.now(UTC)

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# The whole path (decode, fold, status with the matrix) per example: fewer, to keep CI fast.
WHOLE_PATH = settings(FUZZ, max_examples=60)

# -- strategies -------------------------------------------------------------------------

hostile_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, 1.7976931348623157e308, 5e-324, -1e308, 0.0, -0.0]),
)
hostile_ints = st.one_of(
    st.integers(),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), 10**400, -(10**400)]),
)
hostile_text = st.one_of(
    st.text(max_size=50),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=200, max_size=3000),
    st.sampled_from(["", "\u202e\u0000", "\ud7ff" * 10, "💥" * 300, "a" * 254]),
)
json_values = st.recursive(
    st.none() | st.booleans() | hostile_ints | hostile_floats | hostile_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=30,
)
deep = st.integers(min_value=1, max_value=60).map(lambda n: json.loads("[" * n + "1" + "]" * n))
dates = st.one_of(
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat()),  # naive
    st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(hours=1)).map(
        lambda d: (NOW + d).isoformat()
    ),
    st.sampled_from(["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2024-02-30T00:00:00Z"]),
)
peer_observed = st.fixed_dictionaries(
    {},
    optional={
        "p50Ms": hostile_floats | hostile_ints,
        "p99Ms": hostile_floats | hostile_ints,
        "lossPercent": hostile_floats,
        "pathMTU": hostile_ints | hostile_floats,
        "mbps": hostile_floats | hostile_ints,
        "domain": hostile_text,
    },
)
observed = st.one_of(
    st.dictionaries(hostile_text, json_values, max_size=5),
    peer_observed,
    deep.map(lambda d: {"deep": d}),
)


@st.composite
def results(draw: st.DrawFn) -> dict[str, Any]:
    check = draw(st.sampled_from(list(CheckId)))
    subject = draw(st.sampled_from(list(NODES)) | hostile_text)
    return {
        "check": check.value,
        "subject": subject,
        "status": draw(st.sampled_from(list(Status))).value,
        "message": draw(hostile_text),
        "observed": draw(observed),
        "expected": draw(st.dictionaries(hostile_text, json_values, max_size=2)),
    }


@st.composite
def hostile_reports(draw: st.DrawFn) -> dict[str, Any]:
    """gpu-c's report: the right shape (mostly), hostile values."""
    body: dict[str, Any] = {
        "schema": "netval.io/report/v1",
        "validation": POOL,
        "generation": draw(hostile_ints | st.just(1)),
        "node": "gpu-c",
        "startedAt": draw(dates),
        "durationMs": draw(hostile_floats | hostile_ints),
        "status": draw(st.sampled_from(list(Status))).value,
        "results": draw(st.lists(results(), max_size=6)),
    }
    if draw(st.booleans()):
        body["traceparent"] = draw(hostile_text)
    return body


def encode(body: dict[str, Any]) -> bytes:
    # allow_nan: Python writes NaN/Infinity tokens, the JSON parser reads them back
    return json.dumps(body, allow_nan=True).encode()


# -- the world the reports land in ------------------------------------------------------


def good_report(node: str, status: Status = Status.PASS) -> Report:
    peer = [
        {
            "check": CheckId.PEER_LATENCY.value,
            "subject": other,
            "status": "pass",
            "message": "ok",
            "observed": {"p50Ms": 0.05, "p99Ms": 0.1, "domain": NODES[other]},
        }
        for other in NODES
        if other != node
    ]
    return Report.model_validate(
        {
            "validation": POOL,
            "generation": 1,
            "node": node,
            "startedAt": NOW.isoformat(),
            "durationMs": 3.0,
            "status": status.value,
            "results": [
                {
                    "check": "mtu.interface",
                    "subject": "ens1",
                    "status": status.value,
                    "message": "m",
                    "observed": {"mtu": 9000},
                },
                *peer,
            ],
        }
    )


def world() -> tuple[Store, ReportIngest]:
    store = Store(label_keys={**GPU, ZONE: ""})
    for node, zone in NODES.items():
        store.on_node(node, {**GPU, ZONE: zone})
    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": GPU, "interval": "60s", "checks": {"peers": {"enabled": True}}}
    )
    store.upsert_validation(POOL, generation=1, spec=spec, body={}, status=None)
    store.ingest_report(good_report("gpu-a"), False)
    store.ingest_report(good_report("gpu-b", Status.FAIL), False)
    mqtt = MqttSettings(host="127.0.0.1", port=1, tls=False, username=None, password=None,
                        ca_file=None, client_id="fuzz")  # fmt: skip
    ingest = ReportIngest(
        mqtt, on_report=store.ingest_report, on_state=store.on_state, on_beat=store.ingest_beat
    )
    return store, ingest


def assert_patch_is_json(store: Store) -> None:
    status = validation_status(
        store.states[POOL],
        store.specs[POOL],
        node_labels=store.node_labels,
        previous=store.previous.get(POOL),
        now=datetime.now(UTC),
    )
    json.dumps(status.to_patch(), allow_nan=False)
    store.previous[POOL] = status


def counted(ingest: ReportIngest) -> int:
    stats = ingest.stats
    return stats.reports + stats.states + sum(stats.beats.values()) + sum(stats.dropped.values())


# -- properties -------------------------------------------------------------------------


@FUZZ
@given(topic=st.text(max_size=300), payload=st.binary(max_size=4096))
def test_decode_never_raises_on_garbage(topic: str, payload: bytes) -> None:
    decoded = decode_message(topic, payload)
    if isinstance(decoded, Dropped):
        assert decoded.reason in INGEST_DROP_REASONS and decoded.detail


@FUZZ
@given(
    node=st.sampled_from(list(NODES)) | st.text(min_size=1, max_size=20),
    kind=st.sampled_from(["report", "state", "beat", "endpoint", "assignment", "x"]),
    payload=st.binary(max_size=2048),
)
def test_garbage_on_netval_topics_is_counted_and_harmless(
    node: str, kind: str, payload: bytes
) -> None:
    store, ingest = world()
    before = {n: store.states[POOL].nodes[n] for n in ("gpu-a", "gpu-b")}
    ingest.handle(f"netval/v1/{POOL}/{node}/{kind}", payload)
    assert ingest.stats.dropped[DropReason.INTERNAL_ERROR] == 0
    if kind in ("report", "state", "beat") and "/" not in node:
        assert counted(ingest) == 1 or (kind in ("report", "beat") and not payload)
    if node not in before:
        assert {n: store.states[POOL].nodes[n] for n in before} == before
    assert_patch_is_json(store)


@WHOLE_PATH
@given(bodies=st.lists(hostile_reports(), min_size=1, max_size=4), retained=st.booleans())
def test_hostile_reports_never_escape_and_never_touch_other_nodes(
    bodies: list[dict[str, Any]], retained: bool
) -> None:
    store, ingest = world()
    state = store.states[POOL]
    before = {n: state.nodes[n] for n in ("gpu-a", "gpu-b")}
    for body in bodies:
        ingest.handle(f"netval/v1/{POOL}/gpu-c/report", encode(body), retained=retained)
    assert counted(ingest) == len(bodies)  # each one accepted or dropped, nothing lost
    assert ingest.stats.dropped[DropReason.INTERNAL_ERROR] == 0, ingest.stats.dropped
    assert set(ingest.stats.dropped) <= set(INGEST_DROP_REASONS)
    assert {n: state.nodes[n] for n in before} == before
    assert set(state.nodes) <= set(NODES)
    if "gpu-c" in state.nodes:
        assert state.nodes["gpu-c"].reported_at <= datetime.now(UTC)
    assert_patch_is_json(store)


@FUZZ
@given(payload=st.binary(max_size=64))
def test_state_payloads(payload: bytes) -> None:
    decoded = decode_message(f"netval/v1/{POOL}/gpu-c/state", payload)
    assert isinstance(decoded, StateChange | Dropped)


# Values inside every bound, at their extremes: these are accepted, so they reach the
# aggregation (medians, ratios of the east-west matrix) and the status patch.
extreme_floats = st.one_of(
    st.sampled_from([1.7976931348623157e308, 1e308, 5e-324, 1e-300, -1.7976931348623157e308]),
    st.floats(allow_nan=False, allow_infinity=False),
)
extreme_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
extreme_json = st.recursive(
    st.none() | st.booleans() | extreme_ints | extreme_floats | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=15,
)


@st.composite
def extreme_results(draw: st.DrawFn, node: str) -> dict[str, Any]:
    peer = [CheckId.PEER_LATENCY, CheckId.PEER_LOSS, CheckId.PEER_PATH_MTU, CheckId.PEER_THROUGHPUT]
    check = draw(st.sampled_from(peer) | st.sampled_from(list(CheckId)))
    number = extreme_floats | extreme_ints
    obs = draw(
        st.fixed_dictionaries(
            {},
            optional={"p50Ms": number, "p99Ms": number, "lossPercent": number,
                      "pathMTU": number, "mbps": number, "domain": st.sampled_from(["rack-1", "rack-9", ""]),
                      "x": extreme_json},
        )
    )  # fmt: skip
    return {
        "check": check.value,
        "subject": draw(st.sampled_from([n for n in NODES if n != node])),
        "status": draw(st.just(Status.PASS) | st.sampled_from(list(Status))).value,
        "message": draw(st.text(max_size=1024)),
        "observed": obs,
        "expected": {},
    }


@st.composite
def extreme_reports(draw: st.DrawFn, node: str) -> dict[str, Any]:
    offset = draw(st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(minutes=5)))
    return {
        "validation": POOL,
        "generation": draw(st.integers(min_value=0, max_value=2**63 - 1)),
        "node": node,
        "startedAt": (datetime.now(UTC) + offset).isoformat(),
        "durationMs": draw(st.floats(min_value=0, max_value=86_400_000.0)),
        "status": draw(st.sampled_from(list(Status))).value,
        "results": draw(st.lists(extreme_results(node), min_size=1, max_size=8)),
    }


@WHOLE_PATH
@given(
    c=extreme_reports("gpu-c"),
    d=extreme_reports("gpu-d"),
    a=extreme_reports("gpu-a"),
    retained=st.booleans(),
)
def test_extreme_but_valid_reports_fold_into_a_json_status(
    c: dict[str, Any], d: dict[str, Any], a: dict[str, Any], retained: bool
) -> None:
    store, ingest = world()
    state = store.states[POOL]
    before = state.nodes["gpu-b"]
    for body in (c, d, a):
        node = body["node"]
        ingest.handle(f"netval/v1/{POOL}/{node}/report", encode(body), retained=retained)
    assert ingest.stats.reports + ingest.stats.dropped.total() == 3
    assert set(ingest.stats.dropped) <= {DropReason.INVALID_REPORT}  # startedAt moved on
    assert state.nodes["gpu-b"] == before
    assert_patch_is_json(store)


def peer_report(node: str, results: list[tuple[CheckId, str, dict[str, Any]]]) -> bytes:
    body = {
        "validation": POOL,
        "generation": 1,
        "node": node,
        "startedAt": datetime.now(UTC).isoformat(),
        "durationMs": 1.0,
        "status": "pass",
        "results": [
            {"check": c.value, "subject": s, "status": "pass", "message": "", "observed": o}
            for c, s, o in results
        ],
    }
    return encode(body)


def test_medians_and_ratios_of_the_largest_finite_numbers_stay_finite() -> None:
    """Found by the property above when biased: the mean of two finite maxima is inf, and so
    is a huge throughput over a tiny one; the status must stay valid JSON."""
    store, ingest = world()
    big, tiny = 1.7976931348623157e308, 5e-324
    reports = {
        "gpu-c": [(CheckId.PEER_THROUGHPUT, "gpu-d", {"mbps": big}),
                  (CheckId.PEER_LATENCY, "gpu-d", {"p50Ms": big, "p99Ms": big}),
                  (CheckId.PEER_THROUGHPUT, "gpu-a", {"mbps": big})],
        "gpu-d": [(CheckId.PEER_THROUGHPUT, "gpu-c", {"mbps": big}),
                  (CheckId.PEER_LATENCY, "gpu-c", {"p50Ms": big, "p99Ms": big}),
                  (CheckId.PEER_THROUGHPUT, "gpu-b", {"mbps": big})],
        "gpu-a": [(CheckId.PEER_THROUGHPUT, "gpu-b", {"mbps": tiny})],
    }  # fmt: skip
    for node, results in reports.items():
        ingest.handle(f"netval/v1/{POOL}/{node}/report", peer_report(node, results))
    assert ingest.stats.reports == 3, ingest.stats.dropped
    assert_patch_is_json(store)
