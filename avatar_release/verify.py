"""``avatar-release verify``: re-hash every blob of a build against its manifest."""

from __future__ import annotations

from .registry import open_registry, read_manifest

__all__ = ["verify_build"]


def verify_build(ref: str, registry_uri: str | None = None) -> dict:
    from .runtime import check_blobs

    reg = open_registry(registry_uri, create=False)
    resolved, m = read_manifest(reg, ref)
    rows = [c.to_json() for c in check_blobs(reg, m)]
    return {"build_id": m.build_id, "digest": resolved.digest, "ok": all(r["ok"] for r in rows), "blobs": rows}
