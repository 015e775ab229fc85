"""East-west glue for the agent: responder, endpoint announcements, peer table, probe cycles.

- `start()` finds the fabric address (the first address of `peers.interface`, by default of
  the first RDMA netdev), starts the `PeerResponder` there on `peers.port`, and announces it
  retained on ``netval/v1/<validation>/<node>/endpoint`` as ``{address, port, domain}``
  through the report publisher's connection, once the operator's assignment has arrived
  (never with a domain about to change: a peer would probe and report the wrong pair). Until an address is found, every cycle tries
  again and reports one `skip` result with the reason.
- The publisher's subscription (`subscriptions`, `on_message`) brings this node's
  ``assignment``, published retained by the operator: its domain (from the node label
  `peers.topologyKey`) and its peer set of the epoch, the endpoints of the peers it probes
  and its throughput slots (`netval.operator.ingest.peer_sets`). The agent reads no other
  node's endpoint (issue 24: N^2 messages after a broker restart). Payloads are untrusted:
  validated with pydantic; bad ones are dropped and counted (`dropped`), never raise. A new
  domain is re-announced at once.
- `probe_cycle(cycle, spec)` probes the peers `selection` picks for the cycle among the
  assigned ones (latency, loss, path MTU) and appends the recent throughput samples.
- `run(stop)` takes the throughput samples in the slots the assignment names; a sample stays in the
  reports (with its age) until it is older than four schedule rotations (at least 20
  slots), or more than `throughput_keep` newer ones exist, so the operator always has
  several per domain pair to aggregate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Final, Protocol

import aiomqtt
from pydantic import JsonValue, ValidationError

from netval.agent.peers.echo import probe_peer
from netval.agent.peers.endpoints import (
    Endpoint,
    first_error,
    first_rdma_netdev,
    interface_address,
)
from netval.agent.peers.responder import PeerResponder, ResponderLimits
from netval.agent.peers.target import PeerTarget, ProbeSettings
from netval.agent.peers.throughput import measure_throughput
from netval.model.ids import CheckId, Status
from netval.model.peer_assignment import (
    MAX_ASSIGNMENT_BYTES,
    MIN_SLOT_SECONDS,
    AssignmentPayload,
)
from netval.model.peer_selection import (
    UNASSIGNED,
    PeerPlan,
    peers_for_cycle,
    plan_peers,
    rotation_length,
    slot_of,
)
from netval.model.results import CheckResult
from netval.model.snapshot import Sample
from netval.model.spec import NetworkValidationSpec
from netval.model.topics import DropReason, TopicKind, parse_topic, topic

log = logging.getLogger("netval.agent.peers")

ENDPOINT: Final = TopicKind.ENDPOINT.value
MAX_CONCURRENT_PEERS: Final = 16
THROUGHPUT_KEEP: Final = 16
SLOT_OFFSET: Final = 0.25  # seconds after a slot boundary (absorbs clock skew between nodes)
TTL_ROTATIONS: Final = 4
MIN_TTL_SLOTS: Final = 20
_DROP_LOG_EVERY: Final = 60.0


class SampleSource(Protocol):
    def sample(self) -> Sample: ...


PublishRetained = Callable[[str, bytes], None]


# -- the service ------------------------------------------------------------------------------


class PeerService:
    def __init__(
        self,
        *,
        validation: str,
        node: str,
        spec: NetworkValidationSpec,
        settings: ProbeSettings | None = None,
        responder_limits: ResponderLimits | None = None,
        resolve: Callable[[str], str | None] = interface_address,
        clock: Callable[[], float] = time.time,
        throughput_keep: int = THROUGHPUT_KEEP,
    ) -> None:
        self.validation = validation
        self.node = node
        self.spec = spec
        self.settings = settings or ProbeSettings()
        self.responder_limits = responder_limits
        self._resolve = resolve
        self._clock = clock
        self._throughput_keep = throughput_keep
        self.subscriptions: tuple[str, ...] = (topic(validation, node, TopicKind.ASSIGNMENT),)
        self.domain: str | None = None
        # the operator's assignment arrived (it may say domain None): announcing before it
        # would publish a domain that is about to change, and a peer probing in that gap
        # reports the wrong domain pair (issue 24's flake)
        self.assigned = False
        self.interface: str | None = None
        self.address: str | None = None
        self.responder: PeerResponder | None = None
        self.not_ready: tuple[Status, str] = (Status.SKIP, "not started")
        self.dropped: Counter[DropReason] = Counter()
        self._endpoints: dict[str, Endpoint] = {}  # the assigned peers
        self._slots: dict[int, str] = {}  # throughput slot -> the peer to sample
        self.epoch: int | None = None
        self._fleet_domains = 0  # the throughput rotation spans the fleet's domains
        self._plan: PeerPlan | None = None
        self._publish: PublishRetained | None = None
        self._collector: SampleSource | None = None
        self._announced: bytes | None = None
        self._throughput: OrderedDict[str, tuple[CheckResult, float]] = OrderedDict()
        self._last_drop_log: dict[DropReason, float] = {}
        self.throughput_samples = 0
        # True while a load-test plan runs (netval.agent.loadtest): no samples of our own
        self.paused: Callable[[], bool] = lambda: False
        # this node's load-test rails for the endpoint (netval.agent.loadtest.rails)
        self.announce_rails: Callable[[], dict[str, JsonValue]] = dict

    # -- MQTT in ----------------------------------------------------------------------------

    def on_message(self, message: aiomqtt.Message) -> None:
        payload = message.payload
        data = payload if isinstance(payload, bytes) else str(payload or "").encode()
        self.handle(message.topic.value, data)

    def handle(self, topic_name: str, payload: bytes) -> None:
        """One message of our subscription; never raises for bad input."""
        parsed = parse_topic(topic_name)
        if (
            parsed is None
            or parsed.validation != self.validation
            or parsed.kind is not TopicKind.ASSIGNMENT
            or parsed.node != self.node
        ):
            self._drop(DropReason.BAD_TOPIC, topic_name[:200])
            return
        if len(payload) > MAX_ASSIGNMENT_BYTES:
            self._drop(DropReason.TOO_LARGE, f"{len(payload)} bytes on {topic_name[:200]}")
            return
        self._on_assignment(payload)

    def _on_assignment(self, payload: bytes) -> None:
        try:
            assignment = AssignmentPayload.model_validate_json(payload or b"{}")
        except ValidationError as exc:
            self._drop(DropReason.INVALID_ASSIGNMENT, first_error(exc))
            return
        endpoints = {
            node: Endpoint(str(address), port, None if domain == UNASSIGNED else domain)
            for domain, members in assignment.peers.items()
            for node, address, port in members
            if node != self.node
        }
        if endpoints != self._endpoints:
            self._endpoints = endpoints
            self._plan = None
        self._slots = dict(assignment.throughput)
        self._fleet_domains = assignment.domains
        if assignment.epoch != self.epoch:
            log.info("peer set of epoch %d: %d peers", assignment.epoch, len(endpoints))
            self.epoch = assignment.epoch
        domain = assignment.domain
        first, self.assigned = not self.assigned, True
        if first or domain != self.domain:
            log.info("peer domain of %s: %r -> %r", self.node, self.domain, domain)
            self.domain = domain
            self._plan = None
            self._announce()

    def _drop(self, reason: DropReason, detail: str) -> None:
        self.dropped[reason] += 1
        now = time.monotonic()
        if now - self._last_drop_log.get(reason, float("-inf")) >= _DROP_LOG_EVERY:
            self._last_drop_log[reason] = now
            log.warning(
                "dropped east-west message (%s, %d so far): %s",
                reason.value,
                self.dropped[reason],
                detail,
            )

    @property
    def endpoints(self) -> dict[str, Endpoint]:
        return dict(self._endpoints)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(
        self, publish_retained: PublishRetained, collector: SampleSource | None = None
    ) -> None:
        """Find the fabric address, start the responder, announce (retried every cycle)."""
        self._publish = publish_retained
        self._collector = collector
        await self._ensure_ready()

    async def close(self) -> None:
        """Stop the responder and clear our retained endpoint (peers stop probing us)."""
        if self._publish is not None and self._announced is not None:
            self._publish(ENDPOINT, b"")
            self._announced = None
        responder, self.responder = self.responder, None
        if responder is not None:
            await responder.close()

    async def _ensure_ready(self) -> bool:
        if self.responder is not None:
            self._announce()  # the rails may have changed (an address came or went)
            return True
        peers = self.spec.checks.peers
        ifname = peers.primary_interface
        if ifname is None and self._collector is not None:
            try:
                ifname = first_rdma_netdev(self._collector.sample(), self.spec.checks)
            except Exception as exc:  # a sysfs surprise must not kill the cycle
                log.warning("cannot list RDMA netdevs: %s", exc)
        if ifname is None:
            self.not_ready = (
                Status.SKIP,
                "not probed: no peers.interface set and no RDMA netdev found on this node",
            )
            return False
        address = self._resolve(ifname)
        if address is None:
            self.not_ready = (
                Status.SKIP,
                f"not probed: interface {ifname} has no IP address (peers.interface)",
            )
            return False
        responder = PeerResponder(address, peers.port, limits=self.responder_limits)
        try:
            await responder.start()
        except OSError as exc:
            await responder.close()
            self.not_ready = (
                Status.ERROR,
                f"the peer responder cannot listen on {address}:{peers.port} ({ifname}): "
                f"{exc.strerror or exc}",
            )
            return False
        self.interface, self.address, self.responder = ifname, address, responder
        self._announce()
        return True

    def _announce(self) -> None:
        if not self.assigned:
            return  # see `assigned`; the assignment's arrival announces
        if self._publish is None or self.address is None or self.responder is None:
            return
        payload = json.dumps(
            {
                "address": self.address,
                "port": self.responder.udp_port,
                "domain": self.domain,
                **self.announce_rails(),
            },
            separators=(",", ":"),
        ).encode()
        if payload != self._announced:
            self._publish(ENDPOINT, payload)
            self._announced = payload

    # -- probing ---------------------------------------------------------------------------

    def _own(self, status: Status, message: str) -> list[CheckResult]:
        result = CheckResult(
            check=CheckId.PEER_LATENCY, subject=self.node, status=status, message=message
        )
        return [result]

    def _target(self, node: str) -> PeerTarget | None:
        endpoint = self._endpoints.get(node)
        if endpoint is None:
            return None
        return PeerTarget(node, endpoint.address, endpoint.port, endpoint.domain)

    def peers_for_cycle(self, cycle: int) -> list[str]:
        if self._plan is None:
            table = {n: e.domain for n, e in self._endpoints.items()}
            self._plan = plan_peers(self.node, self.domain, table)
        return peers_for_cycle(self._plan, self.spec.checks.peers.samples_per_domain, cycle)

    async def probe_cycle(
        self, cycle: int, spec: NetworkValidationSpec | None = None
    ) -> list[CheckResult]:
        """The cycle's peer.* results (see the module docstring)."""
        if spec is not None:
            if spec.checks.peers.port != self.spec.checks.peers.port or (
                spec.checks.peers.primary_interface != self.spec.checks.peers.primary_interface
            ):
                log.warning("peers.port/peers.interface changes take effect on agent restart")
            self.spec = spec
        if not await self._ensure_ready():
            return self._own(*self.not_ready)
        targets = [t for n in self.peers_for_cycle(cycle) if (t := self._target(n)) is not None]
        if not targets:
            waiting = self._own(
                Status.SKIP, "not probed: the operator has assigned no announced peer yet"
            )
            return waiting + self._throughput_results()
        checks = self.spec.checks
        limit = asyncio.Semaphore(MAX_CONCURRENT_PEERS)

        async def one(target: PeerTarget) -> list[CheckResult]:
            async with limit:
                return await probe_peer(
                    target,
                    checks=checks.peers,
                    mtu=checks.mtu.interface_mtu,
                    source=self.address,
                    settings=self.settings,
                )

        per_peer = await asyncio.gather(*(one(t) for t in targets))
        return [r for results in per_peer for r in results] + self._throughput_results()

    # -- throughput ------------------------------------------------------------------------

    @property
    def slot_seconds(self) -> float:
        return max(self.spec.interval_seconds, MIN_SLOT_SECONDS)

    def _ttl(self) -> float:
        domains = {e.domain for e in self._endpoints.values()} | {self.domain}
        rotation = rotation_length(max(len(domains), self._fleet_domains))
        slots = max(TTL_ROTATIONS * rotation, MIN_TTL_SLOTS)
        return slots * self.slot_seconds

    def _throughput_results(self) -> list[CheckResult]:
        now = self._clock()
        ttl = self._ttl()
        for target in [t for t, (_, at) in self._throughput.items() if now - at > ttl]:
            del self._throughput[target]
        out: list[CheckResult] = []
        for result, at in reversed(self._throughput.values()):
            age = max(0.0, now - at)
            if age < self.slot_seconds:
                out.append(result)
                continue
            observed: dict[str, JsonValue] = {**result.observed, "ageSeconds": round(age, 1)}
            out.append(
                result.model_copy(
                    update={
                        "message": f"{result.message} (measured {age:.0f} s ago)"[:1024],
                        "observed": observed,
                    }
                )
            )
        return out

    async def sample_throughput(self, slot: int) -> CheckResult | None:
        """This node's sample of `slot`, if its assignment gives it one."""
        if self.paused() or not self.spec.checks.peers.enabled or not await self._ensure_ready():
            return None
        peer = self._slots.get(slot)
        target = self._target(peer) if peer is not None else None
        if target is None:
            return None
        settings = replace(
            self.settings,
            throughput_seconds=min(self.settings.throughput_seconds, self.slot_seconds / 4),
        )
        result = await measure_throughput(
            target, checks=self.spec.checks.peers, source=self.address, settings=settings
        )
        self._throughput[target.node] = (result, self._clock())
        self._throughput.move_to_end(target.node)
        while len(self._throughput) > self._throughput_keep:
            self._throughput.popitem(last=False)
        self.throughput_samples += 1
        return result

    async def run(self, stop: asyncio.Event) -> None:
        """Take this node's throughput samples in their slots until `stop`."""
        while not stop.is_set():
            slot_seconds = self.slot_seconds
            slot = slot_of(self._clock(), slot_seconds) + 1
            delay = slot * slot_seconds + SLOT_OFFSET - self._clock()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(delay, 0.0))
            if stop.is_set():
                return
            try:
                await self.sample_throughput(slot)
            except Exception:
                log.exception("throughput sample failed")
