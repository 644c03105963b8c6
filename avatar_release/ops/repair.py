"""Repair a build whose stored bytes fail verification, from another registry holding the same build.

``repair_build(dst, src, ref)`` reads every blob the build manifest names (and the manifest itself)
from ``dst`` as the loader would (exactly the declared size, hashing to the digest); each one that
is missing or fails is read from ``src``, verified there against the same digest, and put again
into ``dst``, then read back and verified once more. Blobs that pass are never touched, and nothing
but blobs is written: the build reference, its records and the channels stay as they were, so a
repair cannot change what a signature or a channel names.

Why not ``compile`` or ``copy``: both see the build id already published (``put_build`` never
rewrites a build, and ``copy`` skips blobs the destination says it holds), so neither looks at the
bytes; a repair reads them. A store that dedupes by digest without reading (an OCI registry that
answers HEAD for a blob it holds) keeps its damaged bytes: the report says so and the fix is the
registry's own (delete the blob there, then ``copy`` again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from .._digest import sha256_digest
from ..errors import IntegrityError, NotFoundError, RegistryError
from ..records import BlobRef
from ..registry import Registry
from .copy import _manifest_blobs

__all__ = ["RepairReport", "repair_build"]


@dataclass
class RepairReport:
    build_id: str
    digest: str
    source: str
    destination: str
    checked: int = 0  # blobs read and verified in the destination, the manifest included
    repaired: list[dict[str, str]] = field(default_factory=list)  # {digest, was}: what failed, now good

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _drain(pieces: Iterator[bytes]) -> None:
    for _ in pieces:
        pass


def _fault(dst: Registry, ref: BlobRef) -> str | None:
    """Why ``ref``'s stored bytes in ``dst`` fail (None: they pass), read a piece at a time."""
    try:
        dst.stream_blob(ref.digest, ref.size, _drain)
    except (IntegrityError, NotFoundError) as e:
        return str(e)
    return None


def _reput(dst: Registry, src: Registry, ref: BlobRef, data: bytes | None = None) -> None:
    """Good bytes of ``ref`` from ``src`` (verified by digest there) into ``dst``, then read back."""
    good = src.get_blob(ref.digest, ref.size) if data is None else data
    if sha256_digest(good) != ref.digest or len(good) != ref.size:
        raise IntegrityError(
            f"repair: blob {ref.digest} in {src.uri} fails verification too; "
            "repair from a registry that holds a good copy"
        )
    landed = dst.put_blob(good)
    if landed != ref.digest:
        raise IntegrityError(f"repair: blob {ref.digest} was stored in {dst.uri} as {landed}")
    after = _fault(dst, ref)
    if after is not None:
        raise RegistryError(
            f"repair: blob {ref.digest} in {dst.uri} still fails after it was put again ({after}); "
            "the store keeps the damaged bytes under that digest: delete the blob there, then run "
            "`avatar-release copy` from the good registry"
        )


def repair_build(
    dst: Registry, src: Registry, ref: str, *, progress: Callable[[str], None] = lambda m: None
) -> RepairReport:
    """Re-put every blob of build ``ref`` in ``dst`` that fails verification, from ``src``."""
    resolved = dst.resolve(ref)
    report = RepairReport(resolved.build_id, resolved.digest, src.uri, dst.uri)
    try:
        manifest_bytes = dst.get_manifest_bytes(resolved.digest)
    except IntegrityError as e:  # the manifest is a blob too: good bytes by the same digest from the source
        manifest_bytes = src.get_manifest_bytes(resolved.digest)
        manifest = BlobRef(digest=resolved.digest, size=len(manifest_bytes), media_type="manifest")
        _reput(dst, src, manifest, manifest_bytes)
        report.repaired.append({"digest": resolved.digest, "was": str(e)})
        progress(f"repaired the manifest {resolved.digest}")
    report.checked += 1
    for blob in _manifest_blobs(manifest_bytes):
        report.checked += 1
        was = _fault(dst, blob)
        if was is None:
            continue
        _reput(dst, src, blob)
        report.repaired.append({"digest": blob.digest, "was": was})
        progress(f"repaired blob {blob.digest} ({blob.size} bytes) from {src.uri}")
    return report
