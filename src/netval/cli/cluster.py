"""`netval status` and `netval report`: validations from the cluster or from a file."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, cast

from netval.cli.common import (
    EXIT_OK,
    EXIT_UNHEALTHY,
    BadInput,
    kube_errors,
    load_kube_config,
    read_status_file,
)

GROUP, VERSION, PLURAL = "netval.io", "v1alpha1", "networkvalidations"

Fetch = Callable[[], tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]]


def _from_file(args: argparse.Namespace, *, want_nodes: bool) -> Fetch:
    """Validations (and the targeted Nodes of each) from `--from FILE`."""
    data = read_status_file(args.source)
    objs = sorted(data.validations, key=lambda o: o["metadata"]["name"])
    if args.name:
        objs = [o for o in objs if o["metadata"]["name"] == args.name]
        if not objs:
            names = ", ".join(o["metadata"]["name"] for o in data.validations)
            raise BadInput(f"{args.source}: no NetworkValidation {args.name!r} (it holds {names})")
    if want_nodes and not data.nodes:
        raise BadInput(
            f"--nodes: {args.source} holds no Node objects (write it with "
            "`kubectl get netval NAME,nodes -o yaml`)"
        )
    nodes = {o["metadata"]["name"]: data.nodes for o in objs}
    return lambda: (objs, nodes)


def _from_cluster(args: argparse.Namespace, *, want_nodes: bool) -> Fetch:
    from kubernetes import client

    from netval.cli.status_view import label_selector

    load_kube_config(args.kubeconfig, args.context)
    custom = client.CustomObjectsApi()
    core = client.CoreV1Api()
    api_client = client.ApiClient()

    def serialize(obj: Any) -> dict[str, Any]:
        return cast(dict[str, Any], api_client.sanitize_for_serialization(obj))  # type: ignore[no-untyped-call]

    def fetch() -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        with kube_errors(not_found=f"NetworkValidation {args.name!r} not found"):
            objs: list[dict[str, Any]]
            if args.name:
                one = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, args.name)
                objs = [cast(dict[str, Any], one)]
            else:
                found = cast(
                    dict[str, Any], custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
                )
                objs = sorted(found.get("items", []), key=lambda o: o["metadata"]["name"])
            nodes: dict[str, list[dict[str, Any]]] = {}
            for obj in objs if want_nodes else []:
                # only the targeted nodes: the API filters by the validation's nodeSelector
                listed = core.list_node(label_selector=label_selector(obj))
                nodes[obj["metadata"]["name"]] = [serialize(n) for n in listed.items]
        return objs, nodes

    return fetch


def cmd_status(args: argparse.Namespace) -> int:
    from netval.cli.consistency_view import render_consistency
    from netval.cli.status_view import is_healthy, render_matrix, render_nodes, render_validation

    if args.failing and not args.nodes:
        raise BadInput("--failing goes with --nodes (netval status NAME --nodes --failing)")
    if args.source is not None:
        for flag, given in (("--watch", args.watch), ("--kubeconfig", args.kubeconfig),
                            ("--context", args.context)):  # fmt: skip
            if given:
                raise BadInput(f"{flag} does not apply with --from (a file does not change)")
        fetch = _from_file(args, want_nodes=args.nodes)
    else:
        fetch = _from_cluster(args, want_nodes=args.nodes)

    def once() -> int:
        objs, nodes = fetch()
        if not objs:
            sys.stdout.write("no NetworkValidations\n")
            return EXIT_OK
        out = []
        for obj in objs:
            out.append(render_validation(obj))
            if args.nodes:
                out.append(
                    render_nodes(
                        obj, nodes.get(obj["metadata"]["name"], []), failing_only=args.failing
                    )
                )
            if args.matrix:
                out.append(render_matrix(obj))
            if getattr(args, "consistency", False):  # absent from hand-built Namespaces
                out.append(render_consistency(obj))
        sys.stdout.write("\n".join(out))
        sys.stdout.flush()
        return EXIT_OK if all(is_healthy(o) for o in objs) else EXIT_UNHEALTHY

    if not args.watch:
        return once()
    while True:
        if sys.stdout.isatty():
            sys.stdout.write("\x1b[2J\x1b[H")
        once()
        time.sleep(args.every)
        if not sys.stdout.isatty():
            sys.stdout.write("---\n")


def cmd_report(args: argparse.Namespace) -> int:
    from netval.cli.report_html import render_html
    from netval.cli.status_view import is_healthy

    if args.source is not None:
        if args.kubeconfig or args.context:
            raise BadInput("--kubeconfig/--context do not apply with --from")
        objs, _ = _from_file(args, want_nodes=False)()
        if len(objs) > 1:
            names = ", ".join(o["metadata"]["name"] for o in objs)
            raise BadInput(f"{args.source} holds several NetworkValidations ({names}): name one")
    else:
        if not args.name:
            raise BadInput("name the NetworkValidation (or read one from a file with --from)")
        objs, _ = _from_cluster(args, want_nodes=False)()
    obj = objs[0]
    try:
        args.html.write_text(render_html(obj), encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {args.html}: {exc.strerror or exc}") from None
    sys.stderr.write(f"wrote {args.html}\n")
    return EXIT_OK if is_healthy(obj) else EXIT_UNHEALTHY
