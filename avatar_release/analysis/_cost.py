"""Estimated time per chunk from the compiler's own cost model, against the playback deadline.

These are **compiler estimates, never measurements**: XLA's cost analysis of each compiled
executable (flops, bytes accessed, transcendentals) with every while loop counted as often as it
turns (the ``... per run`` figures ``compile/_loopcost.py`` records; a manifest without them falls
back to XLA's once-per-loop figures times ``cost_loop_scale``), turned into seconds with a
roofline against the device's published peaks: ``max(flops / peak, bytes / bandwidth)``.
A chunk of F frames runs every stage once and must be ready within F / fps seconds.

Per stage it also says which term binds (compute or memory), the **share of the compute floor**
(``flops / peak`` over the estimated time: 1.0 when compute binds, lower the more the stage
waits on memory or the wire), and its collectives as the scheduled program leaves them: hidden
(compute scheduled between start and done) or exposed. The bytes an exposed collective brings
to a device, at the target's interconnect rate, are added to the stage's roofline: the device
waits for the wire while they arrive (``compile/_loopcost.py`` counts them per run).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..records import ExecutableEntry, Manifest

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
    compute_seconds: float | None = None  # flops / peak: the compute floor of what XLA counted
    memory_seconds: float | None = None  # bytes accessed / bandwidth
    compute_share: float | None = None  # compute_seconds / roofline_seconds (1.0: compute-bound)
    # All-to-alls of the scheduled program (None: no schedule recorded for this executable).
    all_to_alls: int | None = None
    all_to_alls_hidden: int | None = None
    all_to_alls_exposed: int | None = None
    counted: str = ""  # how flops and bytes were counted over loops (_per_run)
    # Bytes arriving at a device through collectives per run, and those the schedule leaves
    # exposed (None: not recorded, a build compiled before they were); their wire time at the
    # target's interconnect rate is added to the roofline.
    collective_bytes: float | None = None
    exposed_collective_bytes: float | None = None
    exposed_collective_seconds: float | None = None
    seconds: float | None = None  # the stage's estimate: roofline + exposed collective time


@dataclass
class ChunkEstimate:
    bucket: str
    frames: int
    deadline_seconds: float
    estimated_seconds: float | None
    ratio: float | None  # estimated / deadline: above 1 misses the deadline
    stages: list[StageEstimate] = field(default_factory=list)
    label: str = LABEL
    compute_seconds: float | None = None  # the stages' compute floors summed
    compute_share: float | None = None  # compute_seconds / estimated_seconds
    all_to_alls_hidden: int = 0  # over every stage with a recorded schedule
    all_to_alls_exposed: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def _per_run(c: dict[str, float], scale: float) -> tuple[float, float, float, str]:
    """flops, bytes, transcendentals of one run of the program, and how they were counted."""
    if all(f"{k} per run" in c for k in ("flops", "bytes accessed")):
        return (
            c["flops per run"],
            c["bytes accessed per run"],
            c.get("transcendentals per run", 0.0),
            "per-run (every loop counted as it turns)",
        )
    return (
        c.get("flops", 0.0) * scale,
        c.get("bytes accessed", 0.0) * scale,
        c.get("transcendentals", 0.0) * scale,
        "loop-scaled (XLA's figures x the traced scan trip ratio)",
    )


def _stage(
    entry: ExecutableEntry, peak_flops: float | None, bandwidth: float | None, ici: float | None
) -> StageEstimate:
    c, scale = entry.cost, entry.cost_loop_scale
    flops, nbytes, transcendentals, counted = _per_run(c, scale)
    roofline = bound = compute = memory = share = seconds = None
    moved, exposed = c.get("collective bytes per run"), c.get("exposed collective bytes per run")
    wire = exposed / ici if exposed is not None and ici else None
    if peak_flops and bandwidth:
        compute, memory = flops / peak_flops, nbytes / bandwidth
        roofline, bound = max(compute, memory), ("compute" if compute >= memory else "memory")
        seconds = roofline + (wire or 0.0)
        share = compute / seconds if seconds > 0 else None
    raw = c.get("optimal_seconds")
    optimal, note = None, ""
    if raw is None:
        note = "XLA reported no optimal_seconds for this backend"
    elif raw <= 0:
        note = f"XLA reported {raw:.3g} s, which is not a usable estimate"
    else:
        optimal = raw * scale
    sc = getattr(entry, "schedule", None)
    return StageEstimate(
        entry.key,
        flops,
        nbytes,
        transcendentals,
        scale,
        roofline,
        bound,
        optimal,
        note,
        compute,
        memory,
        share,
        None if sc is None else sc.all_to_alls,
        None if sc is None else sc.hidden,
        None if sc is None else sc.exposed,
        counted,
        moved,
        exposed,
        wire,
        seconds,
    )


def estimate_chunks(
    manifest: Manifest, peak_flops: float | None, bandwidth: float | None, ici: float | None = None
) -> list[ChunkEstimate]:
    """One estimate per bucket: its stages' estimates summed, against F / fps seconds. ``ici``:
    bytes per second arriving at a device over the interconnect, to charge exposed collectives."""
    out = []
    fps = manifest.program.fps
    for b in manifest.buckets:
        stages = [_stage(e, peak_flops, bandwidth, ici) for e in manifest.executables if e.bucket == b.name]
        per = [s.seconds if s.seconds is not None else s.xla_optimal_seconds for s in stages]
        known = [v for v in per if v is not None]
        total = sum(known) if stages and len(known) == len(per) else None
        deadline = b.frames / fps
        computes = [s.compute_seconds for s in stages if s.compute_seconds is not None]
        compute = sum(computes) if stages and len(computes) == len(stages) else None
        out.append(
            ChunkEstimate(
                b.name,
                b.frames,
                deadline,
                total,
                None if total is None else total / deadline,
                stages,
                compute_seconds=compute,
                compute_share=compute / total if compute is not None and total else None,
                all_to_alls_hidden=sum(s.all_to_alls_hidden or 0 for s in stages),
                all_to_alls_exposed=sum(s.all_to_alls_exposed or 0 for s in stages),
            )
        )
    return out
