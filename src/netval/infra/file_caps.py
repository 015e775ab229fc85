"""Grant CAP_NET_RAW to one file as a file capability (`setcap cap_net_raw+ep FILE`), by
writing its `security.capability` extended attribute directly, so the image needs no
libcap tools. The Dockerfile gives it to a copy of the interpreter that only the agent runs
with `spec.topology.lldp` (docs/topology.md, "Privileges").

`python -m netval.infra.file_caps FILE` (as root).
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Final

CAP_NET_RAW: Final = 13
# struct vfs_cap_data, revision 2 (linux/capability.h): magic_etc, then (permitted,
# inheritable) for capabilities 0-31 and 32-63. The effective flag raises what is permitted
# into the effective set at exec, for a program that does not raise it itself.
VFS_CAP_REVISION_2: Final = 0x02000000
VFS_CAP_FLAGS_EFFECTIVE: Final = 0x000001
XATTR: Final = "security.capability"


def net_raw_capability() -> bytes:
    """The xattr value of `cap_net_raw=ep`."""
    return struct.pack(
        "<5I", VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, 1 << CAP_NET_RAW, 0, 0, 0
    )


def grant_net_raw(path: str) -> None:
    os.setxattr(path, XATTR, net_raw_capability())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m netval.infra.file_caps FILE\n")
        return 2
    grant_net_raw(argv[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
