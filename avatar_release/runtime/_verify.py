"""``avatar-release verify``: check a build as the loader would, without running anything.

The manifest's identity and seal are recomputed; then, for every blob, its stored size and
sha256, the declared raw size against the bounds (no zstd bomb, no lying ``raw_size``), a
bounded decompression and the raw bytes' sha256; and each executable is deserialized (never
run) and its fingerprint compared with the manifest's, where this machine can load the build
(otherwise the row says why it was not). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import AvatarReleaseError, EnvironmentMismatch, IntegrityError
from ..machine import configure_for_manifest
from ..records import ExecutableEntry, Manifest, check_identity
from ..registry import Registry, open_registry, read_manifest, with_node_cache
from ._blobs import BlobCheck, _bound_error, _gib, build_blobs, codec_of, memory_cap, raw_of
from ._inflate import fetch_inflated
from ._load import check_environment, devices_for
from ._unpickle import check_fingerprint, deserialize_and_load, tree_from_text

__all__ = ["check_blobs", "verify_build"]


def verify_build(ref: str, registry_uri: str | None = None, *, programs: bool = True) -> dict[str, Any]:
    """Every blob's stored and raw size and sha256, and (``programs``) each executable deserialized,
    never run, against its fingerprint. Without ``programs`` JAX never starts: the weights and
    executables stream through the hash a piece at a time, so memory stays flat whatever the build's
    size (about 60 MB for 1.24 GB of weights, measured 2026-12-02; with programs, JAX and the
    programs XLA loads: 570 MB for that build, 390 MB for the default tiny)."""
    reg = with_node_cache(open_registry(registry_uri, create=False))  # --cache-dir: what this node would load
    resolved, m = read_manifest(reg, ref)
    head: dict[str, Any]
    try:
        check_identity(m)
        head = {
            "what": "manifest",
            "digest": resolved.digest,
            "size": None,
            "ok": True,
            "note": "identity and seal match",
        }
        configure_for_manifest(m)  # before JAX starts: the devices the build was compiled for
    except IntegrityError as e:
        head = {"what": "manifest", "digest": resolved.digest, "size": None, "ok": False, "error": str(e)}
    # A manifest that fails its own identity is not unpickled, here as in the loader.
    rows = [head] + [c.to_json() for c in check_blobs(reg, m, contents=True, programs=programs and head["ok"])]
    return {
        "build_id": m.build_id,
        "digest": resolved.digest,
        "ok": all(r["ok"] for r in rows),
        "programs": programs,
        "blobs": rows,
    }


# ---------------------------------------------------------------------------------------------- verify
def _program_checker(manifest: Manifest) -> Callable[[ExecutableEntry, bytes | bytearray], str]:
    """check(entry, payload) -> note: deserialize (never run) and compare the fingerprint, where this
    machine can load the build at all."""
    try:
        check_environment(manifest)
        devices = devices_for(manifest)
        unable = None
    except EnvironmentMismatch as e:
        unable = "; ".join(f"{k}: expected {x!r}, actual {y!r}" for k, (x, y) in e.differences.items())

    def check(entry: ExecutableEntry, payload: bytes | bytearray) -> str:
        if entry.format != "xla-executable":
            return f"program not checked: a {entry.format} stage is compiled in the pod"
        if unable is not None:
            return f"program not checked: this machine cannot load the build ({unable})"
        exe = deserialize_and_load(
            payload,
            tree_from_text(entry.in_tree, entry, "in"),
            tree_from_text(entry.out_tree, entry, "out"),
            backend=devices[0].client,
            execution_devices=devices,
            what=f"build {manifest.build_id}: executable {entry.key}",
        )
        return check_fingerprint(manifest, entry, exe)

    return check


def _blob_key(ref: Any, entry: Any) -> tuple:
    """What makes two entries' checks of one blob the same check: the blob, and for an executable its
    raw bytes, trees and fingerprint (a program shared across buckets, compile/_share.py)."""
    if entry is None:
        return ()
    return (
        ref.digest,
        ref.size,
        entry.raw_size,
        entry.raw_digest,
        entry.format,
        entry.in_tree,
        entry.out_tree,
        entry.fingerprint,
    )


def _within_bounds(manifest: Manifest, what: str, ref: Any, cap: tuple[int, str]) -> tuple[int, str]:
    """The blob's declared raw size and digest, refused (IntegrityError) past the bounds or the memory cap."""
    raw_size, raw_digest = raw_of(manifest, what)
    error = _bound_error(manifest, what, ref, raw_size)
    if error is None and ref.size + raw_size > cap[0]:
        error = f"build {manifest.build_id}: {what}: {_gib(ref.size + raw_size)} is more than {cap[1]}"
    if error:
        raise IntegrityError(error)
    return raw_size, raw_digest


def check_blobs(
    registry: Registry,
    manifest: Manifest,
    *,
    only: set[str] | None = None,
    contents: bool = False,
    programs: bool = False,
) -> list[BlobCheck]:
    """Check every blob (or those whose ``what`` is in ``only``) without stopping at the first failure.

    Always the stored bytes' size and sha256. ``contents``: also the declared sizes against the
    bounds, then a bounded decompression and the raw bytes' size and sha256. ``programs``
    (implies contents): also deserialize each executable and compare its fingerprint.
    """
    contents = contents or programs
    check_program = _program_checker(manifest) if programs else None
    cap = memory_cap(manifest) if contents else None
    rows: list[BlobCheck] = []
    # A blob several entries name (a program shared across buckets, compile/_share.py) is fetched,
    # checked and deserialized once: a later entry asking the same of it takes the note it passed with.
    passed: dict[tuple, str | None] = {}
    for what, ref in build_blobs(manifest):
        if only is not None and what not in only:
            continue
        note = None
        entry = next((e for e in manifest.executables if e.key == what), None)
        same = _blob_key(ref, entry)
        if same in passed:
            rows.append(BlobCheck(what, ref.digest, ref.size, True, note=passed[same]))
            continue
        try:
            if contents:
                assert cap is not None  # measured above for contents
                raw_size, raw_digest = _within_bounds(manifest, what, ref, cap)
            program = check_program is not None and entry is not None
            payload, _ = fetch_inflated(
                registry,
                ref,
                (raw_size, raw_digest) if contents else None,
                where=f"build {manifest.build_id}: {what}",
                keep=program,
                codec=codec_of(manifest, what),
            )
            if contents:
                note = "raw bytes match"
                if check_program is not None and entry is not None and payload is not None:
                    note += "; " + check_program(entry, payload)
                del payload
            if entry is not None:
                passed[same] = note
            rows.append(BlobCheck(what, ref.digest, ref.size, True, note=note))
        except AvatarReleaseError as e:
            rows.append(BlobCheck(what, ref.digest, ref.size, False, str(e)))
    return rows
