"""Gates and reviews: gate run (whole or one shard) / merge / compile / calibrate / inputs, review."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from ..errors import EnvironmentMismatch, InputError, NeedsReview, Refusal
from ..gates import GateOutcome, merge_shards, parse_shard, run_gate, run_shard
from ..gates.compile_gate import run_compile_gate
from ..gates.review import decide, review_status, serve_review
from ..machine import native_log_filter
from ..records import Manifest
from ..registry import open_registry, read_manifest
from ..runtime import check_environment
from ._app import _emit, _finish, _next_step, _progress, cli, json_option
from ._band_cmds import gate_calibrate_cmd, gate_inputs_cmd
from ._devices import prepare_devices_for_build, prepare_devices_for_target
from ._exit_codes import ExitCodesGroup
from ._options import complete_ref, nonempty_ref, project_option, registry_option
from ._summary import append_step_summary, gate_summary


# ------------------------------------------------------------------------------------ gates
class _GateGroup(ExitCodesGroup):
    """``gate BUILD ...`` runs the gates; ``gate calibrate ...`` measures the band."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The common path first: ``gate REF`` is ``gate run REF``, so its options are shown here."""
        run = self.commands["run"]
        rows = [
            r
            for p in run.get_params(ctx)
            if isinstance(p, click.Option) and p.name != "help" and (r := p.get_help_record(ctx)) is not None
        ]
        with formatter.section("Options of `gate REF` (the same as `gate run REF`)"):
            formatter.write_dl(rows)
        super().format_options(ctx, formatter)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # `gate REF ...` and `gate --registry R REF` (options first, as with `gate run`) both mean `gate run`;
        # `gate --help` and `gate OPTIONS SUBCOMMAND ...` are left to the group.
        if (
            args
            and args[0] not in self.commands
            and args[0] not in ctx.help_option_names
            and not any(a in self.commands for a in args)
        ):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@cli.group("gate", cls=_GateGroup)
def gate_group() -> None:
    """Gate a build: `gate BUILD [--baseline prod|BUILD|none]`, `gate BUILD --shard K/N` then
    `gate merge BUILD`, `gate calibrate`, or `gate inputs` (the digests a trust policy pins).

    Exit 0: passed. Exit 1: a gate said no. Exit 13: below the band, a blind review decides.
    Other codes: the gate could not run (listed at the end).
    """


_F = TypeVar("_F", bound=Callable[..., Any])  # a command function, options added


def _compare_options(f: _F) -> _F:
    """What a verdict is decided against: the same for one run (`gate run`) and for shards (`gate merge`)."""
    f = click.option(
        "--band", "band_file", default=None, help="Band file (default: manifests/bands/<pipeline>-<target>.json)."
    )(f)
    f = click.option(
        "--report",
        "report_dir",
        default=None,
        help="Folder for the HTML report (default: gate-reports/<build id>/<UTC time of the run>: one "
        "folder per run, so a re-gate never overwrites an earlier report).",
    )(f)
    return click.option(
        "--baseline",
        default="prod",
        show_default=True,
        help="Compare against: a channel, a build id or digest, or none (first build).",
    )(f)


@gate_group.command("run")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@_compare_options
@click.option(
    "--shard",
    default=None,
    metavar="K/N",
    help="Render only shard K (0..N-1, e.g. $JOB_COMPLETION_INDEX) of N and store signed partial evidence; "
    "`gate merge` decides once all N are stored (baseline, band and report are the merge's).",
)
@click.option(
    "--twin",
    type=click.Choice(["1", "2"]),
    default=None,
    help="With --shard: run only this twin here (the other may run on another host). Default: both.",
)
@click.option(
    "--run-id",
    default=None,
    envvar="AVATAR_RELEASE_GATE_RUN_ID",
    help="With --shard: groups the shards of one pipeline run (merge picks them by it).",
)
@click.option(
    "--requests-of",
    default=None,
    metavar="BUILD",
    shell_complete=complete_ref,
    help="With --baseline none: render BUILD's gate requests instead of REF's own, so that REF can be the "
    "baseline of a candidate compiled with another [gate] table.",
)
@registry_option
@project_option
@json_option
def gate_run_cmd(
    ref: str,
    baseline: str,
    report_dir: str | None,
    band_file: str | None,
    shard: str | None,
    twin: str | None,
    run_id: str | None,
    requests_of: str | None,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Gate REF: zero recompiles, twin baseline, bit-exact or similarity band."""
    if shard is not None:
        if requests_of is not None:
            raise InputError(
                f"--requests-of with --shard: re-gate the baseline on one machine "
                f"(avatar-release gate {ref} --baseline none --requests-of {requests_of})"
            )
        _gate_shard(registry_uri, ref, shard, twin, run_id, as_json)
        return
    if twin is not None:
        raise InputError("--twin splits a shard's twin runs over hosts: give --shard K/N too")
    registry = open_registry(registry_uri, create=False)
    resolved, manifest = prepare_devices_for_build(registry, ref)
    _require_build_hardware(manifest)

    outcome = run_gate(
        resolved.digest,
        registry,
        baseline=baseline,
        report_dir=report_dir or _run_report_dir(manifest.build_id),
        band_file=band_file,
        progress=_progress(),
        requests_of=requests_of,
    )
    _gate_finish(outcome, as_json)


def _run_report_dir(build_id: str) -> str:
    """gate-reports/<build id>/<UTC time>: every run its own folder (a failed report is never replaced)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = Path("gate-reports") / build_id / stamp
    n = 1
    while folder.exists():  # two runs within one second
        n += 1
        folder = Path("gate-reports") / build_id / f"{stamp}-{n}"
    return str(folder)


def _gate_shard(
    registry_uri: str | None, ref: str, shard: str, twin: str | None, run_id: str | None, as_json: bool
) -> None:
    k, n = parse_shard(shard)
    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_dir', '').replace('_file', '')}"
        for name in ("baseline", "report_dir", "band_file")
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        raise InputError(
            f"{', '.join(given)} with --shard: a shard only renders; give them to "
            "`avatar-release gate merge BUILD`, which decides"
        )
    registry = open_registry(registry_uri, create=False)
    resolved, manifest = prepare_devices_for_build(registry, ref)
    _require_build_hardware(manifest)
    out = run_shard(
        resolved.digest,
        registry,
        shard=(k, n),
        twins=(int(twin),) if twin else (1, 2),
        run_id=run_id,
        progress=_progress(),
    )
    s = out.shard
    lines = [f"SHARD {out.label} of {s.build_id}: requests {', '.join(s.requests)}"]
    lines += [
        f"  twin #{r.twin} on {r.host}: {sum(map(len, r.frame_sha256))} frames, {r.compiles} compile(s), "
        f"{r.wall_seconds:.1f}s"
        for r in s.runs
    ]
    lines.append(f"  partial {out.digest} (signed; run id {s.run_id or 'none'})")
    nxt = f"avatar-release gate merge {s.build_id}" + (f" --run-id {s.run_id}" if s.run_id else "")
    lines.append(_next_step(f"{nxt}   (once all {n} shards are stored)"))
    _emit(
        as_json,
        {"ok": True, "shard": s.model_dump(mode="json"), "partial_digest": out.digest, "next": nxt},
        "\n".join(lines),
    )


@gate_group.command("merge")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@_compare_options
@click.option(
    "--run-id",
    default=None,
    envvar="AVATAR_RELEASE_GATE_RUN_ID",
    help="Merge the shards of this run (default: the run of the newest shard).",
)
@registry_option
@json_option
def gate_merge_cmd(
    ref: str,
    baseline: str,
    report_dir: str | None,
    band_file: str | None,
    run_id: str | None,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Merge REF's signed shards (all N, one build, gate set and environment) and decide its gate.

    Needs no accelerator: it reads the shards' frames and hashes from the registry.
    """
    registry = open_registry(registry_uri, create=False)
    _, manifest = read_manifest(registry, ref)
    outcome = merge_shards(
        ref,
        registry,
        baseline=baseline,
        report_dir=report_dir or _run_report_dir(manifest.build_id),
        band_file=band_file,
        run_id=run_id,
        progress=_progress(),
    )
    _gate_finish(outcome, as_json)


def _gate_finish(outcome: GateOutcome, as_json: bool) -> None:
    """One gate result (run or merged): the table, the step summary, the next command, the exit code."""
    r = outcome.result
    lines = [
        f"{r.status.upper()}: {r.build_id}",
        f"  baseline {r.baseline.build_id if r.baseline else 'none'}" + (f", tier {r.tier}" if r.tier else ""),
    ]
    lines += [f"  {g.name:<16} {g.status:<10} {g.summary}" for g in r.gates]
    if outcome.report:
        lines.append(f"  report  {outcome.report}")
    if outcome.review_page:
        lines.append(f"  review  avatar-release review {r.build_id} --serve   (page also at {outcome.review_page})")
    lines.append(f"  result  {outcome.digest}  ({r.seconds.get('total', 0):.1f}s)")
    nxt = {
        "passed": f"avatar-release promote {r.build_id} --to staging",
        "needs-review": f"avatar-release review {r.build_id} --serve",
    }.get(r.status)
    never = getattr(outcome, "never_promotes", None)
    if never:
        lines.append(f"  note    {never}")
        nxt = f"avatar-release gate {r.build_id}"
    if nxt:
        lines.append(_next_step(nxt))
    report = str(outcome.report) if outcome.report else None
    payload = {
        "status": r.status,
        "build_id": r.build_id,
        "result_digest": outcome.digest,
        "promotable": never is None,
        "never_promotes": never,
        "report": report,
        "review_page": str(outcome.review_page) if outcome.review_page else None,
        "next": nxt,
        "result": r.model_dump(mode="json"),
    }
    append_step_summary(gate_summary(r, outcome.digest, report, nxt))
    where = f"; see {outcome.report}" if outcome.report else ""
    failure: Refusal | None = None
    if r.status == "needs-review":
        failure = NeedsReview(
            f"gate of {r.build_id}: needs-review (below the band){where}; a blind review decides: {nxt}"
        )
    elif not outcome.passed:
        failure = Refusal(f"gate of {r.build_id}: {r.status}{where}")
    _finish(as_json, payload, "\n".join(lines), failure)


def _require_build_hardware(manifest: Manifest) -> None:
    """Output gates run the build: without its devices, refuse early with the loader's own
    check (both machines named), pointing at the compile gate."""
    if manifest.platform.backend == "cpu":
        return  # the fresh gate workers check CPU builds field by field as they load

    try:
        check_environment(manifest)
    except EnvironmentMismatch as e:
        raise EnvironmentMismatch(
            f"the output gates run {manifest.build_id}, so they need its hardware: {e}\n"
            f"What can be proven on this host: avatar-release gate compile {manifest.build_id}",
            e.differences,
        ) from None


@gate_group.command("compile")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option("--no-reproduce", is_flag=True, help="Skip the recompile (reproducible HLO and fingerprint).")
@registry_option
@json_option
def gate_compile_cmd(ref: str, no_reproduce: bool, registry_uri: str | None, as_json: bool) -> None:
    """Compile gate for REF: what holds without its hardware (buckets, flags, memory, callbacks, rebuild).

    Never enough to promote past dev: output gates need a run on the build's hardware.
    """
    registry = open_registry(registry_uri, create=False)
    _, manifest = read_manifest(registry, ref)
    prepare_devices_for_target(manifest.target)

    with native_log_filter() as xla_log:  # the recompile's C++ log, as readable lines
        outcome = run_compile_gate(registry, ref, reproduce=not no_reproduce, progress=_progress())
    r = outcome.result
    lines = [f"{r.status.upper()}: compile gate of {r.build_id} ({r.target})"]
    lines += [f"  {c.name:<18} {c.status:<8} {c.summary}" for c in r.checks]
    lines.append(
        f"  stored as record compile-gates/{r.build_id} ({r.seconds:.1f}s). Output gates (twin baseline, "
        "bit-exact, band) still need a run on the build's hardware before staging."
    )
    failure = None if outcome.passed else Refusal(f"compile gate of {r.build_id}: {r.status}")
    _finish(
        as_json,
        {"status": r.status, "result": r.model_dump(mode="json"), "xla_log": [n.to_json() for n in xla_log]},
        "\n".join(lines),
        failure,
    )


gate_group.add_command(gate_calibrate_cmd)
gate_group.add_command(gate_inputs_cmd)


@cli.command("review")
@click.argument("ref", shell_complete=complete_ref, callback=nonempty_ref)
@click.option("--serve", is_flag=True, help="Serve the blind review page and record answers.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address for --serve to listen on.")
@click.option("--port", default=0, type=int, help="Port for --serve (default: any free port).")
@click.option("--approve", "decision", flag_value="approve", help="Approve a build that needs review.")
@click.option("--reject", "decision", flag_value="reject", help="Reject it; a rejected build is never promoted.")
@click.option(
    "--reviewer",
    default=None,
    help="Who answers (--serve; default: this machine's reviewer) or decides (required with "
    "--approve/--reject); the trust policy must name them.",
)
@click.option(
    "--reviewer-key",
    default=None,
    help="The reviewer's Ed25519 private key (PEM) that signs answers and the decision "
    "(default: this machine's reviewer key).",
)
@click.option("--note", default="", help="Why.")
@registry_option
@json_option
def review_cmd(
    ref: str,
    serve: bool,
    host: str,
    port: int,
    decision: str | None,
    reviewer: str | None,
    reviewer_key: str | None,
    note: str,
    registry_uri: str | None,
    as_json: bool,
) -> None:
    """Blind review of a build below the band: --serve, then --approve or --reject; without
    either, the state (counts only until the decision, then the left/right order)."""
    registry = open_registry(registry_uri, create=False)
    build_id = registry.resolve(ref).build_id
    if serve and decision:
        raise InputError("--serve and --approve/--reject are separate steps: answer first, then decide")
    if decision:
        r = decide(registry, build_id, approve=decision == "approve", reviewer=reviewer, note=note, signer=reviewer_key)
        made = r.decision
        assert made is not None  # decide() returns the review with the decision it recorded
        _emit(
            as_json,
            {"ok": True, "review": r.model_dump(mode="json")},
            f"{build_id}: {made.decision} by {made.reviewer}; `avatar-release review {build_id}` "
            "shows the order and each answer",
        )
        return
    if serve:
        server = serve_review(registry, build_id, reviewer=reviewer, reviewer_key=reviewer_key, host=host, port=port)
        _emit(
            as_json,
            {"ok": True, "url": server.url, "reviewer": server.reviewer},
            f"blind review of {build_id} as {server.reviewer}: open {server.url}  (Ctrl-C to stop)",
        )
        sys.stdout.flush()
        server.run()
        return
    status = review_status(registry, build_id)
    _emit(as_json, {"ok": True, "review": status.as_json()}, status.text())
