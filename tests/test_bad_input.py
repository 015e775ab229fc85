"""Bad snapshots and configs: exit 2 and one clear line naming the file and field."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from netval.cli import main

HEALTHY = Path(__file__).resolve().parent.parent / "examples" / "snapshots" / "healthy-roce"
MTU = "samples/1/sys/class/net/ens1np0/mtu"
HW = "samples/0/sys/class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"


def _write(rel: str, data: bytes) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        (root / rel).write_bytes(data)

    return mutate


def _meta(**changes: object) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        meta = json.loads((root / "meta.json").read_text())
        meta.update(changes)
        (root / "meta.json").write_text(json.dumps(meta))

    return mutate


def _remove(rel: str) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    return mutate


SNAPSHOT_CASES = {
    "missing-meta": (_remove("meta.json"), "meta.json: missing"),
    "unknown-format": (_meta(format="netval-snapshot/9"), "field format: unsupported"),
    "meta-not-json": (_write("meta.json", b"{nope"), "meta.json: invalid JSON"),
    "meta-bad-interval": (_meta(interval_seconds=-1), "field interval_seconds"),
    "one-sample": (_remove("samples/1"), "1 sample(s), the format needs at least 2"),
    "non-numeric-mtu": (_write(MTU, b"nine thousand\n"), f"{MTU}: not an integer"),
    "non-utf8-counter": (_write(HW, b"\xff\xfe12\n"), f"{HW}: not UTF-8 text"),
    "ethtool-string-value": (
        _write("samples/0/ethtool/ens1np0.json", b'{"rx_discards_phy": "12"}'),
        "ethtool/ens1np0.json: field rx_discards_phy: expected a non-negative integer",
    ),
    "dcb-priority-out-of-range": (
        _write("samples/1/dcb/ens2np0.json", b'{"pfc_enabled": [9]}'),
        "dcb/ens2np0.json: field pfc_enabled.0",
    ),
    "dcb-error-not-one-line": (
        _write("samples/1/dcb/ens2np0.error", b"EOPNOTSUPP\nand more\n"),
        "dcb/ens2np0.error: expected one short line",
    ),
    "negative-format-minor": (_meta(format="netval-snapshot/1.-1"), "field format: unsupported"),
    "dcb-unknown-field": (
        _write("samples/1/dcb/ens2np0.json", b'{"pfc_enabled": [3], "pfc_mode": 1}'),
        "dcb/ens2np0.json: field pfc_mode: Extra inputs are not permitted",
    ),
}


@pytest.fixture
def snapshot_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "snap"
    shutil.copytree(HEALTHY, dst)
    return dst


@pytest.mark.parametrize("case", sorted(SNAPSHOT_CASES))
def test_bad_snapshot(case: str, snapshot_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mutate, expected = SNAPSHOT_CASES[case]
    mutate(snapshot_copy)
    code = main(["probe", "--from", str(snapshot_copy)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("netval: error: snap/") or lines[0].startswith(
        "netval: error: " + str(snapshot_copy)
    )
    assert expected in lines[0]


def test_missing_snapshot_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--from", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err


CONFIG_CASES = {
    "unknown-field": (
        "mtu: {interfaceMtu: 9000}\n",
        "field mtu.interfaceMtu: unknown field (did you mean interfaceMTU?)",
    ),
    "priority-out-of-range": (
        "pfc: {priorities: [3, 8]}\n",
        "field pfc.priorities.1: Input should be less than or equal to 7 (got 8)",
    ),
    "duplicate-priorities": ("pfc: {priorities: [3, 3]}\n", "priorities must be unique"),
    "bad-roce-mtu": ("mtu: {roceMTU: 3000}\n", "roceMTU must be one of"),
    "manifest-unknown-field": (
        "apiVersion: netval.io/v1alpha1\nkind: NetworkValidation\nmetadata: {name: x}\n"
        "spec: {checks: {ecn: {priority: [3]}}}\n",
        "field spec.checks.ecn.priority: unknown field (did you mean priorities?)",
    ),
    "manifest-short-interval": (
        "apiVersion: netval.io/v1alpha1\nkind: NetworkValidation\nmetadata: {name: x}\n"
        "spec: {interval: 1s}\n",
        "interval must be at least 5s",
    ),
    "wrong-kind": (
        "apiVersion: v1\nkind: ConfigMap\n",
        "field kind/apiVersion: expected NetworkValidation",
    ),
    "invalid-yaml": ("mtu: [unclosed\n", "invalid YAML at line"),
    "not-a-mapping": ("- 1\n- 2\n", "expected a NetworkValidation manifest or a checks mapping"),
    "two-documents": ("mtu: {}\n---\npfc: {}\n", "holds 2 YAML documents"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, expected = CONFIG_CASES[case]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    code = main(["probe", "--from", str(HEALTHY), "--config", str(cfg)])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"netval: error: {cfg}: ")
    assert expected in lines[0]


def test_non_utf8_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_bytes(b"mtu: {interfaceMTU: \xff}\n")
    assert main(["probe", "--from", str(HEALTHY), "--config", str(cfg)]) == 2
    assert capsys.readouterr().err == f"netval: error: {cfg}: not UTF-8 text\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["probe", "--samples", "0"],
        ["probe", "--interval", "soon"],
        ["probe", "--output", "xml"],
        ["snapshot"],
        ["frobnicate"],
    ],
)
def test_bad_usage_exits_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_snapshot_refuses_non_empty_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "keep.txt").write_text("precious")
    assert main(["snapshot", "--out", str(tmp_path), "--interval", "0"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "precious"


def test_process_prints_no_traceback(snapshot_copy: Path) -> None:
    """The installed console script, as a user runs it."""
    (snapshot_copy / MTU).write_bytes(b"\x00\x01garbage")
    proc = subprocess.run(
        [sys.executable, "-m", "netval.cli", "probe", "--from", str(snapshot_copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert f"{MTU}: not an integer" in proc.stderr
