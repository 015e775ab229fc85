"""Publication applied: once per status window, the `topology.netval.io/*` labels the pure
plan (`netval.operator.topology.labels`) asks for are patched onto the Nodes, one merge patch
per Node per change. Steady state writes nothing: the plan diffs against the Node labels the
watch keeps (every key with "topology" in it is kept, `state.node_labels`), overlaid with
what this writer wrote and the watch has not echoed yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from netval.operator.gating.node_writer import GATING_CONCURRENCY, MAX_GATING_WRITES_PER_ROUND
from netval.operator.gating.write_queue import TokenBucket
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.rounds import every_window
from netval.operator.settings import OperatorSettings
from netval.operator.state.store import Store, utcnow
from netval.operator.topology import labels as plan
from netval.operator.topology import routed
from netval.operator.topology.agreement import NetdevView

log = logging.getLogger("netval.operator")


class TopologyLabels:
    def __init__(
        self,
        settings: OperatorSettings,
        kube: KubeApi,
        store: Store,
        ready: Callable[[], Awaitable[bool]],
        bucket: TokenBucket | None = None,
    ) -> None:
        self.settings = settings
        self.bucket = bucket  # the operator's Node write rate, shared with gating
        self.kube = kube
        self.store = store
        self.ready = ready  # every validation loaded: before that, removals would be wrong
        self.written: dict[str, plan.LabelPatch] = {}  # node -> written, not yet watched back
        # node -> the spines its cross-leaf paths ever named (this term): a node's paths go to
        # a few peers at a time, so one report shows only some of its block's spines
        self.spines_seen: dict[str, set[str]] = {}
        self.writes = 0
        self.rounds = 0  # rounds planned (tests wait on it, never on time)

    async def loop(self, synced: asyncio.Event) -> None:
        await synced.wait()
        await every_window(
            lambda: self.settings.status_window,
            lambda: self.apply(utcnow()),
            "topology label publication failed; retrying next window",
        )

    def current(self) -> dict[str, dict[str, str]]:
        """The Nodes' labels as the watch has them, with our unechoed writes applied."""
        out: dict[str, dict[str, str]] = {}
        for node, labels in self.store.node_labels.items():
            written = self.written.get(node)
            if written is not None and all(labels.get(k) == v for k, v in written.items()):
                del self.written[node]  # the watch caught up
                written = None
            if written is None:
                out[node] = dict(labels)
                continue
            merged = {**labels, **{k: v for k, v in written.items() if v is not None}}
            out[node] = {k: v for k, v in merged.items() if written.get(k, v) is not None}
        return out

    def plan(self, now: datetime) -> dict[str, plan.LabelPatch]:
        del now  # the latest view of each node counts, fresh or not: a label is no health
        seen: list[dict[str, tuple[NetdevView, ...]]] = []
        routes: dict[str, routed.RouteView] = {}
        publishing: set[str] = set()
        labels = self.store.node_labels
        for name, state in self.store.states.items():
            spec = self.store.specs.get(name)
            if spec is None:  # an invalid spec: keep what its nodes carry until it is fixed
                publishing.update(state.targeted)
                continue
            if not plan.publishes(spec, (labels.get(n, {}) for n in state.targeted)):
                continue
            publishing.update(state.targeted)
            seen.append(
                {
                    n: rec.topology
                    for n, rec in state.nodes.items()
                    if rec.topology is not None and n in state.targeted
                }
            )
            routes.update(
                (n, rec.routes)
                for n, rec in state.nodes.items()
                if rec.routes is not None and n in state.targeted
            )
        current = self.current()
        leaves = plan.desired_leaves(seen)
        hop_leaves: dict[str, str] = {}
        for views in seen:
            for node, view in views.items():
                value = routed.next_hop_leaf(view, routes.get(node))
                if node not in leaves and value is not None:
                    hop_leaves[node] = min(value, hop_leaves.get(node, value))
        leaves.update(routed.shared_only(hop_leaves))
        spines = routed.spine_blocks(
            self.remember_spines(routes, publishing),
            {**plan.current_values(current, plan.LEAF), **leaves},
            plan.current_values(current, plan.SPINE),
        )
        return plan.plan_label_changes(current, leaves, frozenset(publishing), spines)

    def remember_spines(
        self, routes: dict[str, routed.RouteView], publishing: set[str]
    ) -> dict[str, set[str]]:
        for node in set(self.spines_seen) - publishing:
            del self.spines_seen[node]
        for node, (_, spines) in routes.items():
            known = self.spines_seen.setdefault(node, set())
            for spine in spines:
                if len(known) < routed.MAX_SPINES_PER_NODE:
                    known.add(spine)
        return {n: s for n, s in self.spines_seen.items() if s}

    async def apply(self, now: datetime) -> None:
        # Until every validation is loaded and every referenced label key listed, targets
        # are partial and a partial target set would remove labels to add them back.
        if self.store.label_keys_missing or not await self.ready():
            return
        changes = sorted(self.plan(now).items())[:MAX_GATING_WRITES_PER_ROUND]
        self.rounds += 1
        limit = asyncio.Semaphore(GATING_CONCURRENCY)

        async def write(node: str, patch: plan.LabelPatch) -> None:
            async with limit:
                if self.bucket is not None:
                    await self.bucket.take()
                try:
                    done = await self.kube.set_node_labels(node, patch)
                except Exception as exc:
                    log.warning("topology labels of node %s: %s", node, error_text(exc))
                    return
            if done:
                self.writes += 1
                self.written[node] = {**self.written.get(node, {}), **patch}

        await asyncio.gather(*(write(node, patch) for node, patch in changes))


__all__ = ["TopologyLabels"]
