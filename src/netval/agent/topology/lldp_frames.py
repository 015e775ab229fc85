"""LLDP (IEEE 802.1AB) frames -> the neighbour they announce. Pure: bytes in, a neighbour or
None out, never an exception (the frames come from whatever is cabled to the port).

An LLDPDU is a sequence of TLVs, each a 7-bit type and a 9-bit length then the value; it
must start with Chassis ID (1), Port ID (2) and TTL (3). Port Description (4) and System
Name (5) are optional. Chassis and port ids carry a subtype byte saying how to read them.
"""

from __future__ import annotations

import ipaddress
from typing import Final

from netval.model.topology import LldpNeighbour, NeighbourSource, sanitise

ETH_P_LLDP: Final = 0x88CC
LLDP_MULTICAST: Final = bytes.fromhex("0180c200000e")  # nearest bridge

TLV_END: Final = 0
TLV_CHASSIS_ID: Final = 1
TLV_PORT_ID: Final = 2
TLV_TTL: Final = 3
TLV_PORT_DESCRIPTION: Final = 4
TLV_SYSTEM_NAME: Final = 5

CHASSIS_MAC: Final = 4
CHASSIS_NETWORK_ADDRESS: Final = 5
PORT_MAC: Final = 3
PORT_NETWORK_ADDRESS: Final = 4


def _mac(value: bytes) -> str:
    return ":".join(f"{b:02x}" for b in value)


def _network_address(value: bytes) -> str:
    """IANA address family byte then the address (1 IPv4, 2 IPv6)."""
    family, address = (value[0], value[1:]) if value else (0, b"")
    try:
        if family == 1 and len(address) == 4:
            return str(ipaddress.IPv4Address(address))
        if family == 2 and len(address) == 16:
            return str(ipaddress.IPv6Address(address))
    except ValueError:
        pass
    return address.hex()


def _text(value: bytes) -> str:
    return sanitise(value.decode("utf-8", errors="replace"))


def _id(value: bytes, mac_subtype: int, address_subtype: int) -> str | None:
    if len(value) < 2:
        return None
    subtype, body = value[0], value[1:]
    if subtype == mac_subtype and len(body) == 6:
        return _mac(body)
    if subtype == address_subtype:
        return _network_address(body)
    return _text(body)


def tlvs(payload: bytes) -> list[tuple[int, bytes]]:
    """The TLVs of an LLDPDU up to End (or a TLV that runs past the frame)."""
    out: list[tuple[int, bytes]] = []
    at = 0
    while at + 2 <= len(payload):
        header = int.from_bytes(payload[at : at + 2], "big")
        kind, length = header >> 9, header & 0x1FF
        at += 2
        if kind == TLV_END or at + length > len(payload):
            break
        out.append((kind, payload[at : at + length]))
        at += length
    return out


def parse_lldpdu(
    payload: bytes, source: NeighbourSource = NeighbourSource.FRAMES
) -> LldpNeighbour | None:
    """The neighbour an LLDPDU (the frame after the Ethernet header) announces, or None when
    it is not a valid LLDPDU (mandatory TLVs missing or out of order)."""
    items = tlvs(payload)
    if len(items) < 3 or [k for k, _ in items[:3]] != [TLV_CHASSIS_ID, TLV_PORT_ID, TLV_TTL]:
        return None
    chassis = _id(items[0][1], CHASSIS_MAC, CHASSIS_NETWORK_ADDRESS)
    port = _id(items[1][1], PORT_MAC, PORT_NETWORK_ADDRESS)
    ttl_value = items[2][1]
    if chassis is None or port is None or len(ttl_value) < 2:
        return None
    optional: dict[int, str] = {}
    for kind, value in items[3:]:
        if kind in (TLV_PORT_DESCRIPTION, TLV_SYSTEM_NAME) and kind not in optional and value:
            optional[kind] = _text(value)
    return LldpNeighbour(
        chassis_id=chassis,
        port_id=port,
        system_name=optional.get(TLV_SYSTEM_NAME),
        port_description=optional.get(TLV_PORT_DESCRIPTION),
        ttl_seconds=int.from_bytes(ttl_value[:2], "big"),
        source=source,
    )


def tlv(kind: int, value: bytes) -> bytes:
    """One TLV (the tests' frame builder, and the inverse `tlvs` is checked against)."""
    if not 0 <= kind < 128 or len(value) > 511:
        raise ValueError("TLV type is 7 bits and its length 9 bits")
    return ((kind << 9) | len(value)).to_bytes(2, "big") + value


__all__ = ["ETH_P_LLDP", "LLDP_MULTICAST", "parse_lldpdu", "tlv", "tlvs"]
