"""Node gating, applied: once per status window, the Nodes whose health asks for a change of
the `netval.io/fabric` label or netval's taint (decisions in `netval.operator.gating.decisions`)
are queued for a write, and each validation's Gating condition is recorded. The writes go out
at the operator's Node write rate (`gating.write_queue`: per node the latest wish, FIFO).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Final

from netval.model.keys import FabricHealth
from netval.model.spec import NetworkValidationSpec
from netval.model.status import EventReason
from netval.operator.gating import decisions as gating
from netval.operator.gating.decisions import GatingCondition
from netval.operator.gating.write_queue import NodeWriteQueue, TokenBucket
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.rounds import every_window
from netval.operator.settings import OperatorSettings
from netval.operator.state import validation as vs
from netval.operator.state.store import Store, utcnow
from netval.operator.status.events import Events

log = logging.getLogger("netval.operator")

# Node writes in flight (the rate is the settings' token bucket): a hung PATCH must not stop
# the others.
GATING_CONCURRENCY: Final = 16
# Topology label patches per round (they share the Node write rate, `NodeGating.bucket`).
MAX_GATING_WRITES_PER_ROUND: Final = 500


def gating_input(
    name: str, state: vs.ValidationState, spec: NetworkValidationSpec, now: datetime
) -> gating.GatingInput:
    """What gating needs of one validation at `now`."""
    return gating.GatingInput(
        name=name,
        targeted=frozenset(state.targeted),
        node_label=spec.gating.node_label,
        taint=spec.gating.taint,
        max_unhealthy_percent=spec.gating.max_unhealthy_percent,
        recovery_reports=spec.gating.recovery_reports,
        health={n: FabricHealth(vs.node_health(state, n, now)) for n in state.targeted},
        ok_streak={n: rec.ok_streak for n, rec in state.nodes.items()},
    )


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
        # every Node write of the operator (topology labels too) takes a token of this bucket
        self.bucket = TokenBucket(settings.node_writes_per_second, settings.node_write_burst)
        self.queue = NodeWriteQueue(self._write, self.bucket, GATING_CONCURRENCY)

    @property
    def writes(self) -> int:
        return self.queue.written

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

    def forget(self, name: str) -> None:
        self.conditions.pop(name, None)
        self.breaker_tripped.pop(name, None)

    def inputs(self, now: datetime) -> list[gating.GatingInput]:
        return [
            gating_input(name, state, spec, now)
            for name, state in self.store.states.items()
            if (spec := self.store.specs.get(name)) is not None
        ]

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

    async def apply(self, now: datetime) -> None:
        if not await self.validations_loaded():
            return
        node_fabric = self.store.node_fabric
        inputs = self.inputs(now)
        currently_tainted = [n for n, (_, tainted) in node_fabric.items() if tainted]
        decisions = [gating.decide_taints(v, currently_tainted) for v in inputs]
        taints = frozenset().union(*(d.tainted for d in decisions)) if decisions else frozenset()
        current = {n: label for n, (label, _) in node_fabric.items()}
        held = [gating.decide_labels(v, current, taints) for v in inputs]
        for v, decision, label_decision in zip(inputs, decisions, held, strict=True):
            self._record(v, decision, label_decision)
        labels = gating.merge_labels(zip(inputs, held, strict=True))
        changes = gating.plan_changes(node_fabric, labels, taints)
        self.queue.reconcile({c.node: c for c in changes})

    async def _write(self, change: gating.NodeChange) -> bool | None:
        """One queued change: True written, False the Node is gone, None failed (requeued)."""
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
        if done and change.node in node_fabric:
            # the watch will confirm; until then do not write the same change again
            node_fabric[change.node] = (label, change.taint)
        return done

    def _record(
        self,
        v: gating.GatingInput,
        decision: gating.TaintDecision,
        labels: gating.LabelDecision,
    ) -> None:
        new = gating.gating_condition(v, decision, labels)
        if self.conditions.get(v.name) != new:
            self.conditions[v.name] = new
            state = self.store.states.get(v.name)
            if state is not None:
                state.dirty = True
        tripped = not new[0]
        was_tripped = self.breaker_tripped.get(v.name, False)
        self.breaker_tripped[v.name] = tripped
        if tripped and not was_tripped:
            self.events.queue(v.name, "Warning", EventReason.BREAKER_TRIPPED, new[2])
