"""The application: the click group, shared options, output, and the one place where the
exception tree becomes exit codes (and, with ``--json``, an ``{"ok": false, "error": ...}``
document on stdout carrying the error's details).

JAX is never imported before the command knows how many devices it needs: the entry
point sets XLA_FLAGS explicitly from the target or the build's manifest, then calls in.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from typing import Any

import click

from .. import __version__
from .._suggest import did_you_mean
from ..errors import CRASH_EXIT_CODE, AvatarReleaseError
from ._exit_codes import ExitCodesGroup
from ._progress_view import ProgressView

__all__ = ["main", "cli", "COMMANDS", "load_commands"]

_T0 = time.perf_counter()


def _emit(ctx_json: bool, payload: dict[str, Any], human: str) -> None:
    if ctx_json:
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
    else:
        click.echo(human)


def _finish(as_json: bool, payload: dict[str, Any], human: str, failure: AvatarReleaseError | None = None) -> None:
    """Print a command's result; when it is a failure, end through the exception tree.

    With ``--json`` a failure prints one document (the error's fields plus ``payload``) from the
    group's handler; without, the human report is printed first and the error line follows.
    """
    if failure is None:
        _emit(as_json, {"ok": True, **payload}, human)
        return
    if not as_json:
        click.echo(human)
    raise failure.with_details(**payload)


def _progress() -> Callable[[str], None]:
    """Progress on stderr (with ``--json`` too: stdout carries only the result, so a pipeline step
    that runs for a minute still shows what it is doing): bars on a terminal, lines elsewhere."""
    view = ProgressView(sys.stderr)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(view.close)
    return view


def _next_step(command: str) -> str:
    """The line that tells the user what to run next (also ``next`` in ``--json`` output)."""
    return f"  next: {command}"


_JSON = "avatar_release.json"  # ctx.meta key: the command asked for --json (shared by every context)
_ARGS = "avatar_release.args"  # ctx.meta key: the arguments as typed


# Each command's module and the line `avatar-release --help` shows for it (its short help: the one
# place it is written). A command's module is imported only when that command runs, completes or
# shows its own help, so `--help`, a typo and a usage error load no room beneath the CLI.
COMMANDS: dict[str, tuple[str, str]] = {
    "analyze": ("_analyze_cmds", "Static analyses: of a pipeline config (attention, schedule) or of a build."),
    "approve": ("_release_cmds", "Sign a release approval of REF for prod (the second role)."),
    "autotune": (
        "_tune_cmds",
        "Measure a GPU build's configs on its GPUs; publish it compiled with them as a new build.",
    ),
    "compile": ("_build_cmds", "Trace, AOT-compile and publish a build; points the dev channel at it."),
    "completion": ("_completion_cmds", "Print the shell completion script (bash, zsh, fish)."),
    "copy": ("_registry_cmds", "Mirror build REF with everything that belongs to it into another registry."),
    "diff": ("_diff_cmds", "What differs between two builds: flags, toolchain, digests, executables, verdicts."),
    "gate": ("_gate_cmds", "Gate a build against prod (or shard it, merge shards, calibrate the band)."),
    "gc": ("_release_cmds", "Delete unreferenced blobs (never anything a channel or a rollback can reach)."),
    "history": ("_release_cmds", "The signed history of channel moves (all channels, or one)."),
    "inspect": ("_build_cmds", "Show a build's manifest (REF: channel, build id or digest)."),
    "keys": ("_release_cmds", "Ed25519 keys for signed promotions."),
    "ls": ("_build_cmds", "List builds: their channels, gate status and what the verdict compared with."),
    "promote": ("_release_cmds", "Move a channel to REF if the policy allows it (exit 1 with the reason if not)."),
    "rebuild": ("_build_cmds", "Recompile a published build from its manifest; exit 1 if HLO or fingerprint differ."),
    "registries": ("_registry_cmds", "Show which registry commands here use, why, and the names config files define."),
    "registry": ("_state_cmds", "The signed release state (init, upgrade, refresh, rotate, root, status); migrate."),
    "repair": ("_registry_cmds", "Re-put every blob of REF that fails verification, good bytes from another registry."),
    "render": ("_serve_cmds", "Render a video from REF as a serving pod would, with zero compiles."),
    "review": ("_gate_cmds", "Blind review of a build below the band: serve the page, approve or reject."),
    "revoke": ("_release_cmds", "Revoke REF for good: promotion, rollback and pods refuse it from now on."),
    "rollback": ("_release_cmds", "Move CHANNEL back to an earlier build that passed its gates."),
    "specs": ("_specs_cmds", "JSON Schema of the project's spec files: pipeline, target, flags, levers, band."),
    "serve": ("_serve_cmds", "Serve REF over HTTP (streamed fMP4) after verify, load and a warm chunk."),
    "verify": ("_build_cmds", "Re-hash every blob of a build; exit 4 naming each blob that fails."),
}


def _before_commands() -> None:
    # Imported here, with the first command module: machine brings records (pydantic) with it,
    # which `--help` and a mistyped command never need.
    from ..machine import quiet_jax_import

    quiet_jax_import()  # before any command starts JAX: the CUDA plugin's no-driver lines are dropped


def load_commands() -> None:
    """Import every command module (for what walks the whole CLI: docs, completion tests)."""
    _before_commands()
    for module in sorted({m for m, _ in COMMANDS.values()}):
        importlib.import_module(f"{__package__}.{module}")


class _Group(ExitCodesGroup):
    """Maps AvatarReleaseError subclasses to their exit codes; anything else is a crash. Its
    commands load on first use (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            _before_commands()
            # The module registers its commands on this group as it is imported.
            importlib.import_module(f"{__package__}.{COMMANDS[cmd_name][0]}")
        return self.commands.get(cmd_name)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        super().add_command(cmd, name)
        listed = COMMANDS.get(name or cmd.name or "")
        if listed is not None and cmd.short_help is None:
            cmd.short_help = listed[1]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from ``COMMANDS``: nothing is imported to show it."""
        rows = [
            (n, COMMANDS[n][1] if n in COMMANDS else (self.commands[n].get_short_help_str()))
            for n in self.list_commands(ctx)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_ARGS] = tuple(args)  # what was typed: a usage error still answers --json
        return super().parse_args(ctx, args)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            hint = did_you_mean(args[0], self.list_commands(ctx))
            raise click.UsageError(f"no command {args[0]!r}{hint}; see `avatar-release --help`", ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AvatarReleaseError as e:
            if ctx.meta.get(_JSON):
                payload = {
                    "ok": False,
                    "error": type(e).__name__,
                    "message": str(e),
                    "exit_code": e.exit_code,
                    **e.details,
                }
                fit = getattr(e, "fit", None)
                if fit is not None:  # DoesNotFit: the numbers, for CI and benchmarks
                    payload["memory_fit"] = fit.model_dump()
                click.echo(json.dumps(payload, indent=2, sort_keys=True))
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except click.UsageError as e:
            if not (ctx.meta.get(_JSON) or "--json" in ctx.meta.get(_ARGS, ())):
                raise
            payload = {
                "ok": False,
                "error": "UsageError",
                "message": e.format_message(),
                "exit_code": e.exit_code,
                "usage": e.ctx.get_usage() if e.ctx else None,
            }
            click.echo(json.dumps(payload, indent=2, sort_keys=True))
            e.show()
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception:  # noqa: BLE001 - a crash, reported as one
            traceback.print_exc()
            click.echo("avatar-release crashed (a bug, not a refusal); exit 70", err=True)
            ctx.exit(CRASH_EXIT_CODE)


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[_JSON] = True
    return value


json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    callback=_remember_json,
    expose_value=True,
    is_eager=True,
    help="Print a machine-readable result (errors too) on stdout.",
)


# What a bug report needs beside our own version: the compilers and runtimes a build depends on,
# read from the installed distributions (nothing is imported, so --version stays instant).
_TOOLCHAIN = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "torch", "torchax")


def versions_text() -> str:
    """``avatar-release X`` and one line per toolchain package (``not installed`` when absent)."""
    lines = [f"avatar-release {__version__}", f"python {platform.python_version()}"]
    for dist in _TOOLCHAIN:
        try:
            lines.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{dist} not installed")
    return "\n".join(lines)


def _show_versions(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(versions_text())
        ctx.exit()


@click.group(cls=_Group)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_versions,
    help="Show avatar-release's version and those of jax, jaxlib, libtpu, the CUDA plugin, torch and "
    "torchax, then exit.",
)
def cli() -> None:
    """Compiled XLA programs as release artifacts: compile, gate, promote, render."""


def main(argv: list[str] | None = None) -> Any:
    return cli.main(args=argv, prog_name="avatar-release")


if __name__ == "__main__":  # pragma: no cover
    main()
