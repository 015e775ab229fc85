"""Run the real Kopf operator in-process against the ``kube`` test API for one test.

    from kopf_harness import kopf_operator
    from kube import wait_for

    def test_something(kube):
        with kopf_operator(kube, modules=["netval.operator.handlers"]) as run:
            run.wait_for_watch("netval.io/v1alpha1", "networkvalidations")
            kube.create({...})
            wait_for(lambda: kube.stored(...)["status"] ..., what="...")
        # leaving the block stops Kopf and fails on its ERROR records (see below)

Kopf runs with ``kopf.operator(...)`` in a thread of its own with its own event loop (so Kopf
cancelling "every task created during its run" hits only its own tasks, never pytest's), in
cluster-wide standalone mode (no peering), and stops when the ``with`` block ends (well under
a second with :func:`fast_settings`).

- Credentials: Kopf's vault is pre-filled with the kube URL, so no login handler runs and the
  global ``kubernetes`` client configuration is not touched by Kopf. ``KUBECONFIG`` (and the
  official client's default location, frozen at its import) points at ``kube.kubeconfig_path``
  for the run, so handlers that call ``kubernetes.config.load_kube_config()`` (or
  ``new_client_from_config()``) without a path reach the same API.
- Handlers: ``registry=`` a ``kopf.OperatorRegistry()`` holding the test's handlers
  (``@kopf.on.create(..., registry=REGISTRY)``), or by default Kopf's global registry, filled by
  importing ``modules``. Throwaway handlers in tests must use their own registry: handlers
  decorated without one stay in the global registry and would run in every later operator test.
- Settings: :func:`fast_settings` (short watch/request timeouts and retry backoffs, events
  posted); pass ``settings=`` to change them. The operator's own ``@kopf.on.startup`` handlers
  run after these settings are made and may override them.
- Events: ``kopf.event()/info()/warn()/exception()`` are posted (``posting.enabled``); Kopf's
  default of not posting its log messages as events (``posting.loggers``) is kept.
- Failures: an exception of the operator is re-raised when the block ends, and so are Kopf's log
  records at ``fail_level`` (ERROR) or above -- e.g. "Handler ... failed with an exception",
  which Kopf itself only logs and retries. Pass ``fail_level=None`` when a test provokes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import kopf
from kopf._cogs.structs import credentials  # the vault is not public; pinned kopf version

from kube import KubeCluster, kubeconfig_env, wait_for


def fast_settings() -> kopf.OperatorSettings:
    """Kopf settings for tests: reconnects, retries and shutdown in (sub)seconds."""
    settings = kopf.OperatorSettings()
    # The kube API ends each watch after server_timeout; Kopf resumes from its resourceVersion.
    settings.watching.server_timeout = 10
    settings.watching.client_timeout = 20
    settings.watching.connect_timeout = 2
    settings.watching.reconnect_backoff = 0.1
    settings.networking.request_timeout = 10
    settings.networking.connect_timeout = 2
    settings.networking.error_backoffs = [0.1, 0.2, 0.5]
    settings.execution.default_backoff = 0.5  # retry of a failed handler (Kopf's default: 60 s)
    settings.posting.enabled = True
    settings.posting.level = logging.INFO
    settings.posting.default_backoffs = [0.1, 0.2, 0.5]
    settings.posting.logging_backoffs = [0.1, 0.2]
    settings.queueing.exit_timeout = 2.0
    settings.process.ultimate_exiting_timeout = 30
    return settings


# Caused by running Kopf in a thread, not by the operator.
_BENIGN = {"OS signals are ignored: running not in the main thread."}


def _describe(record: logging.LogRecord) -> str:
    text = f"{record.levelname} {record.name}: {record.getMessage()}"
    if record.exc_info:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    return text


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_records:
            self.records.append(record)


class OperatorRun:
    """A running operator: its settings, its captured ``kopf.*`` log records, sync points."""

    def __init__(self, kube: KubeCluster, settings: kopf.OperatorSettings) -> None:
        self.kube = kube
        self.settings = settings
        self._records = _Records()
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.exception: BaseException | None = None
        self.finished = threading.Event()

    @property
    def records(self) -> list[logging.LogRecord]:
        return list(self._records.records)

    def messages(self, level: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]

    def errors(self, level: int = logging.ERROR) -> list[logging.LogRecord]:
        """Kopf's records at ``level`` or above, but those the harness itself causes."""
        return [r for r in self.records if r.levelno >= level and r.getMessage() not in _BENIGN]

    def wait_for_watch(self, api_version: str, kind: str, timeout: float = 10.0) -> None:
        """Block until a watch on the resource is open (Kopf's, once it has listed it): from
        then on every change reaches the operator. E.g. ``("netval.io/v1alpha1", "netval")``."""
        wait_for(
            lambda: self.kube.watchers(api_version, kind) > 0,
            timeout=timeout,
            what=f"a watch on {kind} {api_version}",
        )

    def wait_for_log(self, fragment: str, timeout: float = 10.0) -> str:
        """Block until a ``kopf.*`` log message contains ``fragment``; return it."""
        return wait_for(
            lambda: next((m for m in self.messages() if fragment in m), None),
            timeout=timeout,
            what=f"a Kopf log message with {fragment!r}",
        )


@contextlib.contextmanager
def kopf_operator(
    kube: KubeCluster,
    *,
    registry: kopf.OperatorRegistry | None = None,
    modules: Iterable[str] = (),
    settings: kopf.OperatorSettings | None = None,
    namespaces: Iterable[str] = (),
    standalone: bool = True,
    memo: Any = None,
    startup_timeout: float = 10.0,
    stop_timeout: float = 15.0,
    fail_level: int | None = logging.ERROR,
) -> Iterator[OperatorRun]:
    """Run Kopf against ``kube`` for the ``with`` block (cluster-wide unless ``namespaces``)."""
    for module in modules:
        importlib.import_module(module)
    run = OperatorRun(kube, settings if settings is not None else fast_settings())
    namespaces = list(namespaces)

    kopf_logger = logging.getLogger("kopf")
    old_level = kopf_logger.level
    kopf_logger.addHandler(run._records)
    kopf_logger.setLevel(logging.DEBUG)
    env = kubeconfig_env(kube.kubeconfig_path)
    env.__enter__()

    async def main() -> None:
        vault = credentials.Vault()
        await vault.populate({"kube-test-api": kopf.ConnectionInfo(server=kube.url)})
        await kopf.operator(
            registry=registry,
            settings=run.settings,
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=standalone,
            stop_flag=run.stop_flag,
            ready_flag=run.ready_flag,
            vault=vault,
            memo=memo,
        )

    def target() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
        except BaseException as e:
            run.exception = e
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            run.finished.set()
            run.ready_flag.set()  # unblock the starter if the operator died early

    thread = threading.Thread(target=target, name="kopf-operator", daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + startup_timeout
        while not run.ready_flag.wait(0.05):
            # Kopf logs a failed startup activity and then idles until stopped: fail early.
            if (bad := run.errors()) or time.monotonic() > deadline:
                details = "".join(f"\n{_describe(r)}" for r in bad)
                raise RuntimeError(f"the operator did not start in {startup_timeout}s{details}")
        if run.finished.is_set():
            raise RuntimeError("the operator exited during startup") from run.exception
        yield run
    finally:
        run.stop_flag.set()
        thread.join(stop_timeout)
        kopf_logger.removeHandler(run._records)
        kopf_logger.setLevel(old_level)
        env.__exit__(None, None, None)
    if thread.is_alive():
        raise RuntimeError(f"the operator did not stop in {stop_timeout}s")
    if run.exception is not None:
        raise RuntimeError("the operator failed") from run.exception
    if fail_level is not None and (bad := run.errors(fail_level)):
        lines = "\n".join(_describe(r) for r in bad)
        raise AssertionError(
            f"the operator logged {len(bad)} record(s) at {logging.getLevelName(fail_level)}+:\n{lines}"
        )
