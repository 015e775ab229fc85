"""The `netval` command line; `netval.cli.main` dispatches, `netval.cli.parser` holds the flags."""

from netval.cli.common import load_probe_config
from netval.cli.main import build_parser, main

__all__ = ["build_parser", "load_probe_config", "main"]
