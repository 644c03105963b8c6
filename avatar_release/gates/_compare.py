"""The gates' verdicts: pure functions from runs (and a baseline) to typed evidence.

A video build is compared frame by frame (uint8, PSNR); an audio or tensors build chunk by chunk
(its delivered arrays, float64, SNR: ``metrics``): the units' dtype says which.

Each verdict's details are written through its typed model (``records.gate``'s ``...Details``,
with ``GateEvidence.with_details``): the stored JSON is the object it always was, now checked
against the model that reads it back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..records import Band, GateEvidence, GateSetRecord
from ..records.gate import (
    BitExactDetails,
    FrameDifference,
    SimilarityBandDetails,
    TwinBaselineDetails,
    ZeroRecompileDetails,
)
from .metrics import max_abs_diff, metric_name, similarity_db

__all__ = ["zero_recompile", "twin_baseline", "bit_exact", "similarity_band", "frame_label", "per_frame_psnr"]

_LIST_LIMIT = 64  # frames listed in evidence; counts always cover all of them


def frame_label(gs: GateSetRecord, index: int, *, chunks: bool = False) -> str:
    """'image0-audio1 frame 7' for a global frame index; with ``chunks`` (an audio or tensors
    build's units) 'audio1 chunk 2' for a global chunk index."""
    unit = "chunk" if chunks else "frame"
    for r in gs.requests:
        n = len(r.buckets) if chunks else r.frames
        if index < n:
            return f"{r.name} {unit} {index}"
        index -= n
    return f"{unit} {index} (past the gate set)"


def _label(gs: GateSetRecord, units: np.ndarray, index: int) -> str:
    return frame_label(gs, index, chunks=np.asarray(units).dtype != np.uint8)


def _unit(units: np.ndarray) -> str:
    return "frame" if np.asarray(units).dtype == np.uint8 else "chunk"


def _diff(a: np.ndarray, b: np.ndarray) -> int | float:
    d = max_abs_diff(a, b)
    return int(d) if np.asarray(a).dtype == np.uint8 else float(d)


def _db(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 3)


def per_frame_psnr(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Per unit: PSNR of video frames, SNR of delivered chunks (``metrics.similarity_db``)."""
    return [similarity_db(x, y) for x, y in zip(a, b)]


def zero_recompile(runs: list[tuple[str, int, list[dict[str, Any]]]]) -> GateEvidence:
    """runs: (label, compile count, events). Passes only when every run compiled nothing."""
    total = sum(n for _, n, _ in runs)
    events = [{"run": label, **e} for label, _, evs in runs for e in evs]
    if total == 0:
        return GateEvidence(
            name="zero-recompile",
            status="passed",
            summary=f"0 compiles in {len(runs)} fresh-process runs of the gate set",
        ).with_details(ZeroRecompileDetails(runs=[label for label, _, _ in runs]))
    where = sorted({e.get("during", "?") for e in events})
    return GateEvidence(
        name="zero-recompile",
        status="failed",
        summary=f"{total} XLA compile(s) while serving; during: " + "; ".join(where),
    ).with_details(ZeroRecompileDetails(compiles=total, events=events[:_LIST_LIMIT]))


def twin_baseline(
    gs: GateSetRecord, a_hashes: list[str], b_hashes: list[str], a: np.ndarray, b: np.ndarray
) -> GateEvidence:
    """Two fresh runs of one build must hash identical, frame by frame."""
    differ = [i for i, (x, y) in enumerate(zip(a_hashes, b_hashes)) if x != y]
    if len(a_hashes) != len(b_hashes):
        return GateEvidence(
            name="twin-baseline",
            status="failed",
            summary=f"the twins delivered {len(a_hashes)} and {len(b_hashes)} {_unit(a)}s",
        ).with_details(TwinBaselineDetails(frames=[len(a_hashes), len(b_hashes)]))
    if not differ:
        return GateEvidence(
            name="twin-baseline",
            status="passed",
            summary=f"two fresh runs hash identical on all {len(a_hashes)} {_unit(a)}s",
        )
    first, unit, metric = differ[0], _unit(a), metric_name(a)
    return GateEvidence(
        name="twin-baseline",
        status="failed",
        summary=(
            f"non-deterministic: the twins differ on {len(differ)} of {len(a_hashes)} {unit}s, "
            f"first at {_label(gs, a, first)} (max abs diff {_diff(a[first], b[first])}, "
            f"{metric} {similarity_db(a[first], b[first]):.2f} dB); nothing can be compared against this build"
        ),
    ).with_details(
        TwinBaselineDetails(
            differing_frames=len(differ),
            first=FrameDifference(
                frame=first,
                label=_label(gs, a, first),
                max_abs_diff=_diff(a[first], b[first]),
                psnr_db=_db(similarity_db(a[first], b[first])),
            ),
            frames=differ[:_LIST_LIMIT],
        )
    )


def bit_exact(
    gs: GateSetRecord, cand_hashes: list[str], base_hashes: list[str], cand: np.ndarray, base: np.ndarray | None
) -> GateEvidence:
    """Per-frame sha256 equal to the baseline's recorded hashes."""
    unit, metric = _unit(cand), metric_name(cand)
    if len(cand_hashes) != len(base_hashes):
        return GateEvidence(
            name="bit-exact",
            status="failed",
            summary=f"{len(cand_hashes)} {unit}s vs the baseline's {len(base_hashes)}",
        )
    differ = [i for i, (x, y) in enumerate(zip(cand_hashes, base_hashes)) if x != y]
    if not differ:
        return GateEvidence(
            name="bit-exact", status="passed", summary=f"all {len(cand_hashes)} {unit} hashes equal the baseline's"
        )
    listed: list[FrameDifference] = []
    worst_diff: int | float = 0
    worst_psnr = math.inf
    for i in differ:
        d: int | float | None = None  # None: the baseline's frames are not at hand
        p: float | None = None
        if base is not None:
            d, p = _diff(cand[i], base[i]), similarity_db(cand[i], base[i])
            worst_diff, worst_psnr = max(worst_diff, d), min(worst_psnr, p)
        if len(listed) < _LIST_LIMIT:
            listed.append(
                FrameDifference(
                    frame=i, label=_label(gs, cand, i), max_abs_diff=d, psnr_db=None if p is None else _db(p)
                )
            )
    return GateEvidence(
        name="bit-exact",
        status="failed",
        summary=(
            f"{len(differ)} of {len(cand_hashes)} {unit}s differ from the baseline "
            f"(first: {_label(gs, cand, differ[0])}; worst max abs diff {worst_diff}, "
            f"lowest {metric} {worst_psnr:.2f} dB)"
        ),
    ).with_details(
        BitExactDetails(
            differing_frames=len(differ), worst_max_abs_diff=worst_diff, lowest_psnr_db=_db(worst_psnr), frames=listed
        )
    )


def similarity_band(gs: GateSetRecord, cand: np.ndarray, base: np.ndarray, band: Band) -> GateEvidence:
    """Every unit inside the measured band: PSNR (video frames; SNR for an audio or tensors build's
    chunks) >= floor and max abs diff <= ceiling. Below it: ``below-band`` (a blind review decides)
    for video; ``failed`` for audio and tensors, which have no blind review."""
    psnrs = per_frame_psnr(cand, base)
    diffs = [_diff(x, y) for x, y in zip(cand, base)]
    below = [i for i, (p, d) in enumerate(zip(psnrs, diffs)) if p < band.psnr_floor_db or d > band.max_abs_diff_ceiling]
    finite = [p for p in psnrs if not math.isinf(p)]
    unit, metric = _unit(cand), metric_name(cand)
    details = SimilarityBandDetails(
        psnr_floor_db=band.psnr_floor_db,
        max_abs_diff_ceiling=band.max_abs_diff_ceiling,
        min_psnr_db=_db(min(psnrs)) if psnrs else None,
        median_psnr_db=_db(sorted(finite)[len(finite) // 2]) if finite else None,
        max_abs_diff=max(diffs) if diffs else 0,
        per_frame_psnr_db=[_db(p) for p in psnrs],
        frames_below=below,
    )
    if not below:
        return GateEvidence(
            name="similarity-band",
            status="passed",
            summary=(
                f"all {len(psnrs)} {unit}s inside the band (lowest {metric} {min(psnrs):.2f} dB >= "
                f"{band.psnr_floor_db:.2f}; max abs diff {max(diffs)} <= {band.max_abs_diff_ceiling})"
            ),
        ).with_details(details)
    i = min(below, key=lambda k: psnrs[k])
    video = unit == "frame"
    return GateEvidence(
        name="similarity-band",
        status="below-band" if video else "failed",
        summary=(
            f"{len(below)} of {len(psnrs)} {unit}s below the band; worst {_label(gs, cand, i)}: "
            f"{metric} {psnrs[i]:.2f} dB (floor {band.psnr_floor_db:.2f}), max abs diff {diffs[i]} "
            f"(ceiling {band.max_abs_diff_ceiling}); "
            + (
                "needs a blind review"
                if video
                else "failed: the blind review shows video frames, and none is available for delivered audio or tensors"
            )
        ),
    ).with_details(details)
