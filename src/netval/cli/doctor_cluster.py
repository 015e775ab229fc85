"""`netval doctor`'s checks of what the cluster serves: the API, netval's CRD, Kueue.

The CRD check compares the installed schema with the spec and status models of this netval:
an older CRD makes the API server prune the fields netval writes, silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, get_origin

from netval import __version__
from netval.cli.common import KubeTarget
from netval.cli.doctor_kube import KubeReader
from netval.cli.doctor_result import CheckResult, fail, ok, skip

CRD_NAME: Final = "networkvalidations.netval.io"
CRD_VERSION: Final = "v1alpha1"
CRD_FIX: Final = (
    "kubectl apply -f crds/networkvalidations.netval.io.yaml (or helm upgrade the chart)"
)
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSIONS: Final = ("v1beta2", "v1beta1")  # what the operator's Kueue controller reads


def check_api(kube: KubeReader, target: KubeTarget) -> CheckResult:
    code, body = kube.get("/version")
    if code != 200:
        return fail("kubernetes-api", f"no answer from the API ({target}): {body}",
                    "check --kubeconfig/--context and that the cluster is up")  # fmt: skip
    version = body.get("gitVersion", "?") if isinstance(body, dict) else "?"
    return ok("kubernetes-api", f"{kube.host} answers ({version}), using {target}")


def check_crd(kube: KubeReader) -> CheckResult:
    code, crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    if code == 404:
        return fail("crd", f"{CRD_NAME} is not installed", CRD_FIX)
    if code != 200 or not isinstance(crd, dict):
        return fail("crd", f"cannot read the CRD {CRD_NAME}: HTTP {code}",
                    "is doctor allowed to get customresourcedefinitions?")  # fmt: skip
    versions = {v.get("name"): v for v in crd.get("spec", {}).get("versions", [])}
    version = versions.get(CRD_VERSION)
    if version is None or not version.get("served", False):
        served = ", ".join(str(n) for n, v in versions.items() if v.get("served")) or "none"
        return fail("crd", f"{CRD_NAME} does not serve {CRD_VERSION} (serves {served}); "
                           f"this netval {__version__} needs it", CRD_FIX)  # fmt: skip
    schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
    missing = missing_schema_fields(schema)
    if missing:
        shown = ", ".join(missing[:6]) + (
            f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        )
        return fail("crd", f"{CRD_NAME} is older than this netval {__version__}: its "
                           f"schema lacks {shown} (the API server would drop them)", CRD_FIX)  # fmt: skip
    return ok("crd", f"{CRD_NAME} serves {CRD_VERSION} with every field netval {__version__} uses")


def check_kueue(kube: KubeReader, used: bool) -> CheckResult:
    """`used`: the operator has NETVAL_KUEUE_ENABLED=true (a missing Kueue is then a failure)."""
    code, body = kube.get(f"/apis/{KUEUE_GROUP}")
    if code != 200 or not isinstance(body, dict):
        if used:
            return fail("kueue", f"the operator has NETVAL_KUEUE_ENABLED=true but the API "
                        f"serves no {KUEUE_GROUP}",
                        "install Kueue, or set kueue.enabled=false in the chart")  # fmt: skip
        return skip("kueue", "Kueue is not installed (the operator does not use it)")
    served = [v.get("version") for v in body.get("versions", [])]
    preferred = (body.get("preferredVersion") or {}).get("version")
    usable = [v for v in KUEUE_VERSIONS if v in served]
    what = f"Kueue installed: {KUEUE_GROUP} serves {', '.join(map(str, served))} (preferred {preferred})"
    if not usable:
        return fail("kueue", f"{what}; netval reads {' or '.join(KUEUE_VERSIONS)}",
                    "upgrade Kueue to a release serving v1beta1 or v1beta2")  # fmt: skip
    use = f"; netval uses {usable[0]}" + ("" if used else " (not enabled in the operator)")
    return ok("kueue", what + use)


def _schema_paths(schema: Mapping[str, Any], prefix: str) -> Iterable[str]:
    yield prefix
    for key, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, Mapping):
            yield from _schema_paths(sub, f"{prefix}.{key}")
            items = sub.get("items")
            if isinstance(items, Mapping):
                yield from _schema_paths(items, f"{prefix}.{key}[]")


def _model_paths(model: Any, prefix: str) -> Iterable[str]:
    from pydantic import BaseModel

    from netval.model.manifest import _inner_models

    yield prefix
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return
    for name, f in model.model_fields.items():
        key = f.alias or name
        if get_origin(f.annotation) is dict:  # additionalProperties: keys are free
            yield f"{prefix}.{key}"
            continue
        inner = next(_inner_models(f.annotation), None)
        is_list = getattr(f.annotation, "__origin__", None) is list or "list[" in str(f.annotation)
        path = f"{prefix}.{key}[]" if is_list and inner is not None else f"{prefix}.{key}"
        if inner is None:
            yield path
        elif inner.model_config.get("extra") != "allow":
            yield from _model_paths(inner, path)


def missing_schema_fields(schema: Mapping[str, Any]) -> list[str]:
    """Fields of the spec and status models that `schema` (the CRD's openAPIV3Schema) lacks:
    a CRD older than this netval, whose API server would prune what netval writes."""
    from netval.model.spec import NetworkValidationSpec
    from netval.model.status import NetworkValidationStatus

    props = schema.get("properties") or {}
    have: set[str] = set()
    for top in ("spec", "status"):
        sub = props.get(top)
        if isinstance(sub, Mapping):
            if sub.get("x-kubernetes-preserve-unknown-fields"):
                return []
            have.update(_schema_paths(sub, top))
    want = [*_model_paths(NetworkValidationSpec, "spec"),
            *_model_paths(NetworkValidationStatus, "status")]  # fmt: skip
    missing = [p for p in want if p not in have]
    # report the shallowest missing field only (spec.checks.peers, not all of peers' fields)
    return [p for p in missing if not any(p.startswith(f"{q}.") or p.startswith(f"{q}[]")
                                          for q in missing if q != p)]  # fmt: skip
