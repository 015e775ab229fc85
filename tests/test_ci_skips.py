"""CI cannot go green on skipped real tests: with NETVAL_REQUIRE_REAL_TESTS=1 (what .ci/run
sets as root) a skip, in a test or at a module's import, fails the run and says why; without
it skips pass and are counted. Checked on a pytest run of its own, with tests/conftest.py as
its plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SAMPLE = """
import pytest

def test_runs() -> None:
    assert True

@pytest.mark.skipif(True, reason="no broker here")
def test_needs_a_broker() -> None:
    pass

def test_skips_inside() -> None:
    pytest.skip("no network namespaces")

@pytest.mark.xfail(reason="known")
def test_expected_to_fail() -> None:
    raise AssertionError
"""
# a module skipped at import, and one test that runs (else pytest exits 5: no test ran)
MODULE_SKIP = 'import pytest\npytest.importorskip("no_such_module_here")\n'


def _run(tmp_path: Path, require: bool, module: str = SAMPLE) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(module)
    (tmp_path / "test_other.py").write_text("def test_runs() -> None:\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if k != "NETVAL_REQUIRE_REAL_TESTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    if require:
        env["NETVAL_REQUIRE_REAL_TESTS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("require", [False, True])
def test_skips_fail_the_run_when_real_tests_are_required(tmp_path: Path, require: bool) -> None:
    done = _run(tmp_path, require)
    out = done.stdout
    assert "real-test skips: 2" in out, out
    if require:
        assert done.returncode == 1, out
        assert "no broker here" in out and "no network namespaces" in out
        # a skipif mark skips in setup: an error there; a pytest.skip call: a failure
        assert "1 failed, 2 passed, 1 xfailed, 1 error" in out, out
    else:
        assert done.returncode == 0, out
        assert "2 passed, 2 skipped, 1 xfailed" in out, out


@pytest.mark.parametrize("require", [False, True])
def test_a_module_skipped_at_import_fails_the_run_too(tmp_path: Path, require: bool) -> None:
    done = _run(tmp_path, require, MODULE_SKIP)
    out = done.stdout
    assert "real-test skips: 1" in out and "no_such_module_here" in out, out
    assert (done.returncode != 0) is require, out  # (pytest exits 5 on no test: not here)
