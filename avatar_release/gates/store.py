"""Gate results, frames and reviews in the registry, next to the build they judge.

* a gate result is a content-addressed blob (canonical JSON); the record
  ``gate-results/<build id>`` lists the digests of every result for that build, newest last;
* the delivered frames of a run are a blob (``.npy``, zstd), referenced from the result;
* the blind review of a build is the record ``reviews/<build id>``;
* each shard run of a sharded gate writes its own record ``gate-shards/<build id>__shard-...``
  naming its partial, its signed envelope and its frames (no shared record: shards on many
  hosts write at once).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np
import zstandard

from .._digest import sha256_digest
from .._zstd import DecodeError, declared_size, decode
from ..errors import IntegrityError
from ..records import (
    FRAMES_MEDIA_TYPE,
    RESULT_MEDIA_TYPE,
    SHARD_MEDIA_TYPE,
    BlobRef,
    GateResult,
    GateShard,
    ReviewRecord,
    parse_record,
)
from ..records.stored import (
    GATE_RESULTS,
    GATE_SHARDS,
    REVIEWS,
    parse_results_index,
    parse_shard_record,
    render_results_index,
    render_shard_record,
    shard_record_build,
    shard_record_name,
)
from ..registry import Registry
from ..trust.attest import ENVELOPE_MEDIA_TYPE, attest
from ..trust.evidence import gate_signing_key, sign_and_store

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "put_frames",
    "get_frames",
    "save_result",
    "result_refs",
    "frames_refs",
    "latest_result",
    "get_result",
    "save_review",
    "load_review",
    "save_shard",
    "shard_refs",
    "shard_envelopes",
]

_RESULTS = GATE_RESULTS.name
_REVIEWS = REVIEWS.name
_SHARDS = GATE_SHARDS.name
_MAX_FRAMES_BYTES = 1 << 34  # a gate run's delivered frames, raw: far beyond any run's, below a bomb's


def put_frames(registry: Registry, frames: np.ndarray) -> BlobRef:
    buf = io.BytesIO()
    # uint8 frames (video), or float64 delivered chunks (audio, tensors: metrics.chunk_units)
    np.save(
        buf,
        np.ascontiguousarray(frames, dtype=np.uint8 if frames.dtype == np.uint8 else np.float64),
        allow_pickle=False,
    )
    data = zstandard.ZstdCompressor(level=10).compress(buf.getvalue())
    digest = registry.put_blob(data)
    return BlobRef(digest=digest, size=len(data), media_type=FRAMES_MEDIA_TYPE)


def get_frames(registry: Registry, ref: BlobRef) -> np.ndarray:
    data = registry.get_blob(ref.digest, ref.size)
    if sha256_digest(data) != ref.digest:
        raise IntegrityError(f"gate frames {ref.digest}: bytes do not match the digest")
    try:
        size = declared_size(data, _MAX_FRAMES_BYTES)  # what put_frames wrote: the frame names its size
        raw = decode([data], size, said="the frame header says")
        assert raw is not None  # kept: decode returns what it wrote
        return np.load(io.BytesIO(raw), allow_pickle=False)
    except (DecodeError, ValueError) as e:
        raise IntegrityError(f"gate frames {ref.digest}: not a zstd .npy array ({e})") from None


def result_refs(registry: Registry, build_id: str) -> list[BlobRef]:
    """Every stored gate result of a build, oldest first."""
    return parse_results_index(registry.get_record(_RESULTS, build_id), f"registry record {_RESULTS}/{build_id}")[0]


def frames_refs(registry: Registry, build_id: str) -> list[BlobRef]:
    """The frames blobs the build's gate results refer to (listed in the index since it has had them)."""
    results, frames = parse_results_index(
        registry.get_record(_RESULTS, build_id), f"registry record {_RESULTS}/{build_id}"
    )
    if frames is not None:
        return frames
    return [get_result(registry, ref).frames_blob for ref in results]  # older indexes


def save_result(
    registry: Registry,
    result: GateResult,
    *,
    subject_digest: str | None = None,
    signer: Ed25519PrivateKey | None = None,
) -> str:
    """Store a gate result and a signed attestation of it; returns the result's digest.

    ``subject_digest``: the build's store-independent manifest digest (``Manifest.content_digest()``;
    default ``result.build_digest``, the same in a directory store). ``signer``: the Ed25519 key
    that attests it (default: ``AVATAR_RELEASE_GATE_KEY``, else this machine's own gate key).
    The promotion policy reads only the signed copy.
    """
    data = result.to_json_bytes()
    ref = BlobRef(digest=registry.put_blob(data), size=len(data), media_type=RESULT_MEDIA_TYPE)
    sign_and_store(
        registry,
        signer or gate_signing_key(),
        kind="gate-result",
        build_id=result.build_id,
        subject_digest=subject_digest or result.build_digest,
        predicate=result.model_dump(mode="json"),
    )

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


def get_result(registry: Registry, ref: BlobRef) -> GateResult:
    digest = ref.digest
    data = registry.get_blob(digest, ref.size)
    if sha256_digest(data) != digest:
        raise IntegrityError(f"gate result {digest}: bytes do not match the digest")
    return parse_record(GateResult, data, where=f"gate result {digest}")


def latest_result(registry: Registry, build_id: str) -> tuple[GateResult, str] | None:
    """(the newest gate result of a build, its digest), or None when it was never gated."""
    refs = result_refs(registry, build_id)
    if not refs:
        return None
    return get_result(registry, refs[-1]), refs[-1].digest


def save_review(registry: Registry, review: ReviewRecord) -> None:
    registry.put_record(_REVIEWS, review.build_id, review.to_json_bytes())


def load_review(registry: Registry, build_id: str) -> ReviewRecord | None:
    raw = registry.get_record(_REVIEWS, build_id)
    if raw is None:
        return None
    return parse_record(ReviewRecord, raw, where=f"registry record {_REVIEWS}/{build_id}")


def save_shard(
    registry: Registry, shard: GateShard, *, subject_digest: str, signer: Ed25519PrivateKey | None = None
) -> str:
    """Store one shard run's partial evidence, signed like a gate result (attestation kind
    ``gate-shard``), under its own record; returns the partial's digest. Only blobs and a record
    no other shard writes: parallel shards need no registry lock. ``gate merge`` reads only
    partials whose envelope verifies."""
    data = shard.to_json_bytes()
    ref = BlobRef(digest=registry.put_blob(data), size=len(data), media_type=SHARD_MEDIA_TYPE)
    envelope = attest(
        signer or gate_signing_key(),
        kind="gate-shard",
        build_id=shard.build_id,
        subject_digest=subject_digest,
        predicate=shard.model_dump(mode="json"),
    )
    env_ref = BlobRef(digest=registry.put_blob(envelope), size=len(envelope), media_type=ENVELOPE_MEDIA_TYPE)
    name = shard_record_name(shard.build_id, shard.index, shard.count, [r.twin for r in shard.runs], shard.run_id)
    registry.put_record(_SHARDS, name, render_shard_record(env_ref, ref, [r.frames_blob for r in shard.runs]))
    return ref.digest


def shard_envelopes(registry: Registry, build_id: str) -> list[tuple[str, bytes]]:
    """(record name, signed envelope bytes) of every stored shard run of a build."""
    out: list[tuple[str, bytes]] = []  # a namespace no store holds yet lists nothing, in every store
    for name in registry.list_records(_SHARDS):
        if shard_record_build(name) != build_id:
            continue
        raw = registry.get_record(_SHARDS, name)
        if raw is None:
            continue
        env = parse_shard_record(raw, f"registry record {_SHARDS}/{name}")["envelope"]
        out.append((name, registry.get_blob(env.digest, env.size)))
    return out


def shard_refs(registry: Registry, build_id: str) -> list[str]:
    """The record names of a build's stored shard runs."""
    return [name for name, _ in shard_envelopes(registry, build_id)]
