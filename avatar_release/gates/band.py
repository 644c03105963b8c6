"""The similarity band: measured from bf16 reassociation alone, stored with its provenance.

``calibrate`` compiles the pipeline as-is (the reference) and once per variant, where each
variant is the same model under a mathematically equivalent but differently ordered
reduction (default: the variants the pipeline declares, ``Pipeline.band_variants``; the bundled
pipeline splits every matmul's contraction in 2 and in 4 float32 partial sums).
Each build renders the gate set in a fresh process; the reference twice (it must be
deterministic, or nothing measured against it means anything), unless its own signed passing gate
verdict on this gate set and machine already holds those two identical renders and their frames
(``band_reference``). The band is then:

    psnr_floor_db        = lowest per-frame PSNR of any variant vs the reference - margin_db
    max_abs_diff_ceiling = largest per-pixel difference any variant produced

For a build that delivers audio or tensors the units are its delivered chunks and the metric is
SNR (``metric = "snr"``; ``metrics.snr_db``): the floor is the lowest per-chunk SNR - margin_db,
the ceiling the largest difference of a delivered value (a float).

and is written to ``manifests/bands/<pipeline>-<target>.json`` with the builds, the gate set,
the environment and the per-variant statistics it came from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import _atomic
from .._digest import sha256_digest
from ..errors import InputError, Refusal, SpecError
from ..machine import environment_record, toolchain
from ..records import Band, BandVariant, EnvironmentRecord, GateSetRecord, Manifest, parse_record, utcnow
from ..registry import Registry, read_manifest
from ..specs import load_pipeline, manifests_dir
from ._compare import per_frame_psnr
from ._fresh import GateRun, chunk_ticks, fresh_run
from .band_reference import stored_reference
from .gateset import gate_set
from .metrics import max_abs_diff

if TYPE_CHECKING:
    from ..compile import CompileResult  # lazy at run time: the gate worker must not import the compiler

__all__ = ["band_path", "load_band", "calibrate", "CalibrationResult"]

DEFAULT_MARGIN_DB = 0.25


def band_path(pipeline: str, target: str) -> Path:
    return manifests_dir() / "bands" / f"{pipeline}-{target}.json"


def load_band(pipeline: str, target: str, path: str | Path | None = None) -> tuple[Band, str, Path]:
    """(band, digest of its bytes, path). Missing or unreadable: a SpecError naming the fix."""
    p = Path(path) if path else band_path(pipeline, target)
    if not p.is_file():
        raise SpecError(
            f"no similarity band for pipeline {pipeline} on target {target} (looked for {p}); "
            f"measure one with: avatar-release gate calibrate --pipeline {pipeline} --target {target}"
        )
    data = p.read_bytes()
    band = parse_record(Band, data, where=str(p))
    if (band.pipeline, band.target) != (pipeline, target):
        raise SpecError(
            f"{p}: band was measured for {band.pipeline} on {band.target}, "
            f"not {pipeline} on {target}; recalibrate or pass the right --band"
        )
    return band, sha256_digest(data), p


def _declared_variants(pipeline: str) -> list[dict[str, str]]:
    """The reassociation variants the pipeline's contract declares (imports its entry)."""
    # Lazy: the gate worker imports this package and must import neither the pipeline nor the compiler.
    from ..pipeline import load_entry

    return [dict(v) for v in load_entry(load_pipeline(pipeline)).band_variants]


@dataclass
class CalibrationResult:
    band: Band
    path: Path
    digest: str


def calibrate(
    pipeline: str,
    target: str,
    *,
    registry: Registry,
    variants: list[dict[str, str]] | None = None,
    margin_db: float = DEFAULT_MARGIN_DB,
    out: str | Path | None = None,
    fresh_reference: bool = False,
    progress: Callable[[str], None] = lambda m: None,
) -> CalibrationResult:
    """Compile the reference and each variant, render the gate set in fresh processes, measure
    each variant against the reference, and write the band with its provenance. The reference's
    frames come from its own signed passing gate verdict on this gate set and machine where there
    is one (``band_reference``), else (or with ``fresh_reference``) from two fresh renders."""
    variants = list(variants or _declared_variants(pipeline))
    if not variants:
        raise InputError(
            f"gate calibrate: pipeline {pipeline} declares no band_variants; give at least one "
            "--variant KEY=VALUE (an override that reorders reductions, e.g. a split contraction)"
        )
    if margin_db < 0:
        raise InputError(f"--margin-db {margin_db}: must be >= 0")
    ref, builds = _compile_all(pipeline, target, registry, variants, progress)
    _, manifest = read_manifest(registry, ref.digest)
    gs = gate_set(manifest)
    here = environment_record(manifest.platform.backend)  # the band's, and whose verdicts may stand in
    ref_frames, verdict = _reference_frames(registry, ref, manifest, gs, here, fresh_reference, progress)
    measured, lowest, ceiling = _measure_variants(registry, ref, builds, gs, ref_frames, progress)
    tools = toolchain(with_compile_tools=False)
    video = manifest.program.delivery().kind == "video"
    band = Band(
        pipeline=pipeline,
        target=target,
        metric="psnr" if video else "snr",
        psnr_floor_db=round(math.floor((lowest - margin_db) * 100) / 100, 2),
        max_abs_diff_ceiling=ceiling,
        margin_db=margin_db,
        reference_build=ref.build_id,
        reference_digest=ref.digest,
        variants=measured,
        gate_set=gs,
        environment=here,
        tool={"avatar_release": tools.avatar_release, "jax": tools.jax, "jaxlib": tools.jaxlib},
        measured_at=utcnow(),
        method=_method(video, verdict),
    )
    path = Path(out) if out else band_path(pipeline, target)
    data = band.to_json_bytes()
    _atomic.write_bytes(path, data)
    return CalibrationResult(band, path, sha256_digest(data))


def _reference_frames(
    registry: Registry,
    ref: CompileResult,
    manifest: Manifest,
    gs: GateSetRecord,
    here: EnvironmentRecord,
    fresh: bool,
    progress: Callable[[str], None],
) -> tuple[np.ndarray, str | None]:
    """(the reference's gate-set frames, the verdict they came from or None when rendered here)."""
    stored = None if fresh else stored_reference(registry, ref.build_id, manifest, gs, here)
    if stored is None:
        return _reference_run(registry, ref, gs, progress).frames, None
    progress(f"reference frames: its passing gate verdict {stored.verdict} (twins identical here), not rendered again")
    return stored.frames, stored.verdict


def _method(video: bool, verdict: str | None) -> str:
    """How the band was measured, in words, and (``verdict``) where the reference's frames came from."""
    method = (
        (
            "per-frame PSNR and max abs pixel difference of each variant's gate-set frames vs "
            "the reference's; floor = lowest PSNR - margin, rounded down to 0.01 dB; "
            "ceiling = largest difference"
        )
        if video
        else (
            "per-chunk SNR and max abs difference of each variant's delivered chunks vs the reference's; "
            "floor = lowest SNR - margin, rounded down to 0.01 dB; ceiling = largest difference"
        )
    )
    if verdict is not None:
        method += f"; the reference's frames are those of its signed passing gate verdict {verdict}"
    return method


def _compile_all(
    pipeline: str, target: str, registry: Registry, variants: list[dict[str, str]], progress: Callable[[str], None]
) -> tuple[CompileResult, list[tuple[dict[str, str], CompileResult]]]:
    """(the reference build, (variant, its build) for each variant); none moves the dev channel."""
    # Lazy: the gate worker imports this package and must not import the compiler.
    from ..compile import compile_build

    progress(f"compiling the reference {pipeline} for {target}")
    ref = compile_build(pipeline, target, registry=registry, move_dev=False, progress=progress)
    builds = []
    for v in variants:
        progress(f"compiling variant {v}")
        builds.append(
            (v, compile_build(pipeline, target, registry=registry, overrides=v, move_dev=False, progress=progress))
        )
    return ref, builds


def _reference_run(
    registry: Registry, ref: CompileResult, gs: GateSetRecord, progress: Callable[[str], None]
) -> GateRun:
    """The reference's gate-set run, rendered twice in fresh processes; Refusal if the two differ."""
    progress("rendering the gate set: reference, twice")
    r1 = fresh_run(
        registry.uri,
        ref.digest,
        gs.digest,
        label="reference #1",
        on_chunk=chunk_ticks(progress, "reference run 1 of 2", gs),
    )
    r2 = fresh_run(
        registry.uri,
        ref.digest,
        gs.digest,
        label="reference #2",
        on_chunk=chunk_ticks(progress, "reference run 2 of 2", gs),
    )
    if r1.flat_hashes != r2.flat_hashes:
        raise Refusal(
            f"reference build {ref.build_id} is not deterministic (two fresh runs differ); "
            "a band measured against it would be meaningless"
        )
    return r1


def _measure_variants(
    registry: Registry,
    ref: CompileResult,
    builds: list[tuple[dict[str, str], CompileResult]],
    gs: GateSetRecord,
    ref_frames: np.ndarray,
    progress: Callable[[str], None],
) -> tuple[list[BandVariant], float, int | float]:
    """(per-variant statistics, the lowest finite PSNR of any variant, the largest pixel difference);
    Refusal when no variant changed a frame."""
    measured: list[BandVariant] = []
    lowest = math.inf
    ceiling: int | float = 0
    for v, b in builds:
        if b.digest == ref.digest:
            raise InputError(f"variant {v} compiled to the reference build itself; it changes nothing")
        progress(f"rendering the gate set: variant {v}")
        run = fresh_run(
            registry.uri, b.digest, gs.digest, label=f"variant {v}", on_chunk=chunk_ticks(progress, f"variant {v}", gs)
        )
        psnrs = per_frame_psnr(run.frames, ref_frames)
        video = run.frames.dtype == np.uint8  # else an audio or tensors build's delivered chunks (float)
        diffs = [int(d) if video else float(d) for d in (max_abs_diff(x, y) for x, y in zip(run.frames, ref_frames))]
        finite = sorted(p for p in psnrs if not math.isinf(p))
        measured.append(
            BandVariant(
                overrides=dict(v),
                build_id=b.build_id,
                min_psnr_db=round(finite[0], 4) if finite else None,
                median_psnr_db=round(finite[len(finite) // 2], 4) if finite else None,
                max_abs_diff=max(diffs),
                identical_frames=len(psnrs) - len(finite),
                frames=len(psnrs),
            )
        )
        if finite:
            lowest = min(lowest, finite[0])
        ceiling = max(ceiling, max(diffs))
    if math.isinf(lowest):
        raise Refusal(
            "no variant changed a single frame: the band would be empty. Choose variants "
            "that reorder reductions in the model (e.g. --variant matmul_k_split=2)"
        )
    return measured, lowest, ceiling
