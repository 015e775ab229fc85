"""SIGHUP to the bundled Mosquitto when its mounted certificate is renewed.

Mosquitto (2.0 and later) reads `certfile`/`keyfile` again on SIGHUP; new handshakes get the
new certificate and open sessions keep running. The kubelet updates a mounted Secret by
swapping the `..data` symlink to a new timestamped directory, so the link's target names the
content; a directory not laid out that way (a hostPath, a test) is told apart by a hash of
its files instead. The broker container and this one share the pod's process namespace and
run as the same user, so the broker is found in /proc and signalled without capabilities.

`decide` is the pure part: what a poll's observation means for the broker. The rest reads
the directory and /proc and sends the signal, and never gives up: a missing directory or
broker is logged and looked at again at the next poll.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import ssl
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

log = logging.getLogger("netval.broker_reloader")

DEFAULT_INTERVAL: Final = 30.0  # seconds: the kubelet itself takes up to a minute to swap
DEFAULT_PROCESS: Final = "mosquitto"
DATA_LINK: Final = "..data"


@dataclass(frozen=True)
class Observation:
    """What one poll saw in the certificate directory."""

    data_target: str | None  # the `..data` link's target; None when there is no such link
    content: str  # sha256 over the files' names and contents
    loadable: bool  # the certificate and key load as a pair (a half-written pair does not)

    @property
    def version(self) -> str:
        # the kubelet's link names a complete set of files; without it only the bytes say
        return self.data_target if self.data_target is not None else self.content


class Action(StrEnum):
    WAIT = "wait"  # nothing to go by yet: no directory, or no loadable pair ever
    BASELINE = "baseline"  # the first pair seen: the broker started with it, nothing to do
    NONE = "none"  # unchanged since the broker was last told
    NOT_READY = "not-ready"  # changed, but the pair does not load (yet): tell nobody
    SIGNAL = "signal"  # changed and loadable: SIGHUP the broker


def decide(told: str | None, seen: Observation | None) -> Action:
    """`told`: the version the broker last loaded (None before the first pair was seen)."""
    if seen is None:
        return Action.WAIT
    if told is None:
        return Action.BASELINE if seen.loadable else Action.WAIT
    if seen.version == told:
        return Action.NONE
    return Action.SIGNAL if seen.loadable else Action.NOT_READY


def _pair_loads(cert: Path, key: Path) -> bool:
    # Straight from the mount (the sidecar's root filesystem is read-only: no scratch copy).
    # A pair read mid-update fails or hashes differently, and the next poll looks again.
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError):
        return False
    return True


def observe(directory: Path, cert: str = "tls.crt", key: str = "tls.key") -> Observation | None:
    """The directory's current version, or None when it is missing or unreadable."""
    try:
        target: str | None = os.readlink(directory / DATA_LINK)
    except FileNotFoundError:
        target = None
    except OSError:  # not a link (a plain directory): go by the content
        target = None
    digest = hashlib.sha256()
    try:
        names = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
        for name in names:
            path = directory / name
            if path.is_file():
                digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return None
    loadable = _pair_loads(directory / cert, directory / key)
    return Observation(target, digest.hexdigest(), loadable)


def find_processes(name: str, uid: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the processes called `name` (their comm) running as `uid`, except this one."""
    pids: list[int] = []
    me = os.getpid()
    try:
        entries = list(proc.iterdir())
    except OSError:
        return pids
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            comm = (entry / "comm").read_text().strip()
        except OSError:  # gone between the listing and the read
            continue
        if comm == name:
            pids.append(int(entry.name))
    return sorted(pids)


def send_hup(pids: list[int]) -> list[int]:
    """SIGHUP each pid; the ones that got it."""
    told: list[int] = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            continue
        except PermissionError as exc:
            log.warning("broker-reloader: may not signal pid %d: %s", pid, exc)
            continue
        told.append(pid)
    return told


@dataclass
class Reloader:
    directory: Path
    process: str = DEFAULT_PROCESS
    uid: int = os.getuid()
    proc: Path = Path("/proc")
    told: str | None = None  # the version the broker has loaded
    signals: int = 0  # SIGHUPs sent since start
    _waiting_logged: bool = False

    def poll(self) -> Action:
        seen = observe(self.directory)
        action = decide(self.told, seen)
        if action is Action.WAIT:
            if not self._waiting_logged:
                log.warning("broker-reloader: no loadable certificate in %s yet; waiting",
                            self.directory)  # fmt: skip
                self._waiting_logged = True
            return action
        self._waiting_logged = False
        assert seen is not None  # decide says WAIT for None
        if action is Action.BASELINE:
            log.info("broker-reloader: watching %s (version %s)", self.directory, seen.version)
            self.told = seen.version
        elif action is Action.NOT_READY:
            log.warning("broker-reloader: %s changed but the certificate and key do not load "
                        "as a pair yet; looking again at the next poll", self.directory)  # fmt: skip
        elif action is Action.SIGNAL:
            pids = send_hup(find_processes(self.process, self.uid, self.proc))
            if pids:
                # a broker that did not get it keeps `told`, so the next poll tries again
                self.told = seen.version
                self.signals += 1
                log.info("broker-reloader: %s changed (version %s): sent SIGHUP to %s pid %s",
                         self.directory, seen.version, self.process,
                         ", ".join(map(str, pids)))  # fmt: skip
            else:
                log.warning("broker-reloader: %s changed but no %s process of uid %d to tell; "
                            "trying again at the next poll", self.directory, self.process,
                            self.uid)  # fmt: skip
        return action

    def run(self, every: float, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll()
            except Exception:  # never die on a poll: the broker would keep the old certificate
                log.exception("broker-reloader: poll failed; trying again")
            stop.wait(every)
