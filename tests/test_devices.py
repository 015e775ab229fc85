"""DRA device taints, pure parts: which device of a real dranet ResourceSlice a NIC is
(never a GPU of the same pool, never another NIC), SR-IOV VFs by their PF, the rules netval
writes against the upstream DeviceTaintRule schema, the driver mapping setting, the Node
condition's list, and ResourceSlices from the API fuzzed (semi-trusted input)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_kit import dranet_slice, fixture_slices, rail_slice, validate_rule, validate_slice
from netval.agent.collect.snapshot_dir import load_snapshot
from netval.agent.nics import node_nics
from netval.model.nics import Nic
from netval.operator.devices.drivers import DEFAULT_DRIVERS, DRANET, SRIOV, parse_drivers
from netval.operator.devices.rules import (
    RuleTarget,
    ours,
    plan_rules,
    rule_name,
    rule_object,
    wanted_rules,
)
from netval.operator.devices.slices import DeviceRef, SliceIndex, parse_slice
from netval.operator.gating.node_condition import (
    TYPE,
    carried_condition,
    plan_conditions,
    with_condition,
)

SNAPSHOTS = Path(__file__).resolve().parents[1] / "examples" / "snapshots"
AWS_NODE = "ip-192-168-153-160.ec2.internal"
OWNER = {"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
         "metadata": {"name": "pool-a", "uid": "u-1"}}  # fmt: skip


def index(*drivers: object) -> SliceIndex:
    chosen = drivers or DEFAULT_DRIVERS
    return SliceIndex({d.driver: d for d in chosen})  # type: ignore[attr-defined]


def test_dranet_slices_of_the_upstream_examples_are_valid_resourceslices() -> None:
    for name in ("dranet-aws-efa.yaml", "gpu-aws-efa.yaml"):
        for obj in fixture_slices(name):
            validate_slice(obj)
    # the gb300 example was written by hand upstream: its pool lacks the generation the API
    # always returns (an int64 without omitempty); the parser takes it as 0
    (gb300,) = fixture_slices("dranet-gb300.yaml")
    gb300["spec"]["pool"].setdefault("generation", 0)
    validate_slice(gb300)
    validate_slice(rail_slice("gpu-1"))


def test_an_efa_node_finds_each_nic_in_dranets_slice_and_never_a_gpu() -> None:
    """The p4d of examples/snapshots/healthy-efa-p4d and dranet's slice of a p4d: the same
    four EFA PCI functions; the GPU driver's slice of the node has the same pool name."""
    idx = index()
    for obj in fixture_slices("dranet-aws-efa.yaml") + fixture_slices("gpu-aws-efa.yaml"):
        idx.upsert(obj)
    nics = {n.rdma_device: n for n in node_nics(load_snapshot(SNAPSHOTS / "healthy-efa-p4d").last)}
    refs = idx.devices_of(AWS_NODE, nics["rdmap16s27"])
    assert refs == (DeviceRef("dra.net", AWS_NODE, "pci-0000-10-1b-0"),)
    assert all(
        r.driver == "dra.net" for n in nics.values() for r in idx.devices_of(AWS_NODE, n) or ()
    )
    assert {r.device for n in nics.values() for r in idx.devices_of(AWS_NODE, n) or ()} == {
        "pci-0000-10-1b-0",
        "pci-0000-20-1b-0",
        "pci-0000-90-1b-0",
        "pci-0000-a0-1b-0",
    }
    # another node's NIC of the same PCI address is not on this node
    assert idx.devices_of("other-node", nics["rdmap16s27"]) == ()


def test_vfs_published_without_netdev_match_by_pci_and_rdma_device() -> None:
    idx = index()
    for obj in fixture_slices("dranet-gb300.yaml"):
        idx.upsert(obj)
    node = "aks-gpu-45139532-vmss000081"
    by_pci = Nic(rdma_device="mlx5_2", pci_address="0103:00:00.0")
    assert [r.device for r in idx.devices_of(node, by_pci) or ()] == ["pci-0103-00-00-0"]
    no_pci = Nic(rdma_device="mlx5_3")  # the agent could not read it: the RDMA device name
    assert [r.device for r in idx.devices_of(node, no_pci) or ()] == ["pci-0104-00-00-0"]
    # a PCI address known on both sides decides alone: no match by name behind it
    moved = Nic(rdma_device="mlx5_3", pci_address="0199:00:00.0")
    assert idx.devices_of(node, moved) == ()


def test_sriov_vfs_of_a_failing_pf_are_its_devices() -> None:
    idx = index(DRANET, SRIOV)
    vf = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
          "metadata": {"name": "n1-sriov"},
          "spec": {"driver": SRIOV.driver, "nodeName": "n1",
                   "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 1},
                   "devices": [{"name": f"vf-{i}", "attributes": {
                       "pciAddress": {"string": f"0000:3b:00.{i + 2}"},  # unqualified: driver's
                       f"{SRIOV.driver}/pfPciAddress": {"string": "0000:3b:00.0"},
                   }} for i in range(3)] + [{"name": "vf-other", "attributes": {
                       "pciAddress": {"string": "0000:5e:00.2"},
                       f"{SRIOV.driver}/pfPciAddress": {"string": "0000:5e:00.0"}}}]}}  # fmt: skip
    validate_slice(vf)
    idx.upsert(vf)
    pf = Nic(rdma_device="mlx5_0", pci_address="0000:3b:00.0", netdevs=("ens1f0np0",))
    assert [r.device for r in idx.devices_of("n1", pf) or ()] == ["vf-0", "vf-1", "vf-2"]


def test_only_the_newest_generation_of_a_pool_counts_and_deletes_are_seen() -> None:
    idx = index()
    old = dranet_slice("n1", [("0000:18:00.0", "mlx5_0", "ens0")], generation=1)
    new = dranet_slice("n1", [("0000:19:00.0", "mlx5_0", "ens0")], generation=2)
    new["metadata"]["name"] = "n1-new"
    idx.upsert(old)
    idx.upsert(new)
    nic = Nic(rdma_device="mlx5_0", pci_address="0000:18:00.0")
    assert idx.devices_of("n1", nic) == ()  # generation 1 is stale
    idx.delete("n1-new")
    assert idx.taintable("n1", nic)
    idx.delete(old["metadata"]["name"])
    assert not idx.taintable("n1", nic) and not idx.by_node


def test_v1beta1_slices_nest_the_device_under_basic() -> None:
    obj = dranet_slice("n1", [("0000:18:00.0", "mlx5_0", None)], version="v1beta1")
    obj["spec"]["devices"] = [{"name": d["name"], "basic": {"attributes": d["attributes"]}}
                              for d in obj["spec"]["devices"]]  # fmt: skip
    idx = index()
    idx.upsert(obj)
    assert idx.taintable("n1", Nic(rdma_device="mlx5_0", pci_address="0000:18:00.0"))


def test_slices_keep_only_what_matching_needs() -> None:
    idx = index()
    for obj in fixture_slices("dranet-aws-efa.yaml") + fixture_slices("gpu-aws-efa.yaml"):
        idx.upsert(obj)
    entries = [e for es in idx.slices.values() for e in es]
    assert {e.driver for e in entries} == {"dra.net"}  # the GPU driver's slice is not kept
    device = entries[0].devices[0]
    assert len(device) == 5  # name, pci, parent, netdev, rdma: the rest is dropped


# -- rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta2"])
def test_rules_are_valid_device_taint_rules_selecting_exactly_one_device(version: str) -> None:
    ref = DeviceRef("dra.net", "gpu-17.example.com", "pci-0000-98-00-0")
    target = RuleTarget("pool-a", ref, "gpu-17.example.com", "mlx5_3")
    name = rule_name("pool-a", ref)
    obj = rule_object(name, target, version, OWNER)
    validate_rule(obj, version)
    assert obj["spec"]["deviceSelector"] == {"driver": "dra.net", "pool": "gpu-17.example.com",
                                              "device": "pci-0000-98-00-0"}  # fmt: skip
    assert obj["spec"]["taint"] == {"key": "netval.io/fabric-unhealthy", "value": "true",
                                    "effect": "NoSchedule"}  # fmt: skip
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert ours(obj) == (name, "pool-a", ref)
    foreign = copy.deepcopy(obj)
    foreign["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"
    assert ours(foreign) is None


def test_rule_names_are_stable_and_distinct() -> None:
    a = DeviceRef("dra.net", "n1", "pci-0000-18-00-0")
    b = DeviceRef("dra.net", "n1", "pci-0000-19-00-0")
    assert rule_name("v", a) == rule_name("v", a) != rule_name("v", b) != rule_name("w", a)
    assert len(rule_name("v" * 253, a)) <= 63


def test_plan_creates_missing_and_deletes_unwanted() -> None:
    a = DeviceRef("dra.net", "n1", "pci-0000-18-00-0")
    b = DeviceRef("dra.net", "n2", "pci-0000-18-00-0")
    wanted = wanted_rules([("v", "n1", "mlx5_0", (a,))])
    existing = {rule_name("v", b): RuleTarget("v", b, "n2", "mlx5_0"), "netval-unknown": None}
    changes = plan_rules(wanted, existing)
    assert [(c.name, c.excludes) for c in changes[:1]] == [(rule_name("v", a), True)]
    deletes = {c.name: c for c in changes[1:]}  # creates first: they exclude
    assert set(deletes) == {"netval-unknown", rule_name("v", b)}
    assert not any(c.excludes for c in deletes.values())
    assert changes[0].node == "n1" and deletes[rule_name("v", b)].node == "n2"
    assert plan_rules(wanted, {**wanted}) == []


# -- the driver mapping setting ---------------------------------------------------------------


def test_the_driver_mapping_setting() -> None:
    assert parse_drivers("") == DEFAULT_DRIVERS
    mapped = parse_drivers('[{"driver": "sriovnetwork.k8snetworkplumbingwg.io", '
                           '"pciAddress": "sriovnetwork.k8snetworkplumbingwg.io/pciAddress", '
                           '"parentPciAddress": "sriovnetwork.k8snetworkplumbingwg.io/pfPciAddress"}]')  # fmt: skip
    assert mapped[0].attributes == (
        "sriovnetwork.k8snetworkplumbingwg.io/pciAddress",
        "sriovnetwork.k8snetworkplumbingwg.io/pfPciAddress",
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "not valid JSON"),
        ("{}", "JSON list"),
        ('[{"driver": "Dra.Net", "pciAddress": "x"}]', "DNS subdomain"),
        ('[{"driver": "dra.net"}]', "names no attribute"),
        ('[{"driver": "dra.net", "pciAddress": "bad name!"}]', "not an attribute name"),
        ('[{"driver": "dra.net", "color": "x"}]', "each driver is"),
        ('[{"driver": "dra.net", "ifName": "a"}, {"driver": "dra.net", "ifName": "b"}]', "twice"),
    ],
)
def test_bad_driver_mappings_are_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_drivers(text)


# -- the Node condition list ------------------------------------------------------------------

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
KUBELET = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
           "lastHeartbeatTime": "x", "lastTransitionTime": "y"}  # fmt: skip


def test_the_condition_is_set_changed_kept_and_removed_others_untouched() -> None:
    first = with_condition([KUBELET], ("True", "ChecksPassing", "pool-a: passing"), NOW)
    assert first is not None and first[0] == KUBELET and first[1]["type"] == TYPE
    assert carried_condition(first) == ("True", "ChecksPassing", "pool-a: passing")
    # unchanged: nothing to write (no heartbeat churn)
    assert with_condition(first, ("True", "ChecksPassing", "pool-a: passing"), NOW) is None
    later = datetime(2026, 5, 1, 13, 0, tzinfo=UTC)
    reworded = with_condition(first, ("True", "ChecksWarning", "pool-a: warnings"), later)
    assert reworded is not None
    assert reworded[1]["lastTransitionTime"] == first[1]["lastTransitionTime"]  # same status
    failed = with_condition(reworded, ("False", "DevicesFailing", "pool-a: mlx5_3"), later)
    assert failed is not None and failed[1]["lastTransitionTime"] == "2026-05-01T13:00:00Z"
    removed = with_condition(failed, None, later)
    assert removed == [KUBELET]
    assert with_condition(removed, None, later) is None


# -- ResourceSlices from the API: semi-trusted, fuzzed ----------------------------------------

_VALUE = st.one_of(st.none(), st.integers(), st.text(max_size=90), st.booleans(),
                   st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5),
                   st.text(max_size=70), max_size=3))  # fmt: skip
_ATTRS = st.dictionaries(st.sampled_from(["dra.net/pciAddress", "dra.net/rdmaDevice", "pciAddress",
                                          "dra.net/ifName", "x/y"]), _VALUE, max_size=5)  # fmt: skip
_DEVICE = st.one_of(_VALUE, st.fixed_dictionaries(
    {"name": st.one_of(st.text(max_size=70), st.from_regex(r"pci-[0-9a-f-]{1,20}", fullmatch=True))},
    optional={"attributes": st.one_of(_ATTRS, _VALUE), "basic": st.one_of(_VALUE, st.fixed_dictionaries(
        {"attributes": _ATTRS})), "nodeName": _VALUE}))  # fmt: skip
_SLICE = st.fixed_dictionaries({
    "metadata": st.one_of(_VALUE, st.fixed_dictionaries({"name": st.one_of(st.text(max_size=300), _VALUE)})),
    "spec": st.one_of(_VALUE, st.fixed_dictionaries({
        "driver": st.sampled_from(["dra.net", "gpu.nvidia.com", "", "DRA.NET"]),
        "nodeName": st.one_of(st.just("n1"), _VALUE, st.text(max_size=300)),
        "perDeviceNodeSelection": _VALUE,
        "pool": st.one_of(_VALUE, st.fixed_dictionaries({"name": st.one_of(st.just("n1"), _VALUE),
                                                         "generation": st.one_of(st.integers(-2, 2**70), _VALUE)})),
        "devices": st.one_of(_VALUE, st.lists(_DEVICE, max_size=140)),
    })),
})  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_SLICE, max_size=6), st.booleans())
def test_fuzzed_slices_never_break_the_index(slices: list[dict[str, object]], delete: bool) -> None:
    idx = index()
    for obj in slices:
        idx.upsert(obj)
        parse_slice(obj, idx.drivers)
    for entries in idx.slices.values():
        for entry in entries:
            assert len(entry.devices) <= 128
            for device in entry.devices:
                assert all(v is None or (isinstance(v, str) and len(v) <= 64) for v in device[1:])
    nic = Nic(rdma_device="mlx5_0", pci_address="0000:18:00.0", netdevs=("ens0",))
    refs = idx.devices_of("n1", nic)
    assert refs is None or all(r.driver == "dra.net" for r in refs)
    if delete:
        for name in list(idx.slices):
            idx.delete(name)
        assert not idx.by_node


def test_condition_changes_only_where_nodes_differ() -> None:
    ok = ("True", "ChecksPassing", "pool-a: fabric checks passing")
    never = ("Unknown", "NeverReported", "pool-a: no fresh report (NeverReported)")
    wanted = {"a": ok, "b": ok, "c": never, "d": never, "gone": ok}
    carried = {"a": ok, "d": ok, "e": ok}
    changes = {
        c.node: c.condition for c in plan_conditions(wanted, carried, {"a", "b", "c", "d", "e"})
    }
    # a: unchanged; b: new; c: never heard and carrying none: nothing yet; d: now unknown;
    # e: no validation speaks for it any more; gone: no such Node
    assert changes == {"b": ok, "d": never, "e": None}
