"""``avatar-release gate``: prove a build's pixels before it may leave dev.

Order of work, and why:
  1. refuse bad input before any rendering: unknown build or baseline, a baseline that never
     passed, was gated elsewhere (environment fingerprint) or on another gate set, a tier-2
     candidate without a band;
  2. twin runs: the gate set rendered twice, each in a fresh process that only loads and
     serves (zero-recompile evidence comes from both);
  3. the twins must hash identical, or nothing is compared (non-deterministic);
  4. tier 1: every frame hash equals the baseline's; tier 2 (declared levers only): if not
     bit-exact, every frame inside the measured band, else ``needs-review`` with a blind page;
  5. the result (JSON), the frames, and a review when needed are stored with the build; the
     HTML report goes to ``report_dir``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import __version__, _atomic
from ..errors import EnvironmentMismatch, GateInfraError, InputError, Refusal, SpecError
from ..machine import Machine, configure_host_devices, diff_machines, environment_record, toolchain, who
from ..records import (
    Band,
    BaselineRef,
    EnvironmentRecord,
    GateEvidence,
    GateResult,
    GateSetRecord,
    Manifest,
    ReviewRecord,
    utcnow,
)
from ..registry import CHANNELS, Registry, Resolved, read_manifest
from ..specs import load_target
from ..trust.policy import load_policy
from ._compare import bit_exact, similarity_band, twin_baseline, zero_recompile
from ._fresh import GateRun, fresh_run
from .band import load_band
from .gateset import gate_set
from .report import write_report
from .review import new_review, review_page
from .store import get_frames, latest_result, load_review, put_frames, save_result, save_review
from .tier import decide_tier
from .verdicts import signed_verdicts, verdict_status

if TYPE_CHECKING:
    import numpy as np

__all__ = ["GateOutcome", "run_gate", "effective_status"]


@dataclass
class GateOutcome:
    result: GateResult
    digest: str
    report: Path | None
    review_page: Path | None
    # Why this verdict cannot promote, said when the gate runs (None: it may): a comparison with
    # nothing while prod holds another build proves determinism only.
    never_promotes: str | None = None

    @property
    def passed(self) -> bool:
        return self.result.status == "passed"


def effective_status(registry, build_id: str) -> tuple[str, GateResult | None, str | None]:
    """What promotion sees: 'passed', 'approved', 'rejected', 'needs-review', 'failed' or 'ungated'."""
    latest = latest_result(registry, build_id)
    if latest is None:
        return "ungated", None, None
    result, digest = latest
    review = load_review(registry, build_id)
    if review is not None and review.decision is not None and review.decision.decision == "rejected":
        return "rejected", result, digest  # a rejection is final, whatever came later
    if result.status == "needs-review" and review is not None and review.decision is not None \
            and review.gate_result_digest == digest:
        return review.decision.decision, result, digest
    return result.status, result, digest


def _resolve_baseline(registry, baseline: str, manifest: Manifest, resolved_digest: str, env: EnvironmentRecord,
                      gs_digest: str):
    if baseline == "none":
        return None, None, None

    if baseline in CHANNELS and registry.get_channel(baseline) is None:
        raise InputError(
            f"--baseline {baseline}: channel {baseline} is empty in {registry.uri}. Gate a first build "
            "with --baseline none, or name a gated build with --baseline BUILD"
        )
    b_resolved, b_manifest = read_manifest(registry, baseline)
    if b_resolved.digest == resolved_digest:
        raise InputError(f"--baseline {baseline} is {b_resolved.build_id}, the candidate itself; "
                         "use --baseline none to re-gate a build on its own")
    b_result, b_digest = _verified_baseline(registry, b_resolved, b_manifest)
    if b_result.environment.fingerprint != env.fingerprint:
        diff = diff_machines(Machine.of_environment(b_result.environment), Machine.of_environment(env),
                             cpu_features="equal")
        diffs, listed = diff.differences, diff.inline("baseline", "here")
        raise EnvironmentMismatch(
            f"baseline {b_resolved.build_id} was gated in environment {b_result.environment.fingerprint}, this "
            f"machine is {env.fingerprint} ({listed}); hashes only compare within one environment. Re-gate "
            f"the baseline here (avatar-release gate {b_resolved.build_id} --baseline none) or gate on a "
            "matching machine", diffs)
    if b_result.gate_set.digest != gs_digest:
        raise Refusal(f"baseline {b_resolved.build_id} was gated on gate set {b_result.gate_set.name} "
                      f"v{b_result.gate_set.version} ({b_result.gate_set.digest}), the candidate's is {gs_digest}; "
                      "re-gate the baseline with this version of avatar-release")
    return (BaselineRef(build_id=b_resolved.build_id, digest=b_resolved.digest, gate_result_digest=b_digest),
            b_manifest, b_result)


def _verified_baseline(registry: Registry, b_resolved: Resolved, b_manifest: Manifest) -> tuple[GateResult, str]:
    """The baseline's newest gate result that the trust policy accepts (signed by a key trusted for the
    baseline's target, for its manifest digest, newest by the signed time), and its digest: its frame
    hashes and frames are what the candidate is compared with. Unsigned records never are."""
    policy = load_policy()
    verdicts, rejected = signed_verdicts(registry, b_resolved.build_id, b_manifest, policy)
    fix = f"avatar-release gate {b_resolved.build_id} --baseline none"
    if not verdicts:
        why = f" ({'; '.join(r.reason for r in rejected[-2:])})" if rejected else ""
        raise Refusal(f"baseline {b_resolved.build_id} has no gate result signed by a key the trust policy "
                      f"{policy.path} accepts for target {b_manifest.target}{why}; a baseline's frames are read only "
                      f"from verified evidence. Gate it first: {fix}")
    newest = verdicts[-1]
    status = verdict_status(registry, b_resolved.build_id, newest, b_manifest, policy, approvals=1,
                            rejected_unsigned=effective_status(registry, b_resolved.build_id)[0] == "rejected")
    if status not in ("passed", "approved"):
        raise Refusal(f"baseline {b_resolved.build_id} did not pass its gates (its newest signed result is "
                      f"{status!r}, {newest.digest}); choose a baseline that passed")
    return newest.result, newest.digest


def run_gate(
    ref: str,
    registry,
    *,
    baseline: str = "prod",
    report_dir: str | Path | None = None,
    band_file: str | Path | None = None,
    progress: Callable[[str], None] = lambda m: None,
) -> GateOutcome:
    t_start = time.perf_counter()
    inputs = _check_inputs(registry, ref, baseline, band_file)
    twins = _twin_runs(registry, inputs, progress)
    comparison = _compare(registry, inputs, twins)
    stored = _store(registry, inputs, twins, comparison, t_start, progress)
    report, review_path = _report(report_dir, stored, twins, comparison)
    return GateOutcome(stored.result, stored.digest, report, review_path, _never_promotes(registry, inputs))


def _never_promotes(registry: Registry, inputs: "_Inputs") -> str | None:
    prod = registry.get_channel("prod")
    if inputs.baseline is not None or prod is None or prod.digest == inputs.resolved.digest:
        return None
    return (f"compared with nothing while prod holds {prod.build_id}: this verdict proves determinism only and "
            f"never promotes; to promote, gate against prod: avatar-release gate {inputs.resolved.build_id}")


@dataclass
class _Inputs:
    """Everything checked before anything renders (step 1)."""

    resolved: Resolved
    manifest: Manifest
    env: EnvironmentRecord  # this machine
    gate_set: GateSetRecord
    baseline: BaselineRef | None  # None: --baseline none
    base_manifest: Manifest | None
    base_result: GateResult | None
    tier: int | None  # None without a baseline
    tier_reasons: list[str] = field(default_factory=list)
    band: Band | None = None  # tier 2 only
    band_info: dict | None = None  # the band's provenance, as the result records it


def _check_inputs(registry, ref: str, baseline: str, band_file: str | Path | None,
                  env: EnvironmentRecord | None = None) -> _Inputs:
    """Step 1: refuse bad input (build, machine, baseline, band) before any rendering.

    ``env``: where the runs rendered, when that was elsewhere (``gate merge``: the shards'
    machines); default this machine, which then must match the build.
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
            here.differences)
    gs = gate_set(manifest)
    base_ref, base_manifest, base_result = _resolve_baseline(registry, baseline, manifest, resolved.digest, env,
                                                             gs.digest)
    inputs = _Inputs(resolved, manifest, env, gs, base_ref, base_manifest, base_result, tier=None)
    if base_manifest is not None:
        decision = decide_tier(manifest, base_manifest)
        inputs.tier, inputs.tier_reasons = decision.tier, decision.reasons
        if decision.tier == 2:
            band, band_digest, band_path = load_band(manifest.pipeline, manifest.target, band_file)
            inputs.band = band
            inputs.band_info = {"path": str(band_path), "digest": band_digest, "psnr_floor_db": band.psnr_floor_db,
                                "max_abs_diff_ceiling": band.max_abs_diff_ceiling,
                                "measured_at": band.measured_at, "environment": band.environment.fingerprint}
    return inputs


@dataclass
class _Twins:
    a: GateRun  # its frames are the ones compared, stored and reported
    b: GateRun
    # (label, compiles, compile events, host) of every fresh process; default the two twins.
    # A merged sharded gate lists each shard's runs here.
    runs: list[tuple[str, int, list[dict], str]] | None = None

    def processes(self) -> list[tuple[str, int, list[dict], str]]:
        return self.runs or [("twin #1", self.a.compiles, self.a.compile_events, self.a.host),
                             ("twin #2", self.b.compiles, self.b.compile_events, self.b.host)]


def _twin_runs(registry, inputs: _Inputs, progress: Callable[[str], None]) -> _Twins:
    """Step 2: the gate set rendered twice, each in a fresh process that only loads and serves."""
    digest, gs = inputs.resolved.digest, inputs.gate_set
    progress(f"twin run 1 of 2: {gs.frames} frames in a fresh process")
    run_a = fresh_run(registry.uri, digest, gs.digest, label="twin #1")
    progress(f"twin run 2 of 2 ({run_a.wall_seconds:.1f}s for the first)")
    run_b = fresh_run(registry.uri, digest, gs.digest, label="twin #2")
    for run in (run_a, run_b):
        if run.environment["fingerprint"] != inputs.env.fingerprint:
            raise GateInfraError(f"a gate run saw environment {run.environment['fingerprint']}, "
                                 f"the gate {inputs.env.fingerprint}")
    return _Twins(run_a, run_b)


@dataclass
class _Comparison:
    status: str  # "passed", "failed" or "needs-review"
    gates: list[GateEvidence]
    base_frames: np.ndarray | None  # (N, H, W, 3) uint8; None when nothing was compared with a baseline
    seconds: float


def _compare(registry, inputs: _Inputs, twins: _Twins) -> _Comparison:
    """Steps 3 and 4: zero recompiles and identical twins; then bit-exact or the band vs the baseline."""
    t_cmp = time.perf_counter()
    run_a, run_b, gs = twins.a, twins.b, inputs.gate_set
    processes = twins.processes()
    gates: list[GateEvidence] = [
        zero_recompile([(label, n, events) for label, n, events, _ in processes]),
        twin_baseline(gs, run_a.flat_hashes, run_b.flat_hashes, run_a.frames, run_b.frames),
    ]
    # What the serving processes imported (a pod needs none of the compile stack), and where each ran.
    imports = sorted(set(run_a.heavy_modules) | set(run_b.heavy_modules))
    hosts = {label: host for label, _, _, host in processes}
    gates[0] = gates[0].model_copy(update={"details": {**gates[0].details, "imports": imports, "hosts": hosts}})
    zr_ok, twin_ok = gates[0].status == "passed", gates[1].status == "passed"
    base_frames = None
    status = "passed" if zr_ok and twin_ok else "failed"
    base_result, tier = inputs.base_result, inputs.tier
    if base_result is not None:
        if not twin_ok:
            gates.append(GateEvidence(name="bit-exact", status="skipped",
                                      summary="not compared: the twins differ, so no comparison can be trusted"))
        else:
            base_frames = get_frames(registry, base_result.frames_blob)
            base_hashes = [h for req in base_result.frame_sha256 for h in req]
            be = bit_exact(gs, run_a.flat_hashes, base_hashes, run_a.frames, base_frames)
            gates.append(be)
            if be.status == "passed":
                if tier == 2:
                    gates.append(GateEvidence(name="similarity-band", status="skipped",
                                              summary="not needed: bit-exact"))
            elif tier == 1:
                status = "failed"
                gates.append(GateEvidence(
                    name="similarity-band", status="skipped",
                    summary="not allowed: tier 1 (" + "; ".join(inputs.tier_reasons[:3]) + ") must be bit-exact"))
            else:
                sb = similarity_band(gs, run_a.frames, base_frames, inputs.band)
                gates.append(sb)
                if sb.status != "passed" and status == "passed":
                    status = "needs-review"
    return _Comparison(status, gates, base_frames, time.perf_counter() - t_cmp)


@dataclass
class _Stored:
    result: GateResult
    digest: str  # of the stored result
    review: ReviewRecord | None  # a new blind review, when one was opened


def _target_spec_digest(target: str) -> str | None:
    """The digest of the target spec in force (what the evidence vouches for), None without one."""
    try:
        return load_target(target).digest()
    except SpecError:
        return None


def _store(registry, inputs: _Inputs, twins: _Twins, comparison: _Comparison, t_start: float,
           progress: Callable[[str], None]) -> _Stored:
    """Step 5a: the frames, the result and (for needs-review, unless already decided) a review."""
    progress("storing the gate result with the build")
    run_a, run_b, manifest = twins.a, twins.b, inputs.manifest
    frames_blob = put_frames(registry, run_a.frames)
    tools = toolchain(with_compile_tools=False)
    result = GateResult(
        status=comparison.status, build_id=manifest.build_id, build_digest=inputs.resolved.digest,
        pipeline=manifest.pipeline, target=manifest.target, target_spec_digest=_target_spec_digest(manifest.target),
        baseline=inputs.baseline, tier=inputs.tier,
        tier_reasons=inputs.tier_reasons, band=inputs.band_info, environment=inputs.env,
        tool={"avatar_release": __version__, "jax": tools.jax, "jaxlib": tools.jaxlib, "python": tools.python},
        gate_set=inputs.gate_set, gates=comparison.gates, frame_sha256=run_a.frame_sha256, frames_blob=frames_blob,
        seconds={"twin_1": round(run_a.wall_seconds, 3), "twin_2": round(run_b.wall_seconds, 3),
                 "compare": round(comparison.seconds, 3), "total": round(time.perf_counter() - t_start, 3)},
        created_at=utcnow(), created_by=who(),
    )
    digest = save_result(registry, result, subject_digest=manifest.content_digest())

    review = None
    if comparison.status == "needs-review":
        existing = load_review(registry, manifest.build_id)
        if existing is not None and existing.decision is not None:
            progress(f"review already decided: {existing.decision.decision} by {existing.decision.reviewer}")
        else:
            below = next(g for g in comparison.gates if g.name == "similarity-band").details["frames_below"]
            review = new_review(result, digest, below)
            save_review(registry, review)
    return _Stored(result, digest, review)


def _report(report_dir: str | Path | None, stored: _Stored, twins: _Twins,
            comparison: _Comparison) -> tuple[Path | None, Path | None]:
    """Step 5b: the HTML report (and the blind review page) -> (report, review page); None without a folder."""
    if report_dir is None:
        return None, None

    folder, review, frames, base_frames = Path(report_dir), stored.review, twins.a.frames, comparison.base_frames
    review_path = None
    if review is not None:
        folder.mkdir(parents=True, exist_ok=True)
        review_path = folder / "review.html"
        _atomic.write_text(review_path, review_page(review, frames[review.frames], base_frames[review.frames]))
    report = write_report(folder, stored.result, stored.digest, frames, base_frames,
                          review_page="review.html" if review_path else None)
    return report, review_path
