"""The Kueue AdmissionCheck controller at fleet scale, before/after, side by side.

    python bench/kueue_scale.py [--nodes 10000] [--running 500] [--pending 50] [--others 1000]
                                [--repeat 3] [--window 10] [--before REV|SRC_DIR]

What runs, in one process per side (*before* is the code at `--before`, default the merge
base with `main`, extracted with `git archive`; *after* is this tree), each side `--repeat`
times, alternating; the figures are medians:

- The operator's runtime (`OperatorRuntime`, its store as the Kopf and MQTT handlers fill
  it) with `--nodes` Nodes of 200 labels each (node-feature-discovery-like keys, a block and
  a rack level `cloud.example.com/topology-{block,rack}` and `kubernetes.io/hostname`; 16
  nodes per rack), one NetworkValidation targeting all of them with every node's passing
  report ingested, its verdict recorded as the gating round records it and its status
  Healthy and Usable.
- One AdmissionCheck of ours naming it; `--running` admitted Workloads (TAS, 16 pods on 16
  hostnames of one rack, our check Ready, the shape Kueue v1beta2 writes: `slices` with an
  individual hostname level), `--pending` Workloads with quota reserved, not admitted (our
  check Pending at first, and a check of another controller that keeps them from being
  admitted), and `--others` Workloads of other ClusterQueues (no check of ours). Each
  Workload carries a pod template of ~1 KiB, as Kueue copies the Job's.
- `KueueController` as `netval operator` runs it, fed the watch events of all of them; the
  Kubernetes API is a stand-in (`StandInCustomObjects`: Workloads and AdmissionChecks in
  memory, merge patches with resourceVersion conflicts, and each write delivered back as a
  watch event, as Kopf would). It fails loudly: a call it does not implement raises.

Figures:

- `cache MiB`: memory the controller holds for the Workload events (tracemalloc, before the
  controller starts).
- `steady CPU s/s`: process CPU seconds per wall second over `--window` seconds once every
  pending Workload is Ready (nothing changes in the cluster); on a shared machine a busy
  process gets only its share of a core, so also `loop blocked %`: the share of that window a
  10 ms timer on the event loop ran late (100 %: the loop never idled).
- `change ms` / `change CPU ms`: one node of a pending Workload's rack turns unhealthy (its
  failing report ingested, the verdict recorded again): wall time until that Workload's
  check is `Retry` in the API, and the process CPU spent in that time.
- `webhook p50/p99 ms`: the admission webhook (`admission.reviewer.Reviewer`, the function
  Kopf's webhook server calls) on the controller's event loop, answering Pod reviews for the
  validation with 100 in flight for `--window` seconds; each review is submitted from a
  client thread and timed from its submission to its answer, so time the event loop spends
  in other work counts. In-process: no TLS or HTTP parsing (bench/webhook_latency.py measures
  those); what this adds is the loop's availability while the controller runs. With 100 in
  flight a stall of the loop holds only those 100 (a closed loop), so p99 can hide a stall of
  seconds: `webhook max ms` and `reviews over 1 s` show it.

Pure CPU and memory: no broker, no Kubernetes. The machine's other load shows in the
figures: compare the sides of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
VALIDATION: Final = "pool"
CHECK: Final = "fabric"
FOREIGN_CHECK: Final = "prov"
GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
BLOCK: Final = "cloud.example.com/topology-block"
RACK: Final = "cloud.example.com/topology-rack"
HOSTNAME: Final = "kubernetes.io/hostname"
GPU: Final = "nvidia.com/gpu.present"
PER_RACK: Final = 16
RACKS_PER_BLOCK: Final = 32
LABELS: Final = 200


def node_name(i: int) -> str:
    return f"gpu-{i:05d}"


def rack_of(i: int) -> int:
    return i // PER_RACK


def node_labels(i: int) -> dict[str, str]:
    rack = rack_of(i)
    labels = {
        GPU: "true",
        HOSTNAME: node_name(i),
        BLOCK: f"block-{rack // RACKS_PER_BLOCK}",
        RACK: f"rack-{rack}",
    }
    for j in range(LABELS - len(labels)):  # node-feature-discovery and the cloud's
        labels[f"feature.node.kubernetes.io/feature-{j:03d}"] = f"value-{j}-{i % 7}"
    return labels


def pod_template() -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "trainer", "job-name": "allreduce"}},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "train",
                    "image": "nvcr.io/nvidia/pytorch:24.08-py3",
                    "command": ["torchrun", "--nnodes=16", "--nproc-per-node=8", "train.py"],
                    "env": [{"name": f"NCCL_VAR_{k}", "value": f"v{k}"} for k in range(12)],
                    "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "96"}},
                }
            ],
        },
    }


def workload(index: int, rack: int | None, checks: list[tuple[str, str]], admitted: bool) -> dict:
    """A Workload; `rack`: its TAS assignment (16 pods on the 16 hostnames of that rack)."""
    name = f"wl-{index:05d}"
    conditions = [] if rack is None else [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]  # fmt: skip
    if admitted:
        conditions.append({"type": "Admitted", "status": "True", "reason": "Admitted",
                           "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})  # fmt: skip
    status: dict[str, Any] = {
        "conditions": conditions,
        "admissionChecks": [
            {"name": n, "state": s, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for n, s in checks
        ],
    }
    if rack is not None:
        first = rack * PER_RACK
        roots = [f"{i:05d}" for i in range(first, first + PER_RACK)]
        status["admission"] = {
            "clusterQueue": "gpu",
            "podSetAssignments": [{
                "name": "main", "count": PER_RACK, "flavors": {"nvidia.com/gpu": "h100"},
                "topologyAssignment": {
                    "levels": [BLOCK, RACK, HOSTNAME],
                    "slices": [{
                        "domainCount": PER_RACK,
                        "valuesPerLevel": [
                            {"universal": f"block-{rack // RACKS_PER_BLOCK}"},
                            {"universal": f"rack-{rack}"},
                            {"individual": {"prefix": "gpu-", "roots": roots}},
                        ],
                        "podCounts": {"universal": 1},
                    }],
                },
            }],
        }  # fmt: skip
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "team-a", "resourceVersion": "1",
                     "uid": f"uid-{index}", "labels": {"kueue.x-k8s.io/queue-name": "gpu"}},
        "spec": {"queueName": "gpu", "podSets": [
            {"name": "main", "count": PER_RACK, "template": pod_template()}]},
        "status": status,
    }  # fmt: skip


def admission_check(name: str, controller: str, params: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AdmissionCheck",
        "metadata": {"name": name, "generation": 1, "resourceVersion": "1"},
        "spec": {"controllerName": controller, "parameters": params},
        "status": {"conditions": []},
    }


def _api_error(status: int, reason: str) -> Exception:
    from kubernetes.client.exceptions import ApiException

    return ApiException(status=status, reason=reason)


class StandInCustomObjects:
    """The `CustomObjectsApi` calls the Kueue controller makes, on objects in memory. Each
    write is delivered back to `on_event` as a watch event on the loop (Kopf does that).
    BENCHMARK ONLY. A call it does not implement raises AttributeError."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self.lock = threading.Lock()
        self.rv = 1
        self.calls: dict[str, int] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.on_event: Any = None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the bench's API stand-in does not implement {name!r}")

    def _count(self, call: str) -> None:
        self.calls[call] = self.calls.get(call, 0) + 1

    def add(self, plural: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self.objects[(plural, meta.get("namespace") or "", meta["name"])] = body

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **_: Any
    ) -> dict[str, Any]:
        self._count("get_namespaced_custom_object")
        with self.lock:
            found = self.objects.get((plural, namespace, name))
            if found is None:
                raise _api_error(404, "Not Found")
            return copy.deepcopy(found)

    def get_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, **_: Any
    ) -> dict[str, Any]:
        self._count("get_cluster_custom_object")
        if group == "netval.io" and name == VALIDATION:
            return {"metadata": {"name": name}}
        with self.lock:
            found = self.objects.get((plural, "", name))
            if found is None:
                raise _api_error(404, "Not Found")
            return copy.deepcopy(found)

    def list_namespaced_custom_object(self, *_: Any, **__: Any) -> Any:
        raise AttributeError("the bench's API stand-in does not implement namespaced lists")

    def list_cluster_custom_object(
        self, group: str, version: str, plural: str, **_: Any
    ) -> dict[str, Any]:
        self._count("list_cluster_custom_object")
        with self.lock:
            items = [copy.deepcopy(o) for (p, _, _), o in self.objects.items() if p == plural]
        return {"apiVersion": f"{group}/{version}", "items": items,
                "metadata": {"resourceVersion": str(self.rv)}}  # fmt: skip

    def _patch_status(self, plural: str, namespace: str, name: str, patch: dict) -> dict:
        with self.lock:
            found = self.objects.get((plural, namespace, name))
            if found is None:
                raise _api_error(404, "Not Found")
            want = (patch.get("metadata") or {}).get("resourceVersion")
            if want is not None and want != found["metadata"]["resourceVersion"]:
                raise _api_error(409, "Conflict")
            found["status"].update(copy.deepcopy(patch.get("status") or {}))
            self.rv += 1
            found["metadata"]["resourceVersion"] = str(self.rv)
            result = copy.deepcopy(found)
        if self.loop is not None and self.on_event is not None:  # the watch sees the write
            event = copy.deepcopy(result)
            self.loop.call_soon_threadsafe(self.on_event, plural, "MODIFIED", event)
        return result

    def patch_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: dict,
        **_: Any,
    ) -> dict[str, Any]:  # fmt: skip
        self._count("patch_namespaced_custom_object_status")
        return self._patch_status(plural, namespace, name, body)

    def patch_cluster_custom_object_status(
        self, group: str, version: str, plural: str, name: str, body: dict, **_: Any
    ) -> dict[str, Any]:
        self._count("patch_cluster_custom_object_status")
        return self._patch_status(plural, "", name, body)


class StandInKube:
    """`KubeApi` as the Kueue controller uses it: `custom` (the stand-in above) and `pools`
    (the operator's real thread pools). Anything else raises."""

    def __init__(self, custom: StandInCustomObjects) -> None:
        from netval.operator.thread_pools import TERM_CONCERNS, ThreadPools

        self.custom = custom
        self.pools = ThreadPools(TERM_CONCERNS)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the bench's KubeApi stand-in does not implement {name!r}")

    def close(self) -> None:
        self.pools.close()


def operator_runtime(nodes: int, kube: StandInKube) -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    from netval.infra.mqtt_settings import MqttSettings
    from netval.model import CheckId, CheckResult, NetworkValidationSpec, Report, Status
    from netval.operator.settings import OperatorSettings
    from netval.operator.term_runtime import OperatorRuntime

    mqtt = MqttSettings(host="127.0.0.1", port=1883, tls=False, username=None, password=None,
                        ca_file=None, client_id="bench")  # fmt: skip
    settings = OperatorSettings(
        namespace="netval-system", agent_image="netval:bench", mqtt=mqtt,
        agent_mqtt_url="mqtt://broker:1883", agent_mqtt_username=None,
        agent_mqtt_secret="netval-mqtt-agent", agent_mqtt_ca_secret=None, status_window=2.0,
    )  # fmt: skip
    runtime = OperatorRuntime(settings, kube, TracerProvider())  # type: ignore[arg-type]
    store = runtime.store
    spec = NetworkValidationSpec.model_validate({"nodeSelector": {GPU: "true"}})
    now = datetime.now(UTC)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"conditions": [
        {"type": t, "status": "True", "reason": "AllPassing", "message": "all nodes pass",
         "lastTransitionTime": stamp, "observedGeneration": 1}
        for t in ("Healthy", "Usable")]}  # fmt: skip
    body = {"apiVersion": "netval.io/v1alpha1", "kind": "NetworkValidation",
            "metadata": {"name": VALIDATION, "generation": 1}}  # fmt: skip
    store.upsert_validation(VALIDATION, generation=1, spec=spec, body=body, status=status)
    assert store.previous.get(VALIDATION) is not None, "the status did not parse"
    for i in range(nodes):  # after the validation: its selector's key is kept
        store.on_node(node_name(i), node_labels(i))
    assert len(store.states[VALIDATION].targeted) == nodes
    started = now - timedelta(seconds=1)
    for i in range(nodes):
        result = CheckResult(
            check=CheckId.MTU_INTERFACE,
            subject="ens1np0",
            status=Status.PASS,
            message="MTU 9000",
            observed={"mtu": 9000},
            expected={"mtu": 9000},
        )
        store.ingest_report(Report(validation=VALIDATION, generation=1, node=node_name(i),
                                   started_at=started, duration_ms=2.0, status=Status.PASS,
                                   results=[result]), False)  # fmt: skip
    record_verdict(runtime)
    return runtime


def record_verdict(runtime: Any) -> None:
    """What the gating round does each status window: decide and record the verdict."""
    from netval.operator.gating.facts import verdict_of

    store = runtime.store
    state = store.states[VALIDATION]
    state.verdict = verdict_of(VALIDATION, state, store.specs[VALIDATION], store.node_fabric,
                               datetime.now(UTC))  # fmt: skip


def fail_node(runtime: Any, i: int) -> None:
    from netval.model import CheckId, CheckResult, Report, Status

    result = CheckResult(check=CheckId.MTU_INTERFACE, subject="ens1np0", status=Status.FAIL,
                         message="MTU 1500, expected 9000", observed={"mtu": 1500},
                         expected={"mtu": 9000})  # fmt: skip
    runtime.store.ingest_report(Report(validation=VALIDATION, generation=1, node=node_name(i),
                                       started_at=datetime.now(UTC), duration_ms=2.0,
                                       status=Status.FAIL, results=[result]), False)  # fmt: skip
    record_verdict(runtime)


def pod_review(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"uid-{i}", "operation": "CREATE", "namespace": "team-a",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": f"trainer-{i}", "namespace": "team-a",
                                    "annotations": {"netval.io/require-healthy": VALIDATION}},
                       **pod_template()},
        },
    }  # fmt: skip


def webhook_latencies(
    loop: asyncio.AbstractEventLoop, reviewer: Any, seconds: float, in_flight: int = 100
) -> list[float]:
    """From a client thread: keep `in_flight` reviews submitted to the loop for `seconds`;
    each one's time from submission to answer (seconds)."""
    from netval.operator.admission.configurations import MUTATE_PODS

    latencies: list[float] = []

    async def one(i: int) -> float:
        answer = await reviewer(pod_review(i), webhook=MUTATE_PODS)
        assert answer["response"]["allowed"], answer
        return time.perf_counter()

    pending: dict[concurrent.futures.Future[float], float] = {}
    deadline = time.perf_counter() + seconds
    i = 0
    while True:
        now = time.perf_counter()
        while now < deadline and len(pending) < in_flight:
            i += 1
            pending[asyncio.run_coroutine_threadsafe(one(i), loop)] = time.perf_counter()
        if not pending:
            return latencies
        done, _ = concurrent.futures.wait(list(pending), return_when="FIRST_COMPLETED")
        for future in done:
            latencies.append(future.result() - pending.pop(future))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def child(args: argparse.Namespace) -> dict[str, Any]:
    from netval.operator.admission.reviewer import Reviewer
    from netval.operator.kueue.controller import KueueController

    custom = StandInCustomObjects()
    kube = StandInKube(custom)
    t = time.perf_counter()
    runtime = operator_runtime(args.nodes, kube)
    setup_s = time.perf_counter() - t

    racks = args.nodes // PER_RACK
    assert args.running + args.pending <= racks, "more Workloads than racks"
    ours = admission_check(CHECK, "netval.io/fabric",
                           {"apiGroup": "netval.io", "kind": "NetworkValidation",
                            "name": VALIDATION})  # fmt: skip
    foreign = admission_check(FOREIGN_CHECK, "kueue.x-k8s.io/provisioning-request",
                              {"apiGroup": GROUP, "kind": "ProvisioningRequestConfig",
                               "name": "p"})  # fmt: skip
    custom.add("admissionchecks", ours)
    custom.add("admissionchecks", foreign)
    bodies: list[dict[str, Any]] = []
    for k in range(args.running):  # spread over the fleet
        bodies.append(workload(k, k * racks // (args.running + args.pending), [(CHECK, "Ready")],
                               admitted=True))  # fmt: skip
    pending_racks = []
    for k in range(args.running, args.running + args.pending):
        rack = k * racks // (args.running + args.pending)
        pending_racks.append((f"wl-{k:05d}", rack))
        bodies.append(workload(k, rack, [(CHECK, "Pending"), (FOREIGN_CHECK, "Pending")],
                               admitted=False))  # fmt: skip
    for k in range(args.running + args.pending, args.running + args.pending + args.others):
        bodies.append(workload(k, None, [(FOREIGN_CHECK, "Pending")], admitted=False))
    for body in bodies:
        custom.add("workloads", body)

    async def run() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        memo: dict[str, Any] = {"runtime": runtime}
        # the watch's events, as Kopf delivers them (its own copy of each object)
        events = [("admissionchecks", copy.deepcopy(ours)),
                  ("admissionchecks", copy.deepcopy(foreign))] + [
            ("workloads", copy.deepcopy(b)) for b in bodies]  # fmt: skip
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        controller = KueueController(memo)
        for plural, body in events:
            controller.on_event(plural, "ADDED", body)
        del events
        gc.collect()
        cache_mib = (tracemalloc.get_traced_memory()[0] - before) / 2**20
        tracemalloc.stop()

        custom.loop, custom.on_event = loop, controller.on_event
        memo["kueue"] = controller
        controller.start()

        def state_of(name: str) -> str:
            with custom.lock:
                body = custom.objects[("workloads", "team-a", name)]
                return next(c["state"] for c in body["status"]["admissionChecks"]
                            if c["name"] == CHECK)  # fmt: skip

        async def until(pred: Any, limit: float, what: str) -> float:
            start = time.perf_counter()
            while not pred():
                if time.perf_counter() - start > limit:
                    raise SystemExit(f"timed out waiting for {what}")
                await asyncio.sleep(0.005)
            return time.perf_counter() - start

        converge_s = await until(
            lambda: all(state_of(n) == "Ready" for n, _ in pending_racks), 600,
            "the pending Workloads to be Ready")  # fmt: skip
        await asyncio.sleep(2 * controller.interval)  # the writes' own events settle
        patches_before = controller.patches

        # steady state: nothing changes; a probe measures how late the loop runs it
        late = 0.0

        async def probe() -> None:
            nonlocal late
            while True:
                t = time.perf_counter()
                await asyncio.sleep(0.01)
                late += max(0.0, time.perf_counter() - t - 0.01)

        prober = asyncio.create_task(probe())
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.sleep(args.window)
        elapsed = time.perf_counter() - wall
        steady = (time.process_time() - cpu) / elapsed
        prober.cancel()
        loop_blocked = min(1.0, late / elapsed)
        steady_patches = controller.patches - patches_before

        # one node of the first pending Workload's rack turns unhealthy
        name, rack = pending_racks[0]
        wall, cpu = time.perf_counter(), time.process_time()
        fail_node(runtime, rack * PER_RACK + 3)
        change_s = await until(lambda: state_of(name) == "Retry", 600, f"{name} Retry")
        change_cpu = time.process_time() - cpu
        await asyncio.sleep(2 * controller.interval)

        # the webhook on this loop, the controller running
        reviewer = Reviewer(memo)
        latencies = await asyncio.to_thread(webhook_latencies, loop, reviewer, args.window)
        await controller.stop()
        kube.close()
        return {
            "setup_s": setup_s,
            "cache_mib": cache_mib,
            "converge_s": converge_s,
            "steady_cpu_per_s": steady,
            "steady_patches": steady_patches,
            "loop_blocked": loop_blocked,
            "change_ms": change_s * 1000,
            "change_cpu_ms": change_cpu * 1000,
            "webhook_p50_ms": percentile(latencies, 0.50) * 1000,
            "webhook_p99_ms": percentile(latencies, 0.99) * 1000,
            "webhook_max_ms": max(latencies) * 1000,
            "webhook_over_1s": sum(1 for x in latencies if x > 1.0),
            "webhook_reviews": len(latencies),
            "patches": controller.patches,
            "api_calls": dict(sorted(custom.calls.items())),
        }

    return asyncio.run(run())


FIGURES: Final = [
    ("cache MiB", "cache_mib", "{:.2f}"),
    ("steady CPU s/s", "steady_cpu_per_s", "{:.3f}"),
    ("loop blocked %", "loop_blocked_pct", "{:.0f}"),
    ("change ms", "change_ms", "{:.0f}"),
    ("change CPU ms", "change_cpu_ms", "{:.1f}"),
    ("webhook p50 ms", "webhook_p50_ms", "{:.1f}"),
    ("webhook p99 ms", "webhook_p99_ms", "{:.1f}"),
    ("webhook max ms", "webhook_max_ms", "{:.0f}"),
    ("reviews over 1 s", "webhook_over_1s", "{:.0f}"),
    ("reviews answered", "webhook_reviews", "{:.0f}"),
    ("converge s", "converge_s", "{:.1f}"),
]


def run_side(src: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child",
            "--nodes", str(args.nodes), "--running", str(args.running),
            "--pending", str(args.pending), "--others", str(args.others),
            "--window", str(args.window)]  # fmt: skip
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["loop_blocked_pct"] = 100 * result["loop_blocked"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--pending", type=int, default=50)
    parser.add_argument("--others", type=int, default=1_000)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", default=None,
                        help="git revision or src/ directory (default: merge-base main); "
                             "'none': this tree only")  # fmt: skip
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return

    sys.path.insert(0, str(ROOT / "bench"))
    from node_watch_memory import extract, merge_base

    with tempfile.TemporaryDirectory() as tmp:
        sides: list[tuple[str, Path]] = []
        if args.before != "none":
            if args.before is not None and Path(args.before).is_dir():
                sides.append((f"before ({args.before})", Path(args.before)))
            else:
                rev = args.before or merge_base()
                sides.append((f"before ({rev[:10]})", extract(rev, Path(tmp))))
        sides.append(("after (this tree)", ROOT / "src"))
        print(f"{args.nodes} nodes x {LABELS} labels, {args.running} running + {args.pending} "
              f"pending TAS Workloads with our check, {args.others} without; "
              f"median of {args.repeat} runs per side, alternating", flush=True)  # fmt: skip
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in sides}
        for r in range(args.repeat):
            for label, src in sides:
                result = run_side(src, args)
                runs[label].append(result)
                print(f"  run {r + 1} {label}: {json.dumps(result)}", flush=True)
        width = max(len(label) for label, _ in sides)
        print(f"{'':<18}" + "".join(f"{label:>{width + 2}}" for label, _ in sides))
        for title, key, fmt in FIGURES:
            cells = [fmt.format(statistics.median(r[key] for r in runs[label]))
                     for label, _ in sides]  # fmt: skip
            print(f"{title:<18}" + "".join(f"{c:>{width + 2}}" for c in cells))


if __name__ == "__main__":
    main()
