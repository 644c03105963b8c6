"""What a stage returned, matched to the outputs its signature declares, in declared order.

A stage may return its outputs as a bare array, a tuple or list, a mapping (a dict; an
``OrderedDict`` subclass such as the output classes diffusers and transformers return, e.g.
``UNet2DOutput``) or a dataclass instance. The rule:

* one declared output takes a bare array, or any container holding exactly one array (under any
  name: ``UNet2DOutput(sample=...)`` feeds an output declared ``latents``);
* several declared outputs take a mapping or dataclass by field name (every declared name present,
  nothing else), or a tuple or list by position (``check_outputs`` counts them);
* ``None`` entries are absent (as in a ``ModelOutput``, whose unset fields are not its items).

A mismatch is a ContractError (exit 2) naming the stage, the bucket, the declared names and what the
stage returned. The traced program always returns a tuple in declared order, so the manifest and the
runtime see the same program whatever the stage returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._dtypes import dtype_name
from ..errors import ContractError

__all__ = ["Returned", "unpack", "match_outputs", "describe"]


@dataclass(frozen=True)
class Returned:
    """A stage's return value opened one level: its container's type name ("" for a bare value),
    the entries' names (None: positional) and the entries themselves."""

    kind: str
    names: tuple[str, ...] | None
    values: tuple[Any, ...]

    def map(self, fn: Callable[[Any], Any]) -> Returned:
        """The same entries, each through ``fn`` (torch tensors to JAX arrays)."""
        return Returned(self.kind, self.names, tuple(fn(v) for v in self.values))


def unpack(value: Any) -> Returned:
    """``value`` opened one level (a Returned is returned as it is)."""
    if isinstance(value, Returned):
        return value
    kind = type(value).__name__
    if isinstance(value, Mapping):  # before dataclasses: a ModelOutput is both; its items are its set fields
        items = [(str(k), v) for k, v in value.items() if v is not None]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [
            (f.name, getattr(value, f.name)) for f in dataclasses.fields(value) if getattr(value, f.name) is not None
        ]
    elif isinstance(value, (tuple, list)):
        return Returned(kind, None, tuple(value))
    else:
        return Returned("", None, (value,))
    return Returned(kind, tuple(k for k, _ in items), tuple(v for _, v in items))


def match_outputs(returned: Any, declared: Sequence[str], where: str, page: str) -> tuple[Any, ...]:
    """The stage's outputs in ``declared`` order (see the module's rule); ContractError otherwise.
    ``where`` names the stage and bucket, ``page`` says what to fix and where the contract is."""
    r = unpack(returned)
    if r.names is None:  # bare, or positional: check_outputs holds number, shape and dtype to the signature
        return r.values
    if len(declared) == 1 and len(r.values) == 1:
        return r.values
    missing = [n for n in declared if n not in r.names]
    extra = [n for n in r.names if n not in declared]
    if missing or extra:
        said = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + (
            [f"not declared {', '.join(map(repr, extra))}"] if extra else []
        )
        rule = (
            "one declared output takes a container of exactly one array, under any name"
            if len(declared) == 1
            else "a mapping's or dataclass's entries are matched to the declared outputs by name"
        )
        raise ContractError(
            f"{where}: declares outputs ({', '.join(declared)}), the stage returned "
            f"{describe(r)}: {'; '.join(said)} ({rule}). {page}"
        )
    by_name = dict(zip(r.names, r.values))
    return tuple(by_name[n] for n in declared)


def describe(r: Returned) -> str:
    """What a stage returned, for a message: ``UNet2DOutput {sample: (1, 3, 8, 8) float32}``."""
    if r.names is None and not r.kind:
        return _leaf(r.values[0])
    if r.names is None:
        return f"{r.kind} ({', '.join(_leaf(v) for v in r.values)})"
    return f"{r.kind} {{{', '.join(f'{k}: {_leaf(v)}' for k, v in zip(r.names, r.values))}}}"


def _leaf(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        try:
            return f"{tuple(int(d) for d in x.shape)} {dtype_name(x.dtype)}"
        except (TypeError, ValueError):
            return f"{tuple(x.shape)} {x.dtype}"
    return f"a {type(x).__name__}"
