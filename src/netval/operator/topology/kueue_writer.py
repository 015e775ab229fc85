"""The Kueue `Topology` objects of the validations that opt in
(`spec.topology.publishKueueTopology`), kept reconciled: created when absent, replaced
(delete, then create: `spec.levels` is immutable) when the levels in use change, deleted when
no validation wants them (switched off, renamed, the validation deleted). The objects and the
decision are pure (`kueue_topology`); this module reads the cluster and writes.

Writes only on change: the objects this operator knows to exist are kept in memory, and a
round whose wanted objects are those makes no call at all; the cluster is listed again only
when they differ or every RESYNC seconds (someone deleted one by hand). The version is
discovered (GET /apis/kueue.x-k8s.io/v1beta2, then /v1beta1: the newest whose resources
include `topologies`) once per term, and again after RETRY when Kueue serves none: a cluster without
Kueue costs one discovery per RETRY, and each opted-in validation gets one Warning Event per
distinct problem (no Kueue, no RBAC, a name taken by a foreign object), not one per round.
Every write goes through the operator's fenced client: only the leader writes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from kubernetes.client.exceptions import ApiException

from netval.model.keys import MANAGED_BY_OPERATOR, LabelKey
from netval.model.status import EventReason
from netval.operator.kube.api import KubeApi, error_text
from netval.operator.rounds import every_window
from netval.operator.settings import OperatorSettings
from netval.operator.state.store import Store
from netval.operator.status.events import Events
from netval.operator.topology import kueue_topology as kt
from netval.operator.topology.agreement import levels_in_use

log = logging.getLogger("netval.operator")

RETRY: Final = 300.0  # seconds before asking again after Kueue was absent or a call failed
RESYNC: Final = 600.0  # seconds between listings when nothing changed
SELECTOR: Final = f"{LabelKey.MANAGED_BY.value}={MANAGED_BY_OPERATOR}"


@dataclass(frozen=True, slots=True)
class Wanted:
    validation: str
    name: str
    levels: tuple[str, ...]
    owner: Mapping[str, Any] | None


class KueueTopologies:
    def __init__(
        self,
        settings: OperatorSettings,
        kube: KubeApi,
        store: Store,
        events: Events,
        ready: Callable[[], Awaitable[bool]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.store = store
        self.events = events
        self.ready = ready  # every validation loaded: before that, deletions would be wrong
        self.clock = clock
        self.retry = RETRY
        self.resync = RESYNC
        self.version: str | None = None  # the version written, once discovered
        self.known: dict[str, tuple[str, ...]] | None = None  # ours in the cluster: name -> levels
        self.hold_until = 0.0  # no call before (after an absent Kueue or a failure)
        self.listed_at = 0.0
        self.last_wanted: tuple[tuple[str, tuple[str, ...]], ...] = ()
        self.told: dict[str, str] = {}  # validation -> the problem its last Event named
        self.discoveries = 0
        self.writes = 0  # creates and deletes sent
        self.rounds = 0

    async def loop(self) -> None:
        await every_window(
            lambda: self.settings.status_window,
            self.apply,
            "Kueue Topology reconciliation failed; retrying next window",
        )

    def wanted(self) -> list[Wanted]:
        """The Topology each opted-in validation wants, by validation name; a name two
        validations want goes to the first (the other is told)."""
        out: list[Wanted] = []
        taken: dict[str, str] = {}
        for validation in sorted(self.store.specs):
            spec = self.store.specs[validation]
            publication = spec.topology.publish_kueue_topology
            if not publication.enabled:
                continue
            name = kt.topology_name(validation, publication.name)
            if name in taken:
                self.tell(validation, f"the Topology name {name} is {taken[name]}'s already")
                continue
            taken[name] = validation
            state = self.store.states.get(validation)
            targeted = state.targeted if state is not None else ()
            labels = self.store.node_labels
            levels = levels_in_use(spec.topology, (labels.get(n, {}) for n in targeted))
            out.append(Wanted(validation, name, levels, self.store.bodies.get(validation)))
        return out

    def tell(self, validation: str, problem: str) -> None:
        """One Warning Event per distinct problem of a validation (not one per round)."""
        if self.told.get(validation) == problem:
            return
        self.told[validation] = problem
        log.warning("Kueue Topology of %s: %s", validation, problem)
        self.events.queue(validation, "Warning", EventReason.KUEUE_TOPOLOGY_FAILED, problem)

    async def apply(self) -> None:
        if self.store.label_keys_missing or not await self.ready():
            return  # levels detected from partial labels would replace the object twice
        self.rounds += 1
        wanted = self.wanted()
        opted = {
            v
            for v, spec in self.store.specs.items()
            if spec.topology.publish_kueue_topology.enabled
        }
        self.told = {v: problem for v, problem in self.told.items() if v in opted}
        key = tuple((w.name, w.levels) for w in wanted)
        if key != self.last_wanted:  # an opt-in or a change is acted on now, not after RETRY
            self.last_wanted, self.hold_until = key, 0.0
        if (not wanted and self.known == {}) or self.clock() < self.hold_until:
            return
        if self.version is None and not await self.discover(wanted):
            return
        version = cast(str, self.version)
        desired = {
            w.name: (w, kt.topology_object(w.name, w.validation, w.levels, version, w.owner))
            for w in wanted
        }
        want = {name: kt.levels_of(obj) for name, (_, obj) in desired.items()}
        if self.known == want and self.clock() < self.listed_at + self.resync:
            return
        existing = await self.list_ours(wanted)
        if existing is None:
            return
        self.known = {name: kt.levels_of(obj) for name, obj in existing.items()}
        for name, (w, obj) in desired.items():
            action = kt.topology_action(existing.get(name), obj)
            if action is kt.TopologyAction.NONE:
                continue
            if action is kt.TopologyAction.REPLACE and not await self.delete(name, w.validation):
                continue
            await self.create(w, obj)
        for name in sorted(set(existing) - set(desired)):
            await self.delete(name, None)

    async def discover(self, wanted: list[Wanted]) -> bool:
        """The newest version serving `topologies`; False (and a retry after RETRY) when
        none does, each opted-in validation told once."""
        self.discoveries += 1
        try:
            self.version = await self.kube.call(self._served_version)
        except Exception as exc:
            problem = f"cannot read the Kueue API's discovery: {error_text(exc)}"
        else:
            if self.version is not None:
                return True
            problem = (
                f"the cluster serves no Kueue Topology API ({kt.KUEUE_GROUP} "
                f"{' or '.join(kt.SERVED_PREFERENCE)}): install Kueue with "
                "Topology-Aware Scheduling, or switch publishKueueTopology off"
            )
        self.hold_until = self.clock() + self.retry
        if not wanted:
            self.known = {}  # nothing of ours can exist: no more discovery until one opts in
            log.info("Kueue Topology: %s", problem)
        for w in wanted:
            self.tell(w.validation, problem)
        return False

    def _served_version(self) -> str | None:
        for version in kt.SERVED_PREFERENCE:
            try:  # GET /apis/kueue.x-k8s.io/<version>: 404 when that version is not served
                found = self.kube.custom.get_api_resources(kt.KUEUE_GROUP, version)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            if kt.serves_topologies(r.name for r in found.resources or []):
                return version
        return None

    async def list_ours(self, wanted: list[Wanted]) -> dict[str, dict[str, Any]] | None:
        """Our Topology objects (labelled managed-by netval-operator, with a validation);
        None when they cannot be listed (Kueue went away: discover again)."""
        try:
            found = await self.kube.call(
                self.kube.custom.list_cluster_custom_object,
                kt.KUEUE_GROUP,
                self.version,
                kt.TOPOLOGY_PLURAL,
                label_selector=SELECTOR,
            )
        except Exception as exc:
            problem = f"cannot list Kueue Topologies: {error_text(exc)}"
            self.fail([w.validation for w in wanted], problem, exc)
            return None
        self.listed_at = self.clock()
        return {
            obj["metadata"]["name"]: obj
            for obj in cast(dict[str, Any], found).get("items") or []
            if LabelKey.VALIDATION.value in (obj["metadata"].get("labels") or {})
        }

    def fail(self, validations: list[str], problem: str, exc: BaseException) -> None:
        """Held for RETRY, then listed afresh; each validation concerned told once."""
        if isinstance(exc, ApiException) and exc.status == 404:
            self.version = None  # Kueue was uninstalled or downgraded: discover again
        self.known = None
        self.hold_until = self.clock() + self.retry
        for validation in validations:
            self.tell(validation, problem)
        if not validations:
            log.warning("Kueue Topology: %s", problem)

    async def create(self, w: Wanted, obj: dict[str, Any]) -> None:
        try:
            await self.kube.call(
                self.kube.custom.create_cluster_custom_object,
                kt.KUEUE_GROUP,
                self.version,
                kt.TOPOLOGY_PLURAL,
                obj,
                _idempotent=False,  # a 409 is a foreign object of that name, not a retry
            )
        except Exception as exc:
            taken = isinstance(exc, ApiException) and exc.status == 409
            problem = (
                f"a Topology named {w.name} exists and is not netval's: choose another "
                "publishKueueTopology.name"
                if taken
                else f"cannot create the Topology {w.name}: {error_text(exc)}"
            )
            self.fail([w.validation], problem, exc)
            return
        self.writes += 1
        if self.known is not None:
            self.known[w.name] = kt.levels_of(obj)
        self.told.pop(w.validation, None)
        log.info("Kueue Topology %s written, levels %s", w.name, list(kt.levels_of(obj)))

    async def delete(self, name: str, validation: str | None) -> bool:
        try:
            await self.kube.call(
                self.kube.custom.delete_cluster_custom_object,
                kt.KUEUE_GROUP,
                self.version,
                kt.TOPOLOGY_PLURAL,
                name,
            )
        except Exception as exc:
            if not (isinstance(exc, ApiException) and exc.status == 404):  # 404: gone already
                problem = f"cannot delete the Topology {name}: {error_text(exc)}"
                self.fail([validation] if validation else [], problem, exc)
                return False
        self.writes += 1
        if self.known is not None:
            self.known.pop(name, None)
        return True


__all__ = ["KueueTopologies", "Wanted"]
