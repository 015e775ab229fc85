"""What every `netval` command shares: exit codes, BadInput, config and kubeconfig loading.

Exit codes (a contract for scripts and CI): 0 nothing failed or errored, 1 a check failed or
errored (a validation is not Healthy, a doctor check failed), 2 bad usage or bad input (one
line on stderr naming the file, flag or variable). A broken kubeconfig is bad input (2), never
"not Healthy" (1): a script must not read a broken laptop as a broken fabric.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from netval.infra.yaml_input import InputFileError, load_yaml_document
from netval.model.manifest import ConfigError, ProbeConfig, probe_config_from_document

EXIT_OK: Final = 0
EXIT_UNHEALTHY: Final = 1
EXIT_BAD_INPUT: Final = 2
MAX_CONFIG_BYTES: Final = 1 << 20
MAX_STATUS_FILE_BYTES: Final = 16 << 20  # a `kubectl get netval,nodes -o yaml` of a big pool

ENV_KUBECONFIG: Final = "KUBECONFIG"
ENV_NODE_NAME: Final = "NETVAL_NODE_NAME"
ENV_LOG_LEVEL: Final = "NETVAL_LOG_LEVEL"
ENV_SERVICE_HOST: Final = "KUBERNETES_SERVICE_HOST"  # set in every pod: in-cluster config


class BadInput(Exception):
    """Input the user must fix; printed as one line, exit 2."""


def load_probe_config(path: Path | None) -> ProbeConfig:
    """`--config FILE` (absent: the defaults; an empty file is an error, not the defaults)."""
    if path is None:
        return probe_config_from_document(None)
    try:
        doc = load_yaml_document(path, max_bytes=MAX_CONFIG_BYTES)
    except InputFileError as exc:
        raise BadInput(str(exc)) from None
    if doc is None:
        raise BadInput(
            f"{path}: empty: expected a NetworkValidation manifest or a checks mapping "
            "(leave out --config for the defaults)"
        )
    try:
        return probe_config_from_document(doc)
    except ConfigError as exc:
        raise BadInput(f"{path}: {exc}") from None


def node_name(explicit: str | None) -> str:
    return explicit or os.environ.get(ENV_NODE_NAME) or socket.gethostname()


# -- Kubernetes configuration -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KubeTarget:
    """Where the client was pointed: for messages ("in-cluster", a kubeconfig and context)."""

    source: str
    context: str | None = None

    def __str__(self) -> str:
        return f"{self.source} (context {self.context})" if self.context else self.source


def _kubeconfig_files(explicit: Path | None) -> tuple[str, list[Path]]:
    """(how the user named them, the files) of the kubeconfig to load."""
    if explicit is not None:
        return f"--kubeconfig {explicit}", [explicit]
    env = os.environ.get(ENV_KUBECONFIG, "")
    if env:
        return f"{ENV_KUBECONFIG}={env}", [Path(p) for p in env.split(os.pathsep) if p]
    default = Path("~/.kube/config").expanduser()
    return str(default), [default]


def _check_kubeconfig_file(path: Path, named: str) -> None:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{named}: {path}: cannot read: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(raw.decode("utf-8", errors="replace"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{named}: {path}: not a kubeconfig: invalid YAML{where}") from None
    if not isinstance(doc, dict) or not any(k in doc for k in ("clusters", "contexts", "users")):
        raise BadInput(
            f"{named}: {path}: not a kubeconfig (expected a YAML mapping with clusters, "
            "contexts and users)"
        )


def load_kube_config(kubeconfig: Path | None = None, context: str | None = None) -> KubeTarget:
    """Point the official client's default configuration at a cluster, or raise BadInput
    (one line naming the file) for anything that stops it: no configuration at all, a
    missing file, a file that is not a kubeconfig, an unknown context.

    In a pod (and without --kubeconfig/--context) the in-cluster configuration is used;
    otherwise --kubeconfig, else KUBECONFIG (a list of files, as kubectl reads it), else
    ~/.kube/config."""
    from kubernetes import config

    if kubeconfig is None and context is None and os.environ.get(ENV_SERVICE_HOST):
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return KubeTarget("in-cluster configuration")
        except config.ConfigException:
            pass  # not a usable pod environment: try a kubeconfig
    named, files = _kubeconfig_files(kubeconfig)
    existing = [p for p in files if p.exists()]
    if not existing:
        if kubeconfig is None and not os.environ.get(ENV_KUBECONFIG):
            raise BadInput(
                f"no Kubernetes configuration: not in a pod, {ENV_KUBECONFIG} is unset and "
                f"{named} does not exist (use --kubeconfig FILE or set {ENV_KUBECONFIG})"
            )
        missing = ", ".join(str(p) for p in files) or "(empty)"
        raise BadInput(f"{named}: no such file: {missing}")
    for path in existing:
        _check_kubeconfig_file(path, named)
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.pathsep.join(str(p) for p in existing), context=context
        )
    except Exception as exc:  # the client raises ConfigException, but also TypeError & co.
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise BadInput(f"{named}: cannot use this kubeconfig: {text}") from None
    return KubeTarget(named, context)


@contextlib.contextmanager
def kube_errors(not_found: str | None = None) -> Iterator[None]:
    """API errors as one line (exit 2): 404 as `not_found` if given, else the status."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        if exc.status == 404 and not_found:
            raise BadInput(not_found) from None
        raise BadInput(f"Kubernetes API error: {exc.status} {exc.reason}") from None
    except HTTPError as exc:
        raise BadInput(f"cannot reach the Kubernetes API: {exc}") from None


# -- a NetworkValidation from a file (`--from FILE`) ------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusFile:
    """What `kubectl get netval[,netload,nodes] -o yaml|json` wrote: validations, maybe
    NetworkLoadTests and Nodes."""

    validations: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    loadtests: list[dict[str, Any]] = field(default_factory=list)


def read_status_file(path: Path) -> StatusFile:
    """A NetworkValidation, or a List of them (and Nodes and NetworkLoadTests), from YAML or
    JSON. It must hold a validation or a load test; the callers say which they need."""
    try:
        doc = load_yaml_document(path, max_bytes=MAX_STATUS_FILE_BYTES)
    except InputFileError as exc:
        raise BadInput(str(exc)) from None
    if doc is None:
        raise BadInput(
            f"{path}: empty: expected a NetworkValidation (kubectl get netval NAME -o yaml)"
        )
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: expected a NetworkValidation object, got {type(doc).__name__}")
    items: list[Any]
    items = doc["items"] if isinstance(doc.get("items"), list) else [doc]
    validations: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    loadtests: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{path}: items[{i}]" if item is not doc else str(path)
        if not isinstance(item, dict):
            raise BadInput(f"{where}: expected an object, got {type(item).__name__}")
        kind = item.get("kind")
        meta = item.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise BadInput(f"{where}: field metadata.name: missing")
        if kind == "NetworkValidation":
            validations.append(item)
        elif kind == "Node":
            nodes.append(item)
        elif kind == "NetworkLoadTest":
            loadtests.append(item)
        else:
            raise BadInput(
                f"{where}: field kind: expected NetworkValidation (or Node, NetworkLoadTest), "
                f"got {kind!r}"
            )
    if not validations and not loadtests:
        raise BadInput(f"{path}: holds no NetworkValidation")
    return StatusFile(validations, nodes, loadtests)
