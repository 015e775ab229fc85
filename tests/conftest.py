"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import mosquitto as _mosquitto


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
