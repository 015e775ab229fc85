"""Grant one capability to a file as a file capability (`setcap cap_net_raw+ep FILE`), by
writing its `security.capability` extended attribute directly, so the image needs no
libcap tools. The Dockerfile gives CAP_NET_RAW to a copy of the interpreter that only the
agent runs with `spec.topology.lldp` (docs/topology.md, "Privileges"), and CAP_IPC_LOCK to
copies of perftest's binaries that only the agents of validations with RDMA load tests find
(docs/loadtest.md, "Privileges").

`python -m netval.infra.file_caps [--cap net_raw|ipc_lock] FILE` (as root; net_raw when
not said).
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Final

CAP_NET_RAW: Final = 13
CAP_IPC_LOCK: Final = 14
CAPABILITIES: Final = {"net_raw": CAP_NET_RAW, "ipc_lock": CAP_IPC_LOCK}
# struct vfs_cap_data, revision 2 (linux/capability.h): magic_etc, then (permitted,
# inheritable) for capabilities 0-31 and 32-63. The effective flag raises what is permitted
# into the effective set at exec, for a program that does not raise it itself.
VFS_CAP_REVISION_2: Final = 0x02000000
VFS_CAP_FLAGS_EFFECTIVE: Final = 0x000001
XATTR: Final = "security.capability"


def capability_xattr(capability: int) -> bytes:
    """The xattr value of `cap_<capability>=ep` (one capability below 32)."""
    return struct.pack(
        "<5I", VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, 1 << capability, 0, 0, 0
    )


def net_raw_capability() -> bytes:
    """The xattr value of `cap_net_raw=ep`."""
    return capability_xattr(CAP_NET_RAW)


def grant_net_raw(path: str) -> None:
    os.setxattr(path, XATTR, net_raw_capability())


def main(argv: list[str]) -> int:
    name = "net_raw"
    if len(argv) == 3 and argv[0] == "--cap":
        name, argv = argv[1], argv[2:]
    if len(argv) != 1 or name not in CAPABILITIES:
        sys.stderr.write("usage: python -m netval.infra.file_caps [--cap net_raw|ipc_lock] FILE\n")
        return 2
    os.setxattr(argv[0], XATTR, capability_xattr(CAPABILITIES[name]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
