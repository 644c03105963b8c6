"""Static analyses: attention, build cost, schedule (compiler evidence, never measurements)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..analysis import LABEL, ChunkEstimate, StageEstimate, estimate_chunks
from ..compile import parse_set_args
from ..errors import AvatarReleaseError, InputError, SpecError
from ..machine import configure_host_devices, native_log_filter
from ..pipeline import CONTRACT_PAGE, AnalysisContext, load_entry
from ..records import Manifest
from ..registry import open_registry, read_manifest
from ..specs import find_project, load_flag_profile, load_pipeline, load_target
from ._app import _emit, _progress, cli, json_option
from ._devices import prepare_devices_for_target
from ._options import complete_ref, nonempty_ref, project_option, registry_option


@cli.group("analyze")
def analyze_group() -> None:
    """Static analyses: of a pipeline config (attention, schedule) or of a compiled build (build)."""


def _run_analysis(
    name: str, pipeline: str, *, target: str | None = None, options: dict[str, Any] | None = None, as_json: bool
) -> None:
    """Run one of the pipeline's own analyses (its contract's ``analyses``) and print it."""
    spec = load_pipeline(pipeline)
    pipe = load_entry(spec)
    analysis = pipe.analyses.get(name)
    if analysis is None:
        known = ", ".join(sorted(pipe.analyses)) or "none"
        raise SpecError(
            f"pipeline {pipeline} ({spec.entry}) declares no analysis {name!r} (it declares: {known}); "
            f"a pipeline adds its own through the contract's analyses ({CONTRACT_PAGE})"
        )
    tgt = flags = None
    if analysis.needs_target:
        prepare_devices_for_target(target or "cpu-8")
        tgt = load_target(target or "cpu-8")
        flags = load_flag_profile(tgt.flag_profile)
    else:
        configure_host_devices(8)
    config = pipe.config(spec.config, find_project().root)  # its errors name their line in the project
    ctx = AnalysisContext(
        pipeline=pipe,
        spec=spec,
        config=config,
        target=tgt,
        flags=flags,
        options=dict(options or {}),
        progress=_progress(),
    )
    with native_log_filter():  # libtpu's and XLA's C++ log, as readable lines
        result = analysis.run(ctx)
    text = analysis.text(result) if analysis.text else json.dumps(result, indent=2, sort_keys=True)
    _emit(as_json, {"ok": True, "analysis": name, **result}, text)


@analyze_group.command("attention")
@click.option("--pipeline", default="tiny", show_default=True)
@click.option("--no-eligibility", is_flag=True, help="Skip running the eager model for the bounded-softmax share.")
@click.option("--no-collectives", is_flag=True, help="Skip compiling the grouped all-to-alls.")
@project_option
@json_option
def analyze_attention_cmd(pipeline: str, no_eligibility: bool, no_collectives: bool, as_json: bool) -> None:
    """The pipeline's "attention" analysis (the bundled one: mask live fraction, block counts, bounded-softmax
    eligibility, all-to-all bytes)."""
    _run_analysis(
        "attention",
        pipeline,
        options={"no_eligibility": no_eligibility, "no_collectives": no_collectives},
        as_json=as_json,
    )


@analyze_group.command("pipeline")
@click.argument("name")
@click.option("--pipeline", default="tiny", show_default=True)
@click.option("--target", default=None, help="For analyses that compile for a target (default cpu-8).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Passed to the analysis (repeatable).")
@project_option
@json_option
def analyze_pipeline_cmd(name: str, pipeline: str, target: str | None, options: tuple[str, ...], as_json: bool) -> None:
    """Run the analysis NAME that the pipeline declares (its contract's ``analyses``)."""
    _run_analysis(name, pipeline, target=target, options=parse_set_args(options), as_json=as_json)


@analyze_group.command("build")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@registry_option
@project_option
@json_option
def analyze_build_cmd(ref: str, registry_uri: str | None, as_json: bool) -> None:
    """What a compiled build's own evidence says: memory fit, estimated time per chunk vs its
    deadline (a compiler estimate, never a measurement), all-to-all schedule, Pallas kernels."""
    reg = open_registry(registry_uri, create=False)
    _, m = read_manifest(reg, ref)
    try:
        tgt = load_target(m.target)
        peak, bw, ici = tgt.peak_flops_per_second, tgt.hbm_bytes_per_second, tgt.ici_bytes_per_second
    except SpecError:
        peak = bw = ici = None
    chunks = estimate_chunks(m, peak, bw, ici)
    floors = _analytic_floors(m, chunks, peak, bw)
    lines = _header_lines(m, peak, bw, ici)
    for c in chunks:
        lines += _chunk_lines(c, floors.get(c.bucket, {}))
    lines += _evidence_lines(m)
    payload = {
        "ok": True,
        "build_id": m.build_id,
        "target": m.target,
        "label": LABEL,
        "rates": {"peak_flops_per_second": peak, "hbm_bytes_per_second": bw, "ici_bytes_per_second": ici},
        "kernel_routes": {k: [r.model_dump() for r in v] for k, v in (m.kernel_routes or {}).items()},
        "autotune": m.autotune.model_dump() if m.autotune else None,
        "memory_fit": m.memory_fit.model_dump() if m.memory_fit else None,
        "chunks": [{**c.to_json(), "analytic_floors": floors.get(c.bucket)} for c in chunks],
        "executables": [
            {
                "key": e.key,
                "schedule": e.schedule.model_dump() if e.schedule else None,
                "kernels": [k.model_dump() for k in e.kernels],
                "cost": e.cost,
                "cost_loop_scale": e.cost_loop_scale,
                "memory": e.memory,
            }
            for e in m.executables
        ],
    }
    _emit(as_json, payload, "\n".join(lines))


def _header_lines(m: Manifest, peak: float | None, bw: float | None, ici: float | None) -> list[str]:
    """What the build is, its memory fit per device, and the peaks the estimate charges against."""
    p, gib = m.platform, 2**30
    lines = [f"{m.build_id}: {m.pipeline} for {m.target} ({p.backend}: {p.device_kind} x {p.device_count})"]
    if m.memory_fit:
        f = m.memory_fit
        lines.append(
            f"memory per device: {f.total_bytes / gib:.2f} of {f.capacity_bytes / gib:.2f} GiB "
            f"({'fits' if f.fits else 'DOES NOT FIT'}): weights {f.weights_bytes / gib:.2f} GiB "
            f"({f.weight_sharding}), peak working set {f.peak_working_bytes / gib:.2f} GiB in {f.peak_stage}"
        )
    lines.append(f"time per chunk: {LABEL}")
    if peak is None or bw is None:
        lines.append(f"  (target {m.target} publishes no peak rates: roofline unavailable)")
    else:
        link = "NVLink" if p.backend == "gpu" else "interconnect"
        lines.append(
            f"  against {m.target}'s published peaks per device: {peak / 1e12:.1f} TFLOP/s, {bw / 1e9:.0f} GB/s "
            f"memory" + (f", {ici / 1e9:.0f} GB/s arriving over {link}" if ici else "")
        )
    return lines


def _chunk_lines(c: ChunkEstimate, floors: dict[str, Any]) -> list[str]:
    """One bucket's chunk against its deadline, then each of its stages."""
    verdict = (
        "n/a" if c.ratio is None else (f"{c.ratio:.2f}x the deadline: " + ("meets it" if c.ratio <= 1 else "misses it"))
    )
    est = "n/a" if c.estimated_seconds is None else f"{c.estimated_seconds * 1e3:.1f} ms"
    share = (
        ""
        if c.compute_share is None or c.compute_seconds is None
        else f"; compute floor {c.compute_seconds * 1e3:.1f} ms = {c.compute_share:.2f} of the estimate"
    )
    lines = [
        f"  bucket {c.bucket} ({c.frames} frames, deadline {c.deadline_seconds * 1e3:.0f} ms): "
        f"estimated {est}, {verdict}{share}; all-to-alls {c.all_to_alls_hidden} hidden, "
        f"{c.all_to_alls_exposed} exposed"
    ]
    for s in c.stages:
        lines += _stage_lines(s, floors.get(s.key.split("/")[0]))
    return lines


def _evidence_lines(m: Manifest) -> list[str]:
    """The compiler's own evidence per executable: schedules, kernels, attention routes, autotuning."""
    lines = []
    for e in m.executables:
        if e.schedule and e.schedule.all_to_alls:
            sc = e.schedule
            lines.append(
                f"all-to-alls {e.key}: {sc.all_to_alls} ({sc.async_pairs} async pairs, {sc.hidden} hidden "
                f"behind compute, {sc.exposed} exposed)"
            )
        for k in e.kernels:
            flags = ", ".join(f"{n}={v}" for n, v in k.flags.items()) or "no flags"
            lines.append(
                f"kernel {e.key}: {k.name} ({k.backend}"
                + (f", {k.count} call site(s)" if k.count is not None else "")
                + f"; {flags})"
            )
    for stage, routes in (m.kernel_routes or {}).items():
        for r in routes:
            why = f" ({r.reason})" if r.reason else ""
            lines.append(f"route {stage}: {r.kernel}: {r.requested} requested, {r.used} compiled{why}")
    if m.autotune is not None:
        a = m.autotune
        per = ", ".join(
            f"{k}: {f.gemm_fusions} GEMM fusions, {f.block_fusions} block fusions, {f.cublas_calls} cuBLAS, "
            f"{f.convolutions_at_run_time} convolutions at run time"
            for k, f in a.executables.items()
        )
        how = (
            "compiled with the device"
            if not a.deviceless
            else "deviceless compile: "
            + ("configs from the loaded results" if a.results else "nothing measured, default configs")
        )
        loaded = (
            "none"
            if a.results is None
            else (
                f"{a.results} ({a.results_entries} configs; "
                + ("every config required)" if a.complete_required else "XLA's defaults where one is missing)")
            )
        )
        lines.append(
            f"autotuning: {how}{'; first valid config taken (deterministic flags)' if a.select_first else ''}; "
            f"results loaded: {loaded}; {per}"
        )
    return lines


def _stage_lines(s: StageEstimate, floor: dict[str, Any] | None) -> list[str]:
    """One stage of a chunk estimate: roofline and its bound, share of the compute floor, the
    all-to-alls hidden / exposed in its schedule, XLA's own figure; then the analytic floor."""
    if s.roofline_seconds is None or s.seconds is None or s.compute_seconds is None or s.memory_seconds is None:
        roof = "n/a"  # (set together: a roofline needs the target's peak rates)
    else:
        wire = (
            ""
            if s.exposed_collective_seconds is None or s.exposed_collective_bytes is None or s.collective_bytes is None
            else f" + exposed collectives {s.exposed_collective_seconds * 1e3:.2f} ms "
            f"({s.exposed_collective_bytes / 1e9:.2f} of {s.collective_bytes / 1e9:.2f} GB arriving)"
        )
        roof = (
            f"{s.seconds * 1e3:.2f} ms = roofline {s.roofline_seconds * 1e3:.2f} ms ({s.bound}-bound: compute "
            f"{s.compute_seconds * 1e3:.2f} ms, memory {s.memory_seconds * 1e3:.2f} ms){wire}; "
            f"compute-floor share {s.compute_share:.2f}"
        )
    a2a = (
        "no schedule recorded"
        if s.all_to_alls is None
        else f"{s.all_to_alls_hidden} hidden, {s.all_to_alls_exposed} exposed of {s.all_to_alls}"
    )
    xla = f"{s.xla_optimal_seconds * 1e3:.2f} ms" if s.xla_optimal_seconds is not None else s.xla_optimal_note
    if s.counted.startswith("per-run"):
        scale = ", counted per run"
    else:
        scale = f", scans x{s.loop_scale:.1f} (an older build: no per-run count)" if s.loop_scale != 1 else ""
    out = [
        f"    {s.key:<10} {roof}; all-to-alls: {a2a}",
        f"    {'':<10} XLA optimal_seconds: {xla}; {s.flops:.3g} flops, {s.bytes_accessed:.3g} bytes{scale}",
    ]
    if floor:  # per chip, like XLA's figures above
        out.append(
            f"    {'':<10} analytic floor (docs site: Concepts > Production shapes): "
            f"{floor['flops_per_chip']:.3g} flops, "
            f"{floor['bytes_per_chip']:.3g} bytes per chip -> {floor['floor_seconds'] * 1e3:.3g} ms "
            f"({floor['bound']}-bound)"
        )
    return out


def _analytic_floors(m: Manifest, chunks: list[ChunkEstimate], peak: float | None, bw: float | None) -> dict[str, Any]:
    """Per bucket and stage, the pipeline's own analytic floor (its "floors" analysis, when its project
    is here and declares one): the least work any compile of these shapes must do, set beside what
    XLA counted. {} when unavailable."""
    if not (peak and bw):
        return {}
    try:
        spec = load_pipeline(m.pipeline)
        pipe = load_entry(spec)
    except AvatarReleaseError:  # no project here, or not this build's: the build's own evidence only
        return {}
    floors = pipe.analyses.get("floors")
    if floors is None:
        return {}
    options = {
        "config_doc": m.config,
        "buckets": {c.bucket: c.frames for c in chunks},
        "peak": peak,
        "bandwidth": bw,
        "chips": m.platform.device_count or 1,
    }
    try:
        return floors.run(AnalysisContext(pipeline=pipe, spec=spec, config=None, options=options))
    except (TypeError, KeyError, ValueError):  # a config this pipeline version cannot read
        return {}


@analyze_group.command("schedule")
@click.option("--pipeline", default="tiny", show_default=True)
@click.option("--target", default="tpu-v6e-8", show_default=True)
@click.option("--groups", default="1,2,4", show_default=True, help="Ulysses head groups to compile, comma-separated.")
@project_option
@json_option
def analyze_schedule_cmd(pipeline: str, target: str, groups: str, as_json: bool) -> None:
    """The pipeline's "schedule" analysis (the bundled one: hidden vs exposed all-to-alls of one SR attention
    layer, compiled for TARGET per head-group count)."""
    try:
        gs = tuple(int(g) for g in groups.split(",") if g.strip())
    except ValueError:
        raise InputError(f"--groups {groups!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not gs or min(gs) < 1:
        raise InputError(f"--groups {groups!r}: expected positive integers")
    _run_analysis("schedule", pipeline, target=target, options={"groups": gs}, as_json=as_json)
