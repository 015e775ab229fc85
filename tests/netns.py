"""Network-namespace hosts for tests: uniquely named namespaces with veth pairs.

Every namespace is called `nvt-<random>` and is deleted however the test ends (deleting a
namespace deletes the veths inside it). Links are driven through pyroute2 in the namespace;
nothing is configured outside it and no addresses are needed.

/sys/class/net shows the namespace of whoever mounted sysfs, so code that must see the
namespace's interfaces runs in a process started by `ip netns exec` (which remounts /sys):
see `Namespace.argv` / `Namespace.run`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyroute2 import IPRoute

PREFIX = "nvt-"
NOBODY = 65534


def unique_name(prefix: str = PREFIX) -> str:
    return f"{prefix}{secrets.token_hex(4)}"


def netval_script() -> str:
    """The `netval` console script of this interpreter (not a pyenv shim)."""
    candidate = Path(sysconfig.get_path("scripts")) / "netval"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("netval")
    if found is None:
        raise RuntimeError("the netval console script is not installed")
    return found


def skip_reason() -> str | None:
    """Why namespace tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespace tests need root (ip netns add, veth)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    return None


def require_netns() -> None:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)


@dataclass(frozen=True, slots=True)
class LinkState:
    operstate: str
    carrier: int | None
    carrier_changes: int | None
    mtu: int


class Namespace:
    """A network namespace created by `namespace()`; links are managed through netlink."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ipr: IPRoute | None = None

    # -- netlink -----------------------------------------------------------------------------

    @property
    def ipr(self) -> IPRoute:
        """A netlink socket inside the namespace, for the thread that made the namespace."""
        if self._ipr is None:
            self._ipr = IPRoute(netns=self.name, flags=0)
        return self._ipr

    def iproute(self) -> IPRoute:
        """A new socket inside the namespace (pyroute2 sockets are not shared by threads)."""
        return IPRoute(netns=self.name, flags=0)

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    def index(self, ifname: str, ipr: IPRoute | None = None) -> int:
        found = (ipr or self.ipr).link_lookup(ifname=ifname)
        if not found:
            raise LookupError(f"no interface {ifname} in namespace {self.name}")
        return int(found[0])

    def add_veth(
        self,
        ifname: str,
        peer: str,
        *,
        mtu: int | None = None,
        peer_mtu: int | None = None,
        up: bool = True,
        peer_up: bool = True,
    ) -> None:
        """A veth pair with both ends in this namespace; the peer decides the carrier."""
        self.ipr.link("add", ifname=ifname, kind="veth", peer={"ifname": peer})
        if mtu is not None:
            self.set_mtu(ifname, mtu)
        if peer_mtu is not None:
            self.set_mtu(peer, peer_mtu)
        # Peer first: the judged end then comes up straight into carrier on.
        if peer_up:
            self.set_up(peer)
        if up:
            self.set_up(ifname)

    def set_mtu(self, ifname: str, mtu: int) -> None:
        self.ipr.link("set", index=self.index(ifname), mtu=mtu)

    def set_up(self, ifname: str, ipr: IPRoute | None = None) -> None:
        ipr = ipr or self.ipr
        ipr.link("set", index=self.index(ifname, ipr), state="up")

    def set_down(self, ifname: str, ipr: IPRoute | None = None) -> None:
        ipr = ipr or self.ipr
        ipr.link("set", index=self.index(ifname, ipr), state="down")

    def link_state(self, ifname: str) -> LinkState:
        msg = self.ipr.link("get", index=self.index(ifname))[0]
        return LinkState(
            operstate=str(msg.get("IFLA_OPERSTATE")).lower(),
            carrier=msg.get("IFLA_CARRIER"),
            carrier_changes=msg.get("IFLA_CARRIER_CHANGES"),
            mtu=int(msg.get("IFLA_MTU")),
        )

    def wait_operstate(self, ifname: str, want: str, timeout: float = 5.0) -> LinkState:
        """Operstate follows carrier through the kernel's linkwatch work, a little later."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.link_state(ifname)
            if state.operstate == want:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{ifname} in {self.name}: operstate {state.operstate}, want {want}"
                )
            time.sleep(0.01)

    # -- processes inside the namespace ------------------------------------------------------

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run by `ip netns exec`: its own mount namespace with this netns's /sys."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("capture_output", True)
        return subprocess.run(self.argv(argv), text=True, timeout=timeout, **kwargs)


@contextmanager
def namespace(name: str | None = None) -> Iterator[Namespace]:
    """A new namespace, deleted on exit whatever happened inside (veths go with it)."""
    require_netns()
    name = name or unique_name()
    added = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if added.returncode != 0:
        pytest.skip(f"ip netns add is not available here: {added.stderr.strip()}")
    ns = Namespace(name)
    try:
        probe = ns.run(["true"], timeout=10)
        if probe.returncode != 0:
            pytest.skip(f"ip netns exec is not available here: {probe.stderr.strip()}")
        yield ns
    finally:
        ns.close()
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


class Flapper:
    """Toggles a link down and up from its own thread until stopped; ends with it up.

    Each toggle is one netlink request, so a window of one second sees dozens of carrier
    changes on the veth's other end.
    """

    def __init__(self, ns: Namespace, ifname: str, period: float = 0.02) -> None:
        self.ns = ns
        self.ifname = ifname
        self.period = period
        self.toggles = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"flap-{ifname}", daemon=True)

    def _run(self) -> None:
        try:
            with self.ns.iproute() as ipr:
                index = self.ns.index(self.ifname, ipr)
                try:
                    self._started.set()
                    while not self._stop.is_set():
                        ipr.link("set", index=index, state="down")
                        ipr.link("set", index=index, state="up")
                        self.toggles += 1
                        self._stop.wait(self.period)
                finally:
                    ipr.link("set", index=index, state="up")
        except BaseException as exc:
            self.error = exc
            self._started.set()

    def __enter__(self) -> Flapper:
        self._thread.start()
        if not self._started.wait(10):
            raise TimeoutError(f"flapper for {self.ifname} did not start")
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        if self._thread.is_alive():
            raise TimeoutError(f"flapper for {self.ifname} did not stop")


# -- running without privileges --------------------------------------------------------------

# Runs as root inside the private mount namespace of `ip netns exec`: makes the directories
# that hide the Python installation traversable (a 0755 tmpfs over each, with the needed
# children bind-mounted back), then drops to an unprivileged user and execs the command.
# Only that throwaway mount namespace changes; sysfs and everything the probe reads are
# untouched. Arguments: the caller's mount namespace (to refuse running in it), the
# directories as "dir:child,child;dir:child", the uid, then "--" and the command.
_UNLOCK_AND_DROP = r"""
import os, subprocess, sys, tempfile
host_mnt, spec, uid, cmd = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[5:]
if os.readlink("/proc/self/ns/mnt") == host_mnt:
    sys.exit("refusing to remount directories in the caller's mount namespace")
for item in filter(None, spec.split(";")):
    parent, children = item.split(":")
    staged = []
    for child in children.split(","):
        if os.path.isdir(os.path.join(parent, child)):
            stage = tempfile.mkdtemp(prefix="nvt-stage-")
        else:
            fd, stage = tempfile.mkstemp(prefix="nvt-stage-")
            os.close(fd)
        subprocess.run(["mount", "--bind", os.path.join(parent, child), stage], check=True)
        staged.append((child, stage))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "nvt-unlock", parent], check=True)
    for child, stage in staged:
        target = os.path.join(parent, child)
        if os.path.isdir(stage):
            os.mkdir(target)
        else:
            open(target, "x").close()
        subprocess.run(["mount", "--move", stage, target], check=True)
        (os.rmdir if os.path.isdir(stage) else os.unlink)(stage)
os.execvp("setpriv", ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                      "--no-new-privs", *cmd])
"""


def _hidden_dirs(paths: Sequence[str]) -> dict[str, set[str]]:
    """Directories on the way to `paths` that others may not traverse -> needed children."""
    hidden: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(os.path.realpath(path)).parts
        for depth in range(1, len(parts)):
            parent = str(Path(*parts[:depth]))
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                hidden.setdefault(parent, set()).add(parts[depth])
    return hidden


def unprivileged_argv(argv: Sequence[str], uid: int = NOBODY) -> list[str]:
    """`argv` run as `uid` with no capabilities; prefix with `Namespace.argv`.

    Reading sysfs, ETHTOOL_GSTATS and DCB netlink needs no privilege, but the interpreter may
    live under a 0700 directory (pyenv under /root): then that directory is made traversable
    in the private mount namespace first.
    """
    import netval

    needed = [sys.executable, sys.prefix, os.path.dirname(netval.__file__)]
    needed += [a for a in argv[:1] if os.path.isabs(a)]
    hidden = _hidden_dirs(needed)
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
    if not hidden:
        return [*drop, *argv]
    spec = ";".join(f"{d}:{','.join(sorted(c))}" for d, c in sorted(hidden.items()))
    host_mnt = os.readlink("/proc/self/ns/mnt")
    return [sys.executable, "-c", _UNLOCK_AND_DROP, host_mnt, spec, str(uid), "--", *argv]
