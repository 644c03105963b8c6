"""The steps of a gate, shared by ``run_gate`` (one machine) and ``merge_shards`` (a sharded gate).

    check_inputs -> twin_runs (or a merge's reassembled shards) -> compare -> store_result -> write_reports

Each step takes what the one before returned: ``GateInputs`` (everything checked before anything
renders), ``TwinRuns`` (the two fresh-process renderings, and every process zero-recompile counts),
``Comparison`` (the verdicts), ``StoredResult`` (the stored result and any review it opened).
``run.py`` and ``shards.py`` only say which steps run in which order; the decisions are here once,
so a sharded gate's tiers, band and review are the same code as an unsharded one's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__, _atomic
from ..errors import EnvironmentMismatch, GateInfraError, InputError, SpecError
from ..machine import Machine, configure_host_devices, diff_machines, environment_record, toolchain, who
from ..records import (
    Band,
    BaselineRef,
    EnvironmentRecord,
    GateEvidence,
    GateRequestsRecord,
    GateResult,
    GateSetRecord,
    Manifest,
    ReviewRecord,
    utcnow,
)
from ..records.gate import BandUsed, SimilarityBandDetails, ZeroRecompileDetails
from ..registry import Registry, Resolved, read_manifest
from ..specs import load_target
from ..trust.policy import load_policy
from ._band_note import band_measured_elsewhere
from ._compare import bit_exact, similarity_band, twin_baseline, zero_recompile
from ._fresh import GateRun, chunk_ticks, fresh_run
from .band import load_band
from .baseline import effective_status, resolve_baseline
from .gateset import gate_set
from .report import write_report
from .requests_of import requests_to_render, with_requests
from .review import new_review, review_page
from .store import get_frames, load_review, put_frames, save_result, save_review
from .tier import decide_tier, read_levers
from .verdicts import unpinned_inputs

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Progress",
    "GateInputs",
    "ProcessRun",
    "TwinRuns",
    "Comparison",
    "StoredResult",
    "effective_status",
    "check_inputs",
    "check_run_environment",
    "twin_runs",
    "compare",
    "store_result",
    "write_reports",
    "never_promotes",
    "tool_versions",
]

Progress = Callable[[str], None]


# ------------------------------------------------------------------------- step 1: the inputs
@dataclass
class GateInputs:
    """Everything checked before anything renders (step 1)."""

    resolved: Resolved
    manifest: Manifest
    env: EnvironmentRecord  # where the runs render (this machine, or a merge's shards' machines)
    gate_set: GateSetRecord
    baseline: BaselineRef | None  # None: --baseline none
    base_manifest: Manifest | None
    base_result: GateResult | None
    tier: int | None  # None without a baseline
    tier_reasons: list[str] = field(default_factory=list)
    band: Band | None = None  # tier 2 only
    band_used: BandUsed | None = None  # the band's provenance, as the result records it
    levers_digest: str | None = None  # the levers.toml that decided the tier (None without a baseline)
    requests: GateRequestsRecord | None = None  # rendered instead of the build's own (--requests-of)


def check_inputs(
    registry: Registry,
    ref: str,
    baseline: str,
    band_file: str | Path | None,
    env: EnvironmentRecord | None = None,
    requests_of: str | None = None,
) -> GateInputs:
    """Step 1: refuse bad input (build, machine, baseline, band) before any rendering.

    ``env``: where the runs rendered, when that was elsewhere (``gate merge``: the shards'
    machines); default this machine, which then must match the build. ``requests_of``: a build
    whose gate requests the runs render instead of this build's own (``--requests-of``).
    """
    resolved, manifest = read_manifest(registry, ref)
    if env is None:
        if manifest.platform.backend == "cpu":
            configure_host_devices(manifest.platform.device_count)
        env = environment_record(manifest.platform.backend)
    here = diff_machines(Machine.of_build(manifest), Machine.of_environment(env), fields=("backend", "device_count"))
    if here:
        raise EnvironmentMismatch(
            f"build {manifest.build_id} runs on {Machine.of_build(manifest).describe()}; the gate runs had "
            f"{Machine.of_environment(env).describe()} ({here.inline()}). Output gates need matching hardware",
            here.differences,
        )
    requests = requests_to_render(registry, requests_of, baseline, manifest.build_id)
    gs = gate_set(with_requests(manifest, requests))
    base_ref, base_manifest, base_result = resolve_baseline(registry, baseline, resolved, env, gs)
    inputs = GateInputs(resolved, manifest, env, gs, base_ref, base_manifest, base_result, tier=None, requests=requests)
    if base_manifest is not None:
        levers, inputs.levers_digest, _ = read_levers()
        decision = decide_tier(manifest, base_manifest, levers)
        inputs.tier, inputs.tier_reasons = decision.tier, decision.reasons
        if decision.tier == 2:
            band, band_digest, band_path = load_band(manifest.pipeline, manifest.target, band_file)
            delivers = manifest.program.delivery().kind
            wants = "psnr" if delivers == "video" else "snr"  # video frames; audio or tensors: delivered chunks
            if band.metric != wants:
                raise SpecError(
                    f"{band_path}: the band's metric is {band.metric}, but build {manifest.build_id} delivers "
                    f"{delivers}, judged by {wants.upper()} ({'frames' if wants == 'psnr' else 'delivered chunks'}); "
                    f"measure its band: avatar-release gate calibrate --pipeline {manifest.pipeline} "
                    f"--target {manifest.target}"
                )
            inputs.band = band
            inputs.band_used = BandUsed(
                path=str(band_path),
                digest=band_digest,
                psnr_floor_db=band.psnr_floor_db,
                max_abs_diff_ceiling=band.max_abs_diff_ceiling,
                measured_at=band.measured_at,
                environment=band.environment.fingerprint,
            )
    return inputs


# ---------------------------------------------------------------------- step 2: the renderings
@dataclass(frozen=True)
class ProcessRun:
    """One fresh serving process of a gate: what zero-recompile counts in it, and where it ran."""

    label: str  # 'twin #1', 'shard 0/3 twin #2'
    compiles: int
    compile_events: list[dict[str, Any]]
    host: str


@dataclass
class TwinRuns:
    a: GateRun  # its frames are the ones compared, stored and reported
    b: GateRun
    # Every fresh process, default the two twins; a merged sharded gate lists each shard's runs.
    runs: list[ProcessRun] | None = None
    # A merged sharded gate: the digest of the signed partial behind each process, by label.
    partials: dict[str, str] | None = None

    def processes(self) -> list[ProcessRun]:
        return self.runs or [
            ProcessRun("twin #1", self.a.compiles, self.a.compile_events, self.a.host),
            ProcessRun("twin #2", self.b.compiles, self.b.compile_events, self.b.host),
        ]


def check_run_environment(run: GateRun, inputs: GateInputs) -> GateRun:
    """A fresh process must have seen the gate's environment: hashes only compare within one."""
    if run.environment["fingerprint"] != inputs.env.fingerprint:
        raise GateInfraError(
            f"a gate run saw environment {run.environment['fingerprint']}, the gate {inputs.env.fingerprint}"
        )
    return run


def twin_runs(registry: Registry, inputs: GateInputs, progress: Progress) -> TwinRuns:
    """Step 2: the gate set rendered twice, each in a fresh process that only loads and serves."""
    gs = inputs.gate_set
    progress(f"twin run 1 of 2: {gs.frames} frames in a fresh process")
    runs: list[GateRun] = []
    for n in (1, 2):
        if runs:
            progress(f"twin run 2 of 2 ({runs[0].wall_seconds:.1f}s for the first)")
        run = fresh_run(
            registry.uri,
            inputs.resolved.digest,
            gs.digest,
            label=f"twin #{n}",
            gate_requests=inputs.requests,
            on_chunk=chunk_ticks(progress, f"twin run {n} of 2", gs),
        )
        runs.append(check_run_environment(run, inputs))
    return TwinRuns(runs[0], runs[1])


# ------------------------------------------------------------------------ steps 3-4: verdicts
@dataclass
class Comparison:
    status: str  # "passed", "failed" or "needs-review"
    gates: list[GateEvidence]
    base_frames: np.ndarray | None  # (N, H, W, 3) uint8; None when nothing was compared with a baseline
    seconds: float


def compare(registry: Registry, inputs: GateInputs, twins: TwinRuns) -> Comparison:
    """Steps 3 and 4: zero recompiles and identical twins; then bit-exact or the band vs the baseline."""
    t_cmp = time.perf_counter()
    gates = [
        _zero_recompile(twins),
        twin_baseline(inputs.gate_set, twins.a.flat_hashes, twins.b.flat_hashes, twins.a.frames, twins.b.frames),
    ]
    twin_ok = gates[1].status == "passed"
    status = "passed" if gates[0].status == "passed" and twin_ok else "failed"
    base_frames = None
    if inputs.base_result is not None:
        if not twin_ok:
            gates.append(
                GateEvidence(
                    name="bit-exact",
                    status="skipped",
                    summary="not compared: the twins differ, so no comparison can be trusted",
                )
            )
        else:
            base_frames = get_frames(registry, inputs.base_result.frames_blob)
            against, verdict = _against_baseline(inputs, twins.a, base_frames)
            gates += against
            if verdict == "failed" or (verdict == "needs-review" and status == "passed"):
                status = verdict  # a failure always counts; a review only where nothing failed
    return Comparison(status, gates, base_frames, time.perf_counter() - t_cmp)


def _zero_recompile(twins: TwinRuns) -> GateEvidence:
    """Zero-recompile over every process, with what they imported and where each ran (and, merged,
    which signed partial each came from)."""
    processes = twins.processes()
    evidence = zero_recompile([(p.label, p.compiles, p.compile_events) for p in processes])
    # What the serving processes imported (a pod needs none of the compile stack), and where each ran.
    imports = sorted(set(twins.a.heavy_modules) | set(twins.b.heavy_modules))
    evidence = evidence.with_details(ZeroRecompileDetails(imports=imports, hosts={p.label: p.host for p in processes}))
    if twins.partials is not None:
        evidence = evidence.with_details(ZeroRecompileDetails(partials=twins.partials))
    return evidence


def _against_baseline(inputs: GateInputs, run: GateRun, base_frames: np.ndarray) -> tuple[list[GateEvidence], str]:
    """Bit-exact vs the baseline, then (tier 2 only) the band -> (evidence, 'passed' | 'failed' | 'needs-review')."""
    gs, base_result = inputs.gate_set, inputs.base_result
    assert base_result is not None  # compare() asks only when there is a baseline result
    base_hashes = [h for req in base_result.frame_sha256 for h in req]
    be = bit_exact(gs, run.flat_hashes, base_hashes, run.frames, base_frames)
    if be.status == "passed":
        band = [GateEvidence(name="similarity-band", status="skipped", summary="not needed: bit-exact")]
        return [be, *(band if inputs.tier == 2 else [])], "passed"
    if inputs.tier == 1:
        return [
            be,
            GateEvidence(
                name="similarity-band",
                status="skipped",
                summary="not allowed: tier 1 (" + "; ".join(inputs.tier_reasons[:3]) + ") must be bit-exact",
            ),
        ], "failed"
    assert inputs.band is not None  # tier 2: check_inputs loaded the band
    sb = similarity_band(gs, run.frames, base_frames, inputs.band)
    if (elsewhere := band_measured_elsewhere(inputs.band, inputs.env)) is not None:
        sb = sb.model_copy(update={"summary": f"{sb.summary}; {elsewhere}"})
    # below the band: a blind review for video; audio and tensors have none, so they fail
    return [be, sb], {"passed": "passed", "below-band": "needs-review"}.get(sb.status, "failed")


# ---------------------------------------------------------------------- step 5: store, report
@dataclass
class StoredResult:
    result: GateResult
    digest: str  # of the stored result
    review: ReviewRecord | None  # a new blind review, when one was opened


def tool_versions() -> dict[str, str]:
    """The tools that rendered and judged (no compile stack: a gate imports none)."""
    tools = toolchain(with_compile_tools=False)
    return {"avatar_release": __version__, "jax": tools.jax, "jaxlib": tools.jaxlib, "python": tools.python}


def _target_spec_digest(target: str) -> str | None:
    """The digest of the target spec in force (what the evidence vouches for), None without one."""
    try:
        return load_target(target).digest()
    except SpecError:
        return None


def store_result(
    registry: Registry, inputs: GateInputs, twins: TwinRuns, comparison: Comparison, t_start: float, progress: Progress
) -> StoredResult:
    """Step 5a: the frames, the result and (for needs-review, unless already decided) a review."""
    progress("storing the gate result with the build")
    run_a, run_b, manifest = twins.a, twins.b, inputs.manifest
    band = inputs.band_used.model_dump(mode="json") if inputs.band_used is not None else None
    result = GateResult(
        status=comparison.status,
        build_id=manifest.build_id,
        build_digest=inputs.resolved.digest,
        pipeline=manifest.pipeline,
        target=manifest.target,
        target_spec_digest=_target_spec_digest(manifest.target),
        band_digest=inputs.band_used.digest if inputs.band_used is not None else None,
        levers_digest=inputs.levers_digest,
        baseline=inputs.baseline,
        tier=inputs.tier,
        tier_reasons=inputs.tier_reasons,
        band=band,
        environment=inputs.env,
        tool=tool_versions(),
        gate_set=inputs.gate_set,
        gates=comparison.gates,
        frame_sha256=run_a.frame_sha256,
        frames_blob=put_frames(registry, run_a.frames),
        seconds={
            "twin_1": round(run_a.wall_seconds, 3),
            "twin_2": round(run_b.wall_seconds, 3),
            "compare": round(comparison.seconds, 3),
            "total": round(time.perf_counter() - t_start, 3),
        },
        created_at=utcnow(),
        created_by=who(),
    )
    digest = save_result(registry, result, subject_digest=manifest.content_digest())
    return StoredResult(result, digest, _open_review(registry, result, digest, progress))


def _open_review(registry: Registry, result: GateResult, digest: str, progress: Progress) -> ReviewRecord | None:
    """A blind review of the frames below the band, for needs-review unless one was already decided."""
    if result.status != "needs-review":
        return None
    existing = load_review(registry, result.build_id)
    if existing is not None and existing.decision is not None:
        progress(f"review already decided: {existing.decision.decision} by {existing.decision.reviewer}")
        return None
    band = result.evidence(SimilarityBandDetails)
    below = band.frames_below if band is not None and band.frames_below is not None else []
    review = new_review(result, digest, below)  # needs-review comes only from frames below the band
    save_review(registry, review)
    return review


def write_reports(
    report_dir: str | Path | None, stored: StoredResult, twins: TwinRuns, comparison: Comparison
) -> tuple[Path | None, Path | None]:
    """Step 5b: the HTML report (and the blind review page) -> (report, review page); None without a folder."""
    if report_dir is None:
        return None, None
    folder, review, frames, base_frames = Path(report_dir), stored.review, twins.a.frames, comparison.base_frames
    review_path = None
    if review is not None:
        assert base_frames is not None  # a review opens only below the band: a baseline was compared
        folder.mkdir(parents=True, exist_ok=True)
        review_path = folder / "review.html"
        _atomic.write_text(review_path, review_page(review, frames[review.frames], base_frames[review.frames]))
    report = write_report(
        folder, stored.result, stored.digest, frames, base_frames, review_page="review.html" if review_path else None
    )
    return report, review_path


def never_promotes(registry: Registry, inputs: GateInputs, result: GateResult | None = None) -> str | None:
    """Why this verdict cannot promote, said when the gate runs (None: it may): a comparison with
    nothing while prod holds another build proves determinism only; a verdict decided by a band,
    target spec or lever list the trust policy's ``[gate_inputs]`` does not pin never counts."""
    prod = registry.get_channel("prod")
    if inputs.baseline is None and prod is not None and prod.digest != inputs.resolved.digest:
        return (
            f"compared with nothing while prod holds {prod.build_id}: this verdict proves determinism only and "
            f"never promotes; to promote, gate against prod: avatar-release gate {inputs.resolved.build_id}"
        )
    return None if result is None else _unpinned_note(result)


def _unpinned_note(result: GateResult) -> str | None:
    try:
        policy = load_policy()
    except InputError:
        return None  # advice only: promotion reads the policy again and says what is wrong with it
    unpinned = unpinned_inputs(result, policy)
    if not unpinned:
        return None
    return (
        f"decided by project files the trust policy {policy.path} does not pin "
        f"({'; '.join(u.describe() for u in unpinned)}): this verdict never promotes; gate with the pinned "
        "files in place (`avatar-release gate inputs` prints the digests in force), or pin these in the "
        "policy's [gate_inputs]"
    )
