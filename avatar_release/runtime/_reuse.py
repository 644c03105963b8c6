"""What a new build shares with the build a pod serves now, byte for byte: a swap takes those
programs and placed weights from the running build instead of loading them again.

Sameness is decided by digests the new manifest names, never by names alone: a program is the
same when its raw serialized bytes have the same sha256 (and the same argument trees), a tensor
when it lies at the same offset, with the same dtype and shape, in a weight chunk whose raw bytes
have the same sha256 and the same BLAKE3 (the digest a v8 load checks) — and both builds run on the same devices in the same mesh. The running
build verified those bytes before it deserialized or placed them; the new manifest, verified
before anything here is asked, names the same digests, so they are the bytes it names. Each shared
program's fingerprint is still checked against the new manifest (``_load``). Device arrays are
immutable and the programs never donate their weights, so two builds may hold the same ones: a
swap then needs no second copy of the weights on the devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..records import ExecutableEntry, Manifest

if TYPE_CHECKING:  # only for annotations: JAX starts only after XLA_FLAGS are set
    from jax.sharding import Mesh

    from ._load import LoadedBuild, LoadedStage

__all__ = ["Shared", "shared_with", "program_of"]

Program = tuple[str, str, str, str]  # (format, raw sha256, in_tree, out_tree)
Tensor = tuple[str, str | None, int, int, str, tuple[int, ...]]  # (chunk raw sha256, raw BLAKE3, offset, ...)


@dataclass
class Shared:
    """What the new build takes from the serving one: executable key -> the serving stage with the
    same program; (tensor name, sharding) -> its placed array."""

    programs: dict[str, LoadedStage] = field(default_factory=dict)
    arrays: dict[tuple[str, tuple[str | None, ...]], Any] = field(default_factory=dict)
    raw_bytes: int = 0  # of the tensors taken

    def to_json(self) -> dict[str, int]:
        return {
            "programs": len(self.programs),
            "tensors": len({name for name, _ in self.arrays}),
            "raw_bytes": self.raw_bytes,
        }


def program_of(e: ExecutableEntry) -> Program:
    """What makes two entries one program: the same bytes under the same argument trees (a swap, a
    program shared across buckets)."""
    return (e.format, e.raw_digest, e.in_tree, e.out_tree)


def _tensors(manifest: Manifest) -> dict[str, Tensor]:
    return {
        t.name: (c.raw_digest, c.raw_blake3, t.offset, t.nbytes, t.dtype, tuple(t.shape))
        for c in manifest.weights.chunks or []
        for t in c.tensors
    }


def _same_devices(serving: LoadedBuild, mesh: Mesh) -> bool:
    try:
        return bool(serving.mesh == mesh)
    except Exception:  # noqa: BLE001 - a mesh that cannot be compared is not the same one
        return False


def shared_with(serving: LoadedBuild | None, manifest: Manifest, mesh: Mesh) -> Shared:
    """The programs and placed weights ``manifest`` shares with ``serving`` (nothing without one,
    on other devices, or when the serving build holds no chunked weights)."""
    out = Shared()
    if serving is None or not _same_devices(serving, mesh):
        return out
    programs = {program_of(ls.entry): ls for ls in serving.stages.values() if ls.executable is not None}
    for e in manifest.executables:
        if program_of(e) in programs:
            out.programs[e.key] = programs[program_of(e)]
    ours, theirs = _tensors(manifest), _tensors(serving.manifest)
    placed: dict[tuple[str, tuple[str | None, ...]], Any] = {}
    for ls in serving.stages.values():
        for spec in ls.entry.params:
            arr = ls.params.get(spec.name.split(".", 1)[1])
            if arr is not None and not arr.is_deleted():
                placed[(spec.name, tuple(spec.sharding))] = arr
    nbytes: dict[str, int] = {}
    for e in manifest.executables:
        for spec in e.params:
            key = (spec.name, tuple(spec.sharding))
            source = ours.get(spec.name)
            if source is None or source != theirs.get(spec.name) or key not in placed:
                continue
            if list(placed[key].shape) != spec.shape:
                continue
            out.arrays[key] = placed[key]
            nbytes[spec.name] = source[3]
    out.raw_bytes = sum(nbytes.values())
    return out
