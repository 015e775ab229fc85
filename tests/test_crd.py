"""The NetworkValidation CRD agrees with the pydantic models, is structural, and refuses bad specs.

`crds/networkvalidations.netval.io.yaml` is hand-written. These tests walk the pydantic models
(spec.py, status.py) and the CRD's openAPIV3Schema side by side and report every difference:
property names (by alias), types, enums, bounds, patterns, lengths, defaults (the model's
default dumped by alias in JSON mode against the CRD default with the API server's nested
defaulting applied) and required fields. Where the CRD is deliberately stricter than the model
(list bounds, the core Toleration shape, CEL rules standing in for model validators), the
difference is listed here with the reason, so any other drift fails.

Specs are validated against the schema with `jsonschema` (Draft 4 is the JSON-Schema dialect of
OpenAPI v3.0: boolean exclusiveMinimum), extended with what the API server adds:
`x-kubernetes-list-type` uniqueness and the CRD's CEL rules, emulated one by one in Python.
"""

from __future__ import annotations

import copy
import datetime as dt
import types
import typing
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import annotated_types
import jsonschema
import pytest
import yaml
from jsonschema import Draft4Validator, ValidationError, validators
from pydantic import AfterValidator, BaseModel, Field, Strict, TypeAdapter, create_model
from pydantic.fields import FieldInfo

from netval.model import spec as spec_module
from netval.model import spec_fleet
from netval.model.duration import parse_duration
from netval.model.manifest import API_GROUP, API_VERSION, KIND
from netval.model.spec import (
    MIN_INTERVAL_SECONDS,
    ROCE_MTUS,
    LinkChecks,
    MtuChecks,
    NetworkValidationSpec,
    PfcChecks,
    RdmaChecks,
    StorageChecks,
    TopologySpec,
)
from netval.model.status import MAX_FAILURES, Condition, Failure, NetworkValidationStatus

ROOT = Path(__file__).resolve().parent.parent
CRD_PATH = ROOT / "crds" / "networkvalidations.netval.io.yaml"
EXAMPLES = ROOT / "examples"

# Schema keywords that constrain a value; compared exactly, model against CRD.
CONSTRAINTS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "enum",
    "format",
    "nullable",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
)

INTERVAL_RULE = {
    "rule": f"duration(self) >= duration('{MIN_INTERVAL_SECONDS:g}s')",
    "message": f"interval must be at least {MIN_INTERVAL_SECONDS:g}s",
}

# Model validators (pydantic code, invisible to a field walk) and what stands for each in the
# CRD. A new model validator fails the comparison until it is mapped here, i.e. until someone
# decided how the API server enforces it.
MODEL_VALIDATORS: dict[tuple[type[BaseModel], str], dict[str, dict[str, Any]]] = {
    (MtuChecks, "_roce_mtu_is_ib_mtu"): {"roceMTU": {"enum": list(ROCE_MTUS)}},
    (StorageChecks, "_unique_names"): {
        "endpoints": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    },
    (NetworkValidationSpec, "_interval_floor"): {
        "interval": {"x-kubernetes-validations": [INTERVAL_RULE]}
    },
    # Redaction rewrites status messages, it refuses nothing: no counterpart to enforce.
    (Condition, "_redacted"): {},
    (Failure, "_redacted"): {},
    # Deprecated per-interval counts are converted to per-second limits, nothing is refused;
    # the CRD leaves the per-second fields without a default so the conversion still sees
    # them unset after the API server's defaulting.
    (NetworkValidationSpec, "_deprecated_per_interval"): {},
    (RdmaChecks, "_deprecated_per_interval"): {},
    (PfcChecks, "_deprecated_per_interval"): {},
    (TopologySpec, "_unique_levels"): {"levels": {"x-kubernetes-list-type": "set"}},
}

# Field-level validators (Annotated[..., AfterValidator(f)]) and their CRD counterparts.
# Unique priorities of 0..7: a set, so at most 8 entries.
FIELD_VALIDATORS: dict[Callable[..., Any], dict[str, Any]] = {
    spec_module._unique_priorities: {"x-kubernetes-list-type": "set", "maxItems": 8},
    spec_module._unique_names: {"x-kubernetes-list-type": "set"},
    # key names and count; the CRD says maxProperties (not compared: no model keyword maps)
    spec_fleet._fact_map: {},
    # a network in CIDR notation: the operator parses it (the CRD bounds the length only)
    spec_module._cidr: {},
}

# Where the CRD says more than the model, and why. Everything else must match exactly.
CRD_ONLY: dict[str, dict[str, Any]] = {
    # Bounded lists: keep objects (and the CEL cost estimate for tolerations) small.
    "spec.tolerations": {"maxItems": 64},
    "spec.checks.link.interfaces": {"maxItems": 64},
    "spec.checks.mtu.interfaces": {"maxItems": 64},
    "spec.checks.rdma.devices": {"maxItems": 64},
    "spec.checks.storage.endpoints": {"maxItems": 64},
    # metav1 conditions convention: one condition per type (the model does not check this).
    "status.conditions": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    # Kubernetes convention for generations.
    "status.observedGeneration": {"format": "int64"},
    "status.conditions[].observedGeneration": {"format": "int64"},
}

# The model keeps tolerations as free-form dicts (they are copied into the DaemonSet as they
# are); the CRD gives them the core/v1 Toleration schema and its cross-field rules.
TOLERATION_PATH = "spec.tolerations[]"
TOLERATION_TYPES = {
    "key": "string",
    "operator": "string",
    "value": "string",
    "effect": "string",
    "tolerationSeconds": "integer",
}

_SCALARS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


# --- the CRD -----------------------------------------------------------------------------


def load_crd() -> dict[str, Any]:
    with open(CRD_PATH, encoding="utf-8") as fh:
        doc: dict[str, Any] = yaml.safe_load(fh)
    return doc


def root_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return load_crd()


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    return root_schema(crd)


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """The API server's structural defaulting: absent properties get their default, and the
    defaulted values are defaulted in turn (so `default: {}` fills the nested defaults)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name, sub in props.items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
        extra = schema.get("additionalProperties")
        for name in value:
            if name in props:
                value[name] = apply_defaults(props[name], value[name])
            elif isinstance(extra, dict):
                value[name] = apply_defaults(extra, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def prune(schema: dict[str, Any], value: Any) -> Any:
    """The API server's pruning: drop properties the schema does not know."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is not None:
            return {k: prune(props[k], v) for k, v in value.items() if k in props}
        if isinstance(extra, dict):
            return {k: prune(extra, v) for k, v in value.items()}
        return {}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(schema["items"], v) for v in value]
    return value


# --- the model walk ----------------------------------------------------------------------


def _unwrap(annotation: Any, metadata: list[Any]) -> tuple[Any, list[Any], bool]:
    """Strip Optional and Annotated; return (bare type, all metadata, optional)."""
    meta = list(metadata)
    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation, *more = typing.get_args(annotation)
            meta.extend(more)
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                raise TypeError(f"unsupported union {annotation!r}")
            optional = True
            annotation = args[0]
        else:
            return annotation, meta, optional


def _constraints(meta: list[Any], bare: Any, path: str) -> tuple[dict[str, Any], list[str]]:
    """The schema keywords the field metadata implies, and metadata the walk can't map."""
    out: dict[str, Any] = {}
    unknown: list[str] = []
    is_list = typing.get_origin(bare) is list
    for m in meta:
        if isinstance(m, FieldInfo):
            inner, more = _constraints(list(m.metadata), bare, path)
            out.update(inner)
            unknown += more
        elif isinstance(m, Strict):
            pass  # no coercion (bool, "3", 3.0 refused): the CRD's `type` refuses them already
        elif isinstance(m, annotated_types.Ge):
            out["minimum"] = m.ge
        elif isinstance(m, annotated_types.Gt):
            out.update(minimum=m.gt, exclusiveMinimum=True)
        elif isinstance(m, annotated_types.Le):
            out["maximum"] = m.le
        elif isinstance(m, annotated_types.Lt):
            out.update(maximum=m.lt, exclusiveMaximum=True)
        elif isinstance(m, annotated_types.MinLen):
            out["minItems" if is_list else "minLength"] = m.min_length
        elif isinstance(m, annotated_types.MaxLen):
            out["maxItems" if is_list else "maxLength"] = m.max_length
        elif isinstance(m, AfterValidator) and m.func in FIELD_VALIDATORS:
            out.update(FIELD_VALIDATORS[m.func])
        elif type(m).__name__ == "_PydanticGeneralMetadata" and set(vars(m)) == {"pattern"}:
            out["pattern"] = vars(m)["pattern"]
        else:
            unknown.append(f"{path}: model metadata {m!r} has no CRD mapping in this test")
    return out, unknown


def _check_constraints(
    schema: dict[str, Any], expected: dict[str, Any], path: str
) -> Iterator[str]:
    got = {k: schema[k] for k in CONSTRAINTS if k in schema}
    for key in sorted(got.keys() | expected.keys()):
        if key not in got:
            yield f"{path}: model implies {key}={expected[key]!r}, CRD has none"
        elif key not in expected:
            yield f"{path}: CRD has {key}={got[key]!r}, model has no such constraint"
        elif got[key] != expected[key] or type(got[key]) is not type(expected[key]):
            yield f"{path}: {key} is {got[key]!r} in the CRD, {expected[key]!r} in the model"


def compare_value(
    annotation: Any,
    metadata: list[Any],
    schema: dict[str, Any],
    path: str,
    extra: dict[str, Any] | None = None,
) -> list[str]:
    """Differences between one model type (with its field metadata) and one schema node."""
    bare, meta, _optional = _unwrap(annotation, metadata)
    expected, problems = _constraints(meta, bare, path)
    expected.update(extra or {})
    expected.update(CRD_ONLY.get(path, {}))
    crd_type = schema.get("type")
    origin = typing.get_origin(bare)

    def want(kind: str) -> None:
        if crd_type != kind:
            problems.append(f"{path}: type {crd_type!r} in the CRD, {kind!r} in the model")

    if isinstance(bare, type) and issubclass(bare, BaseModel):
        problems += compare_model(bare, schema, path)
    elif isinstance(bare, type) and issubclass(bare, Enum):
        want("string")
        expected["enum"] = [m.value for m in bare]
    elif origin is Literal:
        values = list(typing.get_args(bare))
        want(_SCALARS[type(values[0])])
        expected["enum"] = values
    elif bare is dt.datetime:
        want("string")
        expected["format"] = "date-time"
    elif bare in _SCALARS:
        want(_SCALARS[bare])
    elif origin is list:
        want("array")
        (item,) = typing.get_args(bare)
        items = schema.get("items")
        if not isinstance(items, dict):
            problems.append(f"{path}: array without an items schema")
        else:
            problems += compare_value(item, [], items, f"{path}[]")
    elif origin is dict and typing.get_args(bare)[1] is Any:
        if path == TOLERATION_PATH:
            return problems + compare_toleration(schema, path)
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            problems.append(f"{path}: free-form in the model, needs a reviewed CRD schema")
        return problems
    elif origin is dict:
        want("object")
        key, value = typing.get_args(bare)
        if key is not str:
            problems.append(f"{path}: map keys must be strings, model has {key!r}")
        if "properties" in schema:
            problems.append(f"{path}: a map in the model, properties in the CRD")
        values = schema.get("additionalProperties")
        if not isinstance(values, dict):
            problems.append(f"{path}: a map in the model, no additionalProperties in the CRD")
        else:
            problems += compare_value(value, [], values, f"{path}{{}}")
    else:
        problems.append(f"{path}: model type {bare!r} has no CRD mapping in this test")
    problems += _check_constraints(schema, expected, path)
    return problems


def compare_toleration(schema: dict[str, Any], path: str) -> list[str]:
    problems = []
    if schema.get("type") != "object":
        problems.append(f"{path}: a toleration is an object")
    props = schema.get("properties", {})
    got = {name: sub.get("type") for name, sub in props.items()}
    if got != TOLERATION_TYPES:
        problems.append(f"{path}: toleration fields {got}, core/v1 has {TOLERATION_TYPES}")
    if props.get("operator", {}).get("enum") != ["Exists", "Equal"]:
        problems.append(f"{path}.operator: enum must be the core operators Exists, Equal")
    if props.get("effect", {}).get("enum") != ["NoSchedule", "PreferNoSchedule", "NoExecute"]:
        problems.append(f"{path}.effect: enum must be the core taint effects")
    rules = [r["rule"] for r in schema.get("x-kubernetes-validations", [])]
    if len(rules) != 3 or not set(rules) <= CEL_RULES.keys():
        problems.append(f"{path}: the core toleration rules (with Python stand-ins) expected")
    return problems


def _default_json(field: FieldInfo) -> Any:
    value = field.get_default(call_default_factory=True)
    return TypeAdapter(field.annotation).dump_python(
        value, mode="json", by_alias=True, exclude_none=True
    )


def compare_default(field: FieldInfo, schema: dict[str, Any], path: str) -> list[str]:
    if field.is_required():
        return [f"{path}: required in the model, has a CRD default"] if "default" in schema else []
    expected = _default_json(field)
    if expected is None:
        if "default" in schema:
            return [f"{path}: CRD default {schema['default']!r}, model default None (unset)"]
        return []
    if "default" not in schema:
        return [f"{path}: model default {expected!r}, CRD has no default"]
    applied = apply_defaults(schema, copy.deepcopy(schema["default"]))
    if applied != expected or type(applied) is not type(expected):
        return [f"{path}: CRD default gives {applied!r}, model default is {expected!r}"]
    return []


def compare_model(model: type[BaseModel], schema: dict[str, Any], path: str) -> list[str]:
    """Every difference between a pydantic model and an object schema, recursively."""
    problems: list[str] = []
    if schema.get("type") != "object":
        problems.append(f"{path}: type {schema.get('type')!r} in the CRD, object in the model")
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    props: dict[str, Any] = schema.get("properties", {})
    for alias in sorted(fields.keys() - props.keys()):
        problems.append(f"{path}.{alias}: in the model, missing from the CRD")
    for alias in sorted(props.keys() - fields.keys()):
        problems.append(f"{path}.{alias}: in the CRD, missing from the model")
    model_required = sorted(a for a, f in fields.items() if f.is_required())
    crd_required = sorted(schema.get("required", []))
    if model_required != crd_required:
        problems.append(
            f"{path}: required {crd_required} in the CRD, {model_required} in the model"
        )

    extras: dict[str, dict[str, Any]] = {}
    decorators = model.__pydantic_decorators__
    for name in [*decorators.model_validators, *decorators.field_validators]:
        mapped = MODEL_VALIDATORS.get((model, name))
        if mapped is None:
            problems.append(
                f"{path}: validator {model.__name__}.{name} has no CRD counterpart in "
                "MODEL_VALIDATORS (decide how the API server enforces it)"
            )
        else:
            for alias, keywords in mapped.items():
                extras.setdefault(alias, {}).update(keywords)

    for alias in sorted(fields.keys() & props.keys()):
        field, sub, where = fields[alias], props[alias], f"{path}.{alias}"
        problems += compare_value(
            field.annotation, list(field.metadata), sub, where, extras.get(alias)
        )
        problems += compare_default(field, sub, where)
    return problems


# --- structural ----------------------------------------------------------------------------

_FORBIDDEN = (
    "$ref",
    "$schema",
    "id",
    "definitions",
    "dependencies",
    "additionalItems",
    "patternProperties",
)
_SCALAR_TYPES = {"string", "integer", "number", "boolean"}


def structural_problems(node: dict[str, Any], path: str = "", root: bool = True) -> list[str]:
    """What would make the API server refuse the schema as non-structural (or its defaults)."""
    where = path or "(root)"
    problems: list[str] = []
    if not (
        node.get("type")
        or node.get("x-kubernetes-int-or-string")
        or node.get("x-kubernetes-preserve-unknown-fields")
    ):
        problems.append(f"{where}: no type")
    for key in _FORBIDDEN:
        if key in node:
            problems.append(f"{where}: {key} is not allowed in a structural schema")
    if node.get("uniqueItems"):
        problems.append(f"{where}: uniqueItems must not be true")
    extra = node.get("additionalProperties")
    if extra is False:
        problems.append(f"{where}: additionalProperties false is not allowed (pruning does it)")
    if extra is not None and "properties" in node:
        problems.append(f"{where}: additionalProperties together with properties")
    if "metadata" in node.get("properties", {}) and not root:
        problems.append(f"{where}: metadata is only allowed at the root")
    if "default" in node:
        if root:
            problems.append(f"{where}: no default at the root")
        try:
            Draft4Validator(node).validate(node["default"])
        except ValidationError as exc:
            problems.append(f"{where}: default {node['default']!r} is invalid: {exc.message}")
        if prune(node, copy.deepcopy(node["default"])) != node["default"]:
            problems.append(f"{where}: default {node['default']!r} is not pruned")
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None:
        items = node.get("items", {})
        if node.get("type") != "array":
            problems.append(f"{where}: x-kubernetes-list-type on a non-array")
        if list_type == "set" and items.get("type") not in _SCALAR_TYPES:
            problems.append(f"{where}: a set needs scalar items")
        if list_type == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            if not keys:
                problems.append(f"{where}: a map list needs x-kubernetes-list-map-keys")
            for key in keys:
                sub = items.get("properties", {}).get(key)
                if sub is None or (key not in items.get("required", []) and "default" not in sub):
                    problems.append(f"{where}: map key {key!r} must be a required item field")
        if list_type not in ("atomic", "set", "map"):
            problems.append(f"{where}: unknown x-kubernetes-list-type {list_type!r}")
    for name, sub in node.get("properties", {}).items():
        problems += structural_problems(sub, f"{path}.{name}" if path else name, root=False)
    items = node.get("items")
    if items is not None:
        if not isinstance(items, dict):
            problems.append(f"{where}: items must be one schema")
        else:
            problems += structural_problems(items, f"{path}[]", root=False)
    if isinstance(extra, dict):
        problems += structural_problems(extra, f"{path}{{}}", root=False)
    return problems


# --- validating objects as the API server would ------------------------------------------


def _interval_rule(value: Any) -> bool:
    if not isinstance(value, str):
        return True  # the type error is reported already
    try:
        return parse_duration(value) >= MIN_INTERVAL_SECONDS
    except ValueError:
        return False  # a CEL evaluation error also refuses the object


# Python stand-ins for the CRD's CEL rules, keyed by the exact rule text: changing a rule in
# the CRD fails the tests until its stand-in is reviewed here.
CEL_RULES: dict[str, Callable[[Any], bool]] = {
    INTERVAL_RULE["rule"]: _interval_rule,
    "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')": (
        lambda t: bool(t.get("key")) or t.get("operator") == "Exists"
    ),
    "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''": (
        lambda t: t.get("operator") != "Exists" or not t.get("value")
    ),
    "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')": (
        lambda t: "tolerationSeconds" not in t or t.get("effect") == "NoExecute"
    ),
}


def _list_type(
    validator: Any, list_type: str, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "array"):
        return
    if list_type == "set":
        keys = [repr(v) for v in instance]
    elif list_type == "map":
        names = schema.get("x-kubernetes-list-map-keys", [])
        keys = [repr([v.get(n) for n in names]) if isinstance(v, dict) else "" for v in instance]
    else:
        return
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        yield ValidationError(f"duplicate entries {', '.join(dupes)} in a {list_type} list")


def _cel(
    validator: Any, rules: list[dict[str, str]], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    for rule in rules:
        check = CEL_RULES.get(rule["rule"])
        if check is None:
            yield ValidationError(f"no Python stand-in for CEL rule {rule['rule']!r}")
        elif not check(instance):
            yield ValidationError(rule.get("message", rule["rule"]))


KubeValidator = validators.extend(
    Draft4Validator, {"x-kubernetes-list-type": _list_type, "x-kubernetes-validations": _cel}
)


def kube_errors(schema: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """Why the API server would refuse `obj` (after pruning, as it does), [] if it accepts."""
    pruned = prune(schema, copy.deepcopy(obj))
    return sorted(
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in KubeValidator(schema).iter_errors(pruned)
    )


def manifest(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "pool-a"},
        "spec": spec,
    }


FULL_SPEC: dict[str, Any] = {
    "nodeSelector": {"nvidia.com/gpu.present": "true", "pool": "training"},
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
        {"operator": "Exists"},
        {"key": "x", "effect": "NoExecute", "tolerationSeconds": 300},
    ],
    "interval": "1m30s",
    "checks": {
        "link": {"interfaces": ["eno1"], "maxCarrierChanges": 1},
        "mtu": {"interfaceMTU": 9000, "roceMTU": 4096, "interfaces": ["eno1"], "ipoibMTU": 2044},
        "rdma": {
            "devices": ["mlx5_0", "mlx5_1"],
            "linkLayer": "Ethernet",
            "minRateGbps": 200,
            "requireRoCEv2": True,
            "maxErrorsPerInterval": 5,
            "linkLayers": ["Ethernet", "InfiniBand"],
            "roceV2GidIndex": 3,
        },
        "infiniband": {
            "minRateGbps": 400,
            "maxCounterDeltas": {"symbolError": 100, "linkDowned": 0, "VL15Dropped": 1000},
        },
        "select": {
            "devices": {"include": ["mlx5_*"], "exclude": ["irdma*", "0000:3b:00.*"]},
            "ports": {"exclude": ["mlx5_1/2"]},
            "netdevs": {"exclude": ["ens3f1np1"]},
            "adminDown": "skip",
            "qosOnIWARP": False,
        },
        "pfc": {
            "priorities": [3, 4],
            "trust": "dscp",
            "warnPausePercent": 2.5,
            "maxPausePercent": 10,
            "maxDiscardsPerInterval": 0,
        },
        "ecn": {"priorities": [3], "minMarksForCnp": 50, "maxCnpIgnoredPerInterval": 0},
        "storage": {
            "endpoints": [
                {"name": "ceph-mon-a", "protocol": "ceph", "host": "10.0.0.5"},
                {
                    "name": "datasets",
                    "protocol": "s3",
                    "host": "s3.example.internal",
                    "port": 443,
                    "path": "/bucket/probe.bin",
                    "maxLatencyMs": 20,
                    "minThroughputMBps": 500,
                },
            ],
            "throughputEveryCycles": 5,
            "maxConcurrentProbes": 2,
        },
        "peers": {
            "enabled": True,
            "interface": "ens1np0",
            "port": 7471,
            "topologyKey": "topology.kubernetes.io/rack",
            "samplesPerDomain": 3,
            "maxLatencyMs": 0.5,
            "maxLossPercent": 0,
            "minThroughputRatio": 0.8,
        },
    },
    "gating": {
        "nodeLabel": True,
        "taint": True,
        "maxUnhealthyPercent": 5,
        "recoveryReports": 3,
        "admission": "deny",
        "admissionPolicy": "strict",
    },
    "telemetry": {"otlpEndpoint": "http://otel-collector.observability:4318"},
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """FULL_SPEC with one dotted path (list indexes as numbers) set to value."""
    spec = copy.deepcopy(FULL_SPEC)
    *parents, last = path.split(".")
    node: Any = spec
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return spec


# --- tests: the CRD's identity --------------------------------------------------------------


def test_names_scope_and_version(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"networkvalidations.{API_GROUP}"
    spec = crd["spec"]
    assert spec["group"] == API_GROUP
    assert spec["scope"] == "Cluster"
    assert spec["names"]["kind"] == KIND
    assert spec["names"]["plural"] == "networkvalidations"
    assert spec["names"]["singular"] == "networkvalidation"
    assert spec["names"]["shortNames"] == ["netval"]
    (version,) = spec["versions"]
    assert f"{spec['group']}/{version['name']}" == API_VERSION
    assert version["served"] is True
    assert version["storage"] is True
    assert version["subresources"] == {"status": {}}


def test_printer_columns(crd: dict[str, Any]) -> None:
    (version,) = crd["spec"]["versions"]
    columns = [(c["name"], c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
        ("Healthy", "string", '.status.conditions[?(@.type=="Healthy")].status'),
        ("Usable", "string", '.status.conditions[?(@.type=="Usable")].status'),
        ("Nodes", "integer", ".status.nodes.targeted"),
        ("Failing", "integer", ".status.nodes.failing"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    assert structural_problems(schema) == []
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}


def test_no_unknown_fields_are_preserved(schema: dict[str, Any]) -> None:
    text = yaml.safe_dump(schema)
    assert "x-kubernetes-preserve-unknown-fields" not in text
    assert "x-kubernetes-embedded-resource" not in text


def test_structural_check_catches_problems(schema: dict[str, Any]) -> None:
    broken = copy.deepcopy(schema)
    spec = broken["properties"]["spec"]
    del spec["properties"]["interval"]["type"]
    spec["properties"]["nodeSelector"]["properties"] = {"a": {"type": "string"}}
    spec["properties"]["checks"]["properties"]["mtu"]["properties"]["interfaceMTU"]["default"] = 1
    spec["properties"]["gating"]["default"] = {"bogus": 1}
    problems = structural_problems(broken)
    assert any(p.startswith("spec.interval: no type") for p in problems)
    assert any("spec.nodeSelector: additionalProperties together" in p for p in problems)
    assert any(p.startswith("spec.checks.mtu.interfaceMTU: default 1 is invalid") for p in problems)
    assert any(p.startswith("spec.gating: default {'bogus': 1} is not pruned") for p in problems)


# --- tests: model and CRD agree ----------------------------------------------------------


def test_spec_schema_matches_the_model(schema: dict[str, Any]) -> None:
    assert compare_model(NetworkValidationSpec, schema["properties"]["spec"], "spec") == []


def test_status_schema_matches_the_model(schema: dict[str, Any]) -> None:
    status = schema["properties"]["status"]
    assert compare_model(NetworkValidationStatus, status, "status") == []
    assert status["properties"]["failures"]["maxItems"] == MAX_FAILURES
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_empty_spec_defaults_to_the_model_defaults(schema: dict[str, Any]) -> None:
    spec_schema = schema["properties"]["spec"]
    defaulted = apply_defaults(spec_schema, copy.deepcopy(spec_schema["default"]))
    assert defaulted == NetworkValidationSpec().model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    # What the API server stores for a manifest without a spec is a valid spec for the model.
    obj = apply_defaults(schema, {"apiVersion": API_VERSION, "kind": KIND, "metadata": {}})
    assert NetworkValidationSpec.model_validate(obj["spec"]) == NetworkValidationSpec()


def test_partial_spec_defaults_like_the_model(schema: dict[str, Any]) -> None:
    given = {
        "checks": {
            "pfc": {"priorities": [3, 4]},
            "storage": {"endpoints": [{"name": "nfs", "protocol": "nfs", "host": "filer"}]},
        }
    }
    defaulted = apply_defaults(schema["properties"]["spec"], copy.deepcopy(given))
    model = NetworkValidationSpec.model_validate(given)
    assert defaulted == model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _spec_schema() -> dict[str, Any]:
    return copy.deepcopy(root_schema(load_crd())["properties"]["spec"])


def _node(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = schema
    for part in dotted.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(
            lambda s: _node(s, "checks.pfc")["properties"].pop("trust"),
            "spec.checks.pfc.trust: in the model, missing from the CRD",
            id="property-deleted",
        ),
        pytest.param(
            lambda s: _node(s, "gating")["properties"].update(extra={"type": "string"}),
            "spec.gating.extra: in the CRD, missing from the model",
            id="property-added",
        ),
        pytest.param(
            lambda s: _node(s, "checks.mtu.interfaceMTU").update(default=1500),
            "spec.checks.mtu.interfaceMTU: CRD default gives 1500, model default is 9000",
            id="default-changed",
        ),
        pytest.param(
            lambda s: _node(s, "checks.pfc.priorities.[]").update(maximum=8),
            "spec.checks.pfc.priorities[]: maximum is 8 in the CRD, 7 in the model",
            id="bound-changed",
        ),
        pytest.param(
            lambda s: _node(s, "checks.peers.maxLatencyMs").pop("exclusiveMinimum"),
            "spec.checks.peers.maxLatencyMs: model implies exclusiveMinimum=True, CRD has none",
            id="gt-became-ge",
        ),
        pytest.param(
            lambda s: _node(s, "checks.storage.endpoints.[].protocol")["enum"].remove("s3"),
            "spec.checks.storage.endpoints[].protocol: enum is ['tcp', 'ceph', 'nfs', 'http'] "
            "in the CRD, ['tcp', 'ceph', 'nfs', 's3', 'http'] in the model",
            id="enum-value-dropped",
        ),
        pytest.param(
            lambda s: _node(s, "checks.storage.endpoints.[]")["required"].remove("host"),
            "spec.checks.storage.endpoints[]: required ['name', 'protocol'] in the CRD, "
            "['host', 'name', 'protocol'] in the model",
            id="required-dropped",
        ),
        pytest.param(
            lambda s: _node(s, "checks.rdma.maxErrorsPerInterval").update(type="number"),
            "spec.checks.rdma.maxErrorsPerInterval: type 'number' in the CRD, 'integer' in the model",
            id="type-changed",
        ),
        pytest.param(
            lambda s: _node(s, "interval").update(pattern="^[0-9]+s$"),
            "spec.interval: pattern is '^[0-9]+s$' in the CRD",
            id="pattern-changed",
        ),
        pytest.param(
            lambda s: _node(s, "checks.rdma.minRateGbps").update(default=0),
            "spec.checks.rdma.minRateGbps: CRD default 0, model default None (unset)",
            id="default-added-to-optional",
        ),
        pytest.param(
            lambda s: _node(s, "interval").pop("x-kubernetes-validations"),
            "spec.interval: model implies x-kubernetes-validations=",
            id="cel-floor-dropped",
        ),
        pytest.param(
            lambda s: _node(s, "tolerations.[]")["properties"].pop("tolerationSeconds"),
            "spec.tolerations[]: toleration fields",
            id="toleration-field-dropped",
        ),
    ],
)
def test_comparison_reports_drift(mutate: Callable[[dict[str, Any]], Any], expected: str) -> None:
    spec_schema = _spec_schema()
    assert compare_model(NetworkValidationSpec, spec_schema, "spec") == []
    mutate(spec_schema)
    problems = compare_model(NetworkValidationSpec, spec_schema, "spec")
    assert any(p.startswith(expected) for p in problems), problems


def test_comparison_reports_a_field_added_to_the_model() -> None:
    link_schema = _node(_spec_schema(), "checks.link")
    assert compare_model(LinkChecks, link_schema, "spec.checks.link") == []
    grown = create_model(  # type: ignore[call-overload]
        "GrownLinkChecks",
        __base__=LinkChecks,
        max_flaps_per_hour=(Annotated[int, Field(ge=0)], 3),
    )
    assert compare_model(grown, link_schema, "spec.checks.link") == [
        "spec.checks.link.maxFlapsPerHour: in the model, missing from the CRD"
    ]


def test_comparison_reports_an_unmapped_model_validator() -> None:
    from pydantic import model_validator

    class Stricter(LinkChecks):
        @model_validator(mode="after")
        def _no_eth0(self) -> Stricter:
            return self

    problems = compare_model(Stricter, _node(_spec_schema(), "checks.link"), "spec.checks.link")
    assert problems == [
        "spec.checks.link: validator Stricter._no_eth0 has no CRD counterpart in "
        "MODEL_VALIDATORS (decide how the API server enforces it)"
    ]


def test_comparison_reports_status_drift(schema: dict[str, Any]) -> None:
    status = copy.deepcopy(schema["properties"]["status"])
    status["properties"]["nodes"]["properties"].pop("stale")
    status["properties"]["checks"]["additionalProperties"]["properties"]["pass"]["default"] = 1
    status["properties"]["failures"]["maxItems"] = 100
    problems = compare_model(NetworkValidationStatus, status, "status")
    assert "status.nodes.stale: in the model, missing from the CRD" in problems
    assert "status.checks{}.pass: CRD default gives 1, model default is 0" in problems
    assert "status.failures: maxItems is 100 in the CRD, 50 in the model" in problems


# --- tests: the API server refuses bad specs ---------------------------------------------


def test_full_spec_is_accepted_by_both(schema: dict[str, Any]) -> None:
    assert kube_errors(schema, manifest(FULL_SPEC)) == []
    NetworkValidationSpec.model_validate(FULL_SPEC)


def test_empty_spec_is_accepted(schema: dict[str, Any]) -> None:
    assert kube_errors(schema, manifest({})) == []
    assert kube_errors(schema, {"apiVersion": API_VERSION, "kind": KIND, "metadata": {}}) == []


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        ("checks.pfc.priorities", [3, 8], "checks.pfc.priorities.1: 8 is greater than the maximum"),
        ("checks.pfc.priorities", [9], "checks.pfc.priorities.0: 9 is greater than the maximum"),
        ("checks.pfc.priorities", [3, 3], "checks.pfc.priorities: duplicate entries 3"),
        ("checks.ecn.priorities", [-1], "checks.ecn.priorities.0: -1 is less than the minimum"),
        (
            "checks.storage.endpoints.0.protocol",
            "smb",
            "checks.storage.endpoints.0.protocol: 'smb' is not one of",
        ),
        (
            "checks.storage.endpoints.0.host",
            "",
            "checks.storage.endpoints.0.host: '' should be non-empty",
        ),
        (
            "checks.storage.endpoints.1.name",
            "ceph-mon-a",
            "checks.storage.endpoints: duplicate entries",
        ),
        (
            "checks.storage.endpoints.1.maxLatencyMs",
            0,
            "checks.storage.endpoints.1.maxLatencyMs: 0 is less than or equal to the minimum",
        ),
        ("interval", "1x", "interval: '1x' does not match"),
        ("interval", "abc", "interval: 'abc' does not match"),
        ("interval", "3s", "interval: interval must be at least 5s"),
        ("interval", "4999ms", "interval: interval must be at least 5s"),
        ("interval", 30, "interval: 30 is not of type 'string'"),
        ("checks.mtu.roceMTU", 9000, "checks.mtu.roceMTU: 9000 is not one of"),
        ("checks.mtu.interfaceMTU", 67, "checks.mtu.interfaceMTU: 67 is less than the minimum"),
        (
            "checks.mtu.interfaces",
            ["has space"],
            "checks.mtu.interfaces.0: 'has space' does not match",
        ),
        (
            "checks.link.interfaces",
            ["a-very-long-ifname"],
            "checks.link.interfaces.0: 'a-very-long-ifname' is too long",
        ),
        ("checks.rdma.linkLayer", "ethernet", "checks.rdma.linkLayer: 'ethernet' is not one of"),
        ("checks.pfc.trust", "DSCP", "checks.pfc.trust: 'DSCP' is not one of"),
        (
            "checks.select.devices.exclude",
            ["irdma 0"],
            "checks.select.devices.exclude.0: 'irdma 0' does not match",
        ),
        ("checks.select.adminDown", "ignore", "checks.select.adminDown: 'ignore' is not one of"),
        ("checks.rdma.roceV2GidIndex", 256, "checks.rdma.roceV2GidIndex: 256 is greater than"),
        ("checks.rdma.linkLayers", [], "checks.rdma.linkLayers: [] should be non-empty"),
        (
            "checks.infiniband.maxCounterDeltas.symbolError",
            -1,
            "checks.infiniband.maxCounterDeltas.symbolError: -1 is less than the minimum",
        ),
        (
            "checks.pfc.maxPausePercent",
            101,
            "checks.pfc.maxPausePercent: 101 is greater than the maximum",
        ),
        (
            "checks.peers.minThroughputRatio",
            1.5,
            "checks.peers.minThroughputRatio: 1.5 is greater than the maximum",
        ),
        (
            "checks.peers.samplesPerDomain",
            0,
            "checks.peers.samplesPerDomain: 0 is less than the minimum",
        ),
        ("gating.admission", "block", "gating.admission: 'block' is not one of"),
        (
            "gating.admissionPolicy",
            "lenient",
            "gating.admissionPolicy: 'lenient' is not one of",
        ),
        ("gating.recoveryReports", 0, "gating.recoveryReports: 0 is less than the minimum"),
        ("gating.taint", "yes", "gating.taint: 'yes' is not of type 'boolean'"),
        ("nodeSelector", {"pool": 1}, "nodeSelector.pool: 1 is not of type 'string'"),
        ("tolerations.0.operator", "Maybe", "tolerations.0.operator: 'Maybe' is not one of"),
        (
            "tolerations.1",
            {"operator": "Equal", "value": "x"},
            "tolerations.1: a toleration without a key needs operator Exists",
        ),
        (
            "tolerations.1",
            {"key": "k", "operator": "Exists", "value": "x"},
            "tolerations.1: a toleration with operator Exists must not have a value",
        ),
        (
            "tolerations.1",
            {"key": "k", "tolerationSeconds": 5},
            "tolerations.1: tolerationSeconds needs effect NoExecute",
        ),
    ],
)
def test_bad_specs_are_refused(schema: dict[str, Any], path: str, value: Any, error: str) -> None:
    errors = kube_errors(schema, manifest(_with(path, value)))
    assert any(e.startswith(f"spec.{error}") for e in errors), errors


def test_missing_required_endpoint_fields_are_refused(schema: dict[str, Any]) -> None:
    spec = _with("checks.storage.endpoints", [{"name": "x"}])
    errors = kube_errors(schema, manifest(spec))
    assert "spec.checks.storage.endpoints.0: 'protocol' is a required property" in errors
    assert "spec.checks.storage.endpoints.0: 'host' is a required property" in errors


def test_unknown_fields_are_pruned_not_stored(schema: dict[str, Any]) -> None:
    spec = _with("checks.pfc", {"priorities": [3], "tust": "dscp"})
    pruned = prune(schema, manifest(spec))
    assert pruned["spec"]["checks"]["pfc"] == {"priorities": [3]}
    # (kubectl's default --validate=strict refuses such a field outright.)


def test_bad_specs_are_also_refused_by_the_model() -> None:
    # The same inputs the CRD refuses (except where only the CRD's stricter bounds apply).
    for path, value in [
        ("checks.pfc.priorities", [8]),
        ("checks.pfc.priorities", [3, 3]),
        ("checks.storage.endpoints.0.protocol", "smb"),
        ("checks.storage.endpoints.0.host", ""),
        ("checks.storage.endpoints.1.name", "ceph-mon-a"),
        ("interval", "1x"),
        ("interval", "3s"),
        ("checks.mtu.roceMTU", 9000),
    ]:
        with pytest.raises(ValueError, match=r"validation error"):
            NetworkValidationSpec.model_validate(_with(path, value))


# --- tests: examples --------------------------------------------------------------------


def _example_validations() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted([*EXAMPLES.rglob("*.yaml"), *EXAMPLES.rglob("*.yml")]):
        with open(path, encoding="utf-8") as fh:
            for doc in yaml.safe_load_all(fh):
                if isinstance(doc, dict) and doc.get("kind") == KIND:
                    found.append((str(path.relative_to(ROOT)), doc))
    return found


def test_example_manifests_validate(schema: dict[str, Any]) -> None:
    # There may be none yet; every one that exists must pass both the CRD and the model.
    for where, doc in _example_validations():
        assert doc.get("apiVersion") == API_VERSION, where
        assert kube_errors(schema, doc) == [], where
        NetworkValidationSpec.model_validate(doc.get("spec") or {})


def test_jsonschema_is_the_openapi_v3_dialect() -> None:
    # OpenAPI v3.0 schemas use the boolean exclusiveMinimum of JSON-Schema draft 4.
    jsonschema.validators.validator_for({"$schema": "http://json-schema.org/draft-04/schema#"})
    assert KubeValidator({"type": "number", "minimum": 0, "exclusiveMinimum": True}).is_valid(0.1)
    assert not KubeValidator({"type": "number", "minimum": 0, "exclusiveMinimum": True}).is_valid(0)
