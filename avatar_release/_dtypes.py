"""The one spelling of array dtypes in records: numpy names, plus "bfloat16" (ml_dtypes)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = ["dtype_name", "np_dtype", "itemsize"]


@functools.cache
def _bf16() -> np.dtype:
    # Lazy (heavy): ml_dtypes' extension takes ~0.5 s to load here, and only a bfloat16 array needs it;
    # the CLI, which imports the compiler and the runtime, starts without it.
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def dtype_name(dt: object) -> str:
    """Record spelling of a numpy / jax / ml_dtypes / torch dtype (anything whose ``str`` is
    ``torch.<name>``, or that ``np.dtype`` reads)."""
    text = str(dt).removeprefix("torch.")
    return "bfloat16" if text == "bfloat16" else np.dtype(text if text != str(dt) else cast("DTypeLike", dt)).name


def np_dtype(name: str) -> np.dtype:
    """numpy dtype for a record spelling (np.dtype("bfloat16") alone does not know it)."""
    return _bf16() if name == "bfloat16" else np.dtype(name)


def itemsize(name: str) -> int:
    """Bytes per element of a record dtype."""
    return np_dtype(name).itemsize
