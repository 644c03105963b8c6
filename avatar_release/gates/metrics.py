"""Metrics the gates decide with: a digest per frame (or per delivered chunk), PSNR or SNR, the
largest difference.

A video build's units are its uint8 frames (PSNR in dB, peak 255). An audio or tensors build's
units are its delivered chunks, each the chunk's delivered arrays flattened to float64 (see
:func:`chunk_units`); they are compared by SNR in dB, the baseline's energy over the energy of the
difference (``10 log10(sum(b^2) / sum((a - b)^2))``, i.e. ``-20 log10`` of the relative error).
:func:`similarity_db` picks the metric by the unit: PSNR for uint8 frames, SNR otherwise.

Public so that reports, benchmarks and tests compare outputs the way the gates do.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import InputError

__all__ = [
    "frame_sha256",
    "delivered_sha256",
    "chunk_units",
    "psnr",
    "snr_db",
    "similarity_db",
    "metric_name",
    "max_abs_diff",
]


def frame_sha256(frame: np.ndarray) -> str:
    """Hex SHA-256 of a uint8 frame's bytes in C order (layout independent)."""
    arr = np.asarray(frame)
    if arr.dtype != np.uint8:
        raise InputError(f"frame_sha256: dtype {arr.dtype}, expected uint8")
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def delivered_sha256(outputs: Mapping[str, np.ndarray]) -> str:
    """Hex SHA-256 of one chunk's delivered arrays: per output in the given order, its name, dtype,
    shape and bytes in C order (an audio or tensors build's unit of the bit-exact gate)."""
    h = hashlib.sha256()
    for name, value in outputs.items():
        arr = np.ascontiguousarray(np.asarray(value))
        h.update(f"{name}\0{arr.dtype.str}\0{list(arr.shape)}\0".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def chunk_units(chunks: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """Delivered chunks as one float64 (chunks, longest) array: each row a chunk's outputs flattened
    and concatenated, zero-padded to the longest (padding adds nothing to SNR's sums)."""
    rows = [
        np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in c.values()]) if c else np.zeros(0)
        for c in chunks
    ]
    out = np.zeros((len(rows), max((r.size for r in rows), default=0)), np.float64)
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return out


def _same_shape(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.shape != b.shape:
        raise InputError(
            f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}; compare frames of the same size"
        )


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


def snr_db(a: np.ndarray, b: np.ndarray) -> float:
    """SNR in dB of ``a`` against the reference ``b``: ``10 log10(sum(b^2) / sum((a - b)^2))``;
    ``inf`` when equal, ``-inf`` when ``b`` is all zeros and ``a`` is not."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    _same_shape(a64, b64, "snr_db")
    noise = float(np.sum((a64 - b64) ** 2))
    if noise == 0.0:
        return math.inf
    signal = float(np.sum(b64**2))
    return -math.inf if signal == 0.0 else 10.0 * math.log10(signal / noise)


def similarity_db(a: np.ndarray, b: np.ndarray) -> float:
    """The gates' similarity of two units: PSNR for uint8 frames, SNR for delivered chunks."""
    return psnr(a, b) if np.asarray(a).dtype == np.uint8 else snr_db(a, b)


def metric_name(units: np.ndarray) -> str:
    """'PSNR' for uint8 frames, 'SNR' for delivered chunks."""
    return "PSNR" if np.asarray(units).dtype == np.uint8 else "SNR"


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
