"""The one spelling of array dtypes in records: numpy names, plus "bfloat16" (ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["dtype_name", "np_dtype", "itemsize"]

_BF16 = np.dtype(ml_dtypes.bfloat16)


def dtype_name(dt) -> str:
    """Record spelling of a numpy / jax / ml_dtypes / torch dtype."""
    text = str(dt).removeprefix("torch.")
    return "bfloat16" if text == "bfloat16" else np.dtype(text if text != str(dt) else dt).name


def np_dtype(name: str) -> np.dtype:
    """numpy dtype for a record spelling (np.dtype("bfloat16") alone does not know it)."""
    return _BF16 if name == "bfloat16" else np.dtype(name)


def itemsize(name: str) -> int:
    """Bytes per element of a record dtype."""
    return np_dtype(name).itemsize
