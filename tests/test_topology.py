"""Topology pieces without namespaces: LLDP frame and lldpcli parsing (fuzzed: both read
whatever a switch or a daemon sends), the listener's table, levels and agreement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netval.agent.topology.discovery import none_reason, topology_section
from netval.agent.topology.listener import PACKET_OUTGOING, LldpListener
from netval.agent.topology.lldp_frames import parse_lldpdu, tlv, tlvs
from netval.agent.topology.lldpd import parse_lldpcli
from netval.model.ids import Status
from netval.model.results import Report
from netval.model.spec import NetworkValidationSpec, TopologySpec
from netval.model.topology import (
    MAX_TEXT,
    InterfaceTopology,
    LldpNeighbour,
    NeighbourSource,
    TopologyReport,
    auto_level_keys,
)
from netval.operator.topology.agreement import (
    detect_levels,
    judge_agreement,
    levels_in_use,
    netdev_views,
)
from state_kit import node_health


def frame(
    system: bytes = b"leaf-1", port: bytes = b"Ethernet12", ttl: int = 120, descr: bytes = b""
) -> bytes:
    parts = [
        tlv(1, bytes([4]) + bytes.fromhex("02aabbccddee")),
        tlv(2, bytes([5]) + port),
        tlv(3, ttl.to_bytes(2, "big")),
        tlv(5, system),
    ]
    if descr:
        parts.append(tlv(4, descr))
    return b"".join(parts) + tlv(0, b"")


def test_a_switch_frame_gives_chassis_port_name_and_ttl() -> None:
    n = parse_lldpdu(frame(descr=b"to gpu-001 eth0"))
    assert n == LldpNeighbour(
        chassis_id="02:aa:bb:cc:dd:ee",
        port_id="Ethernet12",
        system_name="leaf-1",
        port_description="to gpu-001 eth0",
        ttl_seconds=120,
        source=NeighbourSource.FRAMES,
    )
    assert n.switch == "leaf-1"


def test_a_frame_without_the_mandatory_tlvs_in_order_is_no_neighbour() -> None:
    assert parse_lldpdu(tlv(2, b"\x05p") + tlv(1, b"\x07c") + tlv(3, b"\x00\x10")) is None
    assert parse_lldpdu(b"") is None
    assert parse_lldpdu(frame()[:-9]) is not None  # cut after the TTL: still valid


def test_control_characters_from_a_switch_are_replaced_and_text_is_bounded() -> None:
    n = parse_lldpdu(frame(system=b"leaf\x1b[31m\n" + b"x" * 400))
    assert n is not None and n.system_name is not None
    assert "\x1b" not in n.system_name and "\n" not in n.system_name
    assert len(n.system_name) == MAX_TEXT


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_parse_to_a_neighbour_or_none_never_an_error(payload: bytes) -> None:
    n = parse_lldpdu(payload)
    if n is not None:
        assert all(ch.isprintable() for ch in n.chassis_id + n.port_id)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 127), st.binary(max_size=40)), max_size=8))
def test_tlvs_read_back_what_was_written(items: list[tuple[int, bytes]]) -> None:
    assert tlvs(b"".join(tlv(k, v) for k, v in items)) == items


def test_the_listener_keeps_watched_netdevs_expires_by_ttl_and_ignores_its_own_frames() -> None:
    now = [100.0]
    listener = LldpListener(clock=lambda: now[0])
    listener.watch(["f0"])
    listener.on_frame("f1", frame())  # not watched
    listener.on_frame("f0", frame(system=b"self"), pkttype=PACKET_OUTGOING)
    listener.on_frame("f0", frame(ttl=4))
    assert [n.switch for n in listener.neighbours("f0")] == ["leaf-1"]
    assert listener.neighbours("f1") == []
    now[0] += 5
    assert listener.neighbours("f0") == []
    listener.on_frame("f0", frame(ttl=4))
    listener.on_frame("f0", frame(ttl=0))  # shutdown LLDPDU
    assert listener.neighbours("f0") == []
    for i in range(10):  # a hub leaking many neighbours stays bounded
        listener.on_frame("f0", frame(port=f"p{i}".encode(), ttl=100 + i))
    assert len(listener.neighbours("f0")) == 4


LLDPCLI = Path(__file__).parent / "data" / "lldpcli-neighbors.json"


def test_lldpcli_json_of_one_and_of_several_interfaces() -> None:
    one = parse_lldpcli(LLDPCLI.read_text())
    assert list(one) == ["f0"]
    (n,) = one["f0"]
    assert (n.system_name, n.port_id, n.port_description, n.ttl_seconds, n.source) == (
        "leaf-1",
        "82:c2:a2:f2:1a:ab",
        "swp1",
        4,
        NeighbourSource.LLDPD,
    )
    doc = json.loads(LLDPCLI.read_text())
    body = doc["lldp"]["interface"]["f0"]
    doc["lldp"]["interface"] = [{"f0": body}, {"f1": body}]
    assert sorted(parse_lldpcli(json.dumps(doc))) == ["f0", "f1"]


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=30,
    )
)
def test_any_lldpcli_output_parses_without_error(doc: object) -> None:
    parse_lldpcli(json.dumps({"lldp": {"interface": doc}}))
    parse_lldpcli(json.dumps(doc))


def test_none_seen_names_the_firmware_knob_of_the_driver() -> None:
    ice = none_reason("ens1f0", listened=120.0, lldpd=None, driver="ice")
    assert "no LLDP frame in 120s" in ice
    assert "ethtool --set-priv-flags ens1f0 fw-lldp-agent off" in ice
    early = none_reason("f0", listened=3.0, lldpd=None, driver=None)
    assert "yet after 3s" in early
    assert "no LLDP frames are read" in none_reason("f0", listened=None, lldpd="x", driver=None)


def test_the_section_prefers_frames_then_lldpd_and_survives_a_report_round_trip() -> None:
    frames_n = parse_lldpdu(frame())
    assert frames_n is not None
    lldpd_n = frames_n.model_copy(update={"system_name": "leaf-9", "source": NeighbourSource.LLDPD})
    section = topology_section(
        ["f0", "f1", "f2"],
        {"f0": [frames_n]},
        {"f0": [lldpd_n], "f1": [lldpd_n]},
        listened=60.0,
        lldpd_error=None,
        drivers={},
    )
    assert [i.switch for i in section.interfaces] == ["leaf-1", "leaf-9", None]
    assert section.interfaces[2].none_reason is not None
    report = Report(
        validation="v",
        generation=1,
        node="n",
        started_at="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
        duration_ms=1.0,
        status=Status.PASS,
        results=[],
        topology=section,
    )
    assert Report.model_validate_json(report.to_json()) == report
    bare = report.model_copy(update={"topology": None})
    assert "topology" not in bare.to_dict()


def test_a_report_sanitises_switch_text_at_the_operator() -> None:
    hostile = {
        "interfaces": [
            {
                "interface": "f0",
                "neighbours": [
                    {"chassisId": "c", "portId": "p\u0007", "systemName": "<b>\x1b]0;x\x07"}
                ],
            }
        ]
    }
    parsed = TopologyReport.model_validate(hostile)
    n = parsed.interfaces[0].neighbours[0]
    assert n.port_id == "p?" and n.system_name is not None and "\x1b" not in n.system_name


def test_levels_are_declared_or_detected_from_the_first_scheme_present() -> None:
    topograph = {"fabric.topograph.run/tier-1": "l1", "fabric.topograph.run/tier-2": "s1"}
    aws = {"topology.k8s.aws/network-node-layer-3": "nn3"}
    assert detect_levels([aws, topograph]) == (
        "fabric.topograph.run/tier-2",
        "fabric.topograph.run/tier-1",
    )
    assert detect_levels([aws]) == ("topology.k8s.aws/network-node-layer-3",)
    assert detect_levels([{"kubernetes.io/hostname": "x"}]) == ()
    assert levels_in_use(TopologySpec(levels=["a/b"]), [topograph]) == ("a/b",)


def test_referenced_label_keys_include_the_topology_levels() -> None:
    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": {"gpu": "true"}, "topology": {"levels": ["x/rack", "x/leaf"]}}
    )
    assert spec.referenced_label_keys() == {
        "gpu",
        "topology.kubernetes.io/zone",
        "x/rack",
        "x/leaf",
    }
    auto = NetworkValidationSpec().referenced_label_keys()
    assert set(auto_level_keys()) <= auto


def section(*switches: str | None) -> tuple[tuple[str, str | None, str, str | None], ...]:
    return netdev_views(
        TopologyReport(
            interfaces=[
                InterfaceTopology(
                    interface=f"r{i}",
                    neighbours=[LldpNeighbour(chassis_id=s, port_id="p", system_name=s)]
                    if s
                    else [],
                    none_reason=None if s else "no LLDP frame",
                )
                for i, s in enumerate(switches)
            ]
        )
    )


def test_agreement_is_per_rail_and_a_two_two_tie_names_every_node() -> None:
    labels = {n: {"k": "blk"} for n in ("a", "b", "c", "d")}
    seen = {
        "a": section("r0-1", "r1-1"),
        "b": section("r0-1", "r1-1"),
        "c": section("r0-1", "r1-2"),
        "d": section("r0-1", "r1-2"),
    }
    result = judge_agreement(labels, seen, "k")
    assert all(r[0].status is Status.PASS for r in result.results.values())
    assert {n for n, rs in result.results.items() if rs[1].status is Status.WARN} == set("abcd")
    (conflict,) = result.conflicts
    assert conflict.interface == "r1" and dict(conflict.switches) == {"r1-1": 2, "r1-2": 2}


def test_agreement_skips_unlabelled_nodes_and_unseen_netdevs() -> None:
    result = judge_agreement({"a": {}}, {"a": section("s", None)}, "k")
    assert [r.status for r in result.results["a"]] == [Status.SKIP, Status.SKIP]
    assert "no label k" in result.results["a"][0].message
    result = judge_agreement({"a": {"k": "d"}}, {"a": section(None)}, "k")
    assert "no neighbour seen: no LLDP frame" in result.results["a"][0].message
    assert judge_agreement({}, {"a": section("s")}, None).results["a"][0].status is Status.SKIP


def topology_status_patch() -> dict[str, Any]:
    """A status with status.topology, checked on the way (shared with the CLI test)."""
    from datetime import UTC, datetime

    from netval.operator.state.validation import (
        ValidationState,
        ingest_report,
        set_agents_ready,
        set_targeted,
    )
    from netval.operator.status.compute import validation_status

    now = datetime(2026, 1, 1, tzinfo=UTC)
    spec = NetworkValidationSpec.model_validate({"topology": {"lldp": True, "levels": ["x/leaf"]}})
    state = ValidationState(name="v", generation=1)
    set_targeted(state, ["a", "b", "c", "d"], now)
    set_agents_ready(state, True, now)
    views = {"a": "leaf-1", "b": "leaf-1", "c": "leaf-2", "d": None}
    for node, switch in views.items():
        neighbours = [LldpNeighbour(chassis_id="c", port_id="p", system_name=switch)]
        section_ = TopologyReport(
            interfaces=[
                InterfaceTopology(
                    interface="f0",
                    neighbours=neighbours if switch else [],
                    none_reason=None if switch else "no LLDP frame in 60s of listening",
                )
            ]
        )
        report = Report(
            validation="v", generation=1, node=node, started_at=now, duration_ms=1.0,
            status=Status.PASS, results=[], topology=section_,
        )  # fmt: skip
        ingest_report(state, report, now)
    labels = {n: {"x/leaf": "blk-1"} for n in views}
    status = validation_status(state, spec, node_labels=labels, previous=None, now=now)
    topo = status.topology
    assert topo is not None and topo.levels_source == "declared"
    assert [(lv.key, lv.domains, lv.max_nodes) for lv in topo.levels] == [("x/leaf", 1, 4)]
    assert (topo.discovered, topo.undiscovered.count, topo.undiscovered.nodes) == (3, 1, ["d"])
    assert topo.undiscovered.example == "no LLDP frame in 60s of listening"
    assert [(d.node, d.declared, d.seen, d.expected) for d in topo.listed_disagreements] == [
        ("c", "blk-1", "leaf-2", "leaf-1")
    ]
    assert topo.listed_conflicts[0].switches == {"leaf-1": 2, "leaf-2": 1}
    counts = status.checks["topology.agreement"]
    assert (counts.pass_, counts.warn, counts.fail) == (2, 1, 0)
    patch = status.to_patch()
    assert len(json.dumps(patch["topology"])) < 2048
    # a validation without spec.topology writes no section (null deletes an old one)
    plain = validation_status(
        state, NetworkValidationSpec(), node_labels=labels, previous=None, now=now
    )
    assert plain.topology is None and "topology.agreement" not in plain.checks
    return patch


def test_status_carries_the_topology_aggregate_and_counts_agreement_per_node() -> None:
    topology_status_patch()


def test_netval_status_topology_shows_levels_undiscovered_and_disagreements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from netval.cli.main import main

    patch = topology_status_patch()
    patch["topology"]["listedDisagreements"][0]["seen"] = "leaf-2\x1b[2J"  # type: ignore[index]
    obj = {
        "apiVersion": "netval.io/v1alpha1",
        "kind": "NetworkValidation",
        "metadata": {"name": "pool", "generation": 1},
        "spec": {"topology": {"lldp": True, "levels": ["x/leaf"]}},
        "status": patch,
    }
    path = tmp_path / "nv.json"
    path.write_text(json.dumps(obj))
    main(["status", "--from", str(path), "--topology"])
    out = capsys.readouterr().out
    assert "topology of pool" in out
    assert "x/leaf: 1 domains, 4-4 nodes each" in out
    assert "blk-1 (4)" in out
    assert "undiscovered: 1 nodes (d)" in out
    assert "e.g. no LLDP frame in 60s of listening" in out
    assert "c f0: declared blk-1, sees leaf-2?[2J; the domain's nodes see leaf-1" in out
    assert "blk-1 f0: leaf-1 (2), leaf-2 (1)" in out
    assert "\x1b" not in out


def test_the_peer_domain_key_defaults_to_the_lowest_level_in_use() -> None:
    from netval.operator.topology.agreement import peer_topology_key

    topograph = [{"fabric.topograph.run/tier-2": "s", "fabric.topograph.run/tier-1": "l"}]
    spec = NetworkValidationSpec()
    assert spec.checks.peers.topology_key is None
    assert peer_topology_key(spec, topograph) == "fabric.topograph.run/tier-1"
    assert peer_topology_key(spec, [{}]) == "topology.kubernetes.io/zone"
    declared = NetworkValidationSpec.model_validate({"topology": {"levels": ["x/rack"]}})
    assert peer_topology_key(declared, topograph) == "x/rack"
    explicit = NetworkValidationSpec.model_validate(
        {"checks": {"peers": {"topologyKey": "netval.io/rack"}}}
    )
    assert peer_topology_key(explicit, topograph) == "netval.io/rack"


def test_the_html_report_has_a_topology_section_and_escapes_switch_names(
    tmp_path: Path,
) -> None:
    from netval.cli.report_html import render_html
    from test_report_html import CHROMIUM, browse, console_problems

    patch = topology_status_patch()
    patch["topology"]["listedDisagreements"][0]["seen"] = "<script>x()</script>"  # type: ignore[index]
    obj = {
        "apiVersion": "netval.io/v1alpha1",
        "kind": "NetworkValidation",
        "metadata": {"name": "pool", "generation": 1},
        "status": patch,
    }
    page = render_html(obj)
    section = page[page.index('<section id="topology">') :]
    assert "<code>x/leaf</code>: 1 domains, 4-4 nodes each" in section
    assert "blk-1 <small>(4 nodes)</small>" in section
    assert "1 nodes saw no LLDP neighbour on some fabric netdev (d)" in section
    assert "&lt;script&gt;x()&lt;/script&gt;" in section and "<script>" not in section
    assert "blk-1 f0: leaf-1 (2), leaf-2 (1)" in section
    without = {**obj, "status": {k: v for k, v in patch.items() if k != "topology"}}
    assert 'id="topology"' not in render_html(without)
    if CHROMIUM is not None:
        dom, log = browse(tmp_path, page)
        assert console_problems(log) == [], log[-2000:]
        assert 'id="topology"' in dom


KUEUE_DATA = Path(__file__).parent / "data" / "kueue"
# The CEL rules of Topology spec.levels (Kueue v0.19.2) and their Python equivalents over
# (new levels, old levels or None); an unknown rule fails the test.
TOPOLOGY_RULES = {
    "self == oldSelf": lambda new, old: old is None or new == old,
    "size(self.filter(i, size(self.filter(j, j == i)) > 1)) == 0": lambda new, old: (
        len({json.dumps(i, sort_keys=True) for i in new}) == len(new)
    ),
    "size(self.filter(i, i.nodeLabel == 'kubernetes.io/hostname')) == 0 || "
    "self[size(self) - 1].nodeLabel == 'kubernetes.io/hostname'": lambda new, old: (
        all(i["nodeLabel"] != "kubernetes.io/hostname" for i in new)
        or new[-1]["nodeLabel"] == "kubernetes.io/hostname"
    ),
}


def kueue_valid(obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
    from jsonschema import Draft4Validator

    version = obj["apiVersion"].split("/")[1]
    schema = json.loads((KUEUE_DATA / f"topology-spec.{version}.schema.json").read_text())
    Draft4Validator(schema).validate(obj["spec"])
    levels = schema["properties"]["levels"]
    for rule in levels["x-kubernetes-validations"]:
        text = " ".join(rule["rule"].split())
        assert text in TOPOLOGY_RULES, f"unknown Kueue CEL rule: {text}"
        old_levels = old["spec"]["levels"] if old is not None else None
        assert TOPOLOGY_RULES[text](obj["spec"]["levels"], old_levels), rule["message"]


def test_the_kueue_topology_is_valid_in_both_versions_with_hostname_last() -> None:
    from netval.operator.topology.kueue_topology import (
        TopologyAction,
        topology_action,
        topology_object,
        topology_version,
    )

    levels = ["fabric.topograph.run/tier-2", "fabric.topograph.run/tier-1"]
    assert topology_version(["v1beta1", "v1beta2", "v1alpha1"]) == "v1beta2"
    assert topology_version(["v1beta1"]) == "v1beta1"
    assert topology_version(["v1alpha1"]) is None
    for version in ("v1beta1", "v1beta2"):
        obj = topology_object("netval-pool", "pool", levels, version)
        kueue_valid(obj)
        assert [lv["nodeLabel"] for lv in obj["spec"]["levels"]] == [
            *levels,
            "kubernetes.io/hostname",
        ]
        # unchanged levels: left alone; changed: replaced (the API refuses an update)
        assert topology_action(obj, obj) is TopologyAction.NONE
        changed = topology_object("netval-pool", "pool", ["x/leaf"], version)
        assert topology_action(obj, changed) is TopologyAction.REPLACE
        with pytest.raises(AssertionError, match="immutable"):
            kueue_valid(changed, old=obj)
        kueue_valid(changed)  # as a new object it is valid
        assert topology_action(None, changed) is TopologyAction.CREATE
    # hostname declared in the middle moves last; too many levels keep the lowest ones
    odd = topology_object("t", "pool", ["kubernetes.io/hostname", "a/b"], "v1beta1")
    kueue_valid(odd)
    many = topology_object("t", "pool", [f"x/l{i}" for i in range(12)], "v1beta1")
    kueue_valid(many)
    assert many["spec"]["levels"][-2]["nodeLabel"] == "x/l11"


def test_agreement_folds_into_the_node_status_and_fail_lists_a_failure() -> None:
    from datetime import UTC, datetime, timedelta

    from netval.operator.state.validation import (
        ValidationState,
        ingest_report,
        set_agents_ready,
        set_targeted,
    )
    from netval.operator.status.compute import validation_status

    now = datetime(2026, 1, 1, tzinfo=UTC)
    spec = NetworkValidationSpec.model_validate(
        {"topology": {"lldp": True, "levels": ["x/leaf"], "agreement": "fail"}}
    )
    state = ValidationState(name="v", generation=1)
    set_targeted(state, ["a", "b", "c"], now)
    set_agents_ready(state, True, now)

    def send(node: str, switch: str, at: datetime) -> None:
        section_ = TopologyReport(
            interfaces=[
                InterfaceTopology(
                    interface="f0",
                    neighbours=[LldpNeighbour(chassis_id="c", port_id="p", system_name=switch)],
                )
            ]
        )
        report = Report(
            validation="v", generation=1, node=node, started_at=at, duration_ms=1.0,
            status=Status.PASS, results=[], topology=section_,
        )  # fmt: skip
        ingest_report(state, report, at)

    for node, switch in {"a": "leaf-1", "b": "leaf-1", "c": "leaf-2"}.items():
        send(node, switch, now)
    labels = {n: {"x/leaf": "blk-1"} for n in "abc"}
    status = validation_status(state, spec, node_labels=labels, previous=None, now=now)
    assert (status.nodes.passing, status.nodes.failing) == (2, 1)
    assert [(f.node, f.check, f.subject) for f in status.failures] == [
        ("c", "topology.agreement", "f0")
    ]
    assert node_health(state, "c", now) == "unhealthy"
    # c's next report keeps the verdict until it is judged again: no flicker in between
    later = now + timedelta(seconds=10)
    send("c", "leaf-2", later)
    assert node_health(state, "c", later) == "unhealthy"
    # recabled to leaf-1: judged again, the failure goes
    later += timedelta(seconds=1)
    send("c", "leaf-1", later)
    status = validation_status(state, spec, node_labels=labels, previous=None, now=later)
    assert status.failures == [] and node_health(state, "c", later) == "healthy"
    # spec.topology switched off: every verdict is cleared
    send("c", "leaf-2", later + timedelta(seconds=1))
    validation_status(
        state, spec, node_labels=labels, previous=None, now=later + timedelta(seconds=1)
    )
    assert node_health(state, "c", later + timedelta(seconds=1)) == "unhealthy"
    off = validation_status(
        state, NetworkValidationSpec(), node_labels=labels, previous=None,
        now=later + timedelta(seconds=1),
    )  # fmt: skip
    assert off.failures == [] and "topology.agreement" not in off.checks
    assert node_health(state, "c", later + timedelta(seconds=1)) == "healthy"
