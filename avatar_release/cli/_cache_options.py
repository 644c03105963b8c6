"""The node cache's options, shared by the commands that load a build as a pod does (render, serve,
verify): each sets its environment variable for this process and every one it starts (gate
workers, a followed build's load), where :func:`avatar_release.registry.with_node_cache` reads it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..errors import InputError
from ..registry.cache import (
    CACHE_DIR_ENV,
    CACHE_SIZE_ENV,
    DEFAULT_CONCURRENCY,
    PULL_CONCURRENCY_ENV,
    default_cache_dir,
    parse_size,
)

__all__ = ["cache_options"]

_F = TypeVar("_F", bound=Callable[..., Any])
_DEFAULT = "\0default"  # ``--cache-dir`` given without a directory


def _cache_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if ctx.resilient_parsing or value is None:
        return value
    path = str(default_cache_dir()) if value == _DEFAULT else value
    if not path.strip():
        return None  # AVATAR_RELEASE_CACHE_DIR="" : no cache
    os.environ[CACHE_DIR_ENV] = path
    return path


def _cache_size(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if ctx.resilient_parsing or value is None:
        return value
    try:
        parse_size(value, where="--cache-size")
    except InputError as e:
        raise click.BadParameter(str(e).removeprefix("--cache-size: "), ctx=ctx, param=param) from None
    os.environ[CACHE_SIZE_ENV] = value
    return value


def _pulls(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if not ctx.resilient_parsing and value is not None:
        os.environ[PULL_CONCURRENCY_ENV] = str(value)
    return value


def cache_options(f: _F) -> _F:
    f = click.option(
        "--pull-concurrency",
        type=click.IntRange(1, 64),
        default=None,
        envvar=PULL_CONCURRENCY_ENV,
        callback=_pulls,
        expose_value=False,
        help=f"Blobs pulled side by side into the node cache (env {PULL_CONCURRENCY_ENV}; "
        f"default {DEFAULT_CONCURRENCY}).",
    )(f)
    f = click.option(
        "--cache-size",
        default=None,
        envvar=CACHE_SIZE_ENV,
        callback=_cache_size,
        expose_value=False,
        metavar="SIZE",
        help=f"Bound of the node cache, e.g. 50GiB; least recently used blobs go first past it "
        f"(env {CACHE_SIZE_ENV}; default 50GiB).",
    )(f)
    return click.option(
        "--cache-dir",
        default=None,
        is_flag=False,
        flag_value=_DEFAULT,
        envvar=CACHE_DIR_ENV,
        callback=_cache_dir,
        expose_value=False,
        metavar="[DIR]",
        help=f"Node cache for a remote registry (oci://, gar://): each blob pulled once into DIR, "
        f"shared by the pods of a node, read back mapped (env {CACHE_DIR_ENV}). Without DIR: "
        "the user's cache directory (~/.cache/avatar-release/blobs). Default: no cache.",
    )(f)
