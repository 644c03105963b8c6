"""Frame metrics the gates decide with: a digest per frame, PSNR, the largest pixel difference.

Public so that reports, benchmarks and tests compare frames the way the gates do.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from ..errors import InputError

__all__ = ["frame_sha256", "psnr", "max_abs_diff"]


def frame_sha256(frame: np.ndarray) -> str:
    """Hex SHA-256 of a uint8 frame's bytes in C order (layout independent)."""
    arr = np.asarray(frame)
    if arr.dtype != np.uint8:
        raise InputError(f"frame_sha256: dtype {arr.dtype}, expected uint8")
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def _same_shape(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.shape != b.shape:
        raise InputError(f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}; compare frames of the same size")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB between two uint8 images; ``inf`` when equal."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.dtype != np.uint8 or b.dtype != np.uint8:
        raise InputError(f"psnr: dtypes {a.dtype} and {b.dtype}, expected uint8 for both")
    _same_shape(a, b, "psnr")
    if a.size == 0:
        raise InputError("psnr: empty arrays")
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    if mse == 0.0:
        return math.inf
    return 10.0 * math.log10(255.0 * 255.0 / mse)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> int | float:
    """Largest absolute elementwise difference (an int for integer inputs, else a float)."""
    a = np.asarray(a)
    b = np.asarray(b)
    _same_shape(a, b, "max_abs_diff")
    if a.size == 0:
        return 0
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return int(np.max(np.abs(a.astype(np.int64) - b.astype(np.int64))))
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
