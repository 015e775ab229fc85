"""Read one YAML (or JSON) document from a user-supplied file, with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class InputFileError(ValueError):
    """The file cannot be used; the message is one line naming the file."""


def load_yaml_document(path: Path, *, max_bytes: int = 1 << 20) -> Any:
    """The single document in `path` (None for an empty file)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > max_bytes:
        raise InputFileError(f"{path}: larger than {max_bytes} bytes")
    try:
        docs = [d for d in yaml.safe_load_all(raw.decode("utf-8")) if d is not None]
    except UnicodeDecodeError:
        raise InputFileError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise InputFileError(f"{path}: invalid YAML{where}: {problem}") from None
    if len(docs) > 1:
        raise InputFileError(f"{path}: holds {len(docs)} YAML documents, expected one")
    return docs[0] if docs else None
