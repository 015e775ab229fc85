"""The `netval` argument parser: every command, flag and default (`netval COMMAND --help`).

Usage errors are one line on stderr and exit 2, as every other bad input (argparse's own
`error` prints the whole usage first)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from netval import __version__

DEFAULT_SAMPLES = 2
DEFAULT_PROBE_INTERVAL = 1.0
DEFAULT_SNAPSHOT_INTERVAL = 5.0
DEFAULT_NAMESPACE = "netval-system"


class NetvalParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (and still exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds: {value}")
    return value


def _poll_seconds(text: str) -> float:
    value = _seconds(text)
    if value <= 0:  # 0 would read the certificates in a busy loop
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = NetvalParser(
        prog="netval",
        description="Validate the network fabric of GPU nodes (RoCE, MTU, PFC, ECN, links).",
    )
    parser.add_argument("--version", action="version", version=f"netval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _probe_parsers(sub)
    _cluster_parsers(sub)
    _doctor_parser(sub)
    _uninstall_parser(sub)
    _process_parsers(sub)
    _broker_reloader_parser(sub)
    return parser


def _probe_parsers(sub: argparse._SubParsersAction[NetvalParser]) -> None:
    probe = sub.add_parser(
        "probe",
        help="run the node checks on this host or on a recorded snapshot",
        description="Run the node checks on this host (default) or on a recorded snapshot.",
    )
    probe.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="SNAPSHOT_DIR",
        help="evaluate a recorded netval-snapshot/1 directory instead of this host",
    )
    _add_common(probe, DEFAULT_PROBE_INTERVAL)
    probe.add_argument(
        "--output",
        choices=("table", "json"),
        default="table",
        help="table for people (default), json for the report schema",
    )
    probe.add_argument(
        "-v", "--verbose", action="store_true", help="table: list passing checks one by one"
    )

    snap = sub.add_parser(
        "snapshot",
        help="record this host in the netval-snapshot/1 format",
        description="Record this host so `netval probe --from DIR` can evaluate it anywhere.",
    )
    snap.add_argument("--out", type=Path, required=True, metavar="DIR", help="new or empty dir")
    _add_common(snap, DEFAULT_SNAPSHOT_INTERVAL)


def _add_common(p: argparse.ArgumentParser, default_interval: float) -> None:
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="NetworkValidation YAML (uses spec.checks) or a bare checks mapping",
    )
    # default None: `probe --from` tells the user when they give one that does not apply
    p.add_argument(
        "--samples",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"samples to take on a live host; counters are judged first vs last "
        f"(default {DEFAULT_SAMPLES})",
    )
    p.add_argument(
        "--interval",
        type=_seconds,
        default=None,
        metavar="S",
        help=f"seconds between samples on a live host (default {default_interval:g})",
    )
    p.add_argument(
        "--node", metavar="NAME", help="node name (default: NETVAL_NODE_NAME or hostname)"
    )


def _add_kube(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig file (default: in-cluster configuration, else KUBECONFIG, else "
        "~/.kube/config)",
    )
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")


def _cluster_parsers(sub: argparse._SubParsersAction[NetvalParser]) -> None:
    st = sub.add_parser(
        "status",
        help="show validations through the Kubernetes API (conditions, counts, failures)",
        description="Show NetworkValidations: conditions, node counts, failing checks and nodes. "
        "Reads the cluster (in-cluster config, --kubeconfig or KUBECONFIG) or, with --from, a "
        "file written by `kubectl get netval[,nodes] -o yaml`. Exit 0 when every shown "
        "validation is Healthy, 1 when one is not, 2 on errors (a broken kubeconfig included). "
        "With --loadtests or --loadtest: NetworkLoadTests instead, exit 1 when a shown one "
        "Failed; --matrix adds a validation's last load-test run beside its capacity ratios.",
    )
    st.add_argument("name", nargs="?", help="one validation (default: all)")
    st.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="FILE",
        help="read a NetworkValidation (or a List, with Nodes for --nodes) from a YAML/JSON "
        "file instead of the cluster",
    )
    st.add_argument(
        "--nodes", action="store_true", help="per-node view of the targeted nodes: state, "
        "fabric label, taint, failures"
    )  # fmt: skip
    st.add_argument("--failing", action="store_true", help="--nodes: only nodes failing or stale")
    st.add_argument("--watch", action="store_true", help="refresh every --every seconds")
    st.add_argument("--every", type=_seconds, default=2.0, metavar="S", help="refresh period")
    st.add_argument(
        "--matrix",
        action="store_true",
        help="east-west view: domain x domain matrix, flagged (low capacity ratio) pairs, suspects",
    )
    st.add_argument(
        "--consistency",
        action="store_true",
        help="fleet consistency: per cohort and fact key the majority value, share, outliers",
    )
    st.add_argument(
        "--topology",
        action="store_true",
        help="fabric topology: levels and domains, undiscovered nodes, disagreements with the "
        "node labels, figures measured between domains (status.topology)",
    )
    st.add_argument(
        "--loadtests",
        action="store_true",
        help="list NetworkLoadTests instead (of validation NAME if given): phase, passed, nodes, "
        "max oversubscription, last and next run",
    )
    st.add_argument(
        "--loadtest",
        metavar="LOADTEST",
        help="one NetworkLoadTest in detail: oversubscription per domain pair, latency idle vs "
        "loaded, storage per endpoint, breaches, history (exit 1 when it Failed)",
    )
    _add_kube(st)

    rep = sub.add_parser(
        "report",
        help="write one validation as a self-contained HTML page (verdict, failures, heatmaps)",
        description="Write a NetworkValidation as one HTML file: a verdict banner, the "
        "failures, conditions and counts, latency and throughput heatmaps per domain pair, "
        "flagged (low capacity ratio) pairs and suspects, and the last run of each of its "
        "NetworkLoadTests (oversubscription heatmap, storage, latency under load). Reads the "
        "cluster or, with --from, a file (`kubectl get netval NAME[,netload] -o yaml`). Exit 0 "
        "when it is Healthy, 1 when not (the file is written either way), 2 on errors.",
    )
    rep.add_argument("name", nargs="?", help="the NetworkValidation (optional with --from)")
    rep.add_argument("--html", type=Path, required=True, metavar="FILE", help="file to write")
    rep.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="FILE",
        help="read the NetworkValidation from a YAML/JSON file instead of the cluster",
    )
    _add_kube(rep)


def _doctor_parser(sub: argparse._SubParsersAction[NetvalParser]) -> None:
    doc = sub.add_parser(
        "doctor",
        help="check that the cluster is ready for netval, and say what to fix",
        description="Check the cluster for netval: the CRD and its version, the operator and "
        "its permissions (SelfSubjectAccessReview, as the operator's service account), the "
        "leader's Lease, the MQTT broker (reachable, TLS, login, ACL), Kueue, the admission webhook "
        "and its CA, the agents' DaemonSets. One line per check with the fix; exit 0 only when "
        "every check passes (skipped: not applicable), 1 when one fails, 2 on bad input.",
    )
    _add_kube(doc)
    doc.add_argument(
        "-n",
        "--namespace",
        default=DEFAULT_NAMESPACE,
        metavar="NS",
        help=f"the operator's namespace (default {DEFAULT_NAMESPACE})",
    )
    doc.add_argument(
        "--service-account",
        metavar="NAME",
        help="check the permissions of this service account in --namespace (default: the "
        "operator Deployment's; in a pod: the pod's own)",
    )
    doc.add_argument(
        "--mqtt-url",
        metavar="URL",
        help="broker to check (default: NETVAL_MQTT_URL, else the operator Deployment's)",
    )
    doc.add_argument(
        "--mqtt-username", metavar="USER", help="default: NETVAL_MQTT_USERNAME or the operator's"
    )
    doc.add_argument(
        "--mqtt-password-file", type=Path, metavar="FILE", help="default: NETVAL_MQTT_PASSWORD_FILE"
    )
    doc.add_argument(
        "--mqtt-ca-file", type=Path, metavar="FILE", help="default: NETVAL_MQTT_CA_FILE"
    )
    doc.add_argument(
        "--timeout", type=_seconds, default=5.0, metavar="S", help="per network check (default 5)"
    )


def _uninstall_parser(sub: argparse._SubParsersAction[NetvalParser]) -> None:
    cleanup = sub.add_parser(
        "uninstall-cleanup",
        help="remove what netval wrote into the cluster (the chart's pre-delete hook)",
        description="Scale the operator to 0, then delete the webhook configurations "
        "netval.io, release Pods held by netval's scheduling gate, remove netval's label and "
        "taint from Nodes, Kopf's finalizer from NetworkValidations and the agent "
        "DaemonSets and ConfigMaps. Idempotent. Exit 0 when everything was cleaned, 1 when "
        "something could not be (listed on stderr), 2 on usage errors.",
    )
    cleanup.add_argument(
        "--operator-deployment",
        metavar="NAMESPACE/NAME",
        help="scale this Deployment (the operator) to 0 first and wait for its pods to stop",
    )
    cleanup.add_argument(
        "--agent-namespace",
        metavar="NAMESPACE",
        help="delete the agent DaemonSets and ConfigMaps the operator rendered there",
    )
    cleanup.add_argument(
        "--kueue-topologies",
        action="store_true",
        help="delete the Kueue Topologies the operator wrote (spec.topology.publishKueueTopology)",
    )
    cleanup.add_argument(
        "--device-taint-rules",
        action="store_true",
        help="delete the DeviceTaintRules the operator wrote (spec.gating.deviceTaints)",
    )
    cleanup.add_argument(
        "--timeout", type=_seconds, default=10.0, metavar="S", help="per API call (default 10)"
    )
    cleanup.add_argument(
        "--operator-wait",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="how long to wait for the operator's pods to stop (default 60)",
    )


def _process_parsers(sub: argparse._SubParsersAction[NetvalParser]) -> None:
    sub.add_parser(
        "agent",
        help="run the node agent (in the DaemonSet): probe every interval, publish over MQTT",
        description="Run the node agent. Settings come from the environment: NETVAL_CONFIG, "
        "NETVAL_NODE_NAME, NETVAL_MQTT_URL, NETVAL_MQTT_USERNAME, NETVAL_MQTT_PASSWORD_FILE, "
        "NETVAL_MQTT_CA_FILE, NETVAL_METRICS_ADDR, NETVAL_LOG_LEVEL and the standard OTEL_* "
        "variables.",
    )
    op = sub.add_parser(
        "operator",
        help="run the Kubernetes operator (Kopf): agents, MQTT ingest, status",
        description="Run the operator (in-cluster config or KUBECONFIG). Settings come from "
        "the environment: NETVAL_MQTT_URL, NETVAL_MQTT_USERNAME, NETVAL_MQTT_PASSWORD_FILE, "
        "NETVAL_MQTT_CA_FILE, NETVAL_NAMESPACE, NETVAL_AGENT_IMAGE, NETVAL_AGENT_MQTT_URL, "
        "NETVAL_AGENT_MQTT_USERNAME, NETVAL_AGENT_MQTT_SECRET, NETVAL_AGENT_MQTT_CA_SECRET, "
        "NETVAL_AGENT_RESOURCES, NETVAL_AGENT_TOLERATIONS, NETVAL_KUEUE_ENABLED, "
        "NETVAL_STATUS_WINDOW_SECONDS, NETVAL_LEASE_NAME, NETVAL_LEASE_NAMESPACE, "
        "NETVAL_LEASE_DURATION_SECONDS, NETVAL_LEASE_RENEW_DEADLINE_SECONDS, "
        "NETVAL_LEASE_RETRY_PERIOD_SECONDS, NETVAL_LOG_LEVEL and OTEL_*. Without a usable "
        "Kubernetes configuration or MQTT settings it exits 2 before starting.",
    )
    op.add_argument(
        "--standalone",
        action="store_true",
        help="no leader election: run as the only replica (default: the replica holding the "
        "Lease NETVAL_LEASE_NAME leads, the others stand by)",
    )
    op.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve a liveness probe (leader and standby alike), e.g. http://0.0.0.0:8080/healthz",
    )
    op.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        default=":9478",
        help="serve Prometheus /metrics and /healthz here ('off' to disable; default :9478)",
    )
    hook = op.add_argument_group(
        "admission webhook", "gate or refuse Pods and Jobs annotated netval.io/require-healthy"
    )
    hook.add_argument(
        "--webhook-addr",
        metavar="HOST:PORT",
        help="serve the admission webhooks (HTTPS) here, e.g. 0.0.0.0:9443 (default: none)",
    )
    hook.add_argument("--webhook-cert", type=Path, metavar="FILE", help="server certificate "
                      "(PEM; default: a self-signed CA and certificate are made)")  # fmt: skip
    hook.add_argument("--webhook-key", type=Path, metavar="FILE", help="its private key (PEM)")
    hook.add_argument("--webhook-ca", type=Path, metavar="FILE",
                      help="CA bundle put into the webhook configurations (default: the cert)")  # fmt: skip
    hook.add_argument(
        "--webhook-service",
        metavar="NAMESPACE/NAME[:PORT]",
        help="in cluster: the configurations call this Service (port default 443) instead "
        "of https://HOST:PORT",
    )
    hook.add_argument(
        "--webhook-failure-policy",
        choices=("Fail", "Ignore"),
        default="Fail",
        help="when the webhook cannot answer: Fail refuses annotated objects (fail-closed, "
        "default), Ignore admits them ungated (fail-open)",
    )
    hook.add_argument(
        "--webhook-timeout",
        type=int,
        default=10,
        metavar="SECONDS",
        help="how long the API server waits for the webhook, 1..30 (default 10)",
    )


def _broker_reloader_parser(sub: argparse._SubParsersAction[NetvalParser]) -> None:
    rel = sub.add_parser(
        "broker-reloader",
        help="SIGHUP the broker when its mounted TLS certificate changes (broker pod sidecar)",
        description="Watch a mounted TLS Secret (the kubelet's ..data link, else the files' "
        "content) and send SIGHUP to the broker processes of this user, found in /proc (the "
        "pod shares its process namespace), when a new certificate and key load as a pair. "
        "Runs until SIGTERM.",
    )
    rel.add_argument("--dir", type=Path, default=Path("/mosquitto/tls"), metavar="DIR",
                     help="the mounted Secret with tls.crt and tls.key (default /mosquitto/tls)")  # fmt: skip
    rel.add_argument("--interval", type=_poll_seconds, default=30.0, metavar="S",
                     help="seconds between looks at the directory (default 30)")  # fmt: skip
    rel.add_argument("--process", default="mosquitto", metavar="NAME",
                     help="the process name (comm) to signal (default mosquitto)")  # fmt: skip
