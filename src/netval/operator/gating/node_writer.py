"""Node gating, applied: once per status window the node verdict (`gating.verdict`) is
decided for every validation from its state and recorded in it (`ValidationState.verdict`,
what the status, admission, Kueue and load tests read); the Nodes whose merged label or taint
or `NetworkFabricReady` condition differs from what they carry, and the DeviceTaintRules to
create or delete (`devices.stage`), are queued for a write (`gating.write_queue`: per key
the latest wish, exclusions first, at the operator's Node write rate). A breaker that trips
is posted as a Warning Event and counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Final

from netval.model.status import EventReason, Reason
from netval.operator.devices.rules import RuleChange
from netval.operator.devices.stage import DeviceStage
from netval.operator.gating import decisions as gating
from netval.operator.gating.conditions import GatingCondition, gating_condition
from netval.operator.gating.facts import node_facts, policy
from netval.operator.gating.node_condition import (
    ConditionChange,
    plan_conditions,
    wanted_conditions,
)
from netval.operator.gating.verdict import Decisions, decide
from netval.operator.gating.write_queue import Change, NodeWriteQueue, TokenBucket
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.rounds import every_window
from netval.operator.settings import OperatorSettings
from netval.operator.state.store import Store, utcnow
from netval.operator.status.events import Events

log = logging.getLogger("netval.operator")

# Node writes in flight (the rate is the settings' token bucket): a hung PATCH must not stop
# the others.
GATING_CONCURRENCY: Final = 16
# Topology label patches per round (they share the Node write rate, `NodeGating.bucket`).
MAX_GATING_WRITES_PER_ROUND: Final = 500


class NodeGating:
    def __init__(
        self, settings: OperatorSettings, kube: KubeApi, store: Store, events: Events
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.store = store
        self.events = events
        self.conditions: dict[str, GatingCondition] = {}  # validation -> its Gating condition
        self.breaker_tripped: dict[str, bool] = {}
        self.breaker_trips: Counter[str] = Counter()  # trips by onBreakerTripped action
        self.decisions: Decisions | None = None  # the last round's
        # validation -> the reason of the Gating False condition said (None: True)
        self._said: dict[str, str | None] = {}
        # every Node write of the operator (topology labels too) takes a token of this bucket
        self.bucket = TokenBucket(settings.node_writes_per_second, settings.node_write_burst)
        self.queue = NodeWriteQueue(self._write, self.bucket, GATING_CONCURRENCY)
        self.devices = DeviceStage(
            settings.device_taints, settings.dra_drivers, kube, store, events,
            on_change=self._devices_changed,
        )  # fmt: skip
        store.device_gate = self.devices.gate
        self.fabric_writes = 0
        self.condition_writes = 0
        # a reason to hold every Node write (the broker ACL check, `operator.broker_check`),
        # shown in the Gating condition; and whether writes wait (that check not answered yet)
        self.hold: Callable[[], str | None] = lambda: None
        self.writes_wait: Callable[[], bool] = lambda: False

    @property
    def writes(self) -> int:
        """Node label/taint writes (conditions and rules are counted apart)."""
        return self.fabric_writes

    async def loop(self, synced: asyncio.Event) -> None:
        await synced.wait()
        drain = asyncio.create_task(self.queue.run(), name="netval-node-writes")
        try:
            await every_window(
                lambda: self.settings.status_window,
                lambda: self.apply(utcnow()),
                "node gating failed; retrying next window",
            )
        finally:
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
            await self.devices.stop()

    def _devices_changed(self) -> None:
        """A ResourceSlice changed: which NICs can be tainted may have (the next round)."""
        for name, state in self.store.states.items():
            spec = self.store.specs.get(name)
            if spec is not None and spec.gating.device_taints:
                state.dirty = True

    def forget(self, name: str) -> None:
        self.conditions.pop(name, None)
        self.breaker_tripped.pop(name, None)
        self._said.pop(name, None)

    async def validations_loaded(self) -> bool:
        """Whether every validation that existed at start has been loaded: before that, a
        validation missing from memory may exist all the same."""
        store = self.store
        if store.expected_validations is None:
            try:
                store.expected_validations = set(await self.kube.list_validation_names())
            except Exception as exc:
                log.warning("cannot list validations yet (%s); gating waits", error_text(exc))
                return False
        return store.expected_validations <= set(store.states)

    def refresh(self, now: datetime) -> Decisions:
        """Decide every validation's verdict at `now` and record it in its state; a change
        the status shows dirties the status."""
        store = self.store
        inputs = []
        for name, state in store.states.items():
            spec = store.specs.get(name)
            if spec is None:
                continue
            gate = self.devices.gate(name)
            gating_policy = policy(name, spec, devices=gate is not None)
            facts = node_facts(state, store.node_fabric, now, gate,
                               gating_policy.max_failed_devices)  # fmt: skip
            inputs.append((gating_policy, facts))
            note = self.devices.note(name)
            if state.devices_note != note:
                state.devices_note = note
                state.dirty = True
        decisions = decide(inputs)
        held = self.hold()
        for name, verdict in decisions.verdicts.items():
            state = store.states[name]
            before = state.verdict
            state.verdict = verdict
            if (
                before is None
                or before.summary() != verdict.summary()
                or before.nodes != verdict.nodes
                or state.gating_hold != held
            ):
                state.dirty = True
            state.gating_hold = held
            condition = gating_condition(verdict)
            if held is not None:
                condition = (False, Reason.BROKER_ACL_VIOLATED.value, held)
            self._record(
                name, condition, verdict.tripped, verdict.policy.on_breaker_tripped.value,
            )  # fmt: skip
        self.decisions = decisions
        return decisions

    async def apply(self, now: datetime) -> None:
        if not await self.devices.prepare():
            return  # the first ResourceSlice listing: deciding without it would take the node path
        decisions = self.refresh(now)
        if self.hold() is not None or self.writes_wait():
            self.queue.reconcile({})  # nothing is written while held, queued wishes dropped
            return
        if not await self.validations_loaded():
            return  # a half-loaded operator never strips what another validation owns
        store = self.store
        changes: dict[str, Change] = {
            c.key: c
            for c in gating.plan_changes(store.node_fabric, decisions.labels, decisions.tainted)
        }
        wanted = wanted_conditions(decisions, store.states)
        for change in plan_conditions(wanted, store.node_conditions, set(store.node_fabric)):
            changes[change.key] = change
        for rule in await self.devices.plan(decisions):
            changes[rule.key] = rule
        self.queue.reconcile(changes)

    async def _write(self, change: Change) -> bool | None:
        """One queued change: True written, False the Node is gone, None failed (requeued)."""
        if isinstance(change, RuleChange):
            return await self.devices.write(change)
        if isinstance(change, ConditionChange):
            return await self._write_condition(change)
        return await self._write_fabric(change)

    async def _write_condition(self, change: ConditionChange) -> bool | None:
        try:
            done = await self.kube.set_node_condition(change.node, change.condition)
        except Exception as exc:
            log.warning("condition write to node %s failed: %s", change.node, error_text(exc))
            return None
        if done:
            self.condition_writes += 1
            conditions = self.store.node_conditions
            if change.condition is None:
                conditions.pop(change.node, None)
            else:  # the watch will confirm; until then do not write the same again
                conditions[change.node] = change.condition
        return done

    async def _write_fabric(self, change: gating.NodeChange) -> bool | None:
        node_fabric = self.store.node_fabric
        label = change.label.value if change.label is not None else None
        _, had_taint = node_fabric.get(change.node, (None, False))
        try:
            if change.taint == had_taint:
                # label only: one merge patch, no read-modify-write needed
                done = await self.kube.set_node_label(change.node, label)
            else:
                done = await self.kube.set_node_gating(change.node, label, change.taint)
        except Exception as exc:
            log.warning("gating write to node %s failed: %s", change.node, error_text(exc))
            return None
        if done:
            self.fabric_writes += 1
        if done and change.node in node_fabric:
            # the watch will confirm; until then do not write the same change again
            node_fabric[change.node] = (label, change.taint)
        return done

    def _record(self, name: str, condition: GatingCondition, tripped: bool, action: str) -> None:
        """The Gating condition as this round left it; a Warning Event when it turns False
        (the breaker trips, or labels are held), counted by what admission does then."""
        if self.conditions.get(name) != condition:
            self.conditions[name] = condition
        was = self.breaker_tripped.get(name, False)
        self.breaker_tripped[name] = tripped
        if tripped and not was:
            self.breaker_trips[action] += 1
        said = self._said.get(name)
        if not condition[0] and (said is None or said != condition[1] or (tripped and not was)):
            reason = (
                EventReason.BROKER_ACL_VIOLATED
                if condition[1] == Reason.BROKER_ACL_VIOLATED.value
                else EventReason.BREAKER_TRIPPED
            )
            self.events.queue(name, "Warning", reason, condition[2])
        self._said[name] = None if condition[0] else condition[1]
