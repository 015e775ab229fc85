"""This node's fabric address and the endpoints of its peers (the payloads agents and the
operator publish about them: `netval.model.peer_assignment`)."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from netval.agent.checks.judged import judged_subjects
from netval.model.snapshot import Sample
from netval.model.spec import Checks


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: str
    port: int
    domain: str | None


def first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(payload)"
    return f"{where}: {err['msg']}"


# -- the fabric address ---------------------------------------------------------------------

_SIOCGIFADDR: Final = 0x8915


def interface_address(ifname: str, proc_root: Path = Path("/proc")) -> str | None:
    """The first IPv4 address of `ifname`, else its first global IPv6 address, else None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            request = struct.pack("256s", ifname.encode()[:15])
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            return socket.inet_ntop(socket.AF_INET, answer[20:24])
        except OSError:
            pass
    try:
        lines = (proc_root / "net" / "if_inet6").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) == 6 and fields[5] == ifname and fields[3] == "00":  # global scope
            return str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
    return None


def first_rdma_netdev(sample: Sample, checks: Checks) -> str | None:
    netdevs = judged_subjects(sample, checks).rdma_netdevs
    return netdevs[0] if netdevs else None
