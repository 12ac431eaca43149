"""Read a YAML file into a pydantic model, with the one-line errors every polyspec command gives.

Fleet files (`polyspec up --config`) and Kubernetes values (`polyspec deploy k8s --values`) are both operator
files: a missing file, bad YAML, a non-mapping top level or an invalid field each become one ``InvalidInput``
subclass with the file and the first failing field, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from polyspec.core.errors import InvalidInput

M = TypeVar("M", bound=BaseModel)


def first_error(exc: ValidationError) -> str:
    """``field.path: message`` of pydantic's first error (the one a user fixes first)."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))


def read_mapping(path: Path, error: type[InvalidInput], what: str, shape: str = "a mapping") -> dict[str, Any]:
    """The YAML mapping in ``path`` (an empty file is an empty mapping)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise error(f"{what} {path} must be {shape}")
    return raw


def validate(model: type[M], raw: dict[str, Any], error: type[InvalidInput], label: str) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise error(f"{label}: {first_error(exc)}") from None
