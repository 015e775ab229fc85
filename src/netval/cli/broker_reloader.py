"""`netval broker-reloader`: the broker pod's sidecar that SIGHUPs Mosquitto on a renewal.

Runs until SIGTERM (the pod stopping), then exits 0; see netval.infra.broker_reloader."""

from __future__ import annotations

import argparse
import signal
import threading
from types import FrameType

from netval.cli.common import EXIT_OK
from netval.cli.processes import setup_logging


def cmd_broker_reloader(args: argparse.Namespace) -> int:
    from netval.infra.broker_reloader import Reloader

    setup_logging()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    Reloader(args.dir, process=args.process).run(args.interval, stop)
    return EXIT_OK
