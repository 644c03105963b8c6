"""Programs identical across buckets, found before anything compiles: compiled once, shared.

A stage whose inputs do not depend on the bucket (an image-only encoder) lowers to the same program
for every bucket. Two lowered stages are the same compile when everything that makes the executable
is equal: the lowered module with its debug locations (its shardings, device count and partitioning
are in it), the executable format (and the exported program, for "jax-export") and the compiler
options. An option that only says where XLA writes a side file for this stage x bucket (the
autotune dump) is not part of the executable and is left out.

Each bucket keeps its own manifest entry (its slot, inputs, outputs); a shared one names the same
blob, so the registry holds it once and a pod deserializes it once (runtime/_load.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._digest import canonical_json
from ._stage import LoweredStage

__all__ = ["NOT_THE_EXECUTABLE", "SharedCompile", "shared_compiles"]

# Compiler options that name where XLA writes a file for one stage x bucket, not what it compiles.
NOT_THE_EXECUTABLE = frozenset({"xla_gpu_dump_autotune_results_to"})


@dataclass(frozen=True)
class SharedCompile:
    """Which lowered stage compiles (``compiles``: their indices) and which reuse another's executable
    (``shares``: index -> the index of the one compiled)."""

    compiles: tuple[int, ...]
    shares: Mapping[int, int]


def program_key(ls: LoweredStage, options: Mapping[str, Any]) -> str:
    """A digest over everything that makes ``ls``'s executable (see the module docstring)."""
    h = hashlib.sha256()
    h.update(ls.lowered.as_text(debug_info=True).encode())
    if ls.exported is not None:
        h.update(bytes(ls.exported.serialize()))
    kept = {k: v for k, v in options.items() if k not in NOT_THE_EXECUTABLE}
    h.update(canonical_json({"options": {k: str(v) for k, v in kept.items()}, "devices": ls.devices}))
    return h.hexdigest()


def shared_compiles(lowered: list[LoweredStage], options: Callable[[LoweredStage], Mapping[str, Any]]) -> SharedCompile:
    """Group ``lowered`` by program: the first of each group compiles, the others share it."""
    first: dict[str, int] = {}
    shares: dict[int, int] = {}
    for i, ls in enumerate(lowered):
        key = program_key(ls, options(ls))
        if key in first:
            shares[i] = first[key]
        else:
            first[key] = i
    return SharedCompile(tuple(first.values()), shares)
