"""The ``avatar-release`` command line: a thin layer that parses, calls one function,
prints (human or ``--json``) and maps the exception tree to exit codes.

JAX is never imported before the command knows how many devices it needs: the entry
point sets XLA_FLAGS explicitly from the target or the build's manifest, then calls in.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

import click

from . import __version__
from .errors import CRASH_EXIT_CODE, AvatarReleaseError, InputError

__all__ = ["main", "cli"]

_T0 = time.perf_counter()


def _emit(ctx_json: bool, payload: dict, human: str) -> None:
    if ctx_json:
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
    else:
        click.echo(human)


def _progress(enabled: bool):
    def say(msg: str) -> None:
        if enabled:
            click.echo(f"  {msg}", err=True)

    return say


class _Group(click.Group):
    """Maps AvatarReleaseError subclasses to their exit codes; anything else is a crash."""

    def parse_args(self, ctx, args):
        ctx.meta["avatar_release.argv"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AvatarReleaseError as e:
            as_json = "--json" in ctx.meta.get("avatar_release.argv", sys.argv)
            if as_json:
                payload = {"ok": False, "error": type(e).__name__, "message": str(e), "exit_code": e.exit_code}
                fit = getattr(e, "fit", None)
                if fit is not None:  # DoesNotFit: the numbers, for CI and benchmarks
                    payload["memory_fit"] = fit.model_dump()
                click.echo(json.dumps(payload, indent=2))
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception:  # noqa: BLE001 - a crash, reported as one
            traceback.print_exc()
            click.echo("avatar-release crashed (a bug, not a refusal); exit 70", err=True)
            ctx.exit(CRASH_EXIT_CODE)


registry_option = click.option(
    "--registry", "registry_uri", default=None, envvar="AVATAR_RELEASE_REGISTRY",
    help="Registry: a directory (default ./.avatar-release), file://PATH or memory://NAME.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print a machine-readable result.")


def trust_options(f):
    f = click.option("--trust-state", default="~/.local/state/avatar-release/accepted.json", show_default=True,
                     envvar="AVATAR_RELEASE_TRUST_STATE",
                     help="Where this pod keeps the highest statement sequence it accepted (replay protection).")(f)
    return click.option("--trust-key", default=None, envvar="AVATAR_RELEASE_TRUST_KEY",
                        help="Ed25519 public key: serve only channels with a valid signed statement.")(f)


def _trust(trust_key, trust_state):
    if not trust_key:
        return None
    import os

    from .runtime import TrustConfig
    from .trust.keys import load_public_key
    from .trust.statements import AcceptedState

    return TrustConfig(load_public_key(trust_key), AcceptedState(os.path.expanduser(trust_state)))


def signing_options(f):
    f = click.option("--valid-days", default=30.0, show_default=True, type=float,
                     help="How long the signed statement stays valid.")(f)
    return click.option("--sign-key", default=None, envvar="AVATAR_RELEASE_SIGNING_KEY",
                        help="Ed25519 private key: sign a statement for the move (pods with the public key need it).")(f)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="avatar-release")
def cli() -> None:
    """Compiled XLA programs as release artifacts: compile, gate, promote, render."""


def _prepare_devices_for_target(target_name: str) -> None:
    from .machine import configure_compile_env
    from .specs import load_target

    configure_compile_env(load_target(target_name))


def _prepare_devices_for_build(registry, ref: str):
    """Read the manifest (no JAX needed) and set the device count it was compiled for."""
    from .machine import configure_for_manifest
    from .registry import read_manifest

    resolved, manifest = read_manifest(registry, ref)
    configure_for_manifest(manifest)
    return resolved, manifest


# ---------------------------------------------------------------------------------- compile
@cli.command("compile")
@click.option("--pipeline", default="tiny", show_default=True, help="A pipeline spec under manifests/pipelines/.")
@click.option("--target", default="cpu-8", show_default=True, help="A target under manifests/targets/.")
@click.option("--weights", "weights_path", default=None, help="A .safetensors checkpoint (default: the spec's source).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a model config field (repeatable).")
@click.option("--serial", is_flag=True, help="Compile stages one after another instead of concurrently.")
@click.option("--format", "executable_format", type=click.Choice(["xla-executable", "jax-export"]),
              default="xla-executable", show_default=True,
              help="jax-export ships portable StableHLO that compiles in the pod (the zero-recompile gate refuses it).")
@registry_option
@json_option
def compile_cmd(pipeline, target, weights_path, sets, serial, executable_format, registry_uri, as_json):
    """Trace, AOT-compile and publish a build; points the dev channel at it."""
    from .compile import parse_set_args
    from .registry import open_registry

    overrides = parse_set_args(sets)
    _prepare_devices_for_target(target)
    registry = open_registry(registry_uri)
    from .compile import compile_build
    from .promote import publish_to_dev

    # compile publishes; moving dev is promote's job.
    result = compile_build(
        pipeline, target, registry=registry, weights_path=weights_path, overrides=overrides,
        concurrent_compile=not serial, executable_format=executable_format, move_dev=False,
        progress=_progress(not as_json),
    )
    publish_to_dev(registry, registry.resolve(result.digest), reason=f"compile {result.pipeline} for {result.target}")
    rows = "\n".join(
        f"  {e.key:<12} raw {e.raw_size / 1e6:7.2f} MB  zstd {e.compressed_size / 1e6:7.2f} MB  "
        f"trace {e.trace_seconds:5.2f}s lower {e.lower_seconds:5.2f}s compile {e.compile_seconds:5.2f}s"
        for e in result.executables
    )
    state = "published" if result.created else "already published (identical build)"
    _emit(as_json, {"ok": True, **result.to_json()},
          f"{state}: {result.build_id}\n  digest {result.digest}\n{rows}\n"
          f"  dev -> {result.build_id}   ({result.wall_seconds:.1f}s)")


@cli.command("rebuild")
@click.argument("ref")
@registry_option
@json_option
def rebuild_cmd(ref, registry_uri, as_json):
    """Recompile a published build from its manifest; exit 1 if HLO or fingerprint differ."""
    from .registry import open_registry, read_manifest

    reg = open_registry(registry_uri, create=False)
    _, m = read_manifest(reg, ref)
    _prepare_devices_for_target(m.target)
    from .compile import rebuild
    from .errors import Refusal

    report = rebuild(ref, reg, progress=_progress(not as_json))
    lines = "\n".join(f"  {d['what']}: published {d['published']}, rebuilt {d['rebuilt']}" for d in report.differences)
    _emit(as_json, {"ok": report.identical, **report.to_json()},
          f"{report.build_id}: " + ("reproduced bit for bit (HLO hashes, fingerprints, identity)" if report.identical
                                    else f"NOT reproducible:\n{lines}"))
    if not report.identical:
        raise Refusal(f"rebuild of {report.build_id} differs in {len(report.differences)} field(s)")


# ---------------------------------------------------------------------------------- ls / inspect / verify
@cli.command("ls")
@registry_option
@json_option
def ls_cmd(registry_uri, as_json):
    """List builds, their gate status and the channels that point at them."""
    from .gates import effective_status
    from .gates.compile_gate import load_compile_gate
    from .registry import open_registry

    reg = open_registry(registry_uri, create=False)
    channels = {c.channel: c for c in reg.list_channels()}
    builds = reg.list_builds()
    rows = []
    for b in builds:
        on = sorted(name for name, c in channels.items() if c.digest == b.digest)
        gate = effective_status(reg, b.build_id)[0]
        compiled = load_compile_gate(reg, b.build_id)
        rows.append({"build_id": b.build_id, "digest": b.digest, "published_at": b.published_at, "channels": on,
                     "gate": gate, "compile_gate": compiled.status if compiled else None})
    human = "\n".join(
        f"{r['build_id']:<40} {r['digest'][:19]}  {r['published_at'][:19]}  {r['gate']:<12} "
        f"{('compile:' + r['compile_gate']) if r['compile_gate'] else '':<16} {' '.join(r['channels'])}".rstrip()
        for r in rows
    ) or "no builds"
    _emit(as_json, {"ok": True, "registry": reg.uri, "builds": rows,
                    "channels": {k: v.build_id for k, v in channels.items()}}, human)


@cli.command("inspect")
@click.argument("ref")
@registry_option
@json_option
def inspect_cmd(ref, registry_uri, as_json):
    """Show a build's manifest (REF: channel, build id or digest)."""
    from .registry import open_registry, read_manifest

    reg = open_registry(registry_uri, create=False)
    resolved, m = read_manifest(reg, ref)
    if as_json:
        click.echo(json.dumps({"ok": True, "digest": resolved.digest, "manifest": m.model_dump(mode="json")},
                              indent=2, sort_keys=True))
        return
    p = m.platform
    lines = [
        f"build      {m.build_id}",
        f"digest     {resolved.digest}",
        f"identity   {m.identity}",
        f"created    {m.created_at} by {m.created_by}",
        f"pipeline   {m.pipeline} ({m.model_entry}), overrides {m.overrides or '{}'}",
        f"target     {m.target}: {p.backend} {p.device_kind} x{p.device_count}, mesh "
        f"{dict(zip(p.mesh_axes, p.mesh_shape))}",
        f"flags      {m.flags.name} v{m.flags.version} {m.flags.digest[:19]}",
        f"toolchain  jax {m.toolchain.jax}, jaxlib {m.toolchain.jaxlib}, torch {m.toolchain.torch}, "
        f"torchax {m.toolchain.torchax}",
        f"weights    {m.weights.tensors} tensors, {m.weights.raw_size / 1e6:.2f} MB ({m.weights.source})",
    ]
    if m.memory_fit:
        f = m.memory_fit
        lines.append(f"memory     {f.total_bytes / 2**30:.2f} of {f.capacity_bytes / 2**30:.2f} GiB per device "
                     f"({f.weight_sharding}; peak {f.peak_stage}){'' if f.fits else ' - DOES NOT FIT'}")
    lines.append("executables:")
    for e in m.executables:
        lines.append(f"  {e.key:<12} {e.blob.size / 1e6:6.2f} MB zstd ({e.raw_size / 1e6:.2f} raw)  "
                     f"hlo {e.hlo_digest[7:19]}  flops {e.cost.get('flops', 0):.3g}")
    click.echo("\n".join(lines))


@cli.command("verify")
@click.argument("ref")
@registry_option
@json_option
def verify_cmd(ref, registry_uri, as_json):
    """Re-hash every blob of a build; exit 4 naming each blob that fails."""
    from .verify import verify_build

    report = verify_build(ref, registry_uri)
    human = "\n".join(f"  {'ok  ' if r['ok'] else 'FAIL'} {r['what']:<16} {r['digest'][:19]}  {r.get('error', '')}"
                      for r in report["blobs"])
    _emit(as_json, {"ok": report["ok"], **report}, f"{report['build_id']}:\n{human}")
    if not report["ok"]:
        bad = [r["what"] for r in report["blobs"] if not r["ok"]]
        from .errors import IntegrityError

        raise IntegrityError(f"build {report['build_id']}: {len(bad)} blob(s) failed verification: {', '.join(bad)}")


# ---------------------------------------------------------------------------------- render
@cli.command("render")
@click.option("--channel", default=None, help="Render the build a channel points at (default: dev).")
@click.option("--build", "build_ref", default=None, help="Render a build id or digest.")
@click.option("--image", "image_path", default=None,
              help="Reference picture: JPEG, PNG or WebP (or a .npy uint8 array); default: the sample face.")
@click.option("--audio", "audio_path", default=None,
              help="Speech track: WAV, MP3, M4A/AAC, FLAC, Ogg/Opus or WebM; default: the sample clip.")
@click.option("--fit", type=click.Choice(["cover", "contain", "exact"]), default="cover", show_default=True,
              help="How a picture of another size meets the pipeline's: cover = scale and centre-crop, "
                   "contain = scale to fit and letterbox on black, exact = refuse another size.")
@click.option("--seconds", default=1.0, show_default=True, help="Length of the default sample audio.")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", "out_path", default="out.mp4", show_default=True, help="H.264 mp4 with the audio muxed in.")
@click.option("--frames-dir", default=None, help="Also write every frame as PNG here.")
@trust_options
@registry_option
@json_option
def render_cmd(channel, build_ref, image_path, audio_path, fit, seconds, seed, out_path, frames_dir, trust_key,
               trust_state, registry_uri, as_json):
    """Load a build as a serving pod would and render a video with zero compiles."""
    if channel and build_ref:
        raise InputError("give --channel or --build, not both")
    from .render import render_to_files

    summary = render_to_files(
        ref=build_ref or channel or "dev", registry_uri=registry_uri, image_path=image_path,
        audio_path=audio_path, seconds=seconds, seed=seed, out_path=out_path, frames_dir=frames_dir,
        prepare=_prepare_devices_for_build, t_process=_T0, trust=_trust(trust_key, trust_state), fit=fit,
    )
    human = (
        f"rendered {summary['frames']} frames in {summary['chunks']} chunks from {summary['build_id']} -> "
        f"{summary['out']}\n  compiles {summary['compiles']}, deadline misses {summary['deadline_misses']}, "
        f"cold start {summary['cold_start']['total']:.2f}s (first chunk {summary['cold_start']['first_chunk']:.2f}s)"
    )
    if f := summary["inputs"]["image"].get("fit"):
        human += (f"\n  image {f['source_format']} {'x'.join(map(str, f['source_size']))} -> "
                  f"{'x'.join(map(str, f['target_size']))} by --fit {f['rule']}, source box {f['box']}")
    _emit(as_json, {"ok": True, **summary}, human)


# ---------------------------------------------------------------------------------- serve
@cli.command("serve")
@click.option("--channel", default="prod", show_default=True, help="Channel (or build id / digest) to serve.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, help="0 picks a free port (printed when ready).")
@trust_options
@registry_option
def serve_cmd(channel, host, port, trust_key, trust_state, registry_uri):
    """Serve renders over HTTP; ready only after verify + load + one warm chunk with 0 compiles."""
    from .registry import open_registry

    registry = open_registry(registry_uri, create=False)
    resolved, _ = _prepare_devices_for_build(registry, channel)
    from .runtime import load
    from .serve import ServingPod, serve_forever

    trust = _trust(trust_key, trust_state)
    pod = ServingPod(load(channel if trust else resolved.digest, registry, strict=True, trust=trust))
    pod.warm_up()

    def ready(addr):
        click.echo(json.dumps({"event": "ready", "host": addr[0], "port": addr[1], **pod.health()}), nl=True)
        sys.stdout.flush()

    serve_forever(pod, host, port, ready)

# ---------------------------------------------------------------------------------- promotion
def _signing_key(path):
    if not path:
        return None
    from .trust.keys import load_private_key

    return load_private_key(path)


def _move_human(r, verb: str) -> str:
    d = r.decision
    if not r.changed:
        return f"{d.channel} already points at {d.build_id}: nothing changed"
    e = r.entry
    gate = f"; gate result {d.gate_result_digest}" if d.gate_result_digest else ""
    signed = f"\n  signed statement #{r.statement.payload.sequence}, expires {r.statement.payload.expires_at}" \
        if r.statement else ""
    return (f"{verb}: {d.channel} {r.previous or '(empty)'} -> {d.build_id}\n"
            f"  history #{e.sequence} by {e.who} at {e.when}{gate}{signed}")


@cli.command("promote")
@click.argument("ref")
@click.option("--to", "channel", required=True, type=click.Choice(["dev", "staging", "prod"]))
@click.option("--reason", default="", help="Recorded in the history.")
@signing_options
@registry_option
@json_option
def promote_cmd(ref, channel, reason, sign_key, valid_days, registry_uri, as_json):
    """Move a channel to REF if the policy allows it (exit 1 with the reason if not)."""
    from .promote import promote
    from .registry import open_registry

    r = promote(open_registry(registry_uri, create=False), ref, channel, reason=reason,
                signing_key=_signing_key(sign_key), valid_days=valid_days)
    _emit(as_json, {"ok": True, **r.to_json()}, _move_human(r, "promoted"))


@cli.command("rollback")
@click.argument("channel", type=click.Choice(["dev", "staging", "prod"]))
@click.option("--to", "to", default=None, help="Build to return to (default: the one before the current).")
@click.option("--reason", default="", help="Recorded in the history.")
@signing_options
@registry_option
@json_option
def rollback_cmd(channel, to, reason, sign_key, valid_days, registry_uri, as_json):
    """Move CHANNEL back to an earlier build that passed its gates."""
    from .promote import rollback
    from .registry import open_registry

    r = rollback(open_registry(registry_uri, create=False), channel, to=to, reason=reason,
                 signing_key=_signing_key(sign_key), valid_days=valid_days)
    _emit(as_json, {"ok": True, **r.to_json()}, _move_human(r, "rolled back"))


@cli.command("history")
@click.argument("channel", required=False, type=click.Choice(["dev", "staging", "prod"]))
@registry_option
@json_option
def history_cmd(channel, registry_uri, as_json):
    """The append-only history of channel moves (all channels, or one)."""
    from .registry import open_registry

    entries = open_registry(registry_uri, create=False).history(channel)
    human = "\n".join(
        f"#{e.sequence:<4} {e.when[:19]}  {e.channel:<8} {e.action:<8} {(e.from_build or '-'):<26} -> "
        f"{e.to_build:<26} {e.who}  {e.reason}" for e in entries) or "no history"
    _emit(as_json, {"ok": True, "entries": [e.model_dump(mode="json") for e in entries]}, human)



@cli.command("gc")
@click.option("--prune-builds", is_flag=True,
              help="Also drop builds no channel points at and staging/prod never held.")
@click.option("--min-age", "min_age_s", default=3600.0, show_default=True, type=float,
              help="Seconds an unreferenced blob must be old before it is deleted (publishes in flight).")
@click.option("--dry-run", is_flag=True, help="Report what would go; delete nothing.")
@registry_option
@json_option
def gc_cmd(prune_builds, min_age_s, dry_run, registry_uri, as_json):
    """Delete unreferenced blobs (never anything a channel or a rollback can reach)."""
    from .registry import open_registry
    from .ops import collect_garbage

    r = collect_garbage(open_registry(registry_uri, create=False), prune_builds=prune_builds,
                        min_age_s=min_age_s, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    _emit(as_json, {"ok": True, **r.to_json()},
          f"{verb} {r.deleted_blobs} blobs ({r.freed_bytes / 1e6:.2f} MB) and {len(r.pruned_builds)} builds; "
          f"kept {len(r.kept_builds)} builds, {r.kept_blobs} blobs ({r.young_blobs} too young to judge)")


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
    from .machine import configure_host_devices

    configure_host_devices(8)
    from .analyze import analyze_attention

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
    from .cost import LABEL, estimate_chunks
    from .errors import SpecError
    from .registry import open_registry, read_manifest
    from .specs import load_target

    reg = open_registry(registry_uri, create=False)
    _, m = read_manifest(reg, ref)
    try:
        tgt = load_target(m.target)
        peak, bw = tgt.peak_flops_per_second, tgt.hbm_bytes_per_second
    except SpecError:
        peak = bw = None
    chunks = estimate_chunks(m, peak, bw)
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
    for c in chunks:
        verdict = "n/a" if c.ratio is None else (f"{c.ratio:.2f}x the deadline: "
                                                 + ("meets it" if c.ratio <= 1 else "misses it"))
        est = "n/a" if c.estimated_seconds is None else f"{c.estimated_seconds * 1e3:.1f} ms"
        lines.append(f"  bucket {c.bucket} ({c.frames} frames, deadline {c.deadline_seconds * 1e3:.0f} ms): "
                     f"estimated {est}, {verdict}")
        for s in c.stages:
            roof = "n/a" if s.roofline_seconds is None else f"{s.roofline_seconds * 1e3:.2f} ms ({s.bound}-bound)"
            xla = (f"{s.xla_optimal_seconds * 1e3:.2f} ms" if s.xla_optimal_seconds is not None else s.xla_optimal_note)
            scale = f", scans x{s.loop_scale:.1f}" if s.loop_scale != 1 else ""
            lines.append(f"    {s.key:<10} roofline {roof}; XLA optimal_seconds: {xla}; "
                         f"{s.flops:.3g} flops, {s.bytes_accessed:.3g} bytes{scale}")
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
               "chunks": [c.to_json() for c in chunks],
               "executables": [{"key": e.key, "schedule": e.schedule.model_dump() if e.schedule else None,
                                "kernels": [k.model_dump() for k in e.kernels], "cost": e.cost,
                                "cost_loop_scale": e.cost_loop_scale, "memory": e.memory} for e in m.executables]}
    _emit(as_json, payload, "\n".join(lines))


@analyze_group.command("schedule")
@click.option("--pipeline", default="tiny", show_default=True)
@click.option("--target", default="tpu-v6e-8", show_default=True)
@click.option("--groups", default="1,2,4", show_default=True, help="Ulysses head groups to compile, comma-separated.")
@json_option
def analyze_schedule_cmd(pipeline, target, groups, as_json):
    """Hidden vs exposed all-to-alls of one SR attention layer, compiled for TARGET per head-group count."""
    from .errors import InputError

    try:
        gs = tuple(int(g) for g in groups.split(",") if g.strip())
    except ValueError:
        raise InputError(f"--groups {groups!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not gs or min(gs) < 1:
        raise InputError(f"--groups {groups!r}: expected positive integers")
    _prepare_devices_for_target(target)
    from .schedule import probe_schedule

    probes = probe_schedule(pipeline, target, gs, progress=_progress(not as_json))
    lines = [f"{pipeline} on {target}: one SR attention layer, {probes[0].sequence} tokens, "
             f"{probes[0].heads} heads x {probes[0].head_dim} (compiler schedule, not a measurement)"]
    if probes[0].note:
        lines.append(f"  note: {probes[0].note}")
    lines += [f"  G={p.groups}: {p.all_to_alls} all-to-alls, {p.async_pairs} async pairs, {p.hidden} hidden behind "
              f"compute, {p.exposed} exposed" for p in probes]
    _emit(as_json, {"ok": True, "pipeline": pipeline, "target": target, "probes": [p.to_json() for p in probes]},
          "\n".join(lines))


# ---------------------------------------------------------------------------------- keys
@cli.group("keys")
def keys_group() -> None:
    """Ed25519 keys for signed promotions."""


@keys_group.command("generate")
@click.option("--out", "out_dir", default="keys", show_default=True, help="Folder for NAME.key and NAME.pub.")
@click.option("--name", default="release", show_default=True)
@json_option
def keys_generate_cmd(out_dir, name, as_json):
    """Create a signing key (0600) and its public key; never overwrites."""
    from .trust.keys import generate_keypair

    priv, pub, kid = generate_keypair(out_dir, name)
    _emit(as_json, {"ok": True, "private_key": str(priv), "public_key": str(pub), "key_id": kid},
          f"key {kid}\n  private {priv} (keep it on the release machine)\n  public  {pub} (give it to serving pods)")


@keys_group.command("sign")
@click.argument("channel", type=click.Choice(["dev", "staging", "prod"]))
@click.option("--key", "key_path", required=True, envvar="AVATAR_RELEASE_SIGNING_KEY")
@click.option("--valid-days", default=30.0, show_default=True, type=float)
@registry_option
@json_option
def keys_sign_cmd(channel, key_path, valid_days, registry_uri, as_json):
    """(Re-)sign the statement for where CHANNEL points now (e.g. before it expires)."""
    from .promote.actions import sign_channel
    from .registry import open_registry

    st = sign_channel(open_registry(registry_uri, create=False), channel, _signing_key(key_path),
                      valid_days=valid_days)
    p = st.payload
    _emit(as_json, {"ok": True, "statement": st.model_dump(mode="json")},
          f"signed {channel} -> {p.build_id} (sequence {p.sequence}), expires {p.expires_at}")

# ------------------------------------------------------------------------------------ gates
class _GateGroup(click.Group):
    """``gate BUILD ...`` runs the gates; ``gate calibrate ...`` measures the band."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@cli.group("gate", cls=_GateGroup)
def gate_group() -> None:
    """Gate a build: `gate BUILD [--baseline prod|BUILD|none]`, or `gate calibrate`.

    Exit 0: passed. Exit 1: a gate said no, or the output needs a blind review.
    Other codes: the gate could not run (see the exit code table in the README).
    """


@gate_group.command("run")
@click.argument("ref")
@click.option("--baseline", default="prod", show_default=True,
              help="Compare against: a channel, a build id or digest, or none (first build).")
@click.option("--report", "report_dir", default=None,
              help="Folder for the HTML report (default: gate-reports/<build id>).")
@click.option("--band", "band_file", default=None, help="Band file (default: manifests/bands/<pipeline>-<target>.json).")
@registry_option
@json_option
def gate_run_cmd(ref, baseline, report_dir, band_file, registry_uri, as_json):
    """Gate REF: zero recompiles, twin baseline, bit-exact or similarity band."""
    from .registry import open_registry

    registry = open_registry(registry_uri, create=False)
    resolved, manifest = _prepare_devices_for_build(registry, ref)
    _require_build_hardware(manifest)
    from .gates import run_gate

    outcome = run_gate(resolved.digest, registry, baseline=baseline,
                       report_dir=report_dir or f"gate-reports/{manifest.build_id}",
                       band_file=band_file, progress=_progress(not as_json))
    r = outcome.result
    lines = [f"{r.status.upper()}: {r.build_id}",
             f"  baseline {r.baseline.build_id if r.baseline else 'none'}"
             + (f", tier {r.tier}" if r.tier else "")]
    lines += [f"  {g.name:<16} {g.status:<10} {g.summary}" for g in r.gates]
    if outcome.report:
        lines.append(f"  report  {outcome.report}")
    if outcome.review_page:
        lines.append(f"  review  avatar-release review {r.build_id} --serve   (page also at {outcome.review_page})")
    lines.append(f"  result  {outcome.digest}  ({r.seconds.get('total', 0):.1f}s)")
    _emit(as_json, {"ok": outcome.passed, "status": r.status, "result_digest": outcome.digest,
                    "report": str(outcome.report) if outcome.report else None,
                    "review_page": str(outcome.review_page) if outcome.review_page else None,
                    "result": r.model_dump(mode="json")}, "\n".join(lines))
    if not outcome.passed:
        click.get_current_context().exit(1)


def _require_build_hardware(manifest) -> None:
    """Output gates run the build: without its devices, refuse early with the loader's own
    check (both machines named), pointing at the compile gate."""
    if manifest.platform.backend == "cpu":
        return  # the fresh gate workers check CPU builds field by field as they load
    from .errors import EnvironmentMismatch
    from .runtime import check_environment

    try:
        check_environment(manifest)
    except EnvironmentMismatch as e:
        raise EnvironmentMismatch(
            f"the output gates run {manifest.build_id}, so they need its hardware: {e}\n"
            f"What can be proven on this host: avatar-release gate compile {manifest.build_id}",
            e.differences,
        ) from None


@gate_group.command("compile")
@click.argument("ref")
@click.option("--no-reproduce", is_flag=True, help="Skip the recompile (reproducible HLO and fingerprint).")
@registry_option
@json_option
def gate_compile_cmd(ref, no_reproduce, registry_uri, as_json):
    """Compile gate for REF: what holds without its hardware (buckets, flags, memory, callbacks, rebuild).

    Never enough to promote past dev: output gates need a run on the build's hardware.
    """
    from .registry import open_registry, read_manifest

    registry = open_registry(registry_uri, create=False)
    _, manifest = read_manifest(registry, ref)
    _prepare_devices_for_target(manifest.target)
    from .gates.compile_gate import run_compile_gate

    outcome = run_compile_gate(registry, ref, reproduce=not no_reproduce, progress=_progress(not as_json))
    r = outcome.result
    lines = [f"{r.status.upper()}: compile gate of {r.build_id} ({r.target})"]
    lines += [f"  {c.name:<18} {c.status:<8} {c.summary}" for c in r.checks]
    lines.append(f"  stored as record compile-gates/{r.build_id} ({r.seconds:.1f}s). Output gates (twin baseline, "
                 "bit-exact, band) still need a run on the build's hardware before staging.")
    _emit(as_json, {"ok": outcome.passed, "status": r.status, "result": r.model_dump(mode="json")}, "\n".join(lines))
    if not outcome.passed:
        click.get_current_context().exit(1)


@gate_group.command("calibrate")
@click.option("--pipeline", default="tiny", show_default=True)
@click.option("--target", default="cpu-8", show_default=True)
@click.option("--variant", "variants", multiple=True, metavar="KEY=VALUE[,KEY=VALUE]",
              help="A mathematically equivalent reduction order (repeatable; default matmul_k_split=2 and =4).")
@click.option("--margin-db", default=0.25, show_default=True, type=float,
              help="Subtracted from the lowest measured PSNR.")
@click.option("--out", default=None, help="Band file to write (default: manifests/bands/<pipeline>-<target>.json).")
@registry_option
@json_option
def gate_calibrate_cmd(pipeline, target, variants, margin_db, out, registry_uri, as_json):
    """Measure the similarity band that bf16 reassociation alone produces, and store it."""
    from .compile import parse_set_args
    from .registry import open_registry

    parsed = [parse_set_args([p for p in v.split(",") if p]) for v in variants] or None
    _prepare_devices_for_target(target)
    registry = open_registry(registry_uri)
    from .gates import calibrate

    res = calibrate(pipeline, target, registry=registry, variants=parsed, margin_db=margin_db, out=out,
                    progress=_progress(not as_json))
    b = res.band
    rows = "\n".join(f"  {v.overrides}: min PSNR {v.min_psnr_db} dB, median {v.median_psnr_db} dB, "
                     f"max abs diff {v.max_abs_diff}, identical frames {v.identical_frames}/{v.frames}"
                     for v in b.variants)
    _emit(as_json, {"ok": True, "path": str(res.path), "digest": res.digest, "band": b.model_dump(mode="json")},
          f"band for {pipeline} on {target}: PSNR >= {b.psnr_floor_db} dB, max abs diff <= "
          f"{b.max_abs_diff_ceiling}\n{rows}\n  written to {res.path}")


@cli.command("review")
@click.argument("ref")
@click.option("--serve", is_flag=True, help="Serve the blind review page and record answers.")
@click.option("--port", default=0, type=int, help="Port for --serve (default: any free port).")
@click.option("--approve", "decision", flag_value="approve", help="Approve a build that needs review.")
@click.option("--reject", "decision", flag_value="reject", help="Reject it; a rejected build is never promoted.")
@click.option("--reviewer", default=None, help="Who decides (required with --approve/--reject).")
@click.option("--note", default="", help="Why.")
@registry_option
@json_option
def review_cmd(ref, serve, port, decision, reviewer, note, registry_uri, as_json):
    """Blind review of a build below the band: --serve, then --approve or --reject."""
    from .gates.review import ReviewServer, decide
    from .gates.store import load_review
    from .registry import open_registry

    registry = open_registry(registry_uri, create=False)
    resolved = registry.resolve(ref)
    build_id = resolved.build_id
    if serve and decision:
        raise InputError("--serve and --approve/--reject are separate steps: answer first, then decide")
    if decision:
        if not reviewer:
            raise InputError("--reviewer NAME is required with --approve or --reject")
        r = decide(registry, build_id, approve=decision == "approve", reviewer=reviewer, note=note)
        _emit(as_json, {"ok": True, "review": r.model_dump(mode="json")},
              f"{build_id}: {r.decision.decision} by {r.decision.reviewer}")
        return
    if serve:
        server = ReviewServer(registry, build_id, port=port)
        _emit(as_json, {"ok": True, "url": server.url}, f"blind review of {build_id}: open {server.url}  (Ctrl-C to stop)")
        sys.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
        return
    r = load_review(registry, build_id)
    if r is None:
        raise InputError(f"no review for {build_id}: only a gate that ends in needs-review opens one")
    prefs = {k: sum(a.preferred == k for a in r.answers) for k in ("candidate", "baseline", "same")}
    state = r.decision.decision if r.decision else ("answered, awaiting decision" if r.complete else "open")
    _emit(as_json, {"ok": True, "review": r.model_dump(mode="json"), "preferences": prefs},
          f"{build_id}: review {state}; {len(r.answers)}/{len(r.frames)} pairs answered "
          f"(candidate preferred {prefs['candidate']}, baseline {prefs['baseline']}, no difference {prefs['same']})")


def main(argv: list[str] | None = None) -> Any:
    return cli.main(args=argv, prog_name="avatar-release")


if __name__ == "__main__":  # pragma: no cover
    main()
