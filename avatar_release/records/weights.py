"""A build's weights as its manifest records them: tensor-aligned chunks (v5), stored raw or zstd,
with the BLAKE3 digest a loader checks (v8). Part of ``avatar-release/build``; its changelog is in
``records/build.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .._digest import BLAKE3_RE
from ._base import BlobRef, Record, check_digest_fields
from ._omit import _omit_when_none

__all__ = [
    "WEIGHT_CHUNK_BYTES",
    "WEIGHT_CHUNKING",
    "WEIGHT_COMPRESSIONS",
    "WeightTensor",
    "WeightChunk",
    "WeightsRecord",
]

# v5's chunk rule: tensors in name order, packed greedily into chunks of at most this many raw
# bytes (a larger tensor is a chunk of its own), each tensor starting on a 64-byte boundary.
WEIGHT_CHUNK_BYTES = 64 << 20
WEIGHT_CHUNKING = f"tensor-aligned/v1 max={WEIGHT_CHUNK_BYTES} align=64 order=name"
# v8: how a build stores its weight chunks (``WeightsRecord.compression``); "none" is the default.
WEIGHT_COMPRESSIONS = ("none", "zstd")


class WeightTensor(Record):
    """One tensor inside a weight chunk: its bytes are ``chunk[offset: offset + nbytes]``, C order.
    Weights are split across devices along their first dimension (FSDP), so in C order each
    device's slice of a tensor is one contiguous run of the chunk's bytes."""

    name: str
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)


class WeightChunk(Record):
    """A content-addressed piece of the weights: raw tensor bytes, stored as they are (v8,
    compression "none") or zstd-compressed on their own."""

    blob: BlobRef
    raw_size: int
    raw_digest: str  # sha256 of the raw bytes
    tensors: list[WeightTensor]
    raw_blake3: str | None = None  # v8: "blake3:<hex>" of the raw bytes, what a loader checks

    _digests = check_digest_fields("raw_digest")
    _omit = _omit_when_none("raw_blake3")

    @field_validator("raw_blake3")
    @classmethod
    def _check_blake3(cls, v: str | None) -> str | None:
        if v is not None and not BLAKE3_RE.match(v):
            raise ValueError(f"expected 'blake3:' + 64 lowercase hex, got {v!r}")
        return v


class WeightsRecord(Record):
    blob: BlobRef | None  # safetensors file, zstd-compressed; None when never materialised or chunked (v5)
    raw_size: int  # bytes of the tensors (for abstract weights: what they would take)
    raw_digest: str  # of the safetensors bytes; for abstract weights, of the (name, shape, dtype) list
    tensors: int
    source: str  # "init:seed=0", the path it was read from, or "abstract: ..."
    materialized: bool = True
    chunks: list[WeightChunk] | None = None  # v5: the weights in chunks (then ``blob`` is None)
    chunking: str | None = None  # v5: the rule that cut them (WEIGHT_CHUNKING)
    # v8: how the chunks are stored, "none" (raw) or "zstd"; None (v5-v7): zstd
    compression: Literal["none", "zstd"] | None = None

    _omit = _omit_when_none("compression")

    @property
    def chunk_codec(self) -> str:
        """How the chunks' blobs are stored: "none" or "zstd" (every chunked build before v8)."""
        return self.compression or "zstd"

    def chunk_blobs(self) -> list[BlobRef]:
        """Every blob the weights are stored in: the chunks, or the one safetensors blob, or none."""
        if self.chunks is not None:
            return [c.blob for c in self.chunks]
        return [self.blob] if self.blob is not None else []
