"""A torch-free safetensors reader (the format: u64 header length, JSON header, raw data).

The serving pod reads the build's weights with numpy alone; bf16 comes from ml_dtypes.
"""

from __future__ import annotations

import json
import struct

import numpy as np

from .._dtypes import np_dtype
from ..errors import IntegrityError

__all__ = ["read_safetensors"]

# safetensors' dtype names -> record spellings (bfloat16 through ml_dtypes, loaded on first use).
_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def read_safetensors(data: bytes, *, where: str) -> dict[str, np.ndarray]:
    """Parse safetensors bytes into {name: array} (views into ``data``, read-only)."""
    if len(data) < 8:
        raise IntegrityError(f"{where}: {len(data)} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise IntegrityError(f"{where}: header length {n} exceeds the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{where}: safetensors header is not JSON ({e})") from None
    body = memoryview(data)[8 + n :]
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        spelling = _DTYPES.get(info.get("dtype"))
        if spelling is None:
            raise IntegrityError(f"{where}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        dtype = np_dtype(spelling)
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= begin <= end <= len(body) or end - begin != count * dtype.itemsize:
            raise IntegrityError(
                f"{where}: tensor {name!r} offsets {begin}..{end} do not fit shape {shape} {info['dtype']}"
            )
        out[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape)
    return out
