"""`netval` command line: probe, snapshot.

Exit codes (a contract for scripts and CI): 0 nothing failed or errored, 1 a check failed or
errored, 2 bad usage or bad input (one line on stderr naming the file and field).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, cast

from netval import __version__
from netval.infra.yaml_input import InputFileError, load_yaml_document
from netval.model.manifest import ConfigError, ProbeConfig, probe_config_from_document

EXIT_OK: Final = 0
EXIT_UNHEALTHY: Final = 1
EXIT_BAD_INPUT: Final = 2
MAX_CONFIG_BYTES: Final = 1 << 20


class BadInput(Exception):
    """Input the user must fix; printed as one line, exit 2."""


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="netval",
        description="Validate the network fabric of GPU nodes (RoCE, MTU, PFC, ECN, links).",
    )
    parser.add_argument("--version", action="version", version=f"netval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    _add_common(probe)
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
    _add_common(snap, default_interval=5.0)

    sub.add_parser(
        "agent",
        help="run the node agent (in the DaemonSet): probe every interval, publish over MQTT",
        description="Run the node agent. Settings come from the environment: NETVAL_CONFIG, "
        "NETVAL_NODE_NAME, NETVAL_MQTT_URL, NETVAL_MQTT_USERNAME, NETVAL_MQTT_PASSWORD_FILE, "
        "NETVAL_MQTT_CA_FILE, NETVAL_METRICS_ADDR and the standard OTEL_* variables.",
    )
    st = sub.add_parser(
        "status",
        help="show validations through the Kubernetes API (conditions, counts, failures)",
        description="Show NetworkValidations: conditions, node counts, failing checks and nodes. "
        "Uses in-cluster config or KUBECONFIG. Exit 0 when every shown validation is Healthy, "
        "1 when one is not, 2 on errors.",
    )
    st.add_argument("name", nargs="?", help="one validation (default: all)")
    st.add_argument("--nodes", action="store_true", help="per-node view: label, taint, failures")
    st.add_argument("--watch", action="store_true", help="refresh every --every seconds")
    st.add_argument("--every", type=_seconds, default=2.0, metavar="S", help="refresh period")
    st.add_argument(
        "--matrix",
        action="store_true",
        help="east-west view: domain x domain matrix, oversubscribed pairs, suspect nodes",
    )

    rep = sub.add_parser(
        "report",
        help="write one validation as a self-contained HTML page (heatmaps, failures)",
        description="Write a NetworkValidation as one HTML file: conditions, counts, latency "
        "and throughput heatmaps per domain pair, oversubscribed pairs, suspects, failures. "
        "Uses in-cluster config or KUBECONFIG. Exit 0 when it is Healthy, 1 when not (the "
        "file is written either way), 2 on errors.",
    )
    rep.add_argument("name", help="the NetworkValidation")
    rep.add_argument("--html", type=Path, required=True, metavar="FILE", help="file to write")

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
        "--timeout", type=_seconds, default=10.0, metavar="S", help="per API call (default 10)"
    )
    cleanup.add_argument(
        "--operator-wait",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="how long to wait for the operator's pods to stop (default 60)",
    )

    op = sub.add_parser(
        "operator",
        help="run the Kubernetes operator (Kopf): agents, MQTT ingest, status",
        description="Run the operator (in-cluster config or KUBECONFIG). Settings come from "
        "the environment: NETVAL_MQTT_URL, NETVAL_MQTT_USERNAME, NETVAL_MQTT_PASSWORD_FILE, "
        "NETVAL_MQTT_CA_FILE, NETVAL_NAMESPACE, NETVAL_AGENT_IMAGE, NETVAL_AGENT_MQTT_URL, "
        "NETVAL_AGENT_MQTT_SECRET, NETVAL_STATUS_WINDOW_SECONDS and OTEL_*.",
    )
    op.add_argument(
        "--standalone",
        action="store_true",
        help="no peering: run as the only replica (default: peering, one active replica)",
    )
    op.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve Kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
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
    return parser


def _add_common(p: argparse.ArgumentParser, default_interval: float = 1.0) -> None:
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="NetworkValidation YAML (uses spec.checks) or a bare checks mapping",
    )
    p.add_argument(
        "--samples",
        type=_positive_int,
        default=2,
        metavar="N",
        help="samples to take on a live host; counters are judged first vs last (default 2)",
    )
    p.add_argument(
        "--interval",
        type=_seconds,
        default=default_interval,
        metavar="S",
        help=f"seconds between samples (default {default_interval:g})",
    )
    p.add_argument(
        "--node", metavar="NAME", help="node name (default: NETVAL_NODE_NAME or hostname)"
    )


def load_probe_config(path: Path | None) -> ProbeConfig:
    if path is None:
        return probe_config_from_document(None)
    try:
        doc = load_yaml_document(path, max_bytes=MAX_CONFIG_BYTES)
        return probe_config_from_document(doc)
    except InputFileError as exc:
        raise BadInput(str(exc)) from None
    except ConfigError as exc:
        raise BadInput(f"{path}: {exc}") from None


def _node_name(explicit: str | None) -> str:
    return explicit or os.environ.get("NETVAL_NODE_NAME") or socket.gethostname()


def cmd_probe(args: argparse.Namespace) -> int:
    from netval.agent.report_builder import build_report
    from netval.agent.snapshot_dir import SnapshotError, load_snapshot
    from netval.cli.table import render_table, use_colour

    config = load_probe_config(args.config)
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    if args.source is not None:
        try:
            snapshot = load_snapshot(args.source)
        except SnapshotError as exc:
            raise BadInput(str(exc)) from None
    else:
        from netval.agent.collect_live import LiveCollector, collect

        with LiveCollector(interfaces=config.checks.named_interfaces) as collector:
            snapshot = collect(
                collector,
                node=_node_name(args.node),
                samples=args.samples,
                interval=args.interval,
            )
    report = build_report(
        snapshot,
        config.checks,
        validation=config.validation,
        generation=0,
        started_at=started_at,
        duration_ms=(time.perf_counter() - t0) * 1000,
    )
    if args.output == "json":
        sys.stdout.write(report.to_json() + "\n")
    else:
        sys.stdout.write(render_table(report, colour=use_colour(sys.stdout), verbose=args.verbose))
    return EXIT_UNHEALTHY if report.status.is_bad else EXIT_OK


def cmd_snapshot(args: argparse.Namespace) -> int:
    from netval.agent.collect_live import (
        DEFAULT_RDMA_CM_ROOT,
        DEFAULT_SYS_ROOT,
        LiveCollector,
        collect,
    )
    from netval.agent.snapshot_dir import (
        MIN_SAMPLES,
        SnapshotError,
        hardware_netdevs,
        prepare_output_dir,
        record_sample,
        write_meta,
    )
    from netval.model.snapshot import Sample

    if args.samples < MIN_SAMPLES:
        raise BadInput(f"--samples: a snapshot needs at least {MIN_SAMPLES} samples")
    config = load_probe_config(args.config)
    try:
        prepare_output_dir(args.out)
    except SnapshotError as exc:
        raise BadInput(str(exc)) from None
    interfaces = [*config.checks.named_interfaces, *hardware_netdevs(DEFAULT_SYS_ROOT)]

    def record(i: int, sample: Sample) -> None:
        record_sample(
            args.out / "samples" / str(i),
            sample,
            sys_root=DEFAULT_SYS_ROOT,
            rdma_cm_root=DEFAULT_RDMA_CM_ROOT,
        )

    with LiveCollector(interfaces=list(dict.fromkeys(interfaces))) as collector:
        snapshot = collect(
            collector,
            node=_node_name(args.node),
            samples=args.samples,
            interval=args.interval,
            on_sample=record,
        )
    write_meta(
        args.out,
        node=snapshot.node,
        captured_at=snapshot.captured_at,
        # a window too short to measure still has a length: the format needs > 0
        interval_seconds=max(snapshot.interval_seconds, 0.001),
    )
    sys.stderr.write(f"recorded {args.samples} samples in {args.out}\n")
    return EXIT_OK


def _setup_logging() -> None:
    """Long-running processes (agent, operator) log to stderr; NETVAL_LOG_LEVEL sets the level."""
    import logging

    logging.basicConfig(
        level=os.environ.get("NETVAL_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def cmd_agent(args: argparse.Namespace) -> int:
    import asyncio

    from netval.agent.agent_config import AgentConfigError, agent_settings_from_env
    from netval.agent.main import run_agent

    _setup_logging()
    try:
        settings = agent_settings_from_env(os.environ)
    except AgentConfigError as exc:
        raise BadInput(str(exc)) from None
    asyncio.run(run_agent(settings))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from netval.cli.status_view import is_healthy, render_matrix, render_nodes, render_validation

    _load_kube_config()
    custom = client.CustomObjectsApi()
    core = client.CoreV1Api()

    def once() -> int:
        try:
            objs: list[dict[str, Any]]
            if args.name:
                one = custom.get_cluster_custom_object(
                    "netval.io", "v1alpha1", "networkvalidations", args.name
                )
                objs = [cast(dict[str, Any], one)]
            else:
                found = cast(
                    dict[str, Any],
                    custom.list_cluster_custom_object(
                        "netval.io", "v1alpha1", "networkvalidations"
                    ),
                )
                objs = sorted(found.get("items", []), key=lambda o: o["metadata"]["name"])
            nodes = (
                [client.ApiClient().sanitize_for_serialization(n) for n in core.list_node().items]  # type: ignore[no-untyped-call]
                if args.nodes
                else []
            )
        except ApiException as exc:
            if exc.status == 404 and args.name:
                raise BadInput(f"NetworkValidation {args.name!r} not found") from None
            raise BadInput(f"Kubernetes API error: {exc.status} {exc.reason}") from None
        except HTTPError as exc:
            raise BadInput(f"cannot reach the Kubernetes API: {exc}") from None
        if not objs:
            sys.stdout.write("no NetworkValidations\n")
            return EXIT_OK
        out = []
        for obj in objs:
            out.append(render_validation(obj))
            if args.nodes:
                out.append(render_nodes(obj, nodes))
            if args.matrix:
                out.append(render_matrix(obj))
        sys.stdout.write("\n".join(out))
        sys.stdout.flush()
        return EXIT_OK if all(is_healthy(o) for o in objs) else EXIT_UNHEALTHY

    if not args.watch:
        return once()
    while True:
        if sys.stdout.isatty():
            sys.stdout.write("\x1b[2J\x1b[H")
        code = once()
        time.sleep(args.every)
        if not sys.stdout.isatty():
            sys.stdout.write("---\n")
    return code


def _load_kube_config() -> None:
    from kubernetes import config

    try:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError) as exc:
        raise BadInput(f"no Kubernetes configuration: {exc}") from None


def cmd_report(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from netval.cli.report_html import render_html
    from netval.cli.status_view import is_healthy

    _load_kube_config()
    try:
        obj = cast(
            dict[str, Any],
            client.CustomObjectsApi().get_cluster_custom_object(
                "netval.io", "v1alpha1", "networkvalidations", args.name
            ),
        )
    except ApiException as exc:
        if exc.status == 404:
            raise BadInput(f"NetworkValidation {args.name!r} not found") from None
        raise BadInput(f"Kubernetes API error: {exc.status} {exc.reason}") from None
    except HTTPError as exc:
        raise BadInput(f"cannot reach the Kubernetes API: {exc}") from None
    try:
        args.html.write_text(render_html(obj), encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {args.html}: {exc.strerror or exc}") from None
    sys.stderr.write(f"wrote {args.html}\n")
    return EXIT_OK if is_healthy(obj) else EXIT_UNHEALTHY


def cmd_operator(args: argparse.Namespace) -> int:
    import asyncio

    from netval.infra.metrics_server import parse_host_port
    from netval.operator.admission import webhook_options
    from netval.operator.main import run_operator
    from netval.operator.settings import OperatorConfigError, operator_settings_from_env

    _setup_logging()
    try:
        settings = operator_settings_from_env(os.environ)
    except OperatorConfigError as exc:
        raise BadInput(str(exc)) from None
    try:
        metrics_addr = parse_host_port(args.metrics_addr, variable="--metrics-addr")
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    try:
        webhook = webhook_options(
            args.webhook_addr,
            cert=args.webhook_cert,
            key=args.webhook_key,
            ca=args.webhook_ca,
            service=args.webhook_service,
            failure_policy=args.webhook_failure_policy,
            timeout_seconds=args.webhook_timeout,
        )
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    asyncio.run(
        run_operator(
            settings,
            standalone=args.standalone,
            liveness_endpoint=args.liveness,
            metrics_addr=metrics_addr,
            webhook=webhook,
        )
    )
    return EXIT_OK


def cmd_uninstall_cleanup(args: argparse.Namespace) -> int:
    from netval.operator.uninstall import CleanupOptions, parse_namespaced_name, run_command

    try:
        deployment = (
            parse_namespaced_name(args.operator_deployment) if args.operator_deployment else None
        )
    except ValueError as exc:
        raise BadInput(f"--operator-deployment: {exc}") from None
    return run_command(
        CleanupOptions(
            operator_deployment=deployment,
            agent_namespace=args.agent_namespace,
            timeout=args.timeout,
            operator_wait=args.operator_wait,
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {
        "probe": cmd_probe,
        "snapshot": cmd_snapshot,
        "agent": cmd_agent,
        "operator": cmd_operator,
        "status": cmd_status,
        "report": cmd_report,
        "uninstall-cleanup": cmd_uninstall_cleanup,
    }
    try:
        return handlers[args.command](args)
    except BadInput as exc:
        sys.stderr.write(f"netval: error: {exc}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
