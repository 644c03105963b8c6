"""What a pod trusts, and a ref read under it: the signed release state a pinned root verifies, or a
channel's signed statement (and fresh timestamp) under an Ed25519 key; and whose revocations count.

All of it runs before anything from the manifest acts on the process, and before any blob is
fetched, decompressed or unpickled (``_load.load``). Imports no torch and no JAX.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from ..errors import Revoked, TrustError
from ..records import Manifest, StatementPayload
from ..registry import CHANNELS, Registry, Resolved, read_manifest
from ..trust import key_id
from ..trust.state_pod import PinnedRoot, VerifiedChannel, verify_channel_state
from ..trust.statements import TIMESTAMP_VALIDITY, AcceptedState, verify_channel

# only for annotations: cryptography loads when a key is used
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["TrustConfig", "check_trusted", "revocation_keys", "resolve_channel"]


@dataclass(frozen=True)
class TrustConfig:
    """What a pod trusts. ``root``: the signed release state's root metadata it pins (TUF, every
    decision from signed state: ``trust.state_pod``). Else, the older way: an Ed25519 public key that
    signs channel statements, and where the pod keeps the highest sequence it accepted."""

    public_key: Ed25519PublicKey | None = None
    state: AcceptedState | None = None  # None: no memory across restarts
    # Require an unexpired signed timestamp naming the statement (refuses replays to a pod that
    # remembers nothing); off only for registries whose promoter cannot refresh timestamps.
    require_fresh: bool = True
    # The oldest signed timestamp this pod accepts, whatever expiry its signer chose: the replay
    # window of a pod without trust state.
    max_timestamp_age: timedelta = TIMESTAMP_VALIDITY
    root: PinnedRoot | None = None
    # With ``root``: keep answering requests with the build loaded when the signed state expires
    # (the pod is not ready either way, so a load balancer stops sending; this says what a request
    # that still arrives gets). False: refused with 503 until a fresh timestamp is seen.
    serve_expired: bool = False


def revocation_keys(trust: TrustConfig | None) -> dict | None:
    """Whose revocations (from the build's attestations) a pod counts: its statement key's; with a
    pinned root, the revoked role's keys; with neither, any that parses (it verifies nothing signed,
    and a revocation can only hold a build back)."""
    if trust is None or trust.public_key is None:
        return None
    return {key_id(trust.public_key): trust.public_key}


def resolve_channel(
    reg: Registry, ref: str, trust: TrustConfig | None
) -> tuple[Resolved, Manifest, VerifiedChannel | None]:
    """``ref`` read once. With a pinned root and a channel name, from the signed release state only:
    the build it names (TrustError / StateExpired / Revoked when that state says no), whose manifest
    must be the very one it signs. Anything else: the registry's own resolution."""
    if trust is None or trust.root is None:
        resolved, manifest = read_manifest(reg, ref)
        return resolved, manifest, None
    if ref not in CHANNELS:
        raise TrustError(
            f"{ref!r} is not a channel; with a trust root a pod serves channels (dev, staging, prod), "
            "whose builds the signed release state names"
        )
    verified = verify_channel_state(reg, ref, trust.root)
    if verified.revoked is not None:
        r = verified.revoked
        raise Revoked(
            f"load {ref}: {verified.build_id} is revoked in the signed release state by {r.get('by', '?')} "
            f"at {r.get('at', '?')}: {r.get('reason', '')}. A revoked build never loads again"
        )
    resolved, manifest = read_manifest(reg, verified.build_id)
    if manifest.content_digest() != verified.manifest_digest:
        raise TrustError(
            f"channel {ref}: the signed state names {verified.build_id} with manifest "
            f"{verified.manifest_digest}, but the registry's {verified.build_id} is "
            f"{manifest.content_digest()}: the build was replaced under its id"
        )
    return Resolved(ref, resolved.build_id, resolved.digest, "channel"), manifest, verified


def check_trusted(
    reg: Registry, resolved: Resolved, trust: TrustConfig, manifest: Manifest
) -> StatementPayload | VerifiedChannel:
    """The channel's signed statement (and fresh timestamp) for this build, checked without JAX: a pod
    calls it before anything from the manifest acts on the process (flags, device count). With a
    pinned root: the signed release state must name this very manifest."""
    if trust.root is not None:
        _, manifest_now, verified = resolve_channel(reg, resolved.ref, trust)
        if manifest_now.content_digest() != manifest.content_digest():
            raise TrustError(
                f"channel {resolved.ref}: the signed release state names {manifest_now.build_id}, not "
                f"{manifest.build_id}; the channel pointer was moved without signed metadata"
            )
        assert verified is not None
        return verified
    if trust.public_key is None:
        raise TrustError("a trust config with neither a root nor a key trusts nothing")
    if resolved.via != "channel":
        raise TrustError(
            f"{resolved.ref!r} is a {resolved.via}; with a trust key configured a pod serves channels "
            "(dev, staging, prod), which carry signed statements"
        )
    # The statement may bind this store's digest or the store-independent manifest digest (a copied build).
    return verify_channel(
        reg,
        resolved.ref,
        trust.public_key,
        digest=resolved.digest,
        state=trust.state,
        require_fresh=trust.require_fresh,
        content_digest=manifest.content_digest(),
        max_age=trust.max_timestamp_age,
    )
