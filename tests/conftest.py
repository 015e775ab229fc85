"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import mosquitto as _mosquitto

# Fuzz tests run on a shared 2-core CI machine: generation speed and size are not what they
# test, so those health checks stay off. Under CI the examples are derandomized, so a red
# build is reproducible from the commit alone (locally every run explores new inputs).
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", deadline=None, suppress_health_check=_QUIET, derandomize=True)
settings.register_profile("dev", deadline=None, suppress_health_check=_QUIET)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# CI must not go green on skipped real tests (a real broker, network namespaces, Chromium,
# capabilities: what the README's measured figures rest on). With NETVAL_REQUIRE_REAL_TESTS=1
# (.ci/run sets it; CI runs as root with every tool installed) a skip is a failure that says
# what was missing; the summary counts the skips either way.
REQUIRE_REAL_TESTS = os.environ.get("NETVAL_REQUIRE_REAL_TESTS") == "1"
_SKIPS: list[str] = []


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        _SKIPS.append(f"{item.nodeid}: {reason}")
        if REQUIRE_REAL_TESTS:
            report.outcome = "failed"
            report.longrepr = (
                f"skipped with NETVAL_REQUIRE_REAL_TESTS=1 (a real test must run here): {reason}"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped:  # a module-level skip (importorskip, pytestmark at import)
        reason = _skip_reason(report)
        _SKIPS.append(f"{collector.nodeid}: {reason}")
        if REQUIRE_REAL_TESTS:
            report.outcome = "failed"
            report.longrepr = (
                f"skipped with NETVAL_REQUIRE_REAL_TESTS=1 (a real test must run here): {reason}"
            )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    mode = "failures" if REQUIRE_REAL_TESTS else "allowed: NETVAL_REQUIRE_REAL_TESTS is not 1"
    terminalreporter.write_line(f"real-test skips: {len(_SKIPS)} ({mode})")
    for line in _SKIPS[:50]:
        terminalreporter.write_line(f"  skipped: {line}")


@pytest.fixture
def mosquitto_broker(tmp_path: Path) -> Iterator[_mosquitto.MosquittoBroker]:
    """A real Mosquitto broker on a free 127.0.0.1 port (password auth, no persistence),
    one per test. ``.address`` is (host, port, username, password); ``.stop()`` and
    ``.restart()`` keep the port. Skips when mosquitto is not installed."""
    if not _mosquitto.available():
        pytest.skip(_mosquitto.MISSING_REASON)
    workdir = tmp_path / "mosquitto"
    workdir.mkdir()
    broker = _mosquitto.MosquittoBroker(workdir)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


# --- Kubernetes: a stateful kmock-based API over real HTTP (tests/kube.py) ------------------


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[object]:
    """A stateful Kubernetes API (kmock + apiserver stamping, see tests/kube.py) on a free
    127.0.0.1 port, one per test (a ``kube.KubeCluster``): ``.url``, ``.kubeconfig_path``
    (``KUBECONFIG`` and the official client's default config point at it during the test),
    client helpers ``create/get/list/patch/replace/delete/watch`` over HTTP,
    ``.stored(...)``/``.store()`` for asserts, ``.api_client()`` for the official client.
    Run Kopf against it with ``kopf_harness.kopf_operator(kube, ...)``."""
    pytest.importorskip("kmock", reason="kmock is not installed (pip install kmock==0.8)")
    import kube as _kube

    api = _kube.KubeCluster(tmp_path / "kube").start()
    try:
        with _kube.kubeconfig_env(api.kubeconfig_path):
            yield api
    finally:
        api.stop()


# The operator tests' fixtures (`cluster`, `operator`), shared by several test files.
from operator_env import cluster, operator  # noqa: E402, F401
