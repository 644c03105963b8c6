"""Static analyses: attention, build cost, schedule (compiler evidence, never measurements)."""

from __future__ import annotations


import click

from ._app import _emit, _prepare_devices_for_target, _progress, cli, json_option, registry_option


@cli.group("analyze")
def analyze_group() -> None:
    """Static analyses: of a pipeline config (attention, schedule) or of a compiled build (build)."""


@analyze_group.command("attention")
@click.option("--pipeline", default="tiny", show_default=True)
@click.option("--no-eligibility", is_flag=True, help="Skip running the eager model for the bounded-softmax share.")
@click.option("--no-collectives", is_flag=True, help="Skip compiling the grouped all-to-alls.")
@json_option
def analyze_attention_cmd(pipeline, no_eligibility, no_collectives, as_json):
    """Mask live fraction, block counts (128 tiles vs aligned), bound eligibility, all-to-all bytes."""
    from ..machine import configure_host_devices

    configure_host_devices(8)
    from ..analyze import analyze_attention

    r = analyze_attention(pipeline, eligibility=not no_eligibility, collectives=not no_collectives)
    sr = r["sr"]
    lines = [f"{pipeline} ({r['config']}): SR {sr['frames']} frames x {sr['tokens_per_frame']} tokens = "
             f"{sr['sequence']}, window {sr['window']}, {sr['heads']} heads x {sr['head_dim']}",
             f"  live fraction of the mask: {r['live_fraction']:.3f}"]
    for name, b in r["blocks"].items():
        lines.append(f"  {name:<12} full {b['full']:>7}  partial {b['partial']:>6}  empty {b['empty']:>7}  "
                     f"(partial share {b['partial_share']:.3f}, padded to {b['padded_length']})")
    e = r["bounded_softmax_eligible"]
    lines.append(f"  heads eligible for the bounded softmax: {e['share'] if e.get('share') is not None else 'n/a'}"
                 + (f" over {e['layers']} layers ({e['inputs']})" if e.get("layers") else f" ({e.get('why')})"))
    for a in r.get("all_to_all", []):
        if "skipped" in a:
            lines.append(f"  G={a['groups']}: {a['skipped']}")
        else:
            lines.append(f"  G={a['groups']}: {a['all_to_alls']} all-to-alls, {a['compiled_bytes_per_group']} B per "
                         f"group per layer (analytic {a['analytic_bytes_per_group']}), total {a['compiled_bytes_total']} B")
    _emit(as_json, {"ok": True, **r}, "\n".join(lines))


@analyze_group.command("build")
@click.argument("ref")
@registry_option
@json_option
def analyze_build_cmd(ref, registry_uri, as_json):
    """What a compiled build's own evidence says: memory fit, estimated time per chunk vs its
    deadline (a compiler estimate, never a measurement), all-to-all schedule, Pallas kernels."""
    from ..cost import LABEL, estimate_chunks
    from ..errors import SpecError
    from ..registry import open_registry, read_manifest
    from ..specs import load_target

    reg = open_registry(registry_uri, create=False)
    _, m = read_manifest(reg, ref)
    try:
        tgt = load_target(m.target)
        peak, bw, ici = tgt.peak_flops_per_second, tgt.hbm_bytes_per_second, tgt.ici_bytes_per_second
    except SpecError:
        peak = bw = ici = None
    chunks = estimate_chunks(m, peak, bw, ici)
    p = m.platform
    gib = 2 ** 30
    lines = [f"{m.build_id}: {m.pipeline} for {m.target} ({p.backend}: {p.device_kind} x {p.device_count})"]
    if m.memory_fit:
        f = m.memory_fit
        lines.append(f"memory per device: {f.total_bytes / gib:.2f} of {f.capacity_bytes / gib:.2f} GiB "
                     f"({'fits' if f.fits else 'DOES NOT FIT'}): weights {f.weights_bytes / gib:.2f} GiB "
                     f"({f.weight_sharding}), peak working set {f.peak_working_bytes / gib:.2f} GiB in {f.peak_stage}")
    lines.append(f"time per chunk: {LABEL}")
    if peak is None:
        lines.append(f"  (target {m.target} publishes no peak rates: roofline unavailable)")
    floors = _analytic_floors(m, chunks, peak, bw)
    for c in chunks:
        verdict = "n/a" if c.ratio is None else (f"{c.ratio:.2f}x the deadline: "
                                                 + ("meets it" if c.ratio <= 1 else "misses it"))
        est = "n/a" if c.estimated_seconds is None else f"{c.estimated_seconds * 1e3:.1f} ms"
        share = ("" if c.compute_share is None else
                 f"; compute floor {c.compute_seconds * 1e3:.1f} ms = {c.compute_share:.2f} of the estimate")
        lines.append(f"  bucket {c.bucket} ({c.frames} frames, deadline {c.deadline_seconds * 1e3:.0f} ms): "
                     f"estimated {est}, {verdict}{share}; all-to-alls {c.all_to_alls_hidden} hidden, "
                     f"{c.all_to_alls_exposed} exposed")
        for s in c.stages:
            lines += _stage_lines(s, floors.get(c.bucket, {}).get(s.key.split("/")[0]))
    for e in m.executables:
        if e.schedule and e.schedule.all_to_alls:
            sc = e.schedule
            lines.append(f"all-to-alls {e.key}: {sc.all_to_alls} ({sc.async_pairs} async pairs, {sc.hidden} hidden "
                         f"behind compute, {sc.exposed} exposed)")
        for k in e.kernels:
            flags = ", ".join(f"{n}={v}" for n, v in k.flags.items()) or "no flags"
            lines.append(f"kernel {e.key}: {k.name} ({k.backend}"
                         + (f", {k.count} call site(s)" if k.count is not None else "") + f"; {flags})")
    payload = {"ok": True, "build_id": m.build_id, "target": m.target, "label": LABEL,
               "memory_fit": m.memory_fit.model_dump() if m.memory_fit else None,
               "chunks": [{**c.to_json(), "analytic_floors": floors.get(c.bucket)} for c in chunks],
               "executables": [{"key": e.key, "schedule": e.schedule.model_dump() if e.schedule else None,
                                "kernels": [k.model_dump() for k in e.kernels], "cost": e.cost,
                                "cost_loop_scale": e.cost_loop_scale, "memory": e.memory} for e in m.executables]}
    _emit(as_json, payload, "\n".join(lines))


def _stage_lines(s, floor) -> list[str]:
    """One stage of a chunk estimate: roofline and its bound, share of the compute floor, the
    all-to-alls hidden / exposed in its schedule, XLA's own figure; then the analytic floor."""
    if s.roofline_seconds is None:
        roof = "n/a"
    else:
        wire = ("" if s.exposed_collective_seconds is None else
                f" + exposed collectives {s.exposed_collective_seconds * 1e3:.2f} ms "
                f"({s.exposed_collective_bytes / 1e9:.2f} of {s.collective_bytes / 1e9:.2f} GB arriving)")
        roof = (f"{s.seconds * 1e3:.2f} ms = roofline {s.roofline_seconds * 1e3:.2f} ms ({s.bound}-bound: compute "
                f"{s.compute_seconds * 1e3:.2f} ms, memory {s.memory_seconds * 1e3:.2f} ms){wire}; "
                f"compute-floor share {s.compute_share:.2f}")
    a2a = ("no schedule recorded" if s.all_to_alls is None else
           f"{s.all_to_alls_hidden} hidden, {s.all_to_alls_exposed} exposed of {s.all_to_alls}")
    xla = (f"{s.xla_optimal_seconds * 1e3:.2f} ms" if s.xla_optimal_seconds is not None else s.xla_optimal_note)
    if s.counted.startswith("per-run"):
        scale = ", counted per run"
    else:
        scale = f", scans x{s.loop_scale:.1f} (an older build: no per-run count)" if s.loop_scale != 1 else ""
    out = [f"    {s.key:<10} {roof}; all-to-alls: {a2a}",
           f"    {'':<10} XLA optimal_seconds: {xla}; {s.flops:.3g} flops, {s.bytes_accessed:.3g} bytes{scale}"]
    if floor:  # per chip, like XLA's figures above
        out.append(f"    {'':<10} analytic floor (docs/production-shapes.md): {floor['flops_per_chip']:.3g} flops, "
                   f"{floor['bytes_per_chip']:.3g} bytes per chip -> {floor['floor_seconds'] * 1e3:.3g} ms "
                   f"({floor['bound']}-bound)")
    return out


def _analytic_floors(m, chunks, peak, bw) -> dict:
    """Per bucket and stage, the config's analytic floor (avatar_release.shapes): the least work
    any compile of these shapes must do, to set beside what XLA counted. {} when unavailable."""
    from ..model.config import PipelineConfig
    from ..model.errors import ConfigError
    from ..shapes import stage_floors

    if not (peak and bw):
        return {}
    try:
        config = PipelineConfig.from_dict(m.config)
    except (ConfigError, TypeError, KeyError, ValueError):
        return {}
    chips = m.platform.device_count or 1
    return {c.bucket: {f.stage: {**f.to_json(), "flops_per_chip": f.flops / chips}
                       for f in stage_floors(config, c.frames, peak, bw, chips)} for c in chunks}


@analyze_group.command("schedule")
@click.option("--pipeline", default="tiny", show_default=True)
@click.option("--target", default="tpu-v6e-8", show_default=True)
@click.option("--groups", default="1,2,4", show_default=True, help="Ulysses head groups to compile, comma-separated.")
@json_option
def analyze_schedule_cmd(pipeline, target, groups, as_json):
    """Hidden vs exposed all-to-alls of one SR attention layer, compiled for TARGET per head-group count."""
    from ..errors import InputError

    try:
        gs = tuple(int(g) for g in groups.split(",") if g.strip())
    except ValueError:
        raise InputError(f"--groups {groups!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not gs or min(gs) < 1:
        raise InputError(f"--groups {groups!r}: expected positive integers")
    _prepare_devices_for_target(target)
    from ..schedule import probe_schedule

    from ..machine import native_log_filter

    with native_log_filter():  # libtpu's and XLA's C++ log, as readable lines
        probes = probe_schedule(pipeline, target, gs, progress=_progress())
    lines = [f"{pipeline} on {target}: one SR attention layer, {probes[0].sequence} tokens, "
             f"{probes[0].heads} heads x {probes[0].head_dim} (compiler schedule, not a measurement)"]
    if probes[0].note:
        lines.append(f"  note: {probes[0].note}")
    lines += [f"  G={p.groups}: {p.all_to_alls} all-to-alls, {p.async_pairs} async pairs, {p.hidden} hidden behind "
              f"compute, {p.exposed} exposed" for p in probes]
    _emit(as_json, {"ok": True, "pipeline": pipeline, "target": target, "probes": [p.to_json() for p in probes]},
          "\n".join(lines))
