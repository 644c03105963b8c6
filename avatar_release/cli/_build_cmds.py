"""Commands about builds: compile, rebuild, ls, inspect, verify."""

from __future__ import annotations

import json

import click

from ..compile import compile_build, parse_set_args, rebuild
from ..errors import IntegrityError, Refusal
from ..machine import native_log_filter
from ..promote import publish_to_dev
from ..promote.status import ReleaseStatus, release_status
from ..records import WEIGHT_COMPRESSIONS
from ..registry import open_registry, read_manifest
from ..runtime import verify_build
from ..specs import levers_warning, manifests_dir
from ._app import _emit, _finish, _next_step, _progress, cli, json_option
from ._cache_options import cache_options
from ._devices import prepare_devices_for_target
from ._options import complete_ref, new_registry_option, nonempty_ref, project_option, registry_option
from ._table import table


# ---------------------------------------------------------------------------------- compile
@cli.command("compile")
@click.option("--pipeline", default="tiny", show_default=True, help="A pipeline spec under manifests/pipelines/.")
@click.option("--target", default="cpu-8", show_default=True, help="A target under manifests/targets/.")
@click.option("--weights", "weights_path", default=None, help="A .safetensors checkpoint (default: the spec's source).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a model config field (repeatable).")
@click.option("--serial", is_flag=True, help="Compile stages one after another instead of concurrently.")
@click.option(
    "--format",
    "executable_format",
    type=click.Choice(["xla-executable", "jax-export"]),
    default="xla-executable",
    show_default=True,
    help="jax-export ships portable StableHLO that compiles in the pod (the zero-recompile gate refuses it).",
)
@click.option(
    "--weight-compression",
    type=click.Choice(list(WEIGHT_COMPRESSIONS)),
    default="none",
    show_default=True,
    help="How weight chunks are stored: none (raw: pods load them with one hash, no decoding) or zstd "
    "(about a fifth fewer bytes of bf16 to move, for a registry where transfer costs more than CPU).",
)
@new_registry_option
@project_option
@json_option
def compile_cmd(
    pipeline: str,
    target: str,
    weights_path: str | None,
    sets: tuple[str, ...],
    serial: bool,
    executable_format: str,
    weight_compression: str,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Trace, AOT-compile and publish a build; points the dev channel at it."""
    overrides = parse_set_args(sets)
    # Before the compile, not at the first gate against prod: a missing lever list is a warning, a
    # malformed one an error (exit 2), so a long compile never ends in a gate that cannot run.
    if levers := levers_warning(manifests_dir() / "levers.toml"):
        click.echo(f"warning: {levers}", err=True)
    prepare_devices_for_target(target)
    registry = open_registry(registry_uri)

    # The compiler's C++ log (glog on fd 2) becomes one readable line per distinct message.
    with native_log_filter() as xla_log:
        result = compile_build(
            pipeline,
            target,
            registry=registry,
            weights_path=weights_path,
            overrides=overrides,
            concurrent_compile=not serial,
            executable_format=executable_format,
            move_dev=False,
            weight_compression=weight_compression,
            progress=_progress(),
        )
    # compile publishes; moving dev is promote's job.
    publish_to_dev(registry, registry.resolve(result.digest), reason=f"compile {result.pipeline} for {result.target}")
    click.echo("".join(f"warning: {w}\n" for w in result.warnings), err=True, nl=False)
    rows = "\n".join(
        f"  {e.key:<12} raw {e.raw_size / 1e6:7.2f} MB  zstd {e.compressed_size / 1e6:7.2f} MB  "
        f"trace {e.trace_seconds:5.2f}s lower {e.lower_seconds:5.2f}s "
        + (f"shared with {result.shared[e.key]}" if e.key in result.shared else f"compile {e.compile_seconds:5.2f}s")
        for e in result.executables
    )
    state = "published" if result.created else "already published (identical build)"
    # A first build has nothing in prod to compare with: its gate runs on its own.
    nxt = f"avatar-release gate {result.build_id}" + (
        " --baseline none" if registry.get_channel("prod") is None else ""
    )
    _emit(
        as_json,
        {
            "ok": True,
            **result.to_json(),
            "xla_log": [n.to_json() for n in xla_log],
            "next": nxt,
            "warnings": ([levers] if levers else []) + result.warnings,
        },
        f"{state}: {result.build_id}\n  digest {result.digest}\n{rows}\n"
        f"  dev -> {result.build_id}   ({result.wall_seconds:.1f}s)\n{_next_step(nxt)}",
    )


@cli.command("rebuild")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@registry_option
@project_option
@json_option
def rebuild_cmd(ref: str, registry_uri: str | None, as_json: bool) -> None:
    """Recompile a published build from its manifest; exit 1 if HLO or fingerprint differ."""
    reg = open_registry(registry_uri, create=False)
    _, m = read_manifest(reg, ref)
    prepare_devices_for_target(m.target)

    with native_log_filter():  # the recompile's C++ log, as readable lines
        report = rebuild(ref, reg, progress=_progress())
    lines = "\n".join(f"  {d['what']}: published {d['published']}, rebuilt {d['rebuilt']}" for d in report.differences)
    human = f"{report.build_id}: " + (
        "reproduced bit for bit (HLO hashes, fingerprints, identity)"
        if report.identical
        else f"NOT reproducible:\n{lines}"
    )
    failure = (
        None
        if report.identical
        else Refusal(f"rebuild of {report.build_id} differs in {len(report.differences)} field(s)")
    )
    _finish(as_json, report.to_json(), human, failure)


# ---------------------------------------------------------------------------------- ls / inspect / verify
_LS_OUTPUTS = ("table", "wide", "name", "json")


def _ls_rows(st: ReleaseStatus, wide: bool) -> tuple[list[str], list[list[str]]]:
    headers = ["BUILD", "CHANNELS", "GATE", "COMPARED WITH", "PUBLISHED"]
    if wide:
        headers += ["DIGEST", "COMPILE GATE"]
    rows = []
    for b in st.builds:
        row = [
            b.build_id,
            ",".join(b.channels) or "-",
            "revoked" if b.revoked else b.gate,
            b.compared_with or "-",
            b.published_at[:19].replace("T", " "),
        ]
        if wide:
            row += [b.digest[:19], b.compile_gate or "-"]
        rows.append(row)
    return headers, rows


def _verdict_lines(st: ReleaseStatus) -> str:
    out = []
    for b in st.builds:
        for v in b.verdicts or []:
            out.append(
                f"{b.build_id}  {v.created_at[:19]}  {v.status:<12} {v.compared_with:<44} {v.digest[:19]}"
                f"{'' if v.signed else '  (unsigned: never promotes)'}"
            )
    return "\n".join(out)


@cli.command("ls")
@click.option(
    "--verdicts",
    is_flag=True,
    help="Also list every gate result of each build: status, what it compared with, when, and whether a "
    "key the trust policy names signed it (only those promote).",
)
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Choice(_LS_OUTPUTS),
    default="table",
    show_default=True,
    help="table: one row per build under a header; wide: also its digest and compile gate; "
    "name: build ids only, one per line (for scripts); json: as --json.",
)
@click.option("--no-headers", is_flag=True, help="Leave out the header row (table, wide).")
@registry_option
@json_option
def ls_cmd(verdicts: bool, output: str, no_headers: bool, registry_uri: str | None, as_json: bool) -> None:
    """List builds, newest last: the channels on each, its gate status and what that verdict compared with."""
    st = release_status(open_registry(registry_uri, create=False), verdicts=verdicts)
    if as_json or output == "json":
        _emit(True, {"ok": True, **st.to_json()}, "")
        return
    if output == "name":
        click.echo("\n".join(b.build_id for b in st.builds))
        return
    headers, rows = _ls_rows(st, wide=output == "wide")
    human = table(headers, rows, header=not no_headers) if rows else "no builds"
    human += "".join(f"\nREVOKED {b.build_id}: {b.revoked}" for b in st.builds if b.revoked)
    if verdicts and (lines := _verdict_lines(st)):
        human += "\n\nverdicts:\n" + lines
    human += "".join(f"\nwarning: {p}" for p in st.problems)
    click.echo(human)


@cli.command("inspect")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@registry_option
@json_option
def inspect_cmd(ref: str, registry_uri: str | None, as_json: bool) -> None:
    """Show a build's manifest (REF: channel, build id or digest)."""
    reg = open_registry(registry_uri, create=False)
    resolved, m = read_manifest(reg, ref)
    if as_json:
        click.echo(
            json.dumps(
                {"ok": True, "digest": resolved.digest, "manifest": m.model_dump(mode="json")}, indent=2, sort_keys=True
            )
        )
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
        lines.append(
            f"memory     {f.total_bytes / 2**30:.2f} of {f.capacity_bytes / 2**30:.2f} GiB per device "
            f"({f.weight_sharding}; peak {f.peak_stage}){'' if f.fits else ' - DOES NOT FIT'}"
        )
    lines.append("executables:")
    first: dict[str, str] = {}  # blob digest -> the first key that runs it (a program shared across buckets)
    for e in m.executables:
        same = first.setdefault(e.blob.digest, e.key)
        lines.append(
            f"  {e.key:<12} {e.blob.size / 1e6:6.2f} MB zstd ({e.raw_size / 1e6:.2f} raw)  "
            f"hlo {e.hlo_digest[7:19]}  flops {e.cost.get('flops', 0):.3g}"
            + (f"  (the executable of {same})" if same != e.key else "")
        )
    click.echo("\n".join(lines))


@cli.command("verify")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option(
    "--no-programs",
    "no_programs",
    is_flag=True,
    help="Skip deserializing each executable to compare its fingerprint: only the blobs' stored and raw "
    "digests, without starting JAX (flat memory whatever the build's size).",
)
@cache_options
@registry_option
@json_option
def verify_cmd(ref: str, no_programs: bool, registry_uri: str | None, as_json: bool) -> None:
    """Re-hash every blob of a build; exit 4 naming each blob that fails."""
    report = verify_build(ref, registry_uri, programs=not no_programs)
    human = "\n".join(
        f"  {'ok  ' if r['ok'] else 'FAIL'} {r['what']:<16} {r['digest'][:19]}  {r.get('error', '')}"
        for r in report["blobs"]
    )
    bad = [r["what"] for r in report["blobs"] if not r["ok"]]
    failure = (
        None
        if report["ok"]
        else IntegrityError(
            f"build {report['build_id']}: {len(bad)} blob(s) failed verification: {', '.join(bad)}; fix: "
            f"`avatar-release repair {report['build_id']} --from REGISTRY` re-puts them from a registry holding the "
            "same build (`compile` and `copy` skip a build already published)"
        )
    )
    if no_programs:
        human += (
            "\n  (--no-programs: stored and raw digests only; no executable was deserialized to check its fingerprint)"
        )
    _finish(as_json, report, f"{report['build_id']}:\n{human}", failure)
