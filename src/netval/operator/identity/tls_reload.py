"""The enrollment server's certificate, picked up again when its files change.

cert-manager renews the webhook's certificate (which enrollment serves) weeks before it
expires and the kubelet swaps the mounted Secret's files in place (a symlink swap of the
`..data` directory): nothing restarts the operator, so without this the server would present
the old certificate until it expired. The files are polled (`os.stat` follows the symlinks,
so the swap shows as a new inode and mtime; a few stats every 10 s cost nothing); a change
loads the pair into the same `SSLContext`, which new handshakes use (connections already
open keep theirs). A pair that does not load (caught between the two files' writes, a key
that does not match) leaves the current one in place, tried again at the next poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from pathlib import Path
from typing import Final

log = logging.getLogger("netval.operator.identity")

RELOAD_EVERY: Final = 10.0  # seconds: cert-manager renews days ahead, so this is plenty

Stamp = tuple[tuple[int, int, int], ...]  # (mtime_ns, inode, size) per file


def _stamp(paths: tuple[Path, ...]) -> Stamp | None:
    try:
        return tuple((s.st_mtime_ns, s.st_ino, s.st_size) for s in map(os.stat, paths))
    except OSError:
        return None  # one file missing mid-swap: look again next time


class CertReloader:
    def __init__(
        self, context: ssl.SSLContext, cert: Path, key: Path, *, every: float = RELOAD_EVERY
    ) -> None:
        self.context = context
        self.paths = (cert, key)
        self.every = every
        self.loaded = _stamp(self.paths)
        self.reloads = 0  # certificates picked up since start
        self.failures = 0  # changed files that did not load

    def check(self) -> bool:
        """Load the pair again if the files changed since the last load; True if it did."""
        stamp = _stamp(self.paths)
        if stamp is None or stamp == self.loaded:
            return False
        try:
            with tempfile.TemporaryDirectory(prefix="netval-enroll-cert-") as scratch:
                # One snapshot of the pair, tried on a scratch context first: a failed
                # load_cert_chain leaves a context with the new certificate and the old key,
                # which no handshake survives.
                copies = (Path(scratch) / "cert.pem", Path(scratch) / "key.pem")
                for path, copy in zip(self.paths, copies, strict=True):
                    copy.write_bytes(path.read_bytes())
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(*copies)
                self.context.load_cert_chain(*copies)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self.failures += 1
            log.warning("enrollment: the changed certificate does not load yet: %s", exc)
            return False
        self.loaded = stamp
        self.reloads += 1
        log.info("enrollment: serving the renewed certificate %s", self.paths[0])
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            # a few stats and, rarely, a file read: not worth a thread
            self.check()
