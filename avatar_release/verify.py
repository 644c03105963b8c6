"""``avatar-release verify``: re-hash every blob of a build against its manifest."""

from __future__ import annotations

from .errors import AvatarReleaseError
from .registry import open_registry, read_manifest

__all__ = ["verify_build"]


def verify_build(ref: str, registry_uri: str | None = None) -> dict:
    reg = open_registry(registry_uri, create=False)
    resolved, m = read_manifest(reg, ref)
    rows = []
    items = ([("weights", m.weights.blob)] if m.weights.blob else []) + [(e.key, e.blob) for e in m.executables]
    for what, blob in items:
        row = {"what": what, "digest": blob.digest, "size": blob.size, "ok": True}
        try:
            reg.get_blob(blob.digest, blob.size)
        except AvatarReleaseError as e:
            row.update(ok=False, error=str(e))
        rows.append(row)
    return {"build_id": m.build_id, "digest": resolved.digest, "ok": all(r["ok"] for r in rows), "blobs": rows}
