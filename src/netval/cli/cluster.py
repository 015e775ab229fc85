"""`netval status` and `netval report`: validations (and NetworkLoadTests) from the cluster
or from a file. `netval status --loadtests` / `--loadtest NAME` show load tests instead of
validations; `--matrix` and the report add a validation's load tests beside its east-west
figures when the cluster (or the file) has any."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from netval.cli.common import (
    EXIT_OK,
    EXIT_UNHEALTHY,
    BadInput,
    kube_errors,
    load_kube_config,
    read_status_file,
)

GROUP, VERSION, PLURAL = "netval.io", "v1alpha1", "networkvalidations"
LOADTESTS = "networkloadtests"

Objs = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Fetched:
    validations: Objs
    nodes: dict[str, Objs]  # validation -> its targeted Nodes
    loadtests: Objs  # NetworkLoadTests (only when asked for)


Fetch = Callable[[], Fetched]
# NetworkLoadTests: none, also (beside the validations: --matrix, report), only (--loadtest[s])
Want = Literal["no", "beside", "only"]


def _from_file(args: argparse.Namespace, *, want_nodes: bool, want_loadtests: Want) -> Fetch:
    """Validations (and the targeted Nodes of each, the NetworkLoadTests) from `--from FILE`."""
    data = read_status_file(args.source)
    loadtests = sorted(data.loadtests, key=lambda o: o["metadata"]["name"])
    if want_loadtests == "only":
        return lambda: Fetched([], {}, loadtests)
    if not data.validations:
        raise BadInput(f"{args.source}: holds no NetworkValidation")
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
    return lambda: Fetched(objs, nodes, loadtests if want_loadtests != "no" else [])


def _list_loadtests(custom: Any, *, required: bool) -> Objs:
    """Every NetworkLoadTest. Not `required` (beside a validation's views): a cluster without
    the CRD, or a user who may not list them, gets the validation views without them."""
    from kubernetes.client.exceptions import ApiException

    try:
        found = cast(dict[str, Any], custom.list_cluster_custom_object(GROUP, VERSION, LOADTESTS))
    except ApiException as exc:
        if not required and exc.status in (403, 404):
            return []
        if exc.status == 404:
            raise BadInput(
                "this cluster has no NetworkLoadTest resource (the CRD "
                "networkloadtests.netval.io is not installed)"
            ) from None
        raise
    return sorted(found.get("items", []), key=lambda o: o["metadata"]["name"])


def _from_cluster(args: argparse.Namespace, *, want_nodes: bool, want_loadtests: Want) -> Fetch:
    from kubernetes import client

    from netval.cli.status_view import label_selector

    load_kube_config(args.kubeconfig, args.context)
    custom = client.CustomObjectsApi()
    core = client.CoreV1Api()
    api_client = client.ApiClient()

    def serialize(obj: Any) -> dict[str, Any]:
        return cast(dict[str, Any], api_client.sanitize_for_serialization(obj))  # type: ignore[no-untyped-call]

    def loadtests_only() -> Fetched:
        one = getattr(args, "loadtest", None)
        with kube_errors(not_found=f"NetworkLoadTest {one!r} not found"):
            if one:
                obj = custom.get_cluster_custom_object(GROUP, VERSION, LOADTESTS, one)
                return Fetched([], {}, [cast(dict[str, Any], obj)])
            return Fetched([], {}, _list_loadtests(custom, required=True))

    def fetch() -> Fetched:
        with kube_errors(not_found=f"NetworkValidation {args.name!r} not found"):
            objs: Objs
            if args.name:
                one = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, args.name)
                objs = [cast(dict[str, Any], one)]
            else:
                found = cast(
                    dict[str, Any], custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
                )
                objs = sorted(found.get("items", []), key=lambda o: o["metadata"]["name"])
            nodes: dict[str, Objs] = {}
            for obj in objs if want_nodes else []:
                # only the targeted nodes: the API filters by the validation's nodeSelector
                listed = core.list_node(label_selector=label_selector(obj))
                nodes[obj["metadata"]["name"]] = [serialize(n) for n in listed.items]
            loadtests = _list_loadtests(custom, required=False) if want_loadtests != "no" else []
        return Fetched(objs, nodes, loadtests)

    return loadtests_only if want_loadtests == "only" else fetch


def _check_loadtest_flags(args: argparse.Namespace) -> None:
    if args.loadtest and args.loadtests:
        raise BadInput("--loadtest NAME shows one load test, --loadtests lists them: give one")
    if args.loadtest and args.name:
        raise BadInput(
            f"--loadtest {args.loadtest} names the load test: leave out {args.name!r} "
            "(or list a validation's load tests with NAME --loadtests)"
        )
    for flag, given in (("--nodes", args.nodes), ("--matrix", args.matrix),
                        ("--consistency", args.consistency), ("--topology", args.topology)):  # fmt: skip
        if given:
            raise BadInput(f"{flag} shows a validation: it does not go with --loadtest(s)")


def _render_loadtests(args: argparse.Namespace, loadtests: Objs) -> tuple[str, bool]:
    """(the text, whether every shown test is not Failed) of --loadtests / --loadtest NAME."""
    from netval.cli.loadtest_format import is_failed, loadtests_of
    from netval.cli.loadtest_view import render_loadtest, render_loadtest_list

    now = datetime.now(UTC)
    shown: Sequence[Mapping[str, Any]]
    if args.loadtest:
        shown = [o for o in loadtests if o["metadata"]["name"] == args.loadtest]
        if not shown:
            raise BadInput(f"NetworkLoadTest {args.loadtest!r} not found")
        text = render_loadtest(shown[0], now)
    else:
        shown = loadtests_of(args.name, loadtests) if args.name else loadtests
        if not shown:
            of = f" of NetworkValidation {args.name!r}" if args.name else ""
            return f"no NetworkLoadTests{of}\n", True
        text = render_loadtest_list(shown, now)
    return text, not any(is_failed(o) for o in shown)


def _render_validations(args: argparse.Namespace, got: Fetched) -> tuple[str, bool]:
    from netval.cli.consistency_view import render_consistency
    from netval.cli.loadtest_format import loadtests_of
    from netval.cli.loadtest_view import capacity_ratios, render_beside_matrix
    from netval.cli.status_view import is_healthy, render_matrix, render_nodes, render_validation
    from netval.cli.topology_view import render_topology

    if not got.validations:
        return "no NetworkValidations\n", True
    now = datetime.now(UTC)
    out = []
    for obj in got.validations:
        name = obj["metadata"]["name"]
        out.append(render_validation(obj))
        if args.nodes:
            out.append(render_nodes(obj, got.nodes.get(name, []), failing_only=args.failing))
        if args.matrix:
            out.append(render_matrix(obj))
            beside = render_beside_matrix(
                capacity_ratios(obj), loadtests_of(name, got.loadtests), now
            )
            if beside:
                out.append(beside)
        if getattr(args, "consistency", False):  # absent from hand-built Namespaces
            out.append(render_consistency(obj))
        if getattr(args, "topology", False):
            out.append(render_topology(obj))
    return "\n".join(out), all(is_healthy(o) for o in got.validations)


def cmd_status(args: argparse.Namespace) -> int:
    if args.failing and not args.nodes:
        raise BadInput("--failing goes with --nodes (netval status NAME --nodes --failing)")
    for flag in ("loadtest", "loadtests", "consistency", "topology"):
        if not hasattr(args, flag):  # a hand-built Namespace
            setattr(args, flag, None)
    only_loadtests = bool(args.loadtest or args.loadtests)
    if only_loadtests:
        _check_loadtest_flags(args)
    want: Want = "only" if only_loadtests else ("beside" if args.matrix else "no")
    if args.source is not None:
        for flag, given in (("--watch", args.watch), ("--kubeconfig", args.kubeconfig),
                            ("--context", args.context)):  # fmt: skip
            if given:
                raise BadInput(f"{flag} does not apply with --from (a file does not change)")
        fetch = _from_file(args, want_nodes=args.nodes, want_loadtests=want)
    else:
        fetch = _from_cluster(args, want_nodes=args.nodes, want_loadtests=want)

    def once() -> int:
        got = fetch()
        if only_loadtests:
            text, good = _render_loadtests(args, got.loadtests)
        else:
            text, good = _render_validations(args, got)
        sys.stdout.write(text)
        sys.stdout.flush()
        return EXIT_OK if good else EXIT_UNHEALTHY

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
    from netval.cli.loadtest_format import loadtests_of
    from netval.cli.report_html import render_html
    from netval.cli.status_view import is_healthy

    if args.source is not None:
        if args.kubeconfig or args.context:
            raise BadInput("--kubeconfig/--context do not apply with --from")
        got = _from_file(args, want_nodes=False, want_loadtests="beside")()
        if len(got.validations) > 1:
            names = ", ".join(o["metadata"]["name"] for o in got.validations)
            raise BadInput(f"{args.source} holds several NetworkValidations ({names}): name one")
    else:
        if not args.name:
            raise BadInput("name the NetworkValidation (or read one from a file with --from)")
        got = _from_cluster(args, want_nodes=False, want_loadtests="beside")()
    obj = got.validations[0]
    loadtests = loadtests_of(obj["metadata"]["name"], got.loadtests)
    try:
        args.html.write_text(render_html(obj, loadtests=loadtests), encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {args.html}: {exc.strerror or exc}") from None
    sys.stderr.write(f"wrote {args.html}\n")
    return EXIT_OK if is_healthy(obj) else EXIT_UNHEALTHY
