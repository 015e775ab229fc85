"""The benches' Kubernetes API stand-ins fail loudly: an unknown call raises (bench/ingest.py's
answered None to any name for months and reported 0 status patches), and each implements
every `KubeApi` call the parts it stands in for make (status writer, Events, node gating)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
CALLERS = [
    "src/netval/operator/status/writer.py",
    "src/netval/operator/status/events.py",
    "src/netval/operator/gating/node_writer.py",
    "src/netval/operator/term_runtime.py",
    "src/netval/operator/metrics.py",
    "src/netval/operator/loadtest/reserve.py",
]


def bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def kube_calls() -> set[str]:
    calls: set[str] = set()
    for path in CALLERS:
        calls |= set(re.findall(r"(?:self|rt)\.kube\.(\w+)", (REPO / path).read_text()))
    return calls


@pytest.mark.parametrize("name", ["ingest", "broker_restart"])
def test_the_stand_in_implements_every_call_and_refuses_others(name: str) -> None:
    module = bench(name)
    kube = module.RecordingKube(module.Probe()) if name == "ingest" else module.RecordingKube()
    calls = kube_calls()
    assert {"patch_status", "set_node_gating", "set_node_label", "post_event", "retries"} <= calls
    missing = sorted(c for c in calls if not hasattr(type(kube), c))
    assert not missing, f"bench/{name}.py's RecordingKube lacks {missing}"
    with pytest.raises(AttributeError, match="stand-in"):
        kube.a_method_added_later  # noqa: B018
