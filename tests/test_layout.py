"""The import directions that keep the data path readable, checked on the source tree.

agent and operator never import each other; model imports nothing of netval outside model;
infra (process plumbing) imports neither component; the pure checks import no I/O.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import netval

PACKAGE = Path(netval.__file__).resolve().parent

# Modules that do I/O: a check importing one of them is no longer a pure function of
# (snapshot, expectations).
IO_MODULES = (
    "socket",
    "ssl",
    "asyncio",
    "subprocess",
    "pyroute2",
    "aiomqtt",
    "kubernetes",
    "kopf",
    "netval.agent.collect",
    "netval.infra",
)


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> Iterator[str]:
    """Every module name `path` imports, relative imports resolved, `from a import b` as a.b."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            yield name
            yield from (f"{name}.{alias.name}" for alias in node.names)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def offenders(subpackage: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    root = PACKAGE.joinpath(*subpackage.split(".")[1:])
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        bad = sorted({n for n in imports_of(path) if any(_within(n, f) for f in forbidden)})
        if bad:
            found[str(path.relative_to(PACKAGE))] = bad
    return found


def test_agent_never_imports_the_operator() -> None:
    assert offenders("netval.agent", ("netval.operator",)) == {}


def test_operator_never_imports_the_agent() -> None:
    assert offenders("netval.operator", ("netval.agent",)) == {}


def test_model_imports_nothing_of_netval_outside_model() -> None:
    outside = ("netval.agent", "netval.operator", "netval.infra", "netval.cli")
    assert offenders("netval.model", outside) == {}


def test_infra_imports_neither_component_nor_the_cli() -> None:
    assert offenders("netval.infra", ("netval.agent", "netval.operator", "netval.cli")) == {}


def test_checks_import_no_io() -> None:
    assert offenders("netval.agent.checks", IO_MODULES) == {}


@pytest.mark.parametrize(
    ("source", "where", "expected"),
    [
        ("from netval import agent\n", "operator/x.py", "netval.agent"),
        ("from ..agent import runner\n", "operator/x.py", "netval.agent.runner"),
        ("import netval.agent.main\n", "operator/x.py", "netval.agent.main"),
        ("from . import sysfs\n", "agent/collect/x.py", "netval.agent.collect.sysfs"),
        ("from .. import collect\n", "agent/checks/x.py", "netval.agent.collect"),
        ("from ...operator import y\n", "agent/checks/x.py", "netval.operator.y"),
    ],
)
def test_the_scan_resolves_every_import_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, where: str, expected: str
) -> None:
    # A scan that misses a form would let the rules above pass vacuously.
    fake_root = tmp_path / "netval"
    target = fake_root / where
    target.parent.mkdir(parents=True)
    target.write_text(source)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake_root)
    assert expected in set(imports_of(target))


def test_every_subpackage_rule_looks_at_real_files() -> None:
    for sub in ("agent", "operator", "model", "infra", "agent/checks"):
        assert list((PACKAGE / sub).rglob("*.py")), sub
