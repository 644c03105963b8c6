"""A build's blobs, fetched by digest and verified: the one check the loader, ``verify`` and the
compile gate share (``verify`` and the compile gate through ``check_blobs``, in ``_verify``).

In order, each step before the next allocates anything:

1. Bounds (``check_bounds``), from the manifest alone: the fields that configure the process (device
   count, mesh, process flags: ``machine.check_process_fields``, which the entry points also run
   before JAX starts) within their bounds and lists; every blob's declared raw size is at most
   ``MAX_ZSTD_RATIO`` times its stored size, and the build's stored + raw bytes fit the memory
   of this host and of the target's devices (``memory_cap``). A zstd bomb, or a manifest that
   lies about ``raw_size``, is refused with the numbers before a byte is fetched.
2. Each blob is read at most its declared size + 1 bytes by the store (which checks size and
   digest) and hashed again by the reader (``_inflate.fetch_inflated``), independent of the store:
   a backend with a bug in its own check still cannot hand the loader bytes the manifest does not
   name. A v8 weight chunk on this node (``NodeBlobs``) is read unhashed, size checked, and its
   raw bytes checked against the manifest's BLAKE3 instead (``_weights``).
3. Decompression (``decompress``) is streamed in chunks into a buffer of the declared (bounded)
   raw size, hashed as it goes, and stops one byte past it: a frame that decompresses to more
   than the manifest says is refused having produced raw_size + 1 bytes, whatever it claims.
4. ``check_blobs(programs=True)`` (``_verify``: what ``verify`` runs) also deserializes each
   executable, never running it, and compares its fingerprint with the manifest's, as the loader does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import AvatarReleaseError, IntegrityError
from ..machine import check_process_fields
from ..records import WEIGHT_CHUNK_BYTES, BlobRef, Manifest
from ..specs import load_target
from ._inflate import inflate

__all__ = [
    "BlobCheck",
    "build_blobs",
    "weight_blobs",
    "raw_of",
    "codec_of",
    "check_bounds",
    "memory_cap",
    "decompress",
    "MAX_ZSTD_RATIO",
]

# The most raw bytes per stored byte a blob may declare. Measured 2026-12-01 at the packager's
# zstd level 9: tiny on cpu-8, executables dit 10.5x, sr 5.8x (6.6x with matmul_k_split=2),
# vae 6.1x, weights (f32 from init) 1.3x; tiny on tpu-v6e-8 (compile-only), executables dit 19.3x,
# sr 7.0x, vae 10.5x, weights 1.3x. ~5x margin over the largest (production shapes not measured:
# benchmarks/bench_attacks.py prints the ratios of the builds it makes). A zstd bomb of zeros
# runs to tens of thousands (21000x for a 1 MiB frame of zeros at level 9).
MAX_ZSTD_RATIO = 100
# Below this many raw bytes the ratio is not applied: zstd's frame overhead dominates a tiny blob,
# and a mebibyte is nothing to allocate.
RATIO_EXEMPT_BYTES = 1 << 20


def weight_blobs(manifest: Manifest) -> list[tuple[str, BlobRef]]:
    """(what, blob) for the weights: each chunk, or nothing (weights never materialised)."""
    chunks = manifest.weights.chunks
    return [] if chunks is None else [(f"weights chunk {i}", c.blob) for i, c in enumerate(chunks)]


AUTOTUNE_RESULTS = "autotune results"  # the ``what`` of a v7 build's autotune results blob


def build_blobs(manifest: Manifest) -> list[tuple[str, BlobRef]]:
    """(what, blob) for every blob a build is made of: the weights, each executable, then (v7) the
    autotune results its executables were compiled with."""
    tuned = manifest.autotune
    kept = [(AUTOTUNE_RESULTS, tuned.results_blob)] if tuned is not None and tuned.results_blob is not None else []
    return weight_blobs(manifest) + [(e.key, e.blob) for e in manifest.executables] + kept


def raw_of(manifest: Manifest, what: str) -> tuple[int, str]:
    """(declared raw size, raw digest) of the blob ``what`` names."""
    if what.startswith("weights chunk "):
        chunks = manifest.weights.chunks
        assert chunks is not None  # weight_blobs names chunks only for a chunked (v5) build
        c = chunks[int(what.rsplit(" ", 1)[1])]
        return c.raw_size, c.raw_blake3 or c.raw_digest  # v8: the BLAKE3 a loader checks
    if what == AUTOTUNE_RESULTS:
        tuned = manifest.autotune
        assert tuned is not None and tuned.results is not None  # build_blobs names it only then
        return tuned.results_size or 0, tuned.results
    e = next(e for e in manifest.executables if e.key == what)
    return e.raw_size, e.raw_digest


def codec_of(manifest: Manifest, what: str) -> str:
    """How the blob ``what`` names is stored: "none" (a v8 raw weight chunk) or "zstd"."""
    return manifest.weights.chunk_codec if what.startswith("weights chunk ") else "zstd"


@dataclass(frozen=True)
class BlobCheck:
    what: str
    digest: str
    size: int
    ok: bool
    error: str | None = None
    note: str | None = None  # what else was checked, or why a check did not apply

    def to_json(self) -> dict:
        row = {"what": self.what, "digest": self.digest, "size": self.size, "ok": self.ok}
        if self.note:
            row["note"] = self.note
        return row if self.ok else {**row, "error": self.error}


# ---------------------------------------------------------------------------------------------- bounds
def _gib(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.2f} GiB)"


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def memory_cap(manifest: Manifest) -> tuple[int, str]:
    """(bytes, where the number comes from): the most a build's blobs may occupy, stored plus raw.

    This host's physical memory (or its cgroup limit, when lower): decompression happens in host
    memory. For a target that declares ``hbm_bytes_per_device`` (its spec on this machine, found
    by the manifest's target name, which the identity covers), also the devices' total memory:
    every byte a build carries ends up on its devices.
    """
    cap = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    why = f"this host's physical memory, {_gib(cap)}"
    limit = _cgroup_limit()
    if limit is not None and limit < cap:
        cap, why = limit, f"this process's cgroup memory limit, {_gib(limit)}"

    try:
        target = load_target(manifest.target)
    except AvatarReleaseError:  # a pod without the target's spec: the host bound alone
        return cap, why
    if target.hbm_bytes_per_device is not None:
        devices = target.hbm_bytes_per_device * target.device_count
        if devices < cap:
            cap = devices
            why = (
                f"the memory of target {target.name}'s devices, {target.device_count} x "
                f"{target.hbm_bytes_per_device} bytes = {_gib(devices)}"
            )
    return cap, why


def _bound_error(manifest: Manifest, what: str, ref: BlobRef, raw_size: int) -> str | None:
    if raw_size < 0:
        return f"build {manifest.build_id}: {what}: declares a raw size of {raw_size} bytes"
    # A v5 weight chunk holds at most WEIGHT_CHUNK_BYTES by the chunk rule (only a single tensor larger
    # than that makes a larger chunk): up to that size its ratio may be anything (a chunk of zero-
    # initialised tensors compresses a thousandfold), and the total is still bounded by memory_cap.
    if codec_of(manifest, what) == "none":  # v8 raw chunk: the blob is the raw bytes
        if raw_size != ref.size:
            return (
                f"build {manifest.build_id}: {what}: a raw (uncompressed) chunk of {ref.size} bytes declares "
                f"{raw_size} raw bytes; the manifest is malformed"
            )
        return None
    exempt = WEIGHT_CHUNK_BYTES if what.startswith("weights chunk ") else RATIO_EXEMPT_BYTES
    allowed = max(MAX_ZSTD_RATIO * ref.size, exempt)
    if raw_size > allowed:
        return (
            f"build {manifest.build_id}: {what}: declares {raw_size} raw bytes from a {ref.size}-byte zstd blob "
            f"(ratio {raw_size / max(ref.size, 1):.0f}x, at most {MAX_ZSTD_RATIO}x allowed); refused before "
            "decompressing: a zstd bomb or a lying raw_size"
        )
    return None


def check_bounds(manifest: Manifest, cap: tuple[int, str] | None = None) -> None:
    """Refuse a build whose process fields are out of bounds or whose declared sizes could exhaust
    memory, before anything is fetched."""
    check_process_fields(manifest)
    cap_bytes, why = memory_cap(manifest) if cap is None else cap
    total = 0
    for what, ref in build_blobs(manifest):
        raw_size, _ = raw_of(manifest, what)
        error = _bound_error(manifest, what, ref, raw_size)
        if error:
            raise IntegrityError(error)
        total += ref.size + raw_size
    if total > cap_bytes:
        raise IntegrityError(
            f"build {manifest.build_id}: its blobs declare {_gib(total)} stored + decompressed, more than "
            f"{why}; refused before fetching"
        )


# ---------------------------------------------------------------------------------------------- bytes
def decompress(data: bytes, raw_size: int, raw_digest: str, *, where: str) -> bytes | bytearray:
    """The raw bytes of a zstd blob held in memory, exactly ``raw_size`` of them hashing to
    ``raw_digest`` (``raw_size`` already bounded: ``check_bounds``), through the one bounded
    decoder (``_inflate``, ``avatar_release._zstd``)."""
    out = inflate(iter([data]), raw_size, raw_digest, where=where, keep=True)
    assert out is not None  # keep=True: the raw bytes come back
    return out
