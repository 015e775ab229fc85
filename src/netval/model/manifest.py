"""Read expectations from a user document: a NetworkValidation manifest or a bare checks map.

Pure: takes the parsed YAML/JSON document, returns typed expectations or a ConfigError whose
message names the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

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


def describe_validation_error(exc: ValidationError, prefix: str) -> str:
    """One line: the first offending field (dotted, camelCase as written) and why."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    where = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "(top level)")
    more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
    value = err.get("input")
    shown = "" if isinstance(value, dict | list) or value is None else f" (got {value!r})"
    return f"field {where}: {err['msg']}{shown}{more}"


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
            raise ConfigError(describe_validation_error(exc, "spec")) from None
        return ProbeConfig(str(name or DEFAULT_VALIDATION_NAME), spec.checks)
    # A bare mapping may be `{checks: {...}}` or the checks themselves.
    body = doc["checks"] if set(doc) == {"checks"} else doc
    prefix = "checks" if body is not doc else ""
    try:
        return ProbeConfig(DEFAULT_VALIDATION_NAME, Checks.model_validate(body))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, prefix)) from None
