"""Weights as chunks (build manifest v5): host tensors -> tensor-aligned pieces, compressed apart.

The rule (``records.WEIGHT_CHUNKING``): tensors in name order, packed greedily into chunks of at
most ``WEIGHT_CHUNK_BYTES`` raw bytes, each tensor starting on a 64-byte boundary; a tensor larger
than a chunk is a chunk of its own. It depends only on the tensors' names and sizes, so two builds
whose weights differ in one layer cut the same chunks and share every chunk but that layer's.

Each chunk is assembled, hashed and zstd-compressed on its own, in worker threads (zstd and
sha256 release the GIL): at no point are all the weights' bytes serialized at once; what is held
is the tensors themselves and the compressed chunks.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import zstandard

from .._digest import canonical_json, sha256_digest
from ..records import WEIGHT_CHUNK_BYTES, WEIGHT_CHUNKING, BlobRef, WeightChunk, WeightTensor

__all__ = ["HostTensor", "plan_chunks", "pack_chunks", "chunk_table_digest", "WEIGHT_CHUNK_MEDIA_TYPE",
           "WEIGHT_CHUNKING"]

WEIGHT_CHUNK_MEDIA_TYPE = "application/vnd.avatar-release.weights.chunk.v1+zstd"
_ALIGN = 64


@dataclass(frozen=True)
class HostTensor:
    """One named tensor's raw bytes (C order) on the host, with its record dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray  # uint8, 1-D, C-contiguous: a view of the tensor's memory, never a copy

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def plan_chunks(tensors: list[HostTensor], max_bytes: int = WEIGHT_CHUNK_BYTES) -> list[list[WeightTensor]]:
    """The chunk table: which tensor goes where (name order, greedy, 64-byte aligned)."""
    chunks: list[list[WeightTensor]] = []
    current: list[WeightTensor] = []
    size = 0
    for t in sorted(tensors, key=lambda t: t.name):
        start = -(-size // _ALIGN) * _ALIGN
        if current and start + t.nbytes > max_bytes:
            chunks.append(current)
            current, start = [], 0
        current.append(WeightTensor(name=t.name, dtype=t.dtype, shape=list(t.shape), offset=start, nbytes=t.nbytes))
        size = start + t.nbytes
    if current:
        chunks.append(current)
    return chunks


def _raw_size(table: list[WeightTensor]) -> int:
    return max((t.offset + t.nbytes for t in table), default=0)


def _pack_one(table: list[WeightTensor], by_name: dict[str, HostTensor], level: int) -> tuple[WeightChunk, bytes]:
    raw = np.zeros(_raw_size(table), dtype=np.uint8)  # alignment gaps stay zero: the bytes are deterministic
    for t in table:
        raw[t.offset: t.offset + t.nbytes] = by_name[t.name].data
    digest = sha256_digest(raw.data)
    z = zstandard.ZstdCompressor(level=level).compress(raw.data)
    chunk = WeightChunk(blob=BlobRef(digest=sha256_digest(z), size=len(z), media_type=WEIGHT_CHUNK_MEDIA_TYPE),
                        raw_size=int(raw.nbytes), raw_digest=digest, tensors=table)
    return chunk, z


def pack_chunks(tensors: list[HostTensor], *, level: int, max_bytes: int = WEIGHT_CHUNK_BYTES,
                workers: int | None = None) -> tuple[list[WeightChunk], dict[str, bytes]]:
    """(the chunks, {digest: zstd bytes}), chunks compressed side by side in ``workers`` threads."""
    by_name = {t.name: t for t in tensors}
    if len(by_name) != len(tensors):
        raise ValueError("two weights share a name")
    tables = plan_chunks(tensors, max_bytes)
    workers = workers or min(len(tables), os.cpu_count() or 1, 8) or 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pack-weights") as pool:
        packed = list(pool.map(lambda table: _pack_one(table, by_name, level), tables))
    return [c for c, _ in packed], {c.blob.digest: z for c, z in packed}


def chunk_table_digest(chunks: list[WeightChunk]) -> str:
    """What ``weights.raw_digest`` is in v5: every chunk's raw digest and the tensors it holds."""
    return sha256_digest(canonical_json([[c.raw_digest, c.raw_size, [t.model_dump(mode="json") for t in c.tensors]]
                                         for c in chunks]))

