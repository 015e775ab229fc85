"""Reads what the product says, as a user would see it: the NetworkValidation's status and
the targeted Nodes' label and taint, from the test API's store (no HTTP: polling must not
load the API the operator writes to), every `every` seconds on a thread of its own.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from detection_env import VALIDATION
from detection_score import Look
from kube import KubeCluster
from netval.model.keys import LabelKey, TaintKey
from operator_env import NV


def look(kube: KubeCluster, nodes: list[str]) -> Look:
    obj: dict[str, Any] = kube.stored(NV, "networkvalidations", VALIDATION) or {}
    status: dict[str, Any] = obj.get("status") or {}
    labels: dict[str, str | None] = {}
    tainted: set[str] = set()
    for node in nodes:
        stored = kube.stored("v1", "nodes", node) or {}
        labels[node] = (stored.get("metadata", {}).get("labels") or {}).get(LabelKey.FABRIC)
        taints = stored.get("spec", {}).get("taints") or []
        if any(t.get("key") == TaintKey.FABRIC_UNHEALTHY for t in taints):
            tainted.add(node)
    east_west: dict[str, Any] = status.get("eastWest") or {}
    return Look(
        at=time.monotonic(),
        labels=labels,
        tainted=frozenset(tainted),
        failures=tuple(
            (f["node"], f["check"], f.get("subject", "")) for f in status.get("failures") or []
        ),
        suspects=tuple(
            (s["node"], tuple(s.get("checks") or ())) for s in east_west.get("suspects") or []
        ),
        cells=tuple(
            (c["a"], c["b"], int(c.get("failing", 0))) for c in east_west.get("cells") or []
        ),
        links=tuple((x["kind"], x["a"], x.get("b")) for x in east_west.get("linkSuspects") or []),
    )


def trim(kube: KubeCluster, keep: int = 1000) -> None:
    """Bound the test API's memory over a long run: the stored versions of each object, the
    watch event log (older than any live watch needs) and the request stamps."""

    async def run() -> None:
        api = kube.api
        async with api._lock:
            for obj in api.objects.values():
                if len(obj.history) > 2 * keep // 100:
                    del obj.history[: -keep // 100]
            for log in api._event_log.values():
                if len(log) > 2 * keep:
                    del log[:-keep]
            if len(api.stamps) > 2 * keep:
                del api.stamps[:-keep]

    kube.call(run)


class Observer:
    """Looks every `every` seconds until stopped; `looks` grows (a look is ~1 kB)."""

    TRIM_EVERY = 60.0

    def __init__(self, kube: KubeCluster, nodes: list[str], every: float = 0.5) -> None:
        self.kube = kube
        self.nodes = nodes
        self.every = every
        self.looks: list[Look] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="detection-observer", daemon=True)

    def __enter__(self) -> Observer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        trimmed = time.monotonic()
        while not self._stop.is_set():
            try:
                self.looks.append(look(self.kube, self.nodes))
                if time.monotonic() - trimmed > self.TRIM_EVERY:
                    trim(self.kube)
                    trimmed = time.monotonic()
            except Exception:  # a read racing the API's own thread: the next look will do
                self.errors += 1
            self._stop.wait(self.every)

    def latest(self) -> Look | None:
        return self.looks[-1] if self.looks else None

    def since(self, at: float) -> list[Look]:
        return [k for k in list(self.looks) if k.at >= at]
