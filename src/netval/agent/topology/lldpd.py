"""Neighbours from the node's own lldpd: `lldpcli -f json show neighbors`.

Used when the agent cannot read frames itself (no CAP_NET_RAW) and the node runs lldpd
with its control socket mounted into the pod. lldpcli's JSON has one shape quirk: with one
interface, `lldp.interface` is an object keyed by name; with several, a list of such
objects (and the same for `chassis`). The parser takes both and anything else as "nothing",
never raising: the daemon's output is input like any other.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any, Final

from netval.model.topology import (
    MAX_NEIGHBOURS_PER_INTERFACE,
    MAX_TOPOLOGY_INTERFACES,
    LldpNeighbour,
    NeighbourSource,
)

DEFAULT_SOCKET: Final = "/run/lldpd.socket"
LLDPCLI_TIMEOUT: Final = 5.0
MAX_OUTPUT: Final = 1 << 20


def _entries(value: Any) -> Iterator[tuple[str, Any]]:
    """(name, body) pairs of `{name: body}` or `[{name: body}, ...]`."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, dict):
            yield from ((str(k), v) for k, v in item.items())


def _id_value(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("value")
    return value if isinstance(value, str) and value else None


def _neighbour(body: Any) -> LldpNeighbour | None:
    if not isinstance(body, dict):
        return None
    chassis = next(_entries(body.get("chassis")), None)
    port = body.get("port")
    if chassis is None or not isinstance(port, dict):
        return None
    system_name, chassis_body = chassis
    chassis_id = _id_value(chassis_body.get("id") if isinstance(chassis_body, dict) else None)
    port_id = _id_value(port.get("id"))
    if chassis_id is None or port_id is None:
        return None
    descr = port.get("descr")
    try:
        ttl = max(0, min(int(str(port.get("ttl", "0"))), 65535))
    except ValueError:
        ttl = 0
    return LldpNeighbour(
        chassis_id=chassis_id,
        port_id=port_id,
        system_name=system_name or None,
        port_description=descr if isinstance(descr, str) and descr else None,
        ttl_seconds=ttl,
        source=NeighbourSource.LLDPD,
    )


def parse_lldpcli(text: str) -> dict[str, list[LldpNeighbour]]:
    """netdev -> its neighbours, from `lldpcli -f json show neighbors` output."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    lldp = doc.get("lldp") if isinstance(doc, dict) else None
    out: dict[str, list[LldpNeighbour]] = {}
    for name, body in _entries(lldp.get("interface") if isinstance(lldp, dict) else None):
        neighbour = _neighbour(body)
        if neighbour is None or len(name) > 15:
            continue
        if name not in out and len(out) >= MAX_TOPOLOGY_INTERFACES:
            continue
        found = out.setdefault(name, [])
        if len(found) < MAX_NEIGHBOURS_PER_INTERFACE:
            found.append(neighbour)
    return out


def lldpd_unavailable(socket_path: str) -> str | None:
    """Why the local lldpd cannot be asked, or None."""
    if shutil.which("lldpcli") is None:
        return "lldpcli is not installed"
    if not os.path.exists(socket_path):
        return f"no lldpd socket at {socket_path}"
    return None


async def query_lldpd(socket_path: str) -> dict[str, list[LldpNeighbour]]:
    """The local lldpd's neighbours; raises OSError/TimeoutError when it does not answer."""
    proc = await asyncio.create_subprocess_exec(
        "lldpcli",
        "-u",
        socket_path,
        "-f",
        "json",
        "show",
        "neighbors",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(LLDPCLI_TIMEOUT):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise OSError(f"lldpcli exited {proc.returncode}: {err.decode(errors='replace')[:200]}")
    return parse_lldpcli(out[:MAX_OUTPUT].decode(errors="replace"))


__all__ = ["DEFAULT_SOCKET", "lldpd_unavailable", "parse_lldpcli", "query_lldpd"]
