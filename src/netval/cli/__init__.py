"""The `netval` command line; `netval.cli.main` holds the parser and the commands."""

from netval.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
