"""Config files as pydantic models, with the errors a person can act on.

Every TOML file a user writes (the specs under ``manifests/``, the registry config, the trust
policy) is read into a :class:`ConfigModel`: unknown keys are errors, values are not coerced
(``"1"`` is not a number, ``true`` is not 1). :func:`describe_validation_error` turns what pydantic
found into one message: every problem with its field path (``registries.team.uri``), a misspelled
key with the closest allowed one, and each missing field with every field its section takes, so a
new file is right after one round trip. :func:`read_toml` adds the file's name and the fix.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError

from ._suggest import closest, did_you_mean

__all__ = ["ConfigModel", "describe_validation_error", "read_toml", "parse_model"]


class ConfigModel(BaseModel):
    """A section of a user's config file: unknown keys refused, no coercion, immutable once read."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


_M = TypeVar("_M", bound=BaseModel)


def _model_at(cls: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The (nested) model at ``loc`` inside ``cls``: list items and dict values count as their model
    (``buckets.0`` is a BucketSpec, ``registries.team`` a registry entry); None when ``loc`` is not a model."""
    model: Any = cls
    key_next = False  # the last field was a list or dict of models: this part is an index or a key
    for part in loc:
        if key_next:
            key_next = False
            continue
        field = model.model_fields.get(part) if isinstance(part, str) and _is_model(model) else None
        if field is None:
            return None
        model = _item_model(field.annotation)
        key_next = model is not None and _is_container(field.annotation)
    return model if _is_model(model) else None


def _is_model(x: Any) -> bool:
    return isinstance(x, type) and issubclass(x, BaseModel)


def _is_container(annotation: Any) -> bool:
    origin = getattr(annotation, "__origin__", None)
    if origin in (list, dict, tuple):
        return True
    return any(_is_container(a) for a in get_args(annotation))


def _item_model(annotation: Any) -> Any:
    """``BucketSpec`` from ``list[BucketSpec]``, ``dict[str, LeverEntry]`` or ``LeverEntry | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(get_args(annotation)):
        found = _item_model(arg)
        if found is not None:
            return found
    return None


def _fields_at(cls: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the (nested) model at ``loc`` inside ``cls`` (empty when it is not a model)."""
    model = _model_at(cls, loc)
    return list(model.model_fields) if model is not None else []


def _section(cls: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """What the section at ``loc`` takes: "required a, b; optional c" (empty when not a model)."""
    model = _model_at(cls, loc)
    if model is None:
        return ""
    fields = model.model_fields
    required = [n for n, f in fields.items() if f.is_required()]
    optional = [n for n, f in fields.items() if not f.is_required()]
    where = ".".join(str(p) for p in loc) or "the top level"
    return (
        f"{where} ({model.__name__}) takes required: {', '.join(required) or 'none'}; "
        f"optional: {', '.join(optional) or 'none'}"
    )


# pydantic's words for what a TOML file holds, where they differ ("a valid dictionary or instance of ...")
_TOML_WORDS = {
    "extra_forbidden": "unknown key",
    "model_type": "expected a table",
    "dict_type": "expected a table",
    "model_attributes_type": "expected a table",
    "list_type": "expected a list (an array)",
}


def describe_validation_error(cls: type[BaseModel], e: ValidationError, footer: str = "") -> str:
    """Every problem pydantic found, in one message: each missing field with every field its section
    takes, a misspelled key with the closest allowed one, each bad value with its field path and what
    it got; then ``footer`` (where the format is documented)."""
    missing: dict[tuple[int | str, ...], list[str]] = {}
    suggested: set[tuple[int | str, ...]] = set()  # a missing field a misspelled key already points at
    lines: list[str] = []
    # A misspelled key is both an unknown key and a missing one: the unknown one leads, with the fix.
    for err in sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden"):
        loc = tuple(err["loc"])
        if err["type"] == "missing":
            if loc in suggested:
                continue
            missing.setdefault(loc[:-1], []).append(str(loc[-1]))
            continue
        where = ".".join(str(p) for p in loc if p != "[key]") or "the top level"
        hint = ""
        if err["type"] == "extra_forbidden" and loc:
            allowed = _fields_at(cls, loc[:-1])
            hint = f"{did_you_mean(str(loc[-1]), allowed)}; allowed here: {', '.join(sorted(allowed))}"
            suggested |= {(*loc[:-1], near) for near in closest(str(loc[-1]), allowed, n=1)}
        msg = _TOML_WORDS.get(err["type"]) or str(err["msg"]).removeprefix("Value error, ")
        got = loc[-2] if loc and loc[-1] == "[key]" else err.get("input")
        lines.append(f"{where}: {msg} (got {got!r}){hint}")
    for parent, names in missing.items():
        prefix = ".".join(str(p) for p in (*parent, "")) if parent else ""
        section = _section(cls, parent)
        lines.append(
            f"missing required field{'s' if len(names) > 1 else ''} "
            f"{', '.join(prefix + n for n in names)}" + (f"; {section}" if section else "")
        )
    return "\n  ".join(lines) + (f"\n  ({footer})" if footer else "")


def parse_model(cls: type[_M], doc: object, *, where: str, error: Callable[[str], Exception], footer: str = "") -> _M:
    """``doc`` validated as ``cls``; what is wrong raised as ``error("<where>: <every problem>")``."""
    try:
        return cls.model_validate(doc)
    except ValidationError as e:
        raise error(f"{where}: {describe_validation_error(cls, e, footer)}") from None


def read_toml(path: Path, *, what: str, error: Callable[[str], Exception], footer: str = "") -> dict[str, Any]:
    """The TOML table in ``path``; unreadable or invalid, ``error("<what> <path>: ...")`` with the fix."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as e:
        raise error(f"{what} {path}: cannot read it ({e.strerror})") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise error(f"{what} {path}: not valid TOML ({e})" + (f"; {footer}" if footer else "")) from None
