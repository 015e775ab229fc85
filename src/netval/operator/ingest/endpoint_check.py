"""Is an announced east-west endpoint the announcing node's own address?

A node's agent announces the address its peer responder answers on; the operator hands it to
the node's peers in their assignments, and their results are attributed to the node by it.
A node that announced another node's address would have its peers probe that node and blame
or clear the wrong one. So an announcement counts only when its address is one of the
Node's `status.addresses` (as the kubelet reports them, from the API server: not from the
node's say-so) or inside one of the validation's declared fabric networks
(`spec.checks.peers.fabricCidrs`: the backend NICs' subnets, which Kubernetes does not
know). Anything else is refused: not used in any peer set, counted
(`netval_operator_endpoints_refused_total{reason}`) and, once per node and address, a
Warning Event on the validation. An announcement whose Node's addresses are not known yet
(the Node watch has not delivered it) waits, unused, and is judged when they come. The
load-test rails a node announces with its endpoint are judged the same way, all or none
(`verified_rails`).

A fabric network shared by many nodes does not tell them apart: with `fabricCidrs` a node
can still claim another node's address inside that network. Declare them only for
networks Kubernetes does not list, and as narrow as the fabric allows.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum

from netval.operator.ingest.peer_sets import Address, AnnouncedRails, EndpointTable


class Refusal(StrEnum):
    NOT_NODE_ADDRESS = "not_node_address"  # neither the Node's address nor a fabric network's
    NOT_AN_ADDRESS = "not_an_address"  # does not parse (the payload model should have caught it)


IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def judge(
    address: str, node_addresses: frozenset[str], fabric: Iterable[IpNetwork]
) -> Refusal | None:
    """None when `address` may be the node's; else why not. Pure."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return Refusal.NOT_AN_ADDRESS
    if any(_same(ip, a) for a in node_addresses):
        return None
    if any(ip.version == net.version and ip in net for net in fabric):
        return None
    return Refusal.NOT_NODE_ADDRESS


def _same(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, text: str) -> bool:
    try:
        return ipaddress.ip_address(text) == ip
    except ValueError:
        return False


def node_addresses(status: Mapping[str, object] | None) -> frozenset[str]:
    """The IP addresses of a Node's `status.addresses` (host names are not addresses)."""
    found = set()
    entries = (status or {}).get("addresses")
    for entry in entries if isinstance(entries, list) else []:
        value = entry.get("address") if isinstance(entry, dict) else None
        if isinstance(value, str):
            try:
                found.add(str(ipaddress.ip_address(value)))
            except ValueError:
                continue
    return frozenset(found)


class EndpointCheck:
    """The Nodes' addresses as the Node watch gives them, the refusals counted and the
    ones to tell (new (validation, node, address) refusals since the last `news`)."""

    def __init__(self) -> None:
        self.addresses: dict[str, frozenset[str]] = {}
        self.refusals: Counter[Refusal] = Counter()
        self._refused: dict[tuple[str, str], Address] = {}  # (validation, node) -> refused
        self._news: list[tuple[str, str, Address]] = []
        self._refused_rails: set[tuple[str, str, str]] = set()  # (validation, node, address)

    def note_node(self, node: str, addresses: frozenset[str] | None) -> bool:
        """A Node's addresses (None: deleted); True when they changed."""
        if addresses is None:
            return self.addresses.pop(node, None) is not None
        if self.addresses.get(node) == addresses:
            return False
        self.addresses[node] = addresses
        return True

    def verified(
        self, validation: str, table: Mapping[str, Address], fabric: Iterable[IpNetwork]
    ) -> dict[str, Address]:
        """The announcements of `validation` that may be used; refusals counted once per
        node and address."""
        networks = tuple(fabric)
        out: dict[str, Address] = {}
        for node, endpoint in table.items():
            known = self.addresses.get(node)
            why = judge(endpoint[0], known or frozenset(), networks)
            if why is None:
                out[node] = endpoint
                self._refused.pop((validation, node), None)
            elif known is not None and self._refused.get((validation, node)) != endpoint:
                # (a Node not delivered by the watch yet: waits unused, judged when it comes)
                self._refused[(validation, node)] = endpoint
                self.refusals[why] += 1
                self._news.append((validation, node, endpoint))
        return out

    def verified_rails(
        self, validation: str, rails: Mapping[str, AnnouncedRails], fabric: Iterable[IpNetwork]
    ) -> dict[str, AnnouncedRails]:
        """The announced load-test rails of `validation` that may be used: a node's rails
        only when every address among them is the node's (a rail dropped from the middle
        would shift the rails facing each other, so one foreign address drops them all and
        the node counts as not having announced any). Refusals counted once per node and
        address, like endpoints."""
        networks = tuple(fabric)
        out: dict[str, AnnouncedRails] = {}
        for node, announced in rails.items():
            known = self.addresses.get(node)
            if known is None:
                continue  # waits, unused, like an endpoint
            bad = [
                (address, why)
                for group in announced
                for _, address, _ in group
                if (why := judge(address, known, networks)) is not None
            ]
            if not bad:
                out[node] = announced
                continue
            for address, why in bad:
                key = (validation, node, address)
                if key not in self._refused_rails:
                    self._refused_rails.add(key)
                    self.refusals[why] += 1
                    self._news.append((validation, node, (address, 0)))
        return out

    def news(self) -> list[tuple[str, str, Address]]:
        """Refusals not told yet (validation, node, (address, port)), and forget them."""
        news, self._news = self._news, []
        return news

    def forget(self, validation: str) -> None:
        for key in [k for k in self._refused if k[0] == validation]:
            del self._refused[key]
        self._refused_rails = {k for k in self._refused_rails if k[0] != validation}


class VerifiedEndpoints:
    """`EndpointTable`'s reading side, through the check: what the peer sets and load
    tests read (`of`)."""

    def __init__(
        self,
        table: EndpointTable,
        check: EndpointCheck,
        fabric_of: Callable[[str], Iterable[IpNetwork]] = lambda validation: (),
    ) -> None:
        self.table = table
        self.check = check
        self.fabric_of = fabric_of

    def of(self, validation: str) -> Mapping[str, Address]:
        return self.check.verified(
            validation, self.table.of(validation), self.fabric_of(validation)
        )

    def rails_of(self, validation: str) -> Mapping[str, AnnouncedRails]:
        return self.check.verified_rails(
            validation, self.table.rails_of(validation), self.fabric_of(validation)
        )


def fabric_networks(cidrs: Iterable[str]) -> tuple[IpNetwork, ...]:
    """The spec's fabricCidrs (validated at the trust boundary) as networks."""
    return tuple(ipaddress.ip_network(c) for c in cidrs)
