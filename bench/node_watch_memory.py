"""The operator's memory for the Node watch of a 10,000-node GPU fleet, before/after.

    python bench/node_watch_memory.py [--nodes 10000] [--labels 200] [--before REV]

Each side runs in its own process with that revision's `src/` first on the path (`--before`,
default: the merge base with `main`, extracted with `git archive`; `after`: this tree). The
process feeds the operator's Node path as Kopf does: it receives the initial list as JSON
(one response of every Node before, Kopf's default `chunk_size` None; pages of
`LIST_CHUNK` after), parses it, and hands each Node to `Store.on_node` (what
`handlers/nodes.py` does), with one validation known (`nodeSelector`
`nvidia.com/gpu.present=true`, peers on `topology.kubernetes.io/zone`). It prints the peak
RSS (ru_maxrss) and the RSS held after a full collection and `malloc_trim`, both above the
process's RSS before the first Node (imports, the generator), the deep size of the labels
the store keeps (`Store.node_labels`), and the size of one Node's JSON.

The Nodes are realistic for a GPU node with node-feature-discovery and GPU feature
discovery: `--labels` labels (about 20 well-known and GPU ones, the rest
`feature.node.kubernetes.io/...`), NFD's feature-labels annotation, managedFields,
capacity/allocatable, conditions, addresses, 40 container images and nodeInfo.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import ctypes, gc, json, resource, sys
sys.setrecursionlimit(10000)
from node_fleet import fleet_chunk
from netval.model.spec import NetworkValidationSpec
from netval.operator.state.store import Store

nodes, labels, chunk = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")

store = Store()
spec = NetworkValidationSpec.model_validate(
    {"nodeSelector": {"nvidia.com/gpu.present": "true"},
     "checks": {"peers": {"enabled": True, "topologyKey": "topology.kubernetes.io/zone"}}}
)
store.upsert_validation("pool-a", generation=1, spec=spec, body={}, status=None)
one = len(fleet_chunk(0, 1, labels))
gc.collect()
base = rss_kib()
for start in range(0, nodes, chunk):
    body = fleet_chunk(start, min(chunk, nodes - start), labels)  # the HTTP response
    items = json.loads(body)["items"]
    del body
    for item in items:
        meta, spec_ = item["metadata"], item.get("spec") or {}
        store.on_node(meta["name"], dict(meta.get("labels") or {}), list(spec_.get("taints") or []))
    del items
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed pages back: RSS then shows what is held
targeted = len(store.states["pool-a"].targeted)
labels_bytes = sys.getsizeof(store.node_labels) + sum(
    sys.getsizeof(k) + sys.getsizeof(d) + sum(sys.getsizeof(a) + sys.getsizeof(b) for a, b in d.items())
    for k, d in store.node_labels.items()
)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base": base, "peak": peak - base, "after": rss_kib() - base,
                  "node_bytes": one, "targeted": targeted,
                  "labels": labels_bytes}))
"""

FLEET = r'''
import json

WELL_KNOWN = {
    "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
    "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
    "node.kubernetes.io/instance-type": "a3-megagpu-8g",
    "beta.kubernetes.io/instance-type": "a3-megagpu-8g",
    "topology.kubernetes.io/region": "us-central1",
    "failure-domain.beta.kubernetes.io/region": "us-central1",
    "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.machine": "a3-megagpu-8g",
    "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "90",
    "nvidia.com/cuda.driver.rev": "07", "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4", "nvidia.com/gfd.timestamp": "1733300000",
    "nvidia.com/mig.capable": "false", "nvidia.com/gpu.compute.major": "9",
}

def labels_of(i, count):
    out = dict(WELL_KNOWN)
    out["kubernetes.io/hostname"] = f"gpu-node-{i:05d}"
    out["topology.kubernetes.io/zone"] = f"us-central1-{'abc'[i % 3]}"
    out["cloud.google.com/gce-topology-block"] = f"block-{i // 1024}"
    out["cloud.google.com/gce-topology-subblock"] = f"subblock-{i // 256}"
    out["cloud.google.com/gce-topology-host"] = f"host-{i // 8:05d}"
    k = 0
    while len(out) < count:
        out[f"feature.node.kubernetes.io/cpu-cpuid.FEATURE_{k:03d}"] = "true"
        k += 1
    return out

IMAGES = [
    {"names": [f"registry.example.com/team-{j}/image-{j}@sha256:{j:064x}",
               f"registry.example.com/team-{j}/image-{j}:v1.{j}.0"], "sizeBytes": 1000000 * j}
    for j in range(40)
]

def node(i, count):
    labels = labels_of(i, count)
    name = f"gpu-node-{i:05d}"
    return {
        "metadata": {
            "name": name, "uid": f"{i:08x}-0000-4000-8000-000000000000",
            "resourceVersion": str(100000 + i), "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": json.dumps({"pd.csi.storage.gke.io": name}),
                "nfd.node.kubernetes.io/feature-labels": ",".join(
                    k.split("/", 1)[1] for k in labels if k.startswith("feature.node")
                ),
                "nfd.node.kubernetes.io/extended-resources": "",
            },
            "managedFields": [
                {"manager": m, "operation": "Update", "apiVersion": "v1",
                 "time": "2026-12-01T00:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in list(labels)[:60]}}}}
                for m in ("kubelet", "nfd-master", "gpu-feature-discovery")
            ],
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24", "providerID": f"gce://p/z/{name}"},
        "status": {
            "capacity": {"cpu": "208", "memory": "1915577340Ki", "nvidia.com/gpu": "8",
                         "ephemeral-storage": "6000000000Ki", "pods": "110",
                         "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "207", "memory": "1900000000Ki", "nvidia.com/gpu": "8",
                            "ephemeral-storage": "5500000000Ki", "pods": "110",
                            "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "conditions": [
                {"type": t, "status": "False" if t != "Ready" else "True",
                 "lastHeartbeatTime": "2026-12-04T12:00:00Z",
                 "lastTransitionTime": "2026-12-01T00:00:00Z",
                 "reason": f"Kubelet{t}", "message": f"kubelet reports {t}"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready",
                          "NetworkUnavailable")
            ],
            "addresses": [{"type": "InternalIP", "address": f"10.128.{i // 256}.{i % 256}"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:032x}",
                         "bootID": f"{i:032x}", "kernelVersion": "6.1.100+",
                         "osImage": "Container-Optimized OS", "containerRuntimeVersion":
                         "containerd://1.7.20", "kubeletVersion": "v1.31.1",
                         "kubeProxyVersion": "v1.31.1", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": IMAGES,
        },
    }

def fleet_chunk(start, count, labels):
    """The JSON text of a NodeList page (as the API server sends it)."""
    items = [node(i, labels) for i in range(start, start + count)]
    return json.dumps({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items})
'''


def run_child(child: str, path: list[Path], *args: object) -> dict[str, Any]:
    """Run `child` (Python source) in its own process with `path` first on PYTHONPATH; the
    JSON object its last line prints."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    out = subprocess.run(
        [sys.executable, "-c", child, *map(str, args)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run_side(src: Path, nodes: int, labels: int, chunk: int, helper_dir: Path) -> dict[str, Any]:
    return run_child(CHILD, [src, helper_dir], nodes, labels, chunk)


def extract(rev: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src"],
        check=True,
        capture_output=True,
    ).stdout
    tar_path = into / "src.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def merge_base() -> str:
    """The commit this tree shares with `main`: the default `before` of a side-by-side."""
    return subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--labels", type=int, default=200)
    parser.add_argument("--before", default=None, help="git revision (default: merge-base main)")
    args = parser.parse_args()
    before = args.before or merge_base()
    sys.path.insert(0, str(ROOT / "src"))
    from netval.operator.term_startup import LIST_CHUNK

    with tempfile.TemporaryDirectory() as tmp:
        helper = Path(tmp) / "helper"
        helper.mkdir()
        (helper / "node_fleet.py").write_text(FLEET)
        old_src = extract(before, Path(tmp))
        rows = [
            (f"before ({before[:10]}, one list)", run_side(old_src, args.nodes, args.labels,
                                                          args.nodes, helper)),
            (f"after (pages of {LIST_CHUNK})", run_side(ROOT / "src", args.nodes, args.labels,
                                                       LIST_CHUNK, helper)),
        ]  # fmt: skip
    first = rows[0][1]
    print(f"{args.nodes} Nodes x {args.labels} labels, {first['node_bytes']:,} bytes of JSON each")
    print(f"{'':34} {'peak MiB':>9} {'held MiB':>9} {'labels MiB':>10} {'targeted':>8}")
    for name, r in rows:
        print(
            f"{name:34} {r['peak'] / 1024:9.1f} {r['after'] / 1024:9.1f}"
            f" {r['labels'] / 2**20:10.1f} {r['targeted']:8}"
        )


if __name__ == "__main__":
    main()
