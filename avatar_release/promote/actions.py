"""Promote and roll back: a policy decision on the signed release state, then one signed move.

The signed state is read once (``trust.state_read``: verified from the policy's root, never older
than this machine saw; missing is exit 4), the policy decides against it, and the move is signed
into it (``trust.state_write``): a new version of the channel's metadata naming the build, the
evidence that let it in and the move before it, committed by a compare-and-swap of the timestamp
(a concurrent promoter: ConflictError, nothing changed). The registry's plain pointer and history
are then written as a mirror for ``ls`` and unsigned pods. Repeating a promotion is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..errors import NeedsApproval, Refusal
from ..machine import who
from ..records import CHANNELS, BlobRef, HistoryEntry, Manifest, MoveRecord
from ..registry import Registry, Resolved, read_manifest
from ..trust import key_id
from ..trust.evidence import attestation_refs
from ..trust.policy import TrustPolicy, load_policy, local_identity
from ..trust.revocation import Revocation, revoke
from ..trust.state_moves import open_state, signed_move
from ..trust.state_moves import publish_to_dev as _publish_signed
from ..trust.state_read import ReleaseState, load_state
from ..trust.state_write import record_revocation
from ..trust.statements import (
    PromotionStatement,
    SignedTimestamp,
    publish_statement,
    publish_timestamp,
    read_statement,
    sign,
    sign_timestamp,
    signed_digest,
)
from .approvals import Approval, sign_approval
from .policy import Decision, check_gate_evidence, check_promotion, check_rollback_target
from .signed import SignedChannels, evidence_ref

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "MoveResult",
    "promote",
    "publish_to_dev",
    "rollback",
    "actor",
    "sign_channel",
    "refresh_timestamp",
    "approve",
    "revoke_build",
]


def actor() -> str:
    """Who is acting (environment.who): AVATAR_RELEASE_ACTOR, else user@host."""
    return who()


@dataclass
class MoveResult:
    decision: Decision
    entry: HistoryEntry | None  # None: the channel already pointed there (no-op)
    previous: str | None  # build id the channel pointed at before
    statement: PromotionStatement | None = None  # the channel's signed statement when a signing key was given
    approved_here: Approval | None = None  # prod: the approval this machine's release key signed for it
    move: MoveRecord | None = None  # the signed move (None: the channel already named the build)
    sequence: int | None = None  # the signed state's snapshot version after the move

    @property
    def changed(self) -> bool:
        return self.entry is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "channel": self.decision.channel,
            "build_id": self.decision.build_id,
            "digest": self.decision.digest,
            "changed": self.changed,
            "previous": self.previous,
            "gate_status": self.decision.gate_status,
            "gate_result_digest": self.decision.gate_result_digest,
            "approvals": list(self.decision.approvals),
            "approved_here": self.approved_here.to_json() if self.approved_here else None,
            "entry": self.entry.model_dump(mode="json") if self.entry else None,
            "move": self.move.model_dump(mode="json") if self.move else None,
            "sequence": self.sequence,
            "statement": self.statement.model_dump(mode="json") if self.statement else None,
        }


def sign_channel(
    registry: Registry,
    channel: str,
    signing_key: Ed25519PrivateKey,
    *,
    valid_days: float = 30.0,
    who: str | None = None,
) -> PromotionStatement:
    """Sign and publish the statement for where ``channel`` points now (its state's sequence).

    The statement binds the build's manifest content digest, not this store's digest for it, so
    it stays valid wherever the build is copied (an OCI registry's digests differ from a
    directory store's)."""
    state = registry.get_channel(channel)
    if state is None:
        raise Refusal(f"sign {channel}: the channel is empty")
    st = sign(
        signing_key,
        build_id=state.build_id,
        build_digest=signed_digest(registry, state.digest),
        channel=channel,
        sequence=state.sequence,
        who=who or actor(),
        validity=timedelta(days=valid_days),
    )
    publish_statement(registry, st)
    refresh_timestamp(registry, channel, signing_key)
    return st


def refresh_timestamp(
    registry: Registry, channel: str, signing_key: Ed25519PrivateKey, *, valid_hours: float | None = None
) -> SignedTimestamp:
    """Re-sign the short-lived timestamp of ``channel``'s newest signed move (run on a schedule)."""
    st = read_statement(registry, channel)
    state = registry.get_channel(channel)
    if st is None or state is None:
        raise Refusal(f"refresh {channel}: no signed statement to vouch for; promote with --sign-key first")
    p = st.payload
    # a version-1 statement may bind this store's digest; a version-2 one binds the content digest
    if p.sequence != state.sequence or p.build_digest not in (state.digest, signed_digest(registry, state.digest)):
        raise Refusal(
            f"refresh {channel}: the channel points at {state.build_id} (#{state.sequence}) but the signed "
            f"statement names {p.build_id} (#{p.sequence}); sign the channel first (keys sign {channel})"
        )
    # The promoter's trust policy says how long a timestamp vouches (default an hour).
    validity = timedelta(hours=valid_hours if valid_hours else load_policy().timestamp_hours)
    ts = sign_timestamp(
        signing_key,
        channel=channel,
        sequence=p.sequence,
        build_id=p.build_id,
        build_digest=p.build_digest,
        validity=validity,
    )
    publish_timestamp(registry, ts)
    return ts


def _maybe_sign(
    registry: Registry, result: MoveResult, signing_key: Ed25519PrivateKey | None, valid_days: float
) -> MoveResult:
    if signing_key is None:
        return result

    current = read_statement(registry, result.decision.channel)
    state = registry.get_channel(result.decision.channel)
    if result.changed or current is None or state is None or current.payload.sequence != state.sequence:
        result.statement = sign_channel(registry, result.decision.channel, signing_key, valid_days=valid_days)
    else:
        result.statement = current  # a repeated promotion re-uses the valid statement
    return result


def publish_to_dev(
    registry: Registry, resolved: Resolved, *, reason: str, who: str | None = None
) -> HistoryEntry | None:
    """Point dev at a just-published build, signed (``trust.state_moves.publish_to_dev``)."""
    _, manifest = read_manifest(registry, resolved.digest)
    return _publish_signed(registry, resolved, manifest, reason=reason, who=who)


def promote(
    registry: Registry,
    ref: str,
    channel: str,
    *,
    reason: str = "",
    who: str | None = None,
    signing_key: Ed25519PrivateKey | None = None,
    valid_days: float = 30.0,
) -> MoveResult:
    """Move ``channel`` to ``ref`` if the policy allows it. Going to prod without a release
    approval that counts, this machine's own release key signs one when the trust policy names it
    an approver (the first-use identity on one laptop holds both roles); otherwise NeedsApproval."""
    policy = load_policy()
    given = (signing_key,) if signing_key is not None else ()
    channels = SignedChannels(registry, open_state(registry, policy, given=given))
    resolved, manifest = channels.resolve(ref)
    decision, approved_here, channels = _decide_with_local_approval(
        registry,
        resolved,
        manifest,
        policy,
        channels,
        lambda ch: check_promotion(registry, resolved, manifest, channel, policy, channels=ch),
        against_prod=True,
    )
    result = _move(
        registry,
        policy,
        channels,
        resolved,
        manifest,
        decision,
        "promote",
        who,
        reason or f"promote to {channel}",
        signing_key,
        valid_days,
    )
    result.approved_here = approved_here
    return result


def _decide_with_local_approval(
    registry: Registry,
    resolved: Resolved,
    manifest: Manifest,
    policy: TrustPolicy,
    channels: SignedChannels,
    decide: Callable[[SignedChannels], Decision],
    *,
    against_prod: bool,
) -> tuple[Decision, Approval | None, SignedChannels]:
    """``decide(channels)``; when prod needs a release approval and this machine's release key is an
    approver's, sign one of the verdict that decides (``against_prod``: as a promotion, else as a
    rollback) and decide again on the state as it is after that (the approval is listed in it): the
    first-use identity holds both roles. Returns the state the decision was made on, for the move."""
    try:
        return decide(channels), None, channels
    except NeedsApproval:
        key = _local_approver_key(policy)
        if key is None:
            raise
        admitted = check_gate_evidence(
            registry,
            resolved,
            manifest,
            what=f"approve {resolved.build_id}",
            channel="prod",
            policy=policy,
            channels=channels,
            against_prod=against_prod,
        )
        approved = sign_approval(
            registry,
            resolved.build_id,
            manifest,
            admitted.verdict,
            policy,
            key,
            note="signed by promote with this machine's release key",
        )
        channels = SignedChannels(registry, load_state(registry, policy))
        return decide(channels), approved, channels


def _local_approver_key(policy: TrustPolicy) -> Ed25519PrivateKey | None:
    """This machine's release key when the policy names it an approver (else None)."""
    path = local_identity().release_key_path
    if not path.is_file():
        return None
    key = local_identity().release_key()
    return key if key_id(key.public_key()) in policy.approver_keys() else None


def approve(
    registry: Registry,
    ref: str,
    *,
    private_key: Ed25519PrivateKey | None = None,
    approver: str | None = None,
    note: str = "",
) -> Approval:
    """Sign a release approval of the gate result that lets ``ref`` into prod now (with this
    machine's release key unless ``private_key`` is given)."""
    policy = load_policy()
    channels = SignedChannels(registry, open_state(registry, policy))
    resolved, manifest = channels.resolve(ref)
    admitted = check_gate_evidence(
        registry,
        resolved,
        manifest,
        what=f"approve {resolved.build_id} for prod",
        channel="prod",
        policy=policy,
        channels=channels,
    )
    key = private_key or local_identity().release_key()
    return sign_approval(
        registry, resolved.build_id, manifest, admitted.verdict, policy, key, approver=approver, note=note
    )


def revoke_build(
    registry: Registry, ref: str, *, reason: str, private_key: Ed25519PrivateKey | None = None
) -> Revocation:
    """Sign a revocation of ``ref`` (with this machine's release key unless ``private_key`` is given).
    The key must be one the trust policy names, or promotion would not count it: refused before
    anything is stored."""
    policy = load_policy()
    key = private_key or local_identity().release_key()
    state = open_state(registry, policy, given=(key,))
    resolved, manifest = SignedChannels(registry, state).resolve(ref)
    kid = key_id(key.public_key())
    if kid not in policy.revoker_keys():
        raise Refusal(
            f"revoke {resolved.build_id}: key {kid} is not named by the trust policy {policy.path}, so "
            "promotion would not count its revocation; sign with a key the policy names (--key)"
        )
    done = revoke(registry, resolved.build_id, manifest.content_digest(), key, reason=reason, by=actor())
    # The signed state lists it too: a revocation removed from the attestation index still counts.
    envelope = next(
        r for r in reversed(attestation_refs(registry, resolved.build_id)) if r.digest == done.envelope_digest
    )
    state = load_state(registry, policy)  # as it is now: storing the revocation listed it as evidence
    record_revocation(
        registry,
        policy,
        state,
        build_id=resolved.build_id,
        manifest_digest=manifest.content_digest(),
        envelope=envelope,
        reason=done.reason,
        by=done.by,
        at=done.at,
        given=(key,),
    )
    return done


def rollback(
    registry: Registry,
    channel: str,
    *,
    to: str | None = None,
    reason: str = "",
    who: str | None = None,
    signing_key: Ed25519PrivateKey | None = None,
    valid_days: float = 30.0,
) -> MoveResult:
    """A promotion back to a build the channel's signed history held: the same evidence and (prod)
    release approval as a promotion (``promote.policy.check_rollback_target``)."""
    policy = load_policy()
    given = (signing_key,) if signing_key is not None else ()
    channels = SignedChannels(registry, open_state(registry, policy, given=given))
    if channel in CHANNELS and to is None:
        holder = channels.state.holder(channel)
        if holder is None:
            raise Refusal(f"rollback {channel}: the channel is empty, there is nothing to roll back")
        undone = _undone_move(channels.moves(channel), holder.manifest_digest)
        if undone is None or undone.from_build is None:
            raise _no_earlier(channels.moves(channel), holder.manifest_digest, channel)
        to = undone.from_build
    assert to is not None
    resolved, manifest = channels.resolve(to)

    decision, approved_here, channels = _decide_with_local_approval(
        registry,
        resolved,
        manifest,
        policy,
        channels,
        lambda ch: check_rollback_target(registry, resolved, manifest, channel, policy, channels=ch),
        against_prod=False,
    )
    result = _move(
        registry,
        policy,
        channels,
        resolved,
        manifest,
        decision,
        "rollback",
        who,
        reason or f"rollback {channel}",
        signing_key,
        valid_days,
    )
    result.approved_here = approved_here
    return result


def _move(
    registry: Registry,
    policy: TrustPolicy,
    channels: SignedChannels,
    resolved: Resolved,
    manifest: Manifest,
    decision: Decision,
    action: Literal["promote", "rollback"],
    who: str | None,
    reason: str,
    signing_key: Ed25519PrivateKey | None,
    valid_days: float,
) -> MoveResult:
    """The one signed move, against the state the policy decided on; then the mirror."""
    state: ReleaseState = channels.state
    before = state.holder(decision.channel)
    evidence: list[BlobRef] = []
    if decision.gate_result_digest is not None and decision.channel != "dev":
        evidence.append(evidence_ref(registry, resolved.build_id, decision.gate_result_digest))
        evidence += [evidence_ref(registry, resolved.build_id, d) for d in decision.approval_digests]
    state, move, entry = signed_move(
        registry,
        policy,
        state,
        decision.channel,
        resolved,
        manifest,
        action=action,
        who=who or actor(),
        reason=reason,
        gate_result_digest=decision.gate_result_digest,
        evidence=evidence,
        given=(signing_key,) if signing_key is not None else (),
    )
    result = MoveResult(decision, entry, before.build_id if before else None, move=move, sequence=state.sequence)
    return _maybe_sign(registry, result, signing_key, valid_days)


def _undone_move(history: list[MoveRecord], current: str) -> MoveRecord | None:
    """The move a plain ``rollback`` undoes: the newest promote (or publish) that brought the channel
    to its current build from another one that was never itself rolled back from. A rollback is
    never undone by the next rollback (that would re-deploy the build just rolled back: name it
    with ``--to`` for that); a second rollback goes one step further back instead."""
    rolled_back = {m.from_manifest_digest for m in history if m.action == "rollback" and m.from_manifest_digest}
    for m in reversed(history):
        if (
            m.manifest_digest == current
            and m.action != "rollback"
            and m.from_manifest_digest
            and m.from_manifest_digest != current
            and m.from_manifest_digest not in rolled_back
        ):
            return m
    return None


def _no_earlier(history: list[MoveRecord], current: str, channel: str) -> Refusal:
    """Why a plain rollback has nowhere to go, naming the builds only ``--to`` may bring back."""
    gone = [
        m.from_build for m in history if m.action == "rollback" and m.from_build and m.from_manifest_digest != current
    ]
    names = f" (rolled back from before: {', '.join(dict.fromkeys(gone))})" if gone else ""
    return Refusal(
        f"rollback {channel}: no earlier build in its signed history to go back to; name one with --to BUILD{names}"
    )
