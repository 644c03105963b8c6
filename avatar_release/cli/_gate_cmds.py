"""Gates and reviews: gate run / compile / calibrate, review."""

from __future__ import annotations

import sys

import click

from ._app import _emit, _finish, _prepare_devices_for_build, _prepare_devices_for_target, _progress, cli, json_option, registry_option
from ..errors import InputError, Refusal


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
    from ..registry import open_registry

    registry = open_registry(registry_uri, create=False)
    resolved, manifest = _prepare_devices_for_build(registry, ref)
    _require_build_hardware(manifest)
    from ..gates import run_gate

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
    payload = {"status": r.status, "result_digest": outcome.digest,
               "report": str(outcome.report) if outcome.report else None,
               "review_page": str(outcome.review_page) if outcome.review_page else None,
               "result": r.model_dump(mode="json")}
    failure = None if outcome.passed else Refusal(
        f"gate of {r.build_id}: {r.status}" + (f"; see {outcome.report}" if outcome.report else ""))
    _finish(as_json, payload, "\n".join(lines), failure)


def _require_build_hardware(manifest) -> None:
    """Output gates run the build: without its devices, refuse early with the loader's own
    check (both machines named), pointing at the compile gate."""
    if manifest.platform.backend == "cpu":
        return  # the fresh gate workers check CPU builds field by field as they load
    from ..errors import EnvironmentMismatch
    from ..runtime import check_environment

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
    from ..registry import open_registry, read_manifest

    registry = open_registry(registry_uri, create=False)
    _, manifest = read_manifest(registry, ref)
    _prepare_devices_for_target(manifest.target)
    from ..gates.compile_gate import run_compile_gate

    outcome = run_compile_gate(registry, ref, reproduce=not no_reproduce, progress=_progress(not as_json))
    r = outcome.result
    lines = [f"{r.status.upper()}: compile gate of {r.build_id} ({r.target})"]
    lines += [f"  {c.name:<18} {c.status:<8} {c.summary}" for c in r.checks]
    lines.append(f"  stored as record compile-gates/{r.build_id} ({r.seconds:.1f}s). Output gates (twin baseline, "
                 "bit-exact, band) still need a run on the build's hardware before staging.")
    failure = None if outcome.passed else Refusal(f"compile gate of {r.build_id}: {r.status}")
    _finish(as_json, {"status": r.status, "result": r.model_dump(mode="json")}, "\n".join(lines), failure)


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
    from ..compile import parse_set_args
    from ..registry import open_registry

    parsed = [parse_set_args([p for p in v.split(",") if p]) for v in variants] or None
    _prepare_devices_for_target(target)
    registry = open_registry(registry_uri)
    from ..gates import calibrate

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
@click.option("--host", default="127.0.0.1", show_default=True, help="Address for --serve to listen on.")
@click.option("--port", default=0, type=int, help="Port for --serve (default: any free port).")
@click.option("--approve", "decision", flag_value="approve", help="Approve a build that needs review.")
@click.option("--reject", "decision", flag_value="reject", help="Reject it; a rejected build is never promoted.")
@click.option("--reviewer", default=None,
              help="Who answers (--serve; default: this machine's reviewer) or decides (required with "
                   "--approve/--reject); the trust policy must name them.")
@click.option("--reviewer-key", default=None,
              help="The reviewer's Ed25519 private key (PEM) that signs answers and the decision "
                   "(default: this machine's reviewer key).")
@click.option("--note", default="", help="Why.")
@registry_option
@json_option
def review_cmd(ref, serve, host, port, decision, reviewer, reviewer_key, note, registry_uri, as_json):
    """Blind review of a build below the band: --serve, then --approve or --reject; without
    either, the state (counts only until the decision, then the left/right order)."""
    from ..gates.review import decide, review_status, serve_review
    from ..registry import open_registry

    registry = open_registry(registry_uri, create=False)
    build_id = registry.resolve(ref).build_id
    if serve and decision:
        raise InputError("--serve and --approve/--reject are separate steps: answer first, then decide")
    if decision:
        r = decide(registry, build_id, approve=decision == "approve", reviewer=reviewer, note=note,
                   signer=reviewer_key)
        _emit(as_json, {"ok": True, "review": r.model_dump(mode="json")},
              f"{build_id}: {r.decision.decision} by {r.decision.reviewer}; `avatar-release review {build_id}` "
              "shows the order and each answer")
        return
    if serve:
        server = serve_review(registry, build_id, reviewer=reviewer, reviewer_key=reviewer_key, host=host, port=port)
        _emit(as_json, {"ok": True, "url": server.url, "reviewer": server.reviewer},
              f"blind review of {build_id} as {server.reviewer}: open {server.url}  (Ctrl-C to stop)")
        sys.stdout.flush()
        server.run()
        return
    status = review_status(registry, build_id)
    _emit(as_json, {"ok": True, "review": status.as_json()}, status.text())
