"""A build's blobs, fetched by digest and verified: the one check the loader, ``verify`` and the
compile gate share.

Each blob is read at most its declared size + 1 bytes by the store (which checks size and
digest), then hashed again here, independent of the store: a backend with a bug in its own
check still cannot hand the loader bytes the manifest does not name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .._digest import sha256_digest
from ..errors import AvatarReleaseError, IntegrityError
from ..records import BlobRef, Manifest

__all__ = ["BlobCheck", "build_blobs", "check_blobs", "fetch_verified"]


def build_blobs(manifest: Manifest) -> list[tuple[str, BlobRef]]:
    """(what, blob) for every blob a build is made of: the weights, then each executable."""
    weights = [("weights", manifest.weights.blob)] if manifest.weights.blob is not None else []
    return weights + [(e.key, e.blob) for e in manifest.executables]


@dataclass(frozen=True)
class BlobCheck:
    what: str
    digest: str
    size: int
    ok: bool
    error: str | None = None

    def to_json(self) -> dict:
        row = {"what": self.what, "digest": self.digest, "size": self.size, "ok": self.ok}
        return row if self.ok else {**row, "error": self.error}


def _verify(manifest: Manifest, what: str, ref: BlobRef, data: bytes) -> bytes:
    if sha256_digest(data) != ref.digest:  # independent of the store's own check
        raise IntegrityError(f"build {manifest.build_id}: {what}: blob {ref.digest} does not match its digest")
    return data


def _fetch_one(registry, manifest: Manifest, what: str, ref: BlobRef) -> bytes:
    return _verify(manifest, what, ref, registry.get_blob(ref.digest, ref.size))


def fetch_verified(registry, manifest: Manifest) -> tuple[dict[str, bytes], float, float]:
    """Every blob's bytes by digest, each verified; raises on the first that fails.

    Returns (bytes by digest, seconds fetching, seconds re-hashing). Nothing is decompressed
    or unpickled until every blob has passed.
    """
    t0 = time.perf_counter()
    fetched = [(what, ref, registry.get_blob(ref.digest, ref.size)) for what, ref in build_blobs(manifest)]
    t1 = time.perf_counter()
    for what, ref, data in fetched:
        _verify(manifest, what, ref, data)
    return {ref.digest: data for _, ref, data in fetched}, t1 - t0, time.perf_counter() - t1


def check_blobs(registry, manifest: Manifest, *, only: set[str] | None = None) -> list[BlobCheck]:
    """Check every blob (or those whose ``what`` is in ``only``) without stopping at the first failure."""
    rows = []
    for what, ref in build_blobs(manifest):
        if only is not None and what not in only:
            continue
        try:
            _fetch_one(registry, manifest, what, ref)
            rows.append(BlobCheck(what, ref.digest, ref.size, True))
        except AvatarReleaseError as e:
            rows.append(BlobCheck(what, ref.digest, ref.size, False, str(e)))
    return rows
