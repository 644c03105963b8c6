"""Estimated time per chunk from the compiler's own cost model, against the playback deadline.

These are **compiler estimates, never measurements**: XLA's ``cost_analysis()`` of each compiled
executable (flops, bytes accessed, transcendentals, and on TPU ``optimal_seconds``), scaled by
the executable's ``cost_loop_scale`` (XLA counts a scanned block once), turned into seconds
with a roofline against the device's published peaks: ``max(flops / peak, bytes / bandwidth)``.
A chunk of F frames runs every stage once and must be ready within F / fps seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .records import Manifest

__all__ = ["StageEstimate", "ChunkEstimate", "estimate_chunks", "LABEL"]

LABEL = "compiler estimate (XLA cost model + published device peaks), not a measurement"


@dataclass
class StageEstimate:
    key: str
    flops: float  # per device, whole stage (scaled for scans)
    bytes_accessed: float
    transcendentals: float
    loop_scale: float
    roofline_seconds: float | None  # max(flops / peak, bytes / bandwidth)
    bound: str | None  # "compute" | "memory"
    xla_optimal_seconds: float | None  # XLA's own figure, scaled; None when XLA gives none usable
    xla_optimal_note: str = ""


@dataclass
class ChunkEstimate:
    bucket: str
    frames: int
    deadline_seconds: float
    estimated_seconds: float | None
    ratio: float | None  # estimated / deadline: above 1 misses the deadline
    stages: list[StageEstimate] = field(default_factory=list)
    label: str = LABEL

    def to_json(self) -> dict:
        return asdict(self)


def _stage(entry, peak_flops: float | None, bandwidth: float | None) -> StageEstimate:
    c, scale = entry.cost, entry.cost_loop_scale
    flops, nbytes = c.get("flops", 0.0) * scale, c.get("bytes accessed", 0.0) * scale
    roofline = bound = None
    if peak_flops and bandwidth:
        compute, memory = flops / peak_flops, nbytes / bandwidth
        roofline, bound = max(compute, memory), ("compute" if compute >= memory else "memory")
    raw = c.get("optimal_seconds")
    optimal, note = None, ""
    if raw is None:
        note = "XLA reported no optimal_seconds for this backend"
    elif raw <= 0:
        note = f"XLA reported {raw:.3g} s, which is not a usable estimate"
    else:
        optimal = raw * scale
    return StageEstimate(entry.key, flops, nbytes, c.get("transcendentals", 0.0) * scale, scale,
                         roofline, bound, optimal, note)


def estimate_chunks(manifest: Manifest, peak_flops: float | None, bandwidth: float | None) -> list[ChunkEstimate]:
    """One estimate per bucket: its stages' estimates summed, against F / fps seconds."""
    out = []
    fps = manifest.program.fps
    for b in manifest.buckets:
        stages = [_stage(e, peak_flops, bandwidth) for e in manifest.executables if e.bucket == b.name]
        per = [s.roofline_seconds if s.roofline_seconds is not None else s.xla_optimal_seconds for s in stages]
        total = sum(per) if stages and all(v is not None for v in per) else None
        deadline = b.frames / fps
        out.append(ChunkEstimate(b.name, b.frames, deadline, total, None if total is None else total / deadline,
                                 stages))
    return out
