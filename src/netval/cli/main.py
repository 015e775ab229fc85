"""`netval` command line: dispatch to the commands, turn BadInput into one line and exit 2.

The commands live next to this module: `parser` (every flag), `probe` (probe, snapshot),
`cluster` (status, report), `doctor`, `processes` (agent, operator); `common` holds the exit
codes, BadInput and the config and kubeconfig loaders. Exit codes (a contract for scripts and
CI): 0 nothing failed, 1 a check failed or a validation is not Healthy, 2 bad usage or bad
input (one line on stderr naming the file, flag or variable).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from netval.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_UNHEALTHY,
    MAX_CONFIG_BYTES,
    BadInput,
    load_probe_config,
)
from netval.cli.parser import build_parser

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_OK",
    "EXIT_UNHEALTHY",
    "MAX_CONFIG_BYTES",
    "BadInput",
    "build_parser",
    "load_probe_config",
    "main",
]


def _handler(command: str) -> Callable[[argparse.Namespace], int]:
    # Imported on use: `netval probe` does not pay for the Kubernetes client, and back.
    if command in ("probe", "snapshot"):
        from netval.cli import probe

        return probe.cmd_probe if command == "probe" else probe.cmd_snapshot
    if command in ("status", "report"):
        from netval.cli import cluster

        return cluster.cmd_status if command == "status" else cluster.cmd_report
    if command == "doctor":
        from netval.cli.doctor import cmd_doctor

        return cmd_doctor
    if command == "broker-reloader":
        from netval.cli.broker_reloader import cmd_broker_reloader

        return cmd_broker_reloader
    from netval.cli import processes

    if command == "uninstall-cleanup":
        return processes.cmd_uninstall_cleanup
    return processes.cmd_agent if command == "agent" else processes.cmd_operator


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _handler(args.command)(args)
    except BadInput as exc:
        sys.stderr.write(f"netval: error: {exc}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
