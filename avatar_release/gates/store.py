"""Gate results, frames and reviews in the registry, next to the build they judge.

* a gate result is a content-addressed blob (canonical JSON); the record
  ``gate-results/<build id>`` lists the digests of every result for that build, newest last;
* the delivered frames of a run are a blob (``.npy``, zstd), referenced from the result;
* the blind review of a build is the record ``reviews/<build id>``;
* the partial evidence of a sharded gate (one blob per shard run, signed like a result) is
  listed, with its frames, in the record ``gate-shards/<build id>``.
"""

from __future__ import annotations

import io

import numpy as np
import zstandard

from .._digest import sha256_digest
from ..errors import IntegrityError
from ..records import (
    FRAMES_MEDIA_TYPE, RESULT_MEDIA_TYPE, SHARD_MEDIA_TYPE, BlobRef, GateResult, GateShard, ReviewRecord, parse_record,
)
from ..records.stored import (
    GATE_RESULTS, GATE_SHARDS, REVIEWS, parse_results_index, parse_shards_index, render_results_index,
    render_shards_index,
)

__all__ = ["put_frames", "get_frames", "save_result", "result_refs", "frames_refs", "latest_result", "get_result",
           "save_review", "load_review", "save_shard", "shard_refs"]

_RESULTS = GATE_RESULTS.name
_REVIEWS = REVIEWS.name
_SHARDS = GATE_SHARDS.name


def put_frames(registry, frames: np.ndarray) -> BlobRef:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(frames, dtype=np.uint8), allow_pickle=False)
    data = zstandard.ZstdCompressor(level=10).compress(buf.getvalue())
    digest = registry.put_blob(data)
    return BlobRef(digest=digest, size=len(data), media_type=FRAMES_MEDIA_TYPE)


def get_frames(registry, ref: BlobRef) -> np.ndarray:
    data = registry.get_blob(ref.digest, ref.size)
    if sha256_digest(data) != ref.digest:
        raise IntegrityError(f"gate frames {ref.digest}: bytes do not match the digest")
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 34)
        return np.load(io.BytesIO(raw), allow_pickle=False)
    except (zstandard.ZstdError, ValueError) as e:
        raise IntegrityError(f"gate frames {ref.digest}: not a zstd .npy array ({e})") from None


def result_refs(registry, build_id: str) -> list[BlobRef]:
    """Every stored gate result of a build, oldest first."""
    return parse_results_index(registry.get_record(_RESULTS, build_id), f"registry record {_RESULTS}/{build_id}")[0]


def frames_refs(registry, build_id: str) -> list[BlobRef]:
    """The frames blobs the build's gate results refer to (listed in the index since it has had them)."""
    results, frames = parse_results_index(registry.get_record(_RESULTS, build_id),
                                          f"registry record {_RESULTS}/{build_id}")
    if frames is not None:
        return frames
    return [get_result(registry, ref).frames_blob for ref in results]  # older indexes


def save_result(registry, result: GateResult, *, subject_digest: str | None = None, signer=None) -> str:
    """Store a gate result and a signed attestation of it; returns the result's digest.

    ``subject_digest``: the build's store-independent manifest digest (``Manifest.content_digest()``;
    default ``result.build_digest``, the same in a directory store). ``signer``: the Ed25519 key
    that attests it (default: ``AVATAR_RELEASE_GATE_KEY``, else this machine's own gate key).
    The promotion policy reads only the signed copy.
    """
    from ..trust.evidence import gate_signing_key, sign_and_store

    data = result.to_json_bytes()
    ref = BlobRef(digest=registry.put_blob(data), size=len(data), media_type=RESULT_MEDIA_TYPE)
    sign_and_store(registry, signer or gate_signing_key(), kind="gate-result", build_id=result.build_id,
                   subject_digest=subject_digest or result.build_digest, predicate=result.model_dump(mode="json"))

    def add(old: bytes | None) -> bytes:
        where = f"registry record {_RESULTS}/{result.build_id}"
        refs, frames = parse_results_index(old, where)
        if frames is None:
            frames = [get_result(registry, r).frames_blob for r in refs]
        if ref not in refs:
            refs.append(ref)
        if result.frames_blob not in frames:
            frames.append(result.frames_blob)
        return render_results_index(refs, frames)

    registry.update_record(_RESULTS, result.build_id, add)
    return ref.digest


def get_result(registry, ref: BlobRef) -> GateResult:
    digest = ref.digest
    data = registry.get_blob(digest, ref.size)
    if sha256_digest(data) != digest:
        raise IntegrityError(f"gate result {digest}: bytes do not match the digest")
    return parse_record(GateResult, data, where=f"gate result {digest}")


def latest_result(registry, build_id: str) -> tuple[GateResult, str] | None:
    """(the newest gate result of a build, its digest), or None when it was never gated."""
    refs = result_refs(registry, build_id)
    if not refs:
        return None
    return get_result(registry, refs[-1]), refs[-1].digest


def save_review(registry, review: ReviewRecord) -> None:
    registry.put_record(_REVIEWS, review.build_id, review.to_json_bytes())


def load_review(registry, build_id: str) -> ReviewRecord | None:
    raw = registry.get_record(_REVIEWS, build_id)
    if raw is None:
        return None
    return parse_record(ReviewRecord, raw, where=f"registry record {_REVIEWS}/{build_id}")


def save_shard(registry, shard: GateShard, *, subject_digest: str, signer=None) -> str:
    """Store one shard's partial evidence and a signed attestation of it (kind ``gate-shard``,
    signed like a gate result); returns the partial's digest. ``gate merge`` reads only the
    signed copies."""
    from ..trust.evidence import gate_signing_key, sign_and_store

    data = shard.to_json_bytes()
    ref = BlobRef(digest=registry.put_blob(data), size=len(data), media_type=SHARD_MEDIA_TYPE)
    sign_and_store(registry, signer or gate_signing_key(), kind="gate-shard", build_id=shard.build_id,
                   subject_digest=subject_digest, predicate=shard.model_dump(mode="json"))

    def add(old: bytes | None) -> bytes:
        refs, frames = parse_shards_index(old, f"registry record {_SHARDS}/{shard.build_id}")
        refs += [] if ref in refs else [ref]
        frames += [r.frames_blob for r in shard.runs if r.frames_blob not in frames]
        return render_shards_index(refs, frames)

    registry.update_record(_SHARDS, shard.build_id, add)
    return ref.digest


def shard_refs(registry, build_id: str) -> list[BlobRef]:
    """Every stored partial of a build's sharded gates, oldest first."""
    return parse_shards_index(registry.get_record(_SHARDS, build_id), f"registry record {_SHARDS}/{build_id}")[0]
