"""Reproducible builds: recompile a published build from its manifest and compare.

The executable fingerprint and the HLO text hash are stable across processes (the raw
serialized bytes are not), so those, the weights digest and the identity are compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import CompileError
from ..records import Manifest

from ..registry import Registry, read_manifest
from ._build import compile_build

__all__ = ["RebuildReport", "rebuild", "rebuild_manifest"]


@dataclass
class RebuildReport:
    build_id: str
    rebuilt_id: str
    identical: bool
    differences: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"build_id": self.build_id, "rebuilt_id": self.rebuilt_id, "identical": self.identical,
                "differences": self.differences}


def rebuild(ref: str, registry: Registry, *, progress: Callable[[str], None] = lambda msg: None) -> RebuildReport:
    return rebuild_manifest(ref, registry, progress=progress)[0]


def rebuild_manifest(ref: str, registry: Registry, *,
                     progress: Callable[[str], None] = lambda msg: None) -> tuple[RebuildReport, Manifest]:
    """(report, the rebuilt manifest): recompile without publishing, and compare."""
    _, m = read_manifest(registry, ref)
    source = m.weights.source
    weights_path = None if source.startswith(("init:", "abstract")) else source
    overrides = {k: str(v) for k, v in m.overrides.items()}
    again = compile_build(m.pipeline, m.target, registry=registry, weights_path=weights_path,
                          overrides=overrides, publish=False, progress=progress).manifest
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
