"""Device taints, as the gating round asks for them: which validations may taint devices
now (`gate`), which DeviceTaintRules to create and delete (`plan`), and the writes (`write`,
from the paced Node write queue).

Device taints are possible for a validation with `spec.gating.deviceTaints` when the
operator may write them (`NETVAL_DEVICE_TAINTS`, chart `deviceTaints.enabled`: the RBAC comes
with it), the cluster serves the DeviceTaintRule API (discovered once per term, again after
RETRY only while some validation wants it) and the ResourceSlices were listed once. When
they are not, the validation's failing NICs gate their node as before, and the validation is
told once per distinct problem (a Warning Event `DeviceTaintsUnavailable`), never once per
round: a cluster without the API costs one discovery per RETRY.

The rules in the cluster are listed once per term and every RESYNC (someone deleted one by
hand), selected by label; in between, the operator's own writes keep the list. A write the
API refuses for good (403, 404) holds rule writes for RETRY and tells the validations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Final

from kubernetes.client.exceptions import ApiException

from netval.model.nics import Nic
from netval.model.status import EventReason
from netval.operator.devices import api
from netval.operator.devices.drivers import DriverAttributes
from netval.operator.devices.rules import (
    RuleChange,
    RuleTarget,
    ours,
    plan_rules,
    rule_object,
    wanted_rules,
)
from netval.operator.devices.slice_watch import SliceWatch, stop_watch
from netval.operator.devices.slices import DeviceRef, SliceIndex
from netval.operator.gating.facts import DeviceGate
from netval.operator.gating.verdict import Decisions
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.state.store import Store
from netval.operator.state.validation import NodeRecord
from netval.operator.status.events import Events
from netval.operator.thread_pools import Concern

log = logging.getLogger("netval.operator")

RETRY: Final = 300.0  # seconds before discovering again, after no API or a refused write
RESYNC: Final = 600.0  # seconds between listings of our rules when nothing changed
SYNC_GRACE: Final = 60.0  # seconds the gating round waits for the first slice listing
NOT_ALLOWED: Final = (
    "the operator may not write DeviceTaintRules (chart deviceTaints.enabled, "
    "NETVAL_DEVICE_TAINTS): failing NICs gate their node as a whole"
)


class DeviceStage:
    def __init__(
        self,
        enabled: bool,
        drivers: tuple[DriverAttributes, ...],
        kube: KubeApi,
        store: Store,
        events: Events,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.enabled = enabled
        self.kube = kube
        self.store = store
        self.events = events
        self.clock = clock
        self.on_change = on_change
        self.index = SliceIndex({d.driver: d for d in drivers})
        self.version: str | None = None  # DeviceTaintRules, once discovered
        self.slices_version: str | None = None
        self.hold_until = 0.0
        self.discoveries = 0
        self.started_at: float | None = None
        self.watch: SliceWatch | None = None
        self._watching: asyncio.Task[None] | None = None
        self.known: dict[str, RuleTarget | None] | None = None  # ours in the cluster
        self.listed_at = 0.0
        self.told: dict[str, str] = {}  # validation -> the problem its last Event named
        self.problem: str | None = None  # why device taints are not possible now
        self._wanting: list[str] = []
        self.writes = 0  # creates and deletes sent

    # -- which validations ---------------------------------------------------------------

    def wanting(self) -> list[str]:
        return sorted(v for v, spec in self.store.specs.items() if spec.gating.device_taints)

    def active(self) -> bool:
        return (
            self.enabled
            and self.version is not None
            and self.watch is not None
            and self.watch.synced.is_set()
            and self.problem is None
        )

    def gate(self, name: str) -> DeviceGate | None:
        spec = self.store.specs.get(name)
        if spec is None or not spec.gating.device_taints or not self.active():
            return None
        tainted: dict[str, set[str]] = {}
        for target in (self.known or {}).values():
            if target is not None and target.validation == name:
                tainted.setdefault(target.node, set()).add(target.nic)
        return DeviceGate(self.index.taintable, {n: frozenset(v) for n, v in tainted.items()})

    def note(self, name: str) -> str | None:
        """For the status: None (device taints off in the spec), "" (in force), or why not."""
        spec = self.store.specs.get(name)
        if spec is None or not spec.gating.device_taints:
            return None
        if not self.enabled:
            return NOT_ALLOWED
        if self.active():
            return ""
        return self.problem or "waiting for the ResourceSlices to be listed"

    def tell(self, validation: str, problem: str) -> None:
        if self.told.get(validation) == problem:
            return
        self.told[validation] = problem
        log.warning("device taints of %s: %s", validation, problem)
        self.events.queue(validation, "Warning", EventReason.DEVICE_TAINTS_UNAVAILABLE, problem)

    def fail(self, problem: str) -> None:
        """Device taints not possible for now: every wanting validation is told."""
        self.problem = problem
        self.hold_until = self.clock() + RETRY
        for validation in self.wanting():
            self.tell(validation, problem)

    # -- the round -------------------------------------------------------------------------

    async def prepare(self) -> bool:
        """Before a gating round: False while the round should wait (the first listing of the
        slices, at most SYNC_GRACE)."""
        wanting = self.wanting()
        self.told = {v: p for v, p in self.told.items() if v in wanting}
        if wanting != self._wanting:  # an opt-in is acted on now, not after RETRY
            self._wanting, self.hold_until = wanting, 0.0
        if not self.enabled:
            for validation in wanting:
                self.tell(validation, NOT_ALLOWED)
            return True
        if not wanting and self.known is not None and not self.known:
            return True  # nothing wanted, none of ours left: no call at all
        # discovered once per term even when no validation asks: rules a validation left
        # (deviceTaints switched off) are found and deleted by `plan`
        if self.version is None and (self.clock() < self.hold_until or not await self.discover()):
            return True
        if self.problem is not None and self.clock() >= self.hold_until:
            self.problem = None  # a refused write is tried again after RETRY
        if wanting and self.watch is None and self.slices_version is not None:
            self.start_watch(self.slices_version)
        if wanting and self.watch is not None and not self.watch.synced.is_set():
            started = self.started_at if self.started_at is not None else self.clock()
            return self.clock() - started >= SYNC_GRACE
        return True

    async def discover(self) -> bool:
        self.discoveries += 1
        try:
            rules, slices = await self.kube.run_in(Concern.OTHER, api.served, self.kube)
        except Exception as exc:
            self.fail(f"cannot read the resource.k8s.io discovery: {error_text(exc)}")
            return False
        if rules is None or slices is None:
            if not self.wanting():
                self.known = {}  # no API, no rule of ours: nothing to ask until one opts in
            self.fail(
                "the cluster serves no DeviceTaintRule API (resource.k8s.io "
                f"{' or '.join(api.RULE_VERSIONS)}) or no ResourceSlices: failing NICs gate "
                "their node as a whole"
            )
            return False
        self.version, self.slices_version, self.problem = rules, slices, None
        log.info("device taints: DeviceTaintRules %s, ResourceSlices %s", rules, slices)
        return True

    def start_watch(self, version: str) -> None:
        self.started_at = self.clock()
        self.watch = SliceWatch(self.kube, self.index, version, on_change=self.on_change,
                                on_error=self._watch_failed)  # fmt: skip
        self._watching = asyncio.create_task(self.watch.run(), name="netval-resourceslices")

    def _watch_failed(self, problem: str) -> None:
        if self.watch is not None and not self.watch.synced.is_set():
            for validation in self.wanting():
                self.tell(validation, problem)

    async def stop(self) -> None:
        await stop_watch(self._watching, self.watch)

    async def plan(self, decisions: Decisions) -> list[RuleChange]:
        """The rule creates and deletes this round wants ([] while rules cannot be written)."""
        if not self.enabled or self.version is None or self.clock() < self.hold_until:
            return []
        stale = self.known is None or self.clock() >= self.listed_at + RESYNC
        if stale and not await self.list_ours():
            return []
        assert self.known is not None
        wanted = wanted_rules(self._wanted_devices(decisions)) if self.active() else {}
        if not self.active() and self.wanting():
            return []  # not sure what is wanted: keep what is there
        return plan_rules(wanted, self.known)

    def _wanted_devices(
        self, decisions: Decisions
    ) -> list[tuple[str, str, str, tuple[DeviceRef, ...]]]:
        out: list[tuple[str, str, str, tuple[DeviceRef, ...]]] = []
        for name, verdict in decisions.verdicts.items():
            if not verdict.devices or self.gate(name) is None:
                continue
            state = self.store.states.get(name)
            if state is None:
                continue
            for node, nics in verdict.devices.items():
                rec = state.nodes.get(node)
                for nic in nics:
                    identity = _identity(rec, nic) if rec is not None else None
                    refs = self.index.devices_of(node, identity) if identity is not None else None
                    if refs:
                        out.append((name, node, nic, refs))
        return out

    async def list_ours(self) -> bool:
        assert self.version is not None
        try:
            items = await self.kube.run_in(Concern.OTHER, api.list_rules, self.kube, self.version)
        except Exception as exc:
            self._refused(exc, f"cannot list DeviceTaintRules: {error_text(exc)}")
            return False
        known: dict[str, RuleTarget | None] = {}
        for obj in items:
            found = ours(obj)
            if found is None:
                continue
            name, validation, ref = found
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            node, nic = annotations.get("netval.io/node"), annotations.get("netval.io/nic")
            known[name] = RuleTarget(validation, ref, str(node or ""), str(nic or ""))
        self.known, self.listed_at = known, self.clock()
        return True

    def _refused(self, exc: BaseException, problem: str) -> None:
        if isinstance(exc, ApiException) and exc.status == 404:
            self.version = None  # the API went away (a downgrade): discover again
        self.known = None
        self.fail(problem)

    async def write(self, change: RuleChange) -> bool | None:
        """One queued change: True done, None failed (the queue tries again)."""
        version = self.version
        if version is None or self.clock() < self.hold_until:
            return False  # dropped: the next round after RETRY plans again
        try:
            if change.target is not None:
                owner = self.store.bodies.get(change.target.validation)
                obj = rule_object(change.name, change.target, version, owner)
                await self.kube.run_in(Concern.NODES, api.create_rule, self.kube, version, obj,
                                       _idempotent=False)  # fmt: skip
            else:
                await self.kube.run_in(Concern.NODES, api.delete_rule, self.kube, version,
                                       change.name)  # fmt: skip
        except Exception as exc:
            if isinstance(exc, ApiException) and exc.status in (403, 404, 422):
                self._refused(exc, f"DeviceTaintRule {change.name}: {error_text(exc)}")
                return False
            log.warning("DeviceTaintRule %s: %s", change.name, error_text(exc))
            return None
        self.writes += 1
        if self.known is not None:
            if change.target is not None:
                self.known[change.name] = change.target
            else:
                self.known.pop(change.name, None)
        return True


def _identity(rec: NodeRecord, nic: str) -> Nic | None:
    seen = (rec.nic_failed or {}).get(nic)
    if seen is not None:
        return seen[1]
    return rec.nics.identity(nic) if rec.nics is not None else None


def rule_counts(known: Mapping[str, RuleTarget | None] | None) -> dict[str, int]:
    """Our rules in the cluster, by validation (for the metrics)."""
    out: dict[str, int] = {}
    for target in (known or {}).values():
        if target is not None:
            out[target.validation] = out.get(target.validation, 0) + 1
    return out


__all__ = ["DeviceStage", "rule_counts"]
