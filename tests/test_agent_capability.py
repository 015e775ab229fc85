"""The agent's capability interpreter (Dockerfile; docs/topology.md "Privileges") as the
image makes it: a copy of the interpreter given cap_net_raw+ep by `netval.infra.file_caps`,
run as the agent's non-root uid, opens the LLDP listener's AF_PACKET socket; the plain
interpreter cannot. (Whether no_new_privs, i.e. allowPrivilegeEscalation: false, voids the
file capability is the kernel's: commoncap.c intersects the gained set with the old one under
no_new_privs, yet this machine's 6.18 kernel granted it; the DaemonSet allows escalation
with lldp on so that it works on either, and that is not asserted here.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from netval.infra.file_caps import grant_net_raw, net_raw_capability
from netval.operator.agents.agent_pod import AGENT_UID

SRC = Path(__file__).resolve().parent.parent / "src"
PROBE = (
    "from netval.agent.topology.listener import LldpListener\n"
    "import asyncio\n"
    "async def main():\n"
    "    lis = LldpListener()\n"
    "    print('open' if lis.start() else lis.error)\n"
    "asyncio.run(main())\n"
)


def test_the_xattr_is_what_setcap_writes() -> None:
    # `setcap cap_net_raw+ep FILE` then `getfattr -n security.capability -e hex FILE`
    assert net_raw_capability().hex() == "0100000200200000000000000000000000000000"


def as_agent(interpreter: Path, *setpriv: str) -> str:
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={AGENT_UID}",
            f"--regid={AGENT_UID}",
            "--clear-groups",
            *setpriv,
            str(interpreter),
            "-c",
            PROBE,
        ],
        env={"PYTHONPATH": os.pathsep.join(sys.path), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_only_the_capability_interpreter_opens_the_lldp_socket(tmp_path: Path) -> None:
    real = Path(os.path.realpath(sys.executable))
    tmp_path.chmod(0o755)
    copy = tmp_path / "python-netraw"
    shutil.copy2(real, copy)
    try:
        grant_net_raw(str(copy))
    except OSError as exc:
        pytest.skip(f"no security xattrs here: {exc}")
    readable = subprocess.run(
        ["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}", "--clear-groups",
         str(real), "-c", "import netval.model.topology"],
        env={"PYTHONPATH": os.pathsep.join(sys.path), "PATH": os.environ["PATH"]},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if readable.returncode != 0:
        # the image installs netval world-readable; a checkout in a private directory (a
        # `mktemp -d` clone is mode 0700) cannot be imported by the agent's uid at all
        pytest.skip(f"the checkout is not readable by uid {AGENT_UID}: "
                    f"{readable.stderr.strip().splitlines()[-1:]}")  # fmt: skip
    assert as_agent(copy) == "open"
    assert "no CAP_NET_RAW" in as_agent(real)
