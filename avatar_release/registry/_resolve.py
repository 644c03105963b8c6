"""How a reference names a build, the same in every store.

In order: a manifest digest; a channel; an exact build id; a unique prefix of a build id.
An empty channel, an ambiguous prefix and an unknown name each get their own message. A store
supplies only the look-ups (``Lookups``); the rules and the messages live here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .._digest import is_digest
from .._suggest import did_you_mean
from ..errors import InputError, NotFoundError
from ._protocol import CHANNELS, Resolved, check_name

__all__ = ["Lookups", "resolve_ref", "plausible_name"]


def plausible_name(name: str) -> bool:
    """Could ``name`` be a channel or build id at all (before asking the store)?"""
    try:
        check_name("channel", name)
        return True
    except InputError:
        return False


@dataclass(frozen=True)
class Lookups:
    by_digest: Callable[[str], Resolved]  # a manifest digest -> Resolved, or NotFoundError
    channel: Callable[[str], Resolved | None]  # a channel -> where it points, None if empty/absent
    exact_build: Callable[[str], str | None]  # a build id -> its digest, None if absent
    builds_with_prefix: Callable[[str], list[str]]  # build ids starting with a prefix
    latest: Callable[[], list[str]]  # a few recent build ids, for the "unknown" message


def resolve_ref(ref: str, uri: str, look: Lookups) -> Resolved:
    """Channel name, build id, manifest digest, or a unique prefix of a build id."""
    if not isinstance(ref, str) or not ref:
        raise NotFoundError("empty build reference: give a channel (dev, staging, prod), a build id or a digest")
    if is_digest(ref):
        return look.by_digest(ref)
    if not plausible_name(ref):
        raise NotFoundError(
            f"unknown build or channel {ref!r} in {uri}: not a valid name (lowercase letters, "
            f"digits, '.', '_', '-'){did_you_mean(ref, [*CHANNELS, *look.latest()])}"
        )
    at = look.channel(ref)
    if at is not None:
        return at
    digest = look.exact_build(ref)
    if digest is not None:
        return Resolved(ref, ref, digest, "build-id")
    ids = look.builds_with_prefix(ref)
    if len(ids) == 1:
        digest = look.exact_build(ids[0])
        if digest is not None:
            return Resolved(ref, ids[0], digest, "build-id")
    if len(ids) > 1:
        raise NotFoundError(f"build reference {ref!r} is ambiguous in {uri}: {', '.join(ids[:5])}")
    if ref in CHANNELS:
        held = {c: r.build_id for c in CHANNELS if c != ref and (r := look.channel(c)) is not None}
        hint = (
            f"; channels that hold a build: {', '.join(f'{c} ({b})' for c, b in held.items())}"
            if held
            else "; no channel holds a build yet"
        )
        raise NotFoundError(
            f"channel {ref!r} is empty in {uri}: nothing has been promoted to it yet{hint}"
        ).with_details(empty_channel=ref, channels_holding=held)
    latest = look.latest()
    known = ", ".join(latest[-5:]) or "none"
    raise NotFoundError(
        f"unknown build or channel {ref!r} in {uri}{did_you_mean(ref, [*CHANNELS, *latest])} "
        f"(latest builds: {known}); see `avatar-release ls`"
    )
