"""The application: the click group, shared options, output, and the one place where the
exception tree becomes exit codes (and, with ``--json``, an ``{"ok": false, "error": ...}``
document on stdout carrying the error's details).

JAX is never imported before the command knows how many devices it needs: the entry
point sets XLA_FLAGS explicitly from the target or the build's manifest, then calls in.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from importlib import metadata
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from .. import __version__
from .._suggest import did_you_mean
from ..errors import CRASH_EXIT_CODE, AvatarReleaseError, InputError
from ..machine import configure_compile_env, configure_for_manifest, quiet_jax_import
from ..records import CHANNELS, Manifest, check_identity
from ..registry import Registry, Resolved, find_registry, open_registry, read_manifest
from ..runtime import TrustConfig, check_trusted
from ..specs import load_target, use_project
from ._exit_codes import ExitCodesGroup
from ._progress_view import ProgressView
from ..trust.keys import load_public_key
from ..trust.statements import AcceptedState

__all__ = ["main", "cli", "CHANNELS"]

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


class _Group(ExitCodesGroup):
    """Maps AvatarReleaseError subclasses to their exit codes; anything else is a crash."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_ARGS] = tuple(args)  # what was typed: a usage error still answers --json
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                         list[str]]:
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            hint = did_you_mean(args[0], self.list_commands(ctx))
            raise click.UsageError(f"no command {args[0]!r}{hint}; see `avatar-release --help`", ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AvatarReleaseError as e:
            if ctx.meta.get(_JSON):
                payload = {"ok": False, "error": type(e).__name__, "message": str(e), "exit_code": e.exit_code,
                           **e.details}
                fit = getattr(e, "fit", None)
                if fit is not None:  # DoesNotFit: the numbers, for CI and benchmarks
                    payload["memory_fit"] = fit.model_dump()
                click.echo(json.dumps(payload, indent=2, sort_keys=True))
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except click.UsageError as e:
            if not (ctx.meta.get(_JSON) or "--json" in ctx.meta.get(_ARGS, ())):
                raise
            payload = {"ok": False, "error": "UsageError", "message": e.format_message(), "exit_code": e.exit_code,
                       "usage": e.ctx.get_usage() if e.ctx else None}
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


_REGISTRY = "avatar_release.registry"  # ctx.meta key: the RegistryChoice this command resolved


def _found_registry(create: bool) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    """A callback that turns ``--registry`` (or nothing) into the URI of the registry to use."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if ctx.resilient_parsing:  # completion, --help: look nothing up
            return value
        choice = find_registry(value, create=create)
        ctx.meta[_REGISTRY] = choice
        return choice.uri

    return callback


_REGISTRY_HELP = ("Registry: a directory, file://PATH, oci://HOST[:PORT]/REPO (oci+http://, oci+https://), "
                  "gar://projects/P/locations/L/repositories/R, memory://NAME, or a name from avatar-release.toml. "
                  "Default: $AVATAR_RELEASE_REGISTRY, then the config files' default, then the nearest "
                  ".avatar-release/ upward (see `avatar-release registries`).")
registry_option = click.option("--registry", "registry_uri", default=None, callback=_found_registry(False),
                               metavar="URI|PATH|NAME", help=_REGISTRY_HELP)
# For the commands that may start a registry: when none is found, ./.avatar-release is created.
new_registry_option = click.option("--registry", "registry_uri", default=None, callback=_found_registry(True),
                                   metavar="URI|PATH|NAME", help=_REGISTRY_HELP + " If none is found, "
                                   "./.avatar-release is created.")


def _use_project(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value:
        use_project(value)  # AVATAR_RELEASE_PROJECT for this process and every one it starts
    return value


project_option = click.option(
    "--project", "project_dir", default=None, callback=_use_project, expose_value=False, metavar="DIR",
    help="The project holding manifests/ and the pipeline's code (default: the nearest directory upward "
         "from here that holds manifests/; or $AVATAR_RELEASE_PROJECT).",
)
json_option = click.option("--json", "as_json", is_flag=True, callback=_remember_json, expose_value=True,
                           is_eager=True, help="Print a machine-readable result (errors too) on stdout.")
def complete_ref(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion for a build reference: the channels that hold a build, then build ids, from
    the registry the command would use (nothing, never an error, when none is found)."""
    try:
        reg = open_registry(find_registry(ctx.params.get("registry_uri")).uri, create=False)
        channels = [c.channel for c in reg.list_channels()]
        builds = [b.build_id for b in reg.list_builds()]
    except Exception:  # noqa: BLE001 - completion must never print a traceback into a shell
        return []
    return [CompletionItem(n, help=h) for n, h in [*((c, "channel") for c in channels),
                                                   *((b, "build") for b in reversed(builds))]
            if n.startswith(incomplete)]


class SuggestingChoice(click.Choice):
    """``click.Choice`` whose refusal names the closest choice (``production`` -> did you mean 'prod')."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            choices = [str(c) for c in self.choices]
            self.fail(f"{value!r} is not one of {', '.join(map(repr, choices))}{did_you_mean(str(value), choices)}",
                      param, ctx)


channel_choice = SuggestingChoice(list(CHANNELS))


_F = TypeVar("_F", bound=Callable[..., Any])  # a command function, options added


def trust_options(f: _F) -> _F:
    f = click.option("--max-timestamp-age", "max_timestamp_hours", default=1.0, show_default=True, type=float,
                     envvar="AVATAR_RELEASE_MAX_TIMESTAMP_AGE_HOURS", metavar="HOURS",
                     help="Accept no signed timestamp signed longer ago than this, whatever its expiry: the replay "
                          "window of a pod that remembers nothing (refresh timestamps well within it).")(f)
    f = click.option("--allow-stale", is_flag=True, envvar="AVATAR_RELEASE_ALLOW_STALE",
                     help="Accept a signed statement without a fresh signed timestamp (a restarted pod can then be "
                          "fed an older, unexpired statement; only for promoters that cannot refresh timestamps).")(f)
    f = click.option("--trust-state", default="~/.local/state/avatar-release/accepted.json", show_default=True,
                     envvar="AVATAR_RELEASE_TRUST_STATE",
                     help="Where this pod keeps the highest statement sequence it accepted (replay protection); "
                          "put it on a volume that outlives the container.")(f)
    return click.option("--trust-key", default=None, envvar="AVATAR_RELEASE_TRUST_KEY",
                        help="Ed25519 public key: serve only channels with a valid signed statement.")(f)


def _trust(trust_key: str | None, trust_state: str, allow_stale: bool = False,
           max_timestamp_hours: float = 1.0) -> TrustConfig | None:
    if not trust_key:
        return None
    if not max_timestamp_hours > 0:
        raise InputError(f"--max-timestamp-age {max_timestamp_hours}: expected a positive number of hours")
    return TrustConfig(load_public_key(trust_key), AcceptedState(os.path.expanduser(trust_state)),
                       require_fresh=not allow_stale, max_timestamp_age=timedelta(hours=max_timestamp_hours))


def signing_options(f: _F) -> _F:
    f = click.option("--valid-days", default=30.0, show_default=True, type=float,
                     help="How long the signed statement stays valid.")(f)
    return click.option("--sign-key", default=None, envvar="AVATAR_RELEASE_SIGNING_KEY",
                        help="Ed25519 private key: sign a statement for the move (pods with the public key need it).")(f)


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
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_versions,
              help="Show avatar-release's version and those of jax, jaxlib, libtpu, the CUDA plugin, torch and "
                   "torchax, then exit.")
def cli() -> None:
    """Compiled XLA programs as release artifacts: compile, gate, promote, render."""


def _prepare_devices_for_target(target_name: str) -> None:
    configure_compile_env(load_target(target_name))


def _prepare_devices_for_build(registry: Registry, ref: str, trust: TrustConfig | None = None
                               ) -> tuple[Resolved, Manifest]:
    """Read the manifest (no JAX needed), check it, and only then apply what it asks of this process
    (its device count and its flag profile's XLA flags): nothing from a manifest acts before its
    identity and, with a trust key, the channel's signed statement for it are verified."""
    resolved, manifest = read_manifest(registry, ref)
    if trust is not None:
        check_identity(manifest)
        check_trusted(registry, resolved, trust, manifest)
    configure_for_manifest(manifest)
    return resolved, manifest



def main(argv: list[str] | None = None) -> Any:
    quiet_jax_import()  # before any command starts JAX: the CUDA plugin's no-driver lines are dropped
    return cli.main(args=argv, prog_name="avatar-release")


if __name__ == "__main__":  # pragma: no cover
    main()
