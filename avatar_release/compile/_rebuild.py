"""Reproducible builds: recompile a published build from its manifest and compare.

The executable fingerprint and the HLO text hash are stable across processes (the raw
serialized bytes are not), so those, the weights digest and the identity are compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import CompileError, IntegrityError
from ..records import Manifest
from ..registry import Registry, read_manifest
from ..runtime import decompress
from ._autotune import AutotunePlan
from ._autotune_results import MAX_RESULTS_BYTES, read_results
from ._build import compile_build

__all__ = ["RebuildReport", "rebuild", "rebuild_manifest", "build_inputs", "kept_autotune"]


def build_inputs(m: Manifest) -> dict[str, Any]:
    """What compiling ``m`` again takes: its pipeline, target, weights source and overrides."""
    source = m.weights.source
    return {
        "pipeline": m.pipeline,
        "target": m.target,
        "overrides": {k: str(v) for k, v in m.overrides.items()},
        "weights_path": None if source.startswith(("init:", "abstract")) else source,
        "weight_compression": m.weights.compression or "none",
    }


def kept_autotune(registry: Registry, m: Manifest) -> AutotunePlan | None:
    """The autotune results ``m`` was compiled with (v7), read back from its blob; None without."""
    tuned = m.autotune
    if tuned is None or tuned.results_blob is None or tuned.results is None:
        return None
    where = f"build {m.build_id}: autotune results"
    ref, size = tuned.results_blob, tuned.results_size or 0
    if size > MAX_RESULTS_BYTES:  # the bound decompress needs, before anything is fetched
        raise IntegrityError(f"{where}: declares {size} raw bytes, more than the {MAX_RESULTS_BYTES} allowed")
    # The store checks the stored size and sha256; decompress, the raw size and the digest the identity covers.
    text = bytes(decompress(registry.get_blob(ref.digest, ref.size), size, tuned.results, where=where))
    return AutotunePlan(results=read_results(text, where=where), require_complete=bool(tuned.complete_required))


@dataclass
class RebuildReport:
    build_id: str
    rebuilt_id: str
    identical: bool
    differences: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "build_id": self.build_id,
            "rebuilt_id": self.rebuilt_id,
            "identical": self.identical,
            "differences": self.differences,
        }


def rebuild(ref: str, registry: Registry, *, progress: Callable[[str], None] = lambda msg: None) -> RebuildReport:
    return rebuild_manifest(ref, registry, progress=progress)[0]


def rebuild_manifest(
    ref: str, registry: Registry, *, progress: Callable[[str], None] = lambda msg: None
) -> tuple[RebuildReport, Manifest]:
    """(report, the rebuilt manifest): recompile without publishing, and compare."""
    _, m = read_manifest(registry, ref)
    again = compile_build(
        **build_inputs(m), registry=registry, autotune=kept_autotune(registry, m), publish=False, progress=progress
    ).manifest
    if again is None:  # compile_build always packages one; None here is a compiler fault, not a difference
        raise CompileError(f"rebuild of {ref}: the compile returned no manifest to compare")
    diffs: list[dict] = []

    def differ(what: str, a: object, b: object) -> None:
        if a != b:
            diffs.append({"what": what, "published": a, "rebuilt": b})

    differ("source_digest", m.source_digest, again.source_digest)
    differ("weights", m.weights.raw_digest, again.weights.raw_digest)
    differ("flags", m.flags.digest, again.flags.digest)
    differ("toolchain", m.toolchain.model_dump(), again.toolchain.model_dump())
    new = {e.key: e for e in again.executables}
    for e in m.executables:
        n = new.get(e.key)
        if n is None:
            diffs.append({"what": f"{e.key}", "published": "present", "rebuilt": "absent"})
            continue
        differ(f"{e.key}.hlo_digest", e.hlo_digest, n.hlo_digest)
        differ(f"{e.key}.fingerprint", e.fingerprint, n.fingerprint)
    differ("identity", m.identity, again.identity)
    return RebuildReport(m.build_id, again.build_id, not diffs, diffs), again
