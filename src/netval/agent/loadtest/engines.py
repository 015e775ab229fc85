"""Which traffic engines this node has, and their versions (docs/loadtest.md, "Engines").

An engine the plan needs and the node lacks is `EngineUnavailable`, naming what is missing
(the binary, the RDMA device, its verbs device node, the privilege): the flow fails with
that error and the node's result says it once (`LoadResult.unavailable`). Never a silent
fallback to another engine: a figure from another engine would not be what was asked.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from netval.agent.loadtest.engine_process import run_engine

# The agent pod of a validation with RDMA load tests sets this: the image's perftest copies
# that hold cap_ipc_lock come first (netval.operator.agents.agent_pod.ENGINE_PATH).
ENV_ENGINE_PATH: Final = "NETVAL_ENGINE_PATH"
IPERF3: Final = "iperf3"
IB_WRITE_BW: Final = "ib_write_bw"
IB_WRITE_LAT: Final = "ib_write_lat"
SEARCH_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
PACKAGES: Final = {IPERF3: "iperf3", IB_WRITE_BW: "perftest", IB_WRITE_LAT: "perftest"}
VERSION_SECONDS: Final = 5.0
_VERSION: Final = re.compile(rb"(?:iperf |Version: ?)(\d+(?:\.\d+)+)")


class EngineUnavailable(Exception):
    """An engine part this node lacks; `what` says which."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def find_binary(name: str, which: Callable[[str], str | None] | None = None) -> str:
    """The path of engine binary `name`, or EngineUnavailable naming its package."""
    path = os.environ.get(ENV_ENGINE_PATH) or SEARCH_PATH
    found = which(name) if which is not None else shutil.which(name, path=path)
    if found is None:
        raise EngineUnavailable(
            f"{name} is not installed (Debian package {PACKAGES.get(name, name)})"
        )
    return found


def rdma_device_ready(
    device: str, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")
) -> None:
    """EngineUnavailable unless perftest can open `device`: it exists and its verbs device
    node (/dev/infiniband/uverbsN) is present and readable and writable in this container."""
    base = sys_root / "class" / "infiniband" / device
    if not base.exists():
        raise EngineUnavailable(f"perftest: no RDMA device {device} (/sys/class/infiniband)")
    try:
        verbs = sorted(p.name for p in (base / "device" / "infiniband_verbs").iterdir())
    except OSError:
        verbs = []
    if not verbs:
        raise EngineUnavailable(f"perftest: RDMA device {device} has no verbs device (uverbs)")
    node = dev_root / "infiniband" / verbs[0]
    if not node.exists():
        raise EngineUnavailable(
            f"perftest: {node} is missing in this container (the agent gets /dev/infiniband "
            "only for validations with RDMA load tests)"
        )
    if not os.access(node, os.R_OK | os.W_OK):
        raise EngineUnavailable(f"perftest: {node} is not readable and writable by the agent")


class Versions:
    """Engine versions, asked once per binary (`<binary> --version`)."""

    def __init__(self) -> None:
        self._known: dict[str, str] = {}

    async def of(self, binary: str) -> str:
        found = self._known.get(binary)
        if found is not None:
            return found
        start = time.time()
        run = await run_engine(
            [binary, "--version"],
            start_at=start,
            deadline=start + VERSION_SECONDS,
            halt=asyncio.Event(),
        )
        match = _VERSION.search(run.stdout + run.stderr)
        version = match.group(1).decode() if match else "unknown"
        self._known[binary] = version
        return version
