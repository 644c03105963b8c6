"""What a command that loads a build needs before JAX starts: this process's devices, set from a
target (compile, calibrate) or from a build's manifest once it is checked (render, serve, gate,
rebuild), and the trust a pod loads with (``--trust-key`` and its options)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import click

from .._paths import state_dir
from ..errors import InputError
from ..machine import configure_compile_env, configure_for_manifest
from ..records import Manifest, check_identity
from ..registry import Registry, Resolved, read_manifest
from ..runtime import TrustConfig, check_trusted, resolve_channel
from ..specs import load_target
from ..trust.keys import load_public_key
from ..trust.state_pod import load_pinned_root
from ..trust.statements import AcceptedState

__all__ = ["prepare_devices_for_target", "prepare_devices_for_build", "trust_options", "trust_config"]

_F = TypeVar("_F", bound=Callable[..., Any])  # a command function, options added


def prepare_devices_for_target(target_name: str) -> None:
    configure_compile_env(load_target(target_name))


def prepare_devices_for_build(
    registry: Registry, ref: str, trust: TrustConfig | None = None
) -> tuple[Resolved, Manifest]:
    """Read the manifest (no JAX needed), check it, and only then apply what it asks of this process
    (its device count and its flag profile's XLA flags): nothing from a manifest acts before its
    identity and, with a trust key, the channel's signed statement for it are verified."""
    if trust is not None and trust.root is not None:
        resolved, manifest, _ = resolve_channel(registry, ref, trust)  # from the signed release state only
        check_identity(manifest)
    else:
        resolved, manifest = read_manifest(registry, ref)
    if trust is not None and trust.root is None:
        check_identity(manifest)
        check_trusted(registry, resolved, trust, manifest)
    configure_for_manifest(manifest)
    return resolved, manifest


def trust_options(f: _F) -> _F:
    f = click.option(
        "--serve-expired",
        is_flag=True,
        envvar="AVATAR_RELEASE_SERVE_EXPIRED",
        help="With --trust-root: while the signed release state is expired (nobody refreshed its "
        "timestamp, or the registry is frozen) keep answering requests with the build loaded; "
        "the pod is not ready either way. Default: refuse them (503).",
    )(f)
    f = click.option(
        "--trust-root",
        default=None,
        envvar="AVATAR_RELEASE_TRUST_ROOT",
        metavar="FILE",
        help="The registry's root metadata (avatar-release registry root --out FILE): serve only what "
        "the signed release state names, verified from this root (TUF); what it has trusted is "
        "kept under AVATAR_RELEASE_STATE_DIR.",
    )(f)
    f = click.option(
        "--max-timestamp-age",
        "max_timestamp_hours",
        default=1.0,
        show_default=True,
        type=float,
        envvar="AVATAR_RELEASE_MAX_TIMESTAMP_AGE_HOURS",
        metavar="HOURS",
        help="Accept no signed timestamp signed longer ago than this, whatever its expiry: the replay "
        "window of a pod that remembers nothing (refresh timestamps well within it).",
    )(f)
    f = click.option(
        "--allow-stale",
        is_flag=True,
        envvar="AVATAR_RELEASE_ALLOW_STALE",
        help="Accept a signed statement without a fresh signed timestamp (a restarted pod can then be "
        "fed an older, unexpired statement; only for promoters that cannot refresh timestamps).",
    )(f)
    f = click.option(
        "--trust-state",
        default=None,
        show_default="accepted.json in the state directory "
        "($AVATAR_RELEASE_STATE_DIR, else ~/.local/state/avatar-release)",
        envvar="AVATAR_RELEASE_TRUST_STATE",
        help="Where this pod keeps the highest statement sequence it accepted (replay protection); "
        "put it on a volume that outlives the container.",
    )(f)
    return click.option(
        "--trust-key",
        default=None,
        envvar="AVATAR_RELEASE_TRUST_KEY",
        help="Ed25519 public key: serve only channels with a valid signed statement.",
    )(f)


def trust_config(
    trust_key: str | None,
    trust_state: str | None,
    allow_stale: bool = False,
    max_timestamp_hours: float = 1.0,
    trust_root: str | None = None,
    serve_expired: bool = False,
) -> TrustConfig | None:
    if trust_root:
        return TrustConfig(root=load_pinned_root(trust_root), serve_expired=serve_expired)
    if not trust_key:
        return None
    if not max_timestamp_hours > 0:
        raise InputError(f"--max-timestamp-age {max_timestamp_hours}: expected a positive number of hours")
    return TrustConfig(
        load_public_key(trust_key),
        AcceptedState(os.path.expanduser(trust_state) if trust_state else state_dir() / "accepted.json"),
        require_fresh=not allow_stale,
        max_timestamp_age=timedelta(hours=max_timestamp_hours),
    )
