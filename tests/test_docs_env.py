"""docs/architecture.md lists every environment variable and flag the code reads, and no more.

The code side is scanned, not hand-listed: every string constant in src/ that looks like one
of our variables (NETVAL_*, OTEL_*), every `ENV_*` constant, and every literal argument of
os.environ.get / os.getenv / os.environ[...] / `in os.environ`; the flags come from the
argument parser itself. The docs side is the "Environment variables and flags" section."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from netval.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Environment variables and flags"
VARIABLE = re.compile(r"^(NETVAL|OTEL)_[A-Z0-9_]*[A-Z0-9]$")


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def code_variables() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            text = _literal(node)
            if text is not None and VARIABLE.match(text):
                names.add(text)
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = _literal(node.value) if node.value is not None else None
                if value and any(isinstance(t, ast.Name) and t.id.startswith("ENV_")
                                 for t in targets):  # fmt: skip
                    names.add(value)
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                arg = _literal(node.args[0])
                env_get = (
                    isinstance(func, ast.Attribute)
                    and func.attr == "get"
                    and _is_environ(func.value)
                )
                getenv = isinstance(func, ast.Attribute) and func.attr == "getenv"
                if arg and (env_get or getenv):
                    names.add(arg)
            key = None
            if isinstance(node, ast.Subscript) and _is_environ(node.value):
                key = _literal(node.slice)
            if isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
                key = _literal(node.left)
            if key is not None:
                names.add(key)
    return names


def code_flags() -> set[tuple[str, str]]:
    flags: set[tuple[str, str]] = set()
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                for a in sub._actions:
                    for option in a.option_strings:
                        if option.startswith("--") and option != "--help":
                            flags.add((command, option))
    return flags


def documented() -> tuple[set[str], set[tuple[str, str]]]:
    text = (REPO / "docs" / "architecture.md").read_text()
    assert SECTION in text, f"docs/architecture.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    variables: set[str] = set()
    flags: set[tuple[str, str]] = set()
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        first = re.findall(r"`([^`]+)`", cells[0])
        if first and first[0].startswith("netval "):  # | `netval status` | `--nodes` | ...
            command = first[0].split()[1]
            for flag in re.findall(r"`(--[a-z0-9-]+)", cells[1] if len(cells) > 1 else ""):
                flags.add((command, flag))
        else:
            variables.update(n for n in first if re.match(r"^[A-Z][A-Z0-9_]+$", n))
    return variables, flags


def test_every_environment_variable_is_documented() -> None:
    docs, _ = documented()
    code = code_variables()
    assert code - docs == set(), "read by the code, not in docs/architecture.md"
    assert docs - code == set(), "in docs/architecture.md, read by no code"


def test_every_flag_is_documented() -> None:
    _, docs = documented()
    code = code_flags()
    assert code - docs == set(), "flags not in docs/architecture.md"
    assert docs - code == set(), "documented flags that do not exist"
