"""Options that commands share and what they resolve: which registry (found as git finds a
repository), which project, which channel (with suggestions), signing keys, and shell
completion of build references. Command modules import these; the top-level group does not, so
``avatar-release --help`` loads none of the registry, records or trust rooms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from .._suggest import did_you_mean
from ..records import CHANNELS
from ..registry import find_registry, open_registry
from ..specs import use_project

__all__ = [
    "registry_option",
    "new_registry_option",
    "project_option",
    "channel_choice",
    "SuggestingChoice",
    "signing_options",
    "complete_ref",
    "CHANNELS",
]


def _found_registry(create: bool) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    """A callback that turns ``--registry`` (or nothing) into the URI of the registry to use."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if ctx.resilient_parsing:  # completion, --help: look nothing up
            return value
        return find_registry(value, create=create).uri

    return callback


_REGISTRY_HELP = (
    "Registry: a directory, file://PATH, oci://HOST[:PORT]/REPO (oci+http://, oci+https://), "
    "gar://projects/P/locations/L/repositories/R, memory://NAME, or a name from avatar-release.toml. "
    "Default: $AVATAR_RELEASE_REGISTRY, then the config files' default, then the nearest "
    ".avatar-release/ upward (see `avatar-release registries`)."
)
registry_option = click.option(
    "--registry",
    "registry_uri",
    default=None,
    callback=_found_registry(False),
    metavar="URI|PATH|NAME",
    help=_REGISTRY_HELP,
)
# For the commands that may start a registry: when none is found, ./.avatar-release is created.
new_registry_option = click.option(
    "--registry",
    "registry_uri",
    default=None,
    callback=_found_registry(True),
    metavar="URI|PATH|NAME",
    help=_REGISTRY_HELP + " If none is found, ./.avatar-release is created.",
)


def _use_project(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value:
        use_project(value)  # AVATAR_RELEASE_PROJECT for this process and every one it starts
    return value


project_option = click.option(
    "--project",
    "project_dir",
    default=None,
    callback=_use_project,
    expose_value=False,
    metavar="DIR",
    help="The project holding manifests/ and the pipeline's code (default: the nearest directory upward "
    "from here that holds manifests/; or $AVATAR_RELEASE_PROJECT).",
)


def nonempty_ref(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A build reference given as "" (an unset shell variable) is a usage error naming the argument,
    not a lookup of nothing or an option parsed as the reference."""
    if value is not None and not value.strip():
        raise click.BadParameter(
            f"{param.human_readable_name} is empty: give a build id, a digest or a channel "
            "(`avatar-release ls` lists them)",
            ctx=ctx,
            param=param,
        )
    return value


def complete_ref(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion for a build reference: the channels that hold a build, then build ids, from
    the registry the command would use (nothing, never an error, when none is found)."""
    try:
        reg = open_registry(find_registry(ctx.params.get("registry_uri")).uri, create=False)
        channels = [c.channel for c in reg.list_channels()]
        builds = [b.build_id for b in reg.list_builds()]
    except Exception:  # noqa: BLE001 - completion must never print a traceback into a shell
        return []
    return [
        CompletionItem(n, help=h)
        for n, h in [*((c, "channel") for c in channels), *((b, "build") for b in reversed(builds))]
        if n.startswith(incomplete)
    ]


class SuggestingChoice(click.Choice):
    """``click.Choice`` whose refusal names the closest choice (``production`` -> did you mean 'prod')."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            choices = [str(c) for c in self.choices]
            self.fail(
                f"{value!r} is not one of {', '.join(map(repr, choices))}{did_you_mean(str(value), choices)}",
                param,
                ctx,
            )


channel_choice = SuggestingChoice(list(CHANNELS))


_F = TypeVar("_F", bound=Callable[..., Any])  # a command function, options added


def signing_options(f: _F) -> _F:
    f = click.option(
        "--valid-days", default=30.0, show_default=True, type=float, help="How long the signed statement stays valid."
    )(f)
    return click.option(
        "--sign-key",
        default=None,
        envvar="AVATAR_RELEASE_SIGNING_KEY",
        help="Ed25519 private key: sign a statement for the move (pods with the public key need it).",
    )(f)
