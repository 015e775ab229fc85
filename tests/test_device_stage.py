"""The devices stage against the test API (tests/kube.py, DRA served by tests/dra_kit.py): one
Event per distinct problem (the operator not allowed, no API), no discovery loop, rules a
validation left after switching deviceTaints off deleted, other owners' rules untouched."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dra_kit import add_slices, rail_slice, rules, serve_dra
from kube import KubeCluster
from netval.model.spec import NetworkValidationSpec
from netval.operator.devices.drivers import DEFAULT_DRIVERS
from netval.operator.devices.rules import RuleTarget, rule_name, rule_object
from netval.operator.devices.slices import DeviceRef
from netval.operator.devices.stage import NOT_ALLOWED, DeviceStage
from netval.operator.gating.verdict import Decisions
from netval.operator.kube.api import KubeApi
from netval.operator.state.store import Store


class Told:
    """Stands in for `status.events.Events`: what the stage queues."""

    def __init__(self) -> None:
        self.queued: list[tuple[str, str, str, str]] = []

    def queue(self, name: str, type_: str, reason: str, message: str) -> None:
        self.queued.append((name, type_, reason, message))


def store(device_taints: bool) -> Store:
    s = Store(label_keys={"pool"})
    spec = NetworkValidationSpec.model_validate(
        {"nodeSelector": {"pool": "a"}, "gating": {"deviceTaints": device_taints}}
    )
    s.upsert_validation("pool-a", generation=1, spec=spec, body={}, status=None)
    return s


def stage(kube: KubeCluster, s: Store, enabled: bool, told: Told) -> DeviceStage:
    return DeviceStage(enabled, DEFAULT_DRIVERS, KubeApi(kube.api_client()), s, told)  # type: ignore[arg-type]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_not_allowed_is_told_once_and_costs_no_call(kube: KubeCluster) -> None:
    told = Told()
    st = stage(kube, store(True), False, told)
    before = len(kube.requests())
    for _ in range(5):
        assert run(st.prepare()) is True
    assert [t[2:] for t in told.queued] == [("DeviceTaintsUnavailable", NOT_ALLOWED)]
    assert st.note("pool-a") == NOT_ALLOWED and st.gate("pool-a") is None
    assert len(kube.requests()) == before


def test_no_api_is_discovered_once_and_told_once(kube: KubeCluster) -> None:
    told = Told()
    st = stage(kube, store(True), True, told)
    for _ in range(5):
        assert run(st.prepare()) is True
    assert st.discoveries == 1 and len(told.queued) == 1
    assert "serves no DeviceTaintRule API" in told.queued[0][3]
    assert st.gate("pool-a") is None and st.note("pool-a") == st.problem


def test_rules_left_by_a_validation_are_deleted_others_untouched(
    kube: KubeCluster, tmp_path: Path
) -> None:
    serve_dra(kube, ("v1",))
    add_slices(kube, [rail_slice("gpu-1")])
    ref = DeviceRef("dra.net", "gpu-1", "pci-0000-18-00-0")
    ours = rule_object(rule_name("pool-a", ref), RuleTarget("pool-a", ref, "gpu-1", "mlx5_0"),
                       "v1", None)  # fmt: skip
    foreign = rule_object("someone-elses", RuleTarget("x", ref, "gpu-1", "mlx5_0"), "v1", None)
    foreign["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "dranet-health"}
    kube.create(ours)
    kube.create(foreign)
    told = Told()
    st = stage(kube, store(False), True, told)  # deviceTaints switched off since
    assert run(st.prepare()) is True and st.version == "v1"
    changes = run(st.plan(Decisions({}, {}, frozenset())))
    assert [(c.name, c.target) for c in changes] == [(ours["metadata"]["name"], None)]
    assert run(st.write(changes[0])) is True
    assert [r["metadata"]["name"] for r in rules(kube)] == ["someone-elses"]
    assert run(st.prepare()) is True and not told.queued
