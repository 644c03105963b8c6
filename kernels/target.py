"""Which compiler a Pallas kernel is built for, set by the build rather than guessed.

A build machine compiling for a TPU topology runs JAX on CPU: ``jax.default_backend()`` says
"cpu" there, yet the kernels must lower through Mosaic, not the Pallas interpreter. The compile
step therefore declares the target for the duration of a trace (``kernel_target``); outside one,
kernels fall back to the running backend. On TPU the target also carries the Mosaic compiler
flags each attention kernel requests by name (the flag profile's ``kernel_flags``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KernelTarget", "kernel_target", "interpret_default", "mosaic_flags"]


@dataclass(frozen=True)
class KernelTarget:
    platform: str  # "cpu" | "tpu" | ...
    flags: Mapping[str, Any] = field(default_factory=dict)  # Mosaic compiler flags (TPU only)


_CURRENT: contextvars.ContextVar[KernelTarget | None] = contextvars.ContextVar("kernel_target", default=None)


@contextlib.contextmanager
def kernel_target(platform: str, flags: Mapping[str, Any] | None = None) -> Iterator[KernelTarget]:
    target = KernelTarget(platform, dict(flags or {}))
    token = _CURRENT.set(target)
    try:
        yield target
    finally:
        _CURRENT.reset(token)


def interpret_default() -> bool:
    """Interpret (Pallas interpreter) unless the kernel is built for TPU (Mosaic)."""
    target = _CURRENT.get()
    if target is not None:
        return target.platform != "tpu"
    import jax

    return jax.default_backend() != "tpu"


def mosaic_flags() -> dict[str, Any]:
    """The Mosaic compiler flags to request: the declared TPU target's, else none."""
    target = _CURRENT.get()
    return dict(target.flags) if target is not None and target.platform == "tpu" else {}
