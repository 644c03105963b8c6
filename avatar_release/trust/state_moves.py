"""A channel move, end to end: signed into the release state, then mirrored to the registry's
plain channel pointer and history (what a pod without a pinned root follows; ``ls`` flags a pointer
that disagrees with the signed state).

The mirror is never read by a decision: promote, rollback, revoke and pods with a trust root
read the signed state only (``trust.state_read``, ``trust.state_pod``). A mirror that someone
edited is simply written over by the next move.

Also the publish of a freshly compiled build to dev, which initialises the signed state of a
registry that is new (no channels, no history): the machine that creates a registry holds its
first root, as ``registry init`` would. A registry that has channels but no signed state is
refused (exit 4: ``registry upgrade``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ConflictError
from ..machine import who as who_is_acting
from ..records import BlobRef, HistoryEntry, Manifest, MoveRecord
from ..registry import Registry, Resolved
from .policy import TrustPolicy, load_policy
from .state_read import ReleaseState, load_state, state_exists
from .state_write import init_state, record_move

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["signed_move", "mirror_move", "publish_to_dev", "open_state", "history_entry"]


def open_state(
    registry: Registry, policy: TrustPolicy, *, init_if_new: bool = False, given: Sequence[Ed25519PrivateKey] = ()
) -> ReleaseState:
    """The verified signed state; with ``init_if_new``, a registry with no channels and no history
    (one this process is creating) is initialised first."""
    if init_if_new and not state_exists(registry) and not registry.list_channels() and not registry.history():
        return init_state(registry, policy, given=given)
    return load_state(registry, policy)


def history_entry(move: MoveRecord) -> HistoryEntry:
    """A signed move as the history shows it: numbered by the channel's signed metadata version (what
    ``history`` lists and a rollback says it undoes), digests the manifests' content digests."""
    return HistoryEntry(
        sequence=move.version,
        channel=move.channel,
        action="promote" if move.action == "upgrade" else move.action,
        from_build=move.from_build,
        from_digest=move.from_manifest_digest,
        to_build=move.build_id,
        to_digest=move.manifest_digest,
        who=move.who,
        when=move.when,
        reason=move.reason,
        gate_result_digest=move.gate_result_digest,
    )


def mirror_move(registry: Registry, channel: str, resolved: Resolved, move: MoveRecord) -> HistoryEntry | None:
    """Point the plain channel pointer where the signed state now names (history action as signed)."""
    action = "promote" if move.action == "upgrade" else move.action
    for _ in range(3):
        current = registry.get_channel(channel)
        try:
            return registry.move_channel(
                channel,
                resolved,
                expected_digest=current.digest if current else None,
                action=action,
                who=move.who,
                reason=move.reason,
                gate_result_digest=move.gate_result_digest,
            )
        except ConflictError:
            continue  # another writer touched the mirror; the signed move stands: write it again
    return None


def signed_move(
    registry: Registry,
    policy: TrustPolicy,
    state: ReleaseState,
    channel: str,
    resolved: Resolved,
    manifest: Manifest,
    *,
    action: str,
    who: str,
    reason: str,
    gate_result_digest: str | None,
    evidence: Sequence[BlobRef] = (),
    given: Sequence[Ed25519PrivateKey] = (),
) -> tuple[ReleaseState, MoveRecord | None, HistoryEntry | None]:
    """Sign ``channel``'s move to the build and mirror it: (the new state, the move, its history entry
    as ``history`` lists it). (state, None, None) when the signed state already names the build there
    (a repeated move is a no-op)."""
    holder = state.holder(channel)
    if holder is not None and holder.manifest_digest == manifest.content_digest():
        return state, None, None
    size = len(registry.get_manifest_bytes(resolved.digest))
    state, move = record_move(
        registry,
        policy,
        state,
        channel,
        action=action,
        build_id=resolved.build_id,
        manifest_digest=manifest.content_digest(),
        manifest_size=size,
        who=who,
        reason=reason,
        gate_result_digest=gate_result_digest,
        evidence=evidence,
        given=given,
    )
    mirror_move(registry, channel, resolved, move)
    # The signed move is what happened, numbered as the signed history numbers it (the mirror's own
    # registry-wide sequence is another count, and no number a user is shown)
    return state, move, history_entry(move)


def publish_to_dev(
    registry: Registry,
    resolved: Resolved,
    manifest: Manifest,
    *,
    reason: str,
    who: str | None = None,
    policy: TrustPolicy | None = None,
) -> HistoryEntry | None:
    """Point dev at a build that was just published (signed; action "publish"). Dev takes any
    compiled build, so no promotion policy is consulted. None when dev already named it."""
    policy = policy or load_policy()
    state = open_state(registry, policy, init_if_new=True)
    _, _, entry = signed_move(
        registry,
        policy,
        state,
        "dev",
        resolved,
        manifest,
        action="publish",
        who=who or who_is_acting(),
        reason=reason,
        gate_result_digest=None,
    )
    return entry
