"""Weights as chunks (build manifest v5, v8): host tensors -> tensor-aligned pieces, stored apart.

The rule (``records.WEIGHT_CHUNKING``): tensors in name order, packed greedily into chunks of at
most ``WEIGHT_CHUNK_BYTES`` raw bytes, each tensor starting on a 64-byte boundary; a tensor larger
than a chunk is a chunk of its own. It depends only on the tensors' names and sizes, so two builds
whose weights differ in one layer cut the same chunks and share every chunk but that layer's.

Each chunk is assembled, hashed (sha256, the blob's address; BLAKE3, what a loader checks) and,
when the build asks for it, zstd-compressed on its own, in worker threads (zstd and both hashes
release the GIL): at no point are all the weights' bytes serialized at once; what is held is the
tensors themselves and the stored chunks. ``compression="none"`` (v8's default) stores each chunk
as its raw bytes: a loader reads them straight into place, with one hash and no decoding; zstd
saves about a fifth of bf16 weights' bytes for a registry where transfer costs more than CPU.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import zstandard

from .._digest import blake3_digest, canonical_json, sha256_digest
from ..records import WEIGHT_CHUNK_BYTES, WEIGHT_CHUNKING, WEIGHT_COMPRESSIONS, BlobRef, WeightChunk, WeightTensor

__all__ = [
    "HostTensor",
    "plan_chunks",
    "pack_chunks",
    "chunk_table_digest",
    "WEIGHT_CHUNK_MEDIA_TYPE",
    "RAW_WEIGHT_CHUNK_MEDIA_TYPE",
    "WEIGHT_CHUNKING",
]

WEIGHT_CHUNK_MEDIA_TYPE = "application/vnd.avatar-release.weights.chunk.v1+zstd"
RAW_WEIGHT_CHUNK_MEDIA_TYPE = "application/vnd.avatar-release.weights.chunk.v1"  # v8, compression "none"
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


def _pack_one(
    table: list[WeightTensor], by_name: dict[str, HostTensor], level: int, compression: str | None
) -> tuple[WeightChunk, bytes]:
    """One chunk: its record and its stored bytes. ``compression`` None: the v5-v7 form (zstd, no
    BLAKE3), kept for tests that write older builds."""
    raw = np.zeros(_raw_size(table), dtype=np.uint8)  # alignment gaps stay zero: the bytes are deterministic
    for t in table:
        raw[t.offset : t.offset + t.nbytes] = by_name[t.name].data
    digest = sha256_digest(raw.data)
    if compression == "none":
        stored, media_type = raw.tobytes(), RAW_WEIGHT_CHUNK_MEDIA_TYPE
        stored_digest = digest
    else:
        stored, media_type = zstandard.ZstdCompressor(level=level).compress(raw.data), WEIGHT_CHUNK_MEDIA_TYPE
        stored_digest = sha256_digest(stored)
    fast = None if compression is None else blake3_digest(raw.data)
    chunk = WeightChunk(
        blob=BlobRef(digest=stored_digest, size=len(stored), media_type=media_type),
        raw_size=int(raw.nbytes),
        raw_digest=digest,
        tensors=table,
        raw_blake3=fast,
    )
    return chunk, stored


def pack_chunks(
    tensors: list[HostTensor],
    *,
    level: int,
    max_bytes: int = WEIGHT_CHUNK_BYTES,
    workers: int | None = None,
    compression: str | None = "none",
) -> tuple[list[WeightChunk], dict[str, bytes]]:
    """(the chunks, {digest: stored bytes}), chunks packed side by side in ``workers`` threads;
    ``compression`` "none" (raw) or "zstd" at ``level`` (v8), or None for the v5-v7 form."""
    if compression is not None and compression not in WEIGHT_COMPRESSIONS:
        raise ValueError(f"weight compression {compression!r}: expected one of {', '.join(WEIGHT_COMPRESSIONS)}")
    by_name = {t.name: t for t in tensors}
    if len(by_name) != len(tensors):
        raise ValueError("two weights share a name")
    tables = plan_chunks(tensors, max_bytes)
    workers = workers or min(len(tables), os.cpu_count() or 1, 8) or 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pack-weights") as pool:
        packed = list(pool.map(lambda table: _pack_one(table, by_name, level, compression), tables))
    return [c for c, _ in packed], {c.blob.digest: z for c, z in packed}


def chunk_table_digest(chunks: list[WeightChunk], compression: str | None = None) -> str:
    """What ``weights.raw_digest`` is: in v5-v7 every chunk's raw digest and the tensors it holds;
    in v8 (``compression`` given) also how the chunks are stored and their BLAKE3 digests, so a
    build stored another way is another build."""
    table = [
        [c.raw_digest, c.raw_size, [t.model_dump(mode="json") for t in c.tensors]]
        + ([c.raw_blake3] if compression is not None else [])
        for c in chunks
    ]
    return sha256_digest(
        canonical_json(table if compression is None else {"compression": compression, "chunks": table})
    )
