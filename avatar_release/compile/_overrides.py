"""``--set KEY=VALUE`` overrides of a model config, typed and validated.

Keys name dataclass fields of the pipeline config, nested with dots (``dit.steps``,
``sr.window``, ``residual_dtype``). An unknown key or a value of the wrong type is an
InputError listing what is accepted.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, TypeVar, get_args, get_origin

from .._suggest import did_you_mean
from ..errors import InputError

if TYPE_CHECKING:  # typeshed's protocol of dataclass instances (what dataclasses.replace takes)
    from _typeshed import DataclassInstance

    _Config = TypeVar("_Config", bound=DataclassInstance)

__all__ = ["apply_overrides", "override_keys", "parse_set_args"]


def parse_set_args(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set dit.steps=2")
        out[key.strip()] = value.strip()
    return out


def _fields(obj: DataclassInstance) -> dict[str, tuple[Any, Any]]:
    hints = typing.get_type_hints(type(obj))
    return {f.name: (hints.get(f.name, Any), getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _nested(value: object) -> TypeGuard[DataclassInstance]:
    """A nested config (``dit``, ``sr``): a field holding a dataclass, read by ``_fields`` in turn."""
    return dataclasses.is_dataclass(value)


def override_keys(config: DataclassInstance, prefix: str = "") -> list[str]:
    keys = []
    for name, (_, value) in _fields(config).items():
        if _nested(value):
            keys += override_keys(value, prefix + name + ".")
        elif name != "name":
            keys.append(prefix + name)
    return keys


def _coerce(key: str, text: str, hint: Any, current: Any) -> Any:
    origin = get_origin(hint)
    if origin is Literal:
        choices = get_args(hint)
        for c in choices:
            if str(c) == text:
                return c
        raise InputError(f"--set {key}={text}: expected one of {', '.join(map(str, choices))}")
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in get_args(hint) if a is not type(None)]
        if text.lower() in ("none", "null") and len(args) < len(get_args(hint)):
            return None
        hint = args[0]
    target = hint if isinstance(hint, type) else type(current)
    try:
        if target is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if target is int:
            return int(text)
        if target is float:
            return float(text)
        if target is str:
            return text
    except ValueError:
        pass
    else:
        if target not in (bool, int, float, str):
            raise InputError(f"--set {key}: field of type {target.__name__} cannot be set from the command line")
    kind = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(
        target.__name__, f"a {target.__name__}"
    )
    raise InputError(f"--set {key}={text}: expected {kind} (current value {current!r})")


def _apply_one(config: _Config, path: list[str], key: str, text: str) -> _Config:
    fields = _fields(config)
    name = path[0]
    if name not in fields or name == "name":
        raise KeyError(key)
    hint, current = fields[name]
    if len(path) > 1:
        if not _nested(current):
            raise KeyError(key)
        return dataclasses.replace(config, **{name: _apply_one(current, path[1:], key, text)})
    if dataclasses.is_dataclass(current):
        raise KeyError(key)
    return dataclasses.replace(config, **{name: _coerce(key, text, hint, current)})


def apply_overrides(config: _Config, overrides: dict[str, str]) -> tuple[_Config, dict[str, Any]]:
    """Return (new config, {key: typed value}) after applying and validating every override."""
    applied: dict[str, Any] = {}
    for key, text in sorted(overrides.items()):
        try:
            config = _apply_one(config, key.split("."), key, text)
        except KeyError:
            keys = override_keys(config)
            raise InputError(
                f"--set {key}: unknown key{did_you_mean(key, keys)}; settable keys are: {', '.join(keys)}"
            ) from None
        except ValueError as e:  # the config's own constraints, checked as it is rebuilt
            raise InputError(f"--set {key}={text}: {e}") from None
        value = config
        for part in key.split("."):
            value = getattr(value, part)
        applied[key] = value
    validate = getattr(config, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as e:
            raise InputError(f"--set {', '.join(f'{k}={v}' for k, v in overrides.items())}: {e}") from None
    return config, applied
