"""Options that commands share and what they resolve: which registry (found as git finds a
repository), which project, which channel (with suggestions), trust and signing keys, and shell
completion of build references. Command modules import these; the top-level group does not, so
``avatar-release --help`` loads none of the registry, records or trust rooms."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from .._suggest import did_you_mean
from ..errors import InputError
from ..records import CHANNELS
from ..registry import find_registry, open_registry
from ..runtime import TrustConfig
from ..specs import use_project
from ..trust.keys import load_public_key
from ..trust.statements import AcceptedState

__all__ = ["registry_option", "new_registry_option", "project_option", "channel_choice", "SuggestingChoice",
           "trust_options", "trust_config", "signing_options", "complete_ref", "CHANNELS"]

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


def trust_config(trust_key: str | None, trust_state: str, allow_stale: bool = False,
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
