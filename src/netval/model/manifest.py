"""Read expectations from a user document: a NetworkValidation manifest or a bare checks map.

Pure: takes the parsed YAML/JSON document, returns typed expectations or a ConfigError whose
message names the field.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, get_args

from pydantic import BaseModel, ValidationError

from netval.model.spec import Checks, NetworkValidationSpec

API_GROUP: Final = "netval.io"
API_VERSION: Final = "netval.io/v1alpha1"
KIND: Final = "NetworkValidation"
DEFAULT_VALIDATION_NAME: Final = "local"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    validation: str
    checks: Checks


MAX_PROBLEMS_SHOWN: Final = 10


def _inner_models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models inside an annotation (list[Model], Model | None, dict[str, Model])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in get_args(annotation):
        yield from _inner_models(arg)


def _field_model(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return next(_inner_models(field.annotation), None)
    return None


def _model_at(root: type[BaseModel] | None, loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model whose fields `loc` (an error location below `root`) names, if any."""
    model = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue  # a list index: the same item model
        model = _field_model(model, part)
    return model


def _known_fields(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def nearest_field(unknown: str, known: Sequence[str]) -> str | None:
    """The known field a misspelt `unknown` most likely meant (case first, then spelling)."""
    by_lower = {k.lower(): k for k in known}
    if unknown.lower() in by_lower:
        return by_lower[unknown.lower()]
    close = difflib.get_close_matches(unknown.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def _problem(err: Any, prefix: str, root: type[BaseModel] | None) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    where = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "(top level)")
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        parent = _model_at(root, err["loc"][:-1])
        hint = ""
        if parent is not None and err["loc"]:
            known = _known_fields(parent)
            guess = nearest_field(str(err["loc"][-1]), known)
            hint = f" (did you mean {guess}?)" if guess else f" (known: {', '.join(known)})"
        return f"field {where}: unknown field{hint}"
    shown = "" if isinstance(value, dict | list) or value is None else f" (got {value!r})"
    return f"field {where}: {err['msg']}{shown}"


def describe_validation_error(
    exc: ValidationError, prefix: str, model: type[BaseModel] | None = None
) -> str:
    """One line with every problem (the first ten): the offending field (dotted, camelCase as
    written) and why, separated by "; ". An unknown field names the nearest known one of
    `model` (the model validated; default: found by the error's title among the spec models)."""
    root = model or _SPEC_MODELS.get(exc.title)
    problems = [_problem(err, prefix, root) for err in exc.errors()]
    text = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    if len(problems) > MAX_PROBLEMS_SHOWN:
        text += f"; and {len(problems) - MAX_PROBLEMS_SHOWN} more problem(s)"
    return text


def _collect_models(model: type[BaseModel], into: dict[str, type[BaseModel]]) -> None:
    if model.__name__ in into:
        return
    into[model.__name__] = model
    for field in model.model_fields.values():
        for inner in _inner_models(field.annotation):
            _collect_models(inner, into)


_SPEC_MODELS: dict[str, type[BaseModel]] = {}
_collect_models(NetworkValidationSpec, _SPEC_MODELS)


def probe_config_from_document(doc: Any) -> ProbeConfig:
    if doc is None:
        return ProbeConfig(DEFAULT_VALIDATION_NAME, Checks())
    if not isinstance(doc, dict):
        raise ConfigError(
            f"expected a NetworkValidation manifest or a checks mapping, got {type(doc).__name__}"
        )
    if "kind" in doc or "apiVersion" in doc:
        if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
            raise ConfigError(
                f"field kind/apiVersion: expected {KIND} {API_VERSION}, got "
                f"{doc.get('kind')!r} {doc.get('apiVersion')!r}"
            )
        metadata = doc.get("metadata") or {}
        name = metadata.get("name") if isinstance(metadata, dict) else None
        try:
            spec = NetworkValidationSpec.model_validate(doc.get("spec") or {})
        except ValidationError as exc:
            raise ConfigError(
                describe_validation_error(exc, "spec", NetworkValidationSpec)
            ) from None
        return ProbeConfig(str(name or DEFAULT_VALIDATION_NAME), spec.checks)
    # A bare mapping may be `{checks: {...}}` or the checks themselves.
    body = doc["checks"] if set(doc) == {"checks"} else doc
    prefix = "checks" if body is not doc else ""
    try:
        return ProbeConfig(DEFAULT_VALIDATION_NAME, Checks.model_validate(body))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, prefix, Checks)) from None
