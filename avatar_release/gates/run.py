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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import EnvironmentMismatch, GateInfraError, InputError, Refusal
from ..records import BaselineRef, EnvironmentRecord, GateEvidence, GateResult, Manifest, utcnow
from ..registry import read_manifest
from ._compare import bit_exact, similarity_band, twin_baseline, zero_recompile
from ._fresh import fresh_run
from .store import get_frames, latest_result, load_review, put_frames, save_result, save_review

__all__ = ["GateOutcome", "run_gate", "effective_status"]


@dataclass
class GateOutcome:
    result: GateResult
    digest: str
    report: Path | None
    review_page: Path | None

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
    from ..machine import Machine, diff_machines

    if baseline == "none":
        return None, None, None
    from ..registry import CHANNELS

    if baseline in CHANNELS and registry.get_channel(baseline) is None:
        raise InputError(
            f"--baseline {baseline}: channel {baseline} is empty in {registry.uri}. Gate a first build "
            "with --baseline none, or name a gated build with --baseline BUILD"
        )
    b_resolved, b_manifest = read_manifest(registry, baseline)
    if b_resolved.digest == resolved_digest:
        raise InputError(f"--baseline {baseline} is {b_resolved.build_id}, the candidate itself; "
                         "use --baseline none to re-gate a build on its own")
    status, b_result, b_digest = effective_status(registry, b_resolved.build_id)
    if b_result is None:
        raise Refusal(f"baseline {b_resolved.build_id} has no gate result to compare with; gate it first: "
                      f"avatar-release gate {b_resolved.build_id} --baseline none")
    if status not in ("passed", "approved"):
        raise Refusal(f"baseline {b_resolved.build_id} did not pass its gates (status {status}); "
                      "choose a baseline that passed")
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
    from .. import __version__
    from ..machine import Machine, configure_host_devices, diff_machines, environment_record, toolchain, who
    from .band import load_band
    from .gateset import gate_set
    from .tier import decide_tier

    resolved, manifest = read_manifest(registry, ref)
    if manifest.platform.backend == "cpu":
        configure_host_devices(manifest.platform.device_count)
    env = environment_record(manifest.platform.backend)
    here = diff_machines(Machine.of_build(manifest), Machine.of_environment(env), fields=("backend", "device_count"))
    if here:
        raise EnvironmentMismatch(
            f"build {manifest.build_id} runs on {Machine.of_build(manifest).describe()}; this machine has "
            f"{Machine.of_environment(env).describe()} ({here.inline()}). Output gates need matching hardware",
            here.differences)
    gs = gate_set(manifest)
    base_ref, base_manifest, base_result = _resolve_baseline(registry, baseline, manifest, resolved.digest, env,
                                                             gs.digest)
    tier, reasons, band, band_info = None, [], None, None
    if base_manifest is not None:
        decision = decide_tier(manifest, base_manifest)
        tier, reasons = decision.tier, decision.reasons
        if tier == 2:
            band, band_digest, band_path = load_band(manifest.pipeline, manifest.target, band_file)
            band_info = {"path": str(band_path), "digest": band_digest, "psnr_floor_db": band.psnr_floor_db,
                         "max_abs_diff_ceiling": band.max_abs_diff_ceiling,
                         "measured_at": band.measured_at, "environment": band.environment.fingerprint}

    progress(f"twin run 1 of 2: {gs.frames} frames in a fresh process")
    run_a = fresh_run(registry.uri, resolved.digest, gs.digest, label="twin #1")
    progress(f"twin run 2 of 2 ({run_a.wall_seconds:.1f}s for the first)")
    run_b = fresh_run(registry.uri, resolved.digest, gs.digest, label="twin #2")
    for run in (run_a, run_b):
        if run.environment["fingerprint"] != env.fingerprint:
            raise GateInfraError(f"a gate run saw environment {run.environment['fingerprint']}, the gate {env.fingerprint}")

    t_cmp = time.perf_counter()
    gates: list[GateEvidence] = [
        zero_recompile([("twin #1", run_a.compiles, run_a.compile_events),
                        ("twin #2", run_b.compiles, run_b.compile_events)]),
        twin_baseline(gs, run_a.flat_hashes, run_b.flat_hashes, run_a.frames, run_b.frames),
    ]
    # What the serving processes imported: a pod needs none of the compile stack.
    imports = sorted(set(run_a.heavy_modules) | set(run_b.heavy_modules))
    gates[0] = gates[0].model_copy(update={"details": {**gates[0].details, "imports": imports}})
    zr_ok, twin_ok = gates[0].status == "passed", gates[1].status == "passed"
    base_frames = None
    status = "passed" if zr_ok and twin_ok else "failed"
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
                    summary="not allowed: tier 1 (" + "; ".join(reasons[:3]) + ") must be bit-exact"))
            else:
                sb = similarity_band(gs, run_a.frames, base_frames, band)
                gates.append(sb)
                if sb.status != "passed" and status == "passed":
                    status = "needs-review"
    compare_seconds = time.perf_counter() - t_cmp

    progress("storing the gate result with the build")
    frames_blob = put_frames(registry, run_a.frames)
    tools = toolchain(with_compile_tools=False)
    result = GateResult(
        status=status, build_id=manifest.build_id, build_digest=resolved.digest,
        pipeline=manifest.pipeline, target=manifest.target, baseline=base_ref, tier=tier,
        tier_reasons=reasons, band=band_info, environment=env,
        tool={"avatar_release": __version__, "jax": tools.jax, "jaxlib": tools.jaxlib, "python": tools.python},
        gate_set=gs, gates=gates, frame_sha256=run_a.frame_sha256, frames_blob=frames_blob,
        seconds={"twin_1": round(run_a.wall_seconds, 3), "twin_2": round(run_b.wall_seconds, 3),
                 "compare": round(compare_seconds, 3), "total": round(time.perf_counter() - t_start, 3)},
        created_at=utcnow(), created_by=who(),
    )
    digest = save_result(registry, result)

    review_path = None
    review = None
    if status == "needs-review":
        from .review import new_review

        existing = load_review(registry, manifest.build_id)
        if existing is not None and existing.decision is not None:
            progress(f"review already decided: {existing.decision.decision} by {existing.decision.reviewer}")
        else:
            below = next(g for g in gates if g.name == "similarity-band").details["frames_below"]
            review = new_review(result, digest, below)
            save_review(registry, review)
    report = None
    if report_dir is not None:
        from .report import write_report

        folder = Path(report_dir)
        if review is not None:
            from .review import review_page

            folder.mkdir(parents=True, exist_ok=True)
            review_path = folder / "review.html"
            review_path.write_text(review_page(review, run_a.frames[review.frames], base_frames[review.frames]))
        report = write_report(folder, result, digest, run_a.frames, base_frames,
                              review_page="review.html" if review_path else None)
    return GateOutcome(result, digest, report, review_path)
