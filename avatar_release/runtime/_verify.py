"""``avatar-release verify``: check a build as the loader would, without running anything.

The manifest's identity and seal are recomputed; then, for every blob, its stored size and
sha256, the declared raw size against the bounds (no zstd bomb, no lying ``raw_size``), a
bounded decompression and the raw bytes' sha256; and each executable is deserialized (never
run) and its fingerprint compared with the manifest's, where this machine can load the build
(otherwise the row says why it was not). Imports no torch.
"""

from __future__ import annotations

from ..errors import IntegrityError
from ..machine import configure_for_manifest
from ..records import check_identity
from ..registry import open_registry, read_manifest
from ._blobs import check_blobs

__all__ = ["verify_build"]


def verify_build(ref: str, registry_uri: str | None = None) -> dict:
    reg = open_registry(registry_uri, create=False)
    resolved, m = read_manifest(reg, ref)
    try:
        check_identity(m)
        head = {"what": "manifest", "digest": resolved.digest, "size": None, "ok": True,
                "note": "identity and seal match"}
        configure_for_manifest(m)  # before JAX starts: the devices the build was compiled for
    except IntegrityError as e:
        head = {"what": "manifest", "digest": resolved.digest, "size": None, "ok": False, "error": str(e)}
    # A manifest that fails its own identity is not unpickled, here as in the loader.
    rows = [head] + [c.to_json() for c in check_blobs(reg, m, contents=True, programs=head["ok"])]
    return {"build_id": m.build_id, "digest": resolved.digest, "ok": all(r["ok"] for r in rows), "blobs": rows}
