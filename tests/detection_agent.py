"""`netval agent`, the real entry point, with one collector part standing in: DCB state.

A veth has no DCB netlink operations (EOPNOTSUPP), so the campaign's nodes
(tests/detection_fabric.py) would never be judged on PFC and DSCP trust. Here the live
collector's DCB reader reads `<NVT_RECORDED_DCB>/<ifname>.json` (the netval-snapshot/1 DCB
file: `pfc_enabled`, `pfc_requests`, `pfc_indications`, `app`) on every sample when that
file exists, and asks the kernel otherwise. Everything else is the agent as shipped.

    NVT_RECORDED_DCB=/dir python tests/detection_agent.py    # then: netval agent
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from netval.agent.collect import live
from netval.agent.collect.dcb_netlink import DcbReader
from netval.cli.main import main
from netval.model.snapshot import Dcb, DcbApp


class RecordedDcb:
    """What `LiveCollector` calls of a `DcbReader`: `read`, `last_error`, `close`. Any other
    attribute raises AttributeError (a stand-in fails loudly on a call it does not know)."""

    __slots__ = ("_dir", "_kernel", "last_error")

    def __init__(self) -> None:
        self._dir = Path(os.environ["NVT_RECORDED_DCB"])
        self._kernel = DcbReader()
        self.last_error: str | None = None

    def read(self, ifname: str) -> Dcb | None:
        path = self._dir / f"{ifname}.json"
        if not path.is_file():
            found = self._kernel.read(ifname)
            self.last_error = self._kernel.last_error
            return found
        doc = json.loads(path.read_text())
        self.last_error = None
        return Dcb(
            pfc_enabled=frozenset(int(p) for p in doc["pfc_enabled"]),
            pfc_requests=tuple(int(n) for n in doc["pfc_requests"]),
            pfc_indications=tuple(int(n) for n in doc["pfc_indications"]),
            app=tuple(DcbApp(a["selector"], a["protocol"], a["priority"]) for a in doc["app"]),
        )

    def close(self) -> None:
        self._kernel.close()


if __name__ == "__main__":
    live.DcbReader = RecordedDcb  # type: ignore[misc, assignment]
    sys.exit(main(["agent", *sys.argv[1:]]))
